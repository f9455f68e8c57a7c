//! [`EncodedBuffer`]: a message buffer kept in its encoding (as [`Buffer::encode`] writes it),
//! indexed, and searched, cut, re-keyed, spliced and written without building its maps.

use super::{Buffer, Taken};
use crate::codec::{Dec, Enc};
use crate::error::Result;
use crate::msg::{KeyMsgs, Msn, RangeDel};
use crate::subbytes::SubBytes;

/// A buffer kept in its encoding (as [`Buffer::encode`] writes it) with an index of where each
/// range delete and each key starts: a point query binary-searches it in place instead of building
/// the map of thousands of keys (which costs far more than reading the sub-block), and it takes
/// about as much memory as the encoding itself. Indexing checks everything decoding checks, so
/// an indexed encoding always builds ([`EncodedBuffer::build`]); a node being changed may keep
/// its untouched buffers in this form and write them back as they are (`node/slot.rs`).
#[derive(Debug)]
pub struct EncodedBuffer {
    /// The encoding: a buffer of its own, or its range of the node image it was read in
    /// (`subbytes.rs`; never changed in place).
    raw: SubBytes,
    /// Offset of each range delete (its MSN), in `lo` order.
    ranges: Vec<u32>,
    /// Offset of each point entry (its key's length prefix), in key order.
    points: Vec<u32>,
    /// Length of the longest point key (0 when none).
    longest: usize,
    max_key: usize,
    max_value: usize,
}

impl EncodedBuffer {
    /// Indexes an encoding, checking its structure, key order and message numbers on the way
    /// (all that [`Buffer::decode`] checks).
    pub fn index(
        raw: impl Into<SubBytes>,
        max_key: usize,
        max_value: usize,
    ) -> Result<EncodedBuffer> {
        let raw = raw.into();
        let mut ranges = Vec::new();
        let mut points = Vec::new();
        let mut longest = 0;
        {
            let mut d = Dec::new(&raw, "message buffer");
            let max_msn = d.u64()?;
            let nr = d.u32()? as usize;
            if nr > d.remaining() {
                return Err(d.corrupt(format!("bad range count {nr}")));
            }
            let mut prev_hi: Option<&[u8]> = None;
            for _ in 0..nr {
                ranges.push(d.pos() as u32);
                let msn = d.u64()?;
                let lo = d.bytes(max_key)?;
                let hi = d.bytes(max_key)?;
                if lo >= hi || msn > max_msn {
                    return Err(d.corrupt("bad range delete"));
                }
                if prev_hi.is_some_and(|p| p > lo) {
                    return Err(d.corrupt("range deletes overlap"));
                }
                prev_hi = Some(hi);
            }
            let np = d.u32()? as usize;
            if np > d.remaining() {
                return Err(d.corrupt(format!("bad message count {np}")));
            }
            points.reserve_exact(np);
            let mut prev: Option<&[u8]> = None;
            for _ in 0..np {
                points.push(d.pos() as u32);
                let k = d.bytes(max_key)?;
                if prev.is_some_and(|p| p >= k) {
                    return Err(d.corrupt("buffer keys out of order"));
                }
                prev = Some(k);
                longest = longest.max(k.len());
                KeyMsgs::check(&mut d, max_value, max_msn)?;
            }
            d.finish()?;
        }
        Ok(EncodedBuffer {
            raw,
            ranges,
            points,
            longest,
            max_key,
            max_value,
        })
    }

    /// Memory held, without the node image the encoding may lie in (the node charges each
    /// image its buffers use once, [`EncodedBuffer::sub_bytes`]).
    pub fn mem(&self) -> usize {
        self.raw.own_capacity() + (self.ranges.len() + self.points.len()) * 4 + 64
    }

    /// The same encoding and index, in a buffer of its own.
    pub(crate) fn unshared(&self) -> EncodedBuffer {
        let mut raw = self.raw.clone();
        raw.to_mut();
        EncodedBuffer {
            raw,
            ranges: self.ranges.clone(),
            points: self.points.clone(),
            longest: self.longest,
            max_key: self.max_key,
            max_value: self.max_value,
        }
    }

    /// The encoding's bytes, to be charged with [`crate::subbytes::ImageCharge`].
    pub(crate) fn sub_bytes(&self) -> &SubBytes {
        &self.raw
    }

    /// The encoding.
    pub fn raw(&self) -> &[u8] {
        &self.raw
    }

    /// Newest MSN in the buffer.
    pub fn max_msn(&self) -> Msn {
        u64::from_le_bytes(self.raw[..8].try_into().expect("8 bytes"))
    }

    /// Number of keys with point messages, and number of range deletes.
    pub fn counts(&self) -> (usize, usize) {
        (self.points.len(), self.ranges.len())
    }

    /// Keys stored: one per point, two per range delete (as [`Buffer::keys_stored`]).
    pub(crate) fn keys_stored(&self) -> usize {
        self.points.len() + 2 * self.ranges.len()
    }

    /// The exact length of the longest key with point messages (0 when none).
    pub fn longest_point_key(&self) -> usize {
        self.longest
    }

    fn at(&self, off: u32) -> Dec<'_> {
        let mut d = Dec::new(&self.raw, "message buffer");
        d.raw(off as usize)
            .expect("indexed offset lies inside the encoding");
        d
    }

    /// The key stored at an indexed offset (checked when indexed).
    fn key_at(&self, off: u32) -> &[u8] {
        self.at(off)
            .bytes(self.max_key)
            .expect("indexed key was checked when indexed")
    }

    /// An encoding written from this one (same key and value limits), with its index.
    fn assembled(
        &self,
        raw: Vec<u8>,
        ranges: Vec<u32>,
        points: Vec<u32>,
        longest: usize,
    ) -> EncodedBuffer {
        EncodedBuffer {
            raw: SubBytes::from(raw),
            ranges,
            points,
            longest,
            max_key: self.max_key,
            max_value: self.max_value,
        }
    }

    /// Every range delete, built.
    fn all_ranges(&self) -> Vec<RangeDel> {
        (0..self.ranges.len())
            .map(|i| {
                let (msn, lo, hi) = self.range_at(i);
                RangeDel {
                    msn,
                    lo: lo.to_vec(),
                    hi: hi.to_vec(),
                }
            })
            .collect()
    }

    /// Point `j`: its key and messages, built.
    fn point_decoded(&self, j: usize) -> (Vec<u8>, KeyMsgs) {
        let mut d = self.at(self.points[j]);
        let k = d.bytes(self.max_key).expect("indexed").to_vec();
        let km = KeyMsgs::decode(&mut d, self.max_value).expect("indexed messages decode");
        (k, km)
    }

    /// Range delete `i`: (MSN, lo, hi), checked when indexed.
    fn range_at(&self, i: usize) -> (Msn, &[u8], &[u8]) {
        let mut d = self.at(self.ranges[i]);
        let msn = d.u64().expect("indexed");
        let lo = d.bytes(self.max_key).expect("indexed");
        let hi = d.bytes(self.max_key).expect("indexed");
        (msn, lo, hi)
    }

    /// The range delete covering `key`: its MSN and high bound.
    pub fn range_covering(&self, key: &[u8]) -> Option<(Msn, &[u8])> {
        let i = self
            .ranges
            .partition_point(|&off| self.key_after_msn(off) <= key);
        if i == 0 {
            return None;
        }
        let (msn, _, hi) = self.range_at(i - 1);
        (key < hi).then_some((msn, hi))
    }

    /// The `lo` of the range delete at an indexed offset.
    fn key_after_msn(&self, off: u32) -> &[u8] {
        let mut d = self.at(off);
        d.u64().expect("indexed");
        d.bytes(self.max_key).expect("indexed")
    }

    /// The length of the longest point key in `[lo, hi)` (0 when none).
    pub fn longest_point_in(&self, lo: &[u8], hi: &[u8]) -> usize {
        let from = self.points.partition_point(|&off| self.key_at(off) < lo);
        self.points[from..]
            .iter()
            .map(|&off| self.key_at(off))
            .take_while(|k| *k < hi)
            .map(<[u8]>::len)
            .max()
            .unwrap_or(0)
    }

    /// Whether every message lies in the child's range `[lo, hi)` (`hi = None`: unbounded):
    /// point keys inside it, range deletes within it.
    pub fn within(&self, lo: &[u8], hi: Option<&[u8]>) -> bool {
        let points_in = match (self.points.first(), self.points.last()) {
            (Some(&f), Some(&l)) => self.key_at(f) >= lo && hi.is_none_or(|h| self.key_at(l) < h),
            _ => true,
        };
        let ranges_in = match self.ranges.len() {
            0 => true,
            n => self.range_at(0).1 >= lo && hi.is_none_or(|h| self.range_at(n - 1).2 <= h),
        };
        points_in && ranges_in
    }

    /// The buffer itself. Cannot fail: the encoding passed every check of decoding when it was
    /// indexed.
    pub fn build(&self) -> Buffer {
        let mut d = Dec::new(&self.raw, "message buffer");
        let b = Buffer::decode(&mut d, self.max_key, self.max_value)
            .expect("an indexed buffer encoding decodes");
        assert_eq!(d.remaining(), 0, "an indexed buffer encoding decodes whole");
        b
    }

    /// The same messages with every key passed through `f`, which must keep their order and
    /// change every key's length by the same amount (a re-key, `node/rekey.rs`): rewritten in
    /// the encoding, message bytes copied as they are, no buffer built.
    pub(crate) fn rekeyed(&self, f: impl Fn(&[u8]) -> Vec<u8>) -> EncodedBuffer {
        let mut e = Enc::with_capacity(self.raw.len() + 64);
        let mut ranges = Vec::with_capacity(self.ranges.len());
        let mut points = Vec::with_capacity(self.points.len());
        e.u64(self.max_msn());
        e.u32(self.ranges.len() as u32);
        let mut prev_hi: Option<Vec<u8>> = None;
        for i in 0..self.ranges.len() {
            let (msn, lo, hi) = self.range_at(i);
            let (lo, hi) = (f(lo), f(hi));
            assert!(lo < hi, "a re-keyed range delete became empty");
            assert!(
                prev_hi.as_ref().is_none_or(|p| *p <= lo),
                "re-keyed range deletes out of order"
            );
            ranges.push(e.len() as u32);
            e.u64(msn);
            e.bytes(&lo);
            e.bytes(&hi);
            prev_hi = Some(hi);
        }
        e.u32(self.points.len() as u32);
        let mut longest = 0;
        let mut prev: Option<Vec<u8>> = None;
        for (j, &off) in self.points.iter().enumerate() {
            let mut d = self.at(off);
            let k = f(d.bytes(self.max_key).expect("indexed"));
            assert!(
                prev.as_ref().is_none_or(|p| *p < k),
                "re-keyed messages out of order"
            );
            let msgs_at = d.pos();
            let msgs_end = self
                .points
                .get(j + 1)
                .map_or(self.raw.len(), |&n| n as usize);
            points.push(e.len() as u32);
            longest = longest.max(k.len());
            e.bytes(&k);
            e.raw(&self.raw[msgs_at..msgs_end]);
            prev = Some(k);
        }
        self.assembled(e.buf, ranges, points, longest)
    }

    /// The messages for the window `[lo, hi)` (`hi = None`: unbounded), built: the points in
    /// it and the range deletes meeting it, clipped to it (what [`Buffer::points_in`] and
    /// [`Buffer::ranges_in`] give for the window). A scan takes one leaf's window from each
    /// ancestor's buffer this way instead of building the buffer's whole map.
    pub(crate) fn window(&self, lo: &[u8], hi: Option<&[u8]>) -> Buffer {
        let below_hi = |k: &[u8]| hi.is_none_or(|h| k < h);
        // The range delete starting at or before `lo` may reach into the window.
        let first = self
            .ranges
            .partition_point(|&off| self.key_after_msn(off) <= lo)
            .saturating_sub(1);
        let mut ranges = Vec::new();
        for i in first..self.ranges.len() {
            let (msn, rlo, rhi) = self.range_at(i);
            if !below_hi(rlo) {
                break;
            }
            let r = RangeDel {
                msn,
                lo: rlo.max(lo).to_vec(),
                hi: match hi {
                    Some(h) if rhi > h => h.to_vec(),
                    _ => rhi.to_vec(),
                },
            };
            // Clipped to nothing (it ends before the window, or the window is empty).
            if r.lo < r.hi {
                ranges.push(r);
            }
        }
        let from = self.points.partition_point(|&off| self.key_at(off) < lo);
        let mut points = Vec::new();
        for &off in &self.points[from..] {
            let mut d = self.at(off);
            let k = d.bytes(self.max_key).expect("indexed");
            if !below_hi(k) {
                break;
            }
            let km = KeyMsgs::decode(&mut d, self.max_value).expect("indexed messages decode");
            points.push((k.to_vec(), km));
        }
        Buffer::from_sorted(self.max_msn(), ranges, points)
    }

    /// The messages a delivery of point messages for `keys` (sorted) and range deletes over
    /// `spans` can change, built: every range delete, the points at `keys` and the points inside
    /// `spans`; with the indices (in key order) of the points taken. Applying the delivery to
    /// this small buffer with [`Buffer`]'s own methods and splicing the result back
    /// ([`EncodedBuffer::spliced`]) gives the encoding of the whole buffer with the delivery
    /// applied: a point message consults only its key's messages and the range deletes, and a
    /// range delete only the points it covers and the range deletes.
    pub(crate) fn affected(
        &self,
        keys: &[&[u8]],
        spans: &[(&[u8], &[u8])],
    ) -> (Buffer, Vec<usize>) {
        let mut taken: Vec<usize> = Vec::new();
        for k in keys {
            let j = self.points.partition_point(|&off| self.key_at(off) < *k);
            if self
                .points
                .get(j)
                .is_some_and(|&off| self.key_at(off) == *k)
            {
                taken.push(j);
            }
        }
        for (lo, hi) in spans {
            let from = self.points.partition_point(|&off| self.key_at(off) < *lo);
            let to = self.points.partition_point(|&off| self.key_at(off) < *hi);
            taken.extend(from..to);
        }
        taken.sort_unstable();
        taken.dedup();
        let ranges = self.all_ranges();
        let points = taken.iter().map(|&j| self.point_decoded(j)).collect();
        (Buffer::from_sorted(self.max_msn(), ranges, points), taken)
    }

    /// This encoding with the points at indices `taken` (sorted) and every range delete replaced
    /// by what `changed` holds (those messages after a delivery, [`EncodedBuffer::affected`]):
    /// the other points' bytes are copied as they are, nothing else is built.
    pub(crate) fn spliced(&self, taken: &[usize], changed: &Buffer) -> EncodedBuffer {
        let mut e = Enc::with_capacity(self.raw.len() + changed.bytes() + 64);
        let mut ranges = Vec::with_capacity(changed.range_count());
        let mut points = Vec::with_capacity(self.points.len() + changed.counts().0);
        e.u64(changed.max_msn().max(self.max_msn()));
        e.u32(changed.range_count() as u32);
        for r in changed.ranges.values() {
            ranges.push(e.len() as u32);
            e.u64(r.msn);
            e.bytes(&r.lo);
            e.bytes(&r.hi);
        }
        let kept: Vec<usize> = {
            let mut t = taken.iter().peekable();
            (0..self.points.len())
                .filter(|j| {
                    if t.peek() == Some(&j) {
                        t.next();
                        false
                    } else {
                        true
                    }
                })
                .collect()
        };
        e.u32((kept.len() + changed.counts().0) as u32);
        let mut new = changed.points.iter().peekable();
        let mut longest = 0;
        let mut old = kept.iter().peekable();
        loop {
            let take_old = match (old.peek(), new.peek()) {
                (None, None) => break,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (Some(&&j), Some((k, _))) => {
                    let ok = self.key_at(self.points[j]);
                    assert!(ok != k.as_slice(), "a key spliced in twice");
                    ok < k.as_slice()
                }
            };
            points.push(e.len() as u32);
            if take_old {
                let j = *old.next().expect("peeked");
                let from = self.points[j] as usize;
                let to = self
                    .points
                    .get(j + 1)
                    .map_or(self.raw.len(), |&n| n as usize);
                longest = longest.max(self.key_at(self.points[j]).len());
                e.raw(&self.raw[from..to]);
            } else {
                let (k, km) = new.next().expect("peeked");
                longest = longest.max(k.len());
                e.bytes(k);
                km.encode(&mut e);
            }
        }
        self.assembled(e.buf, ranges, points, longest)
    }

    /// The messages decoded in order, for delivery (what [`Buffer::into_taken`] of the built
    /// buffer gives, without building its maps).
    pub(crate) fn taken(&self) -> Taken {
        let ranges = self.all_ranges();
        let points = (0..self.points.len())
            .map(|j| self.point_decoded(j))
            .collect();
        Taken {
            max_msn: self.max_msn(),
            ranges,
            points,
            bytes: self.raw.len() - 16,
            longest: self.longest,
        }
    }

    /// The encoding cut at `k`, as [`Buffer::split_off`] cuts the built buffer: messages for
    /// keys below `k` in the first, the others in the second, a range delete across `k` cut in
    /// two with its number, both with the max MSN. The points' bytes are copied as they are.
    pub(crate) fn split_at(&self, k: &[u8]) -> (EncodedBuffer, EncodedBuffer) {
        let split = self.points.partition_point(|&off| self.key_at(off) < k);
        let mut left = EncodedBuilder::new(self.max_msn(), self.raw.len());
        let mut right = EncodedBuilder::new(self.max_msn(), self.raw.len());
        let mut lr = Vec::new();
        let mut rr = Vec::new();
        for i in 0..self.ranges.len() {
            let (msn, lo, hi) = self.range_at(i);
            if hi <= k {
                lr.push((msn, lo, hi));
            } else if lo >= k {
                rr.push((msn, lo, hi));
            } else {
                lr.push((msn, lo, k));
                rr.push((msn, k, hi));
            }
        }
        left.ranges(&lr);
        right.ranges(&rr);
        left.points_from(self, 0..split);
        right.points_from(self, split..self.points.len());
        (left.finish(self), right.finish(self))
    }

    /// The bytes of point `j` (its key and messages) in the encoding.
    fn point_bytes(&self, j: usize) -> &[u8] {
        let from = self.points[j] as usize;
        let to = self
            .points
            .get(j + 1)
            .map_or(self.raw.len(), |&n| n as usize);
        &self.raw[from..to]
    }

    /// The out-of-line blocks the messages reference, one per reference (as
    /// [`Buffer::ref_blocks`]), read from the encoding.
    pub(crate) fn ref_blocks(&self) -> impl Iterator<Item = u64> + '_ {
        self.points.iter().filter_map(|&off| {
            let mut d = self.at(off);
            d.bytes(self.max_key).expect("indexed");
            KeyMsgs::encoded_ref_block(&mut d, self.max_value)
        })
    }

    /// Every point key, in order.
    pub(crate) fn point_keys(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.points.iter().map(|&off| self.key_at(off))
    }

    /// Every point entry: its offset in the encoding and its key, in key order (the points
    /// come last in the encoding: the last entry ends where it does).
    pub(crate) fn point_entries(&self) -> impl Iterator<Item = (usize, &[u8])> + '_ {
        self.points
            .iter()
            .map(|&off| (off as usize, self.key_at(off)))
    }

    /// The folded point messages of `key` in `run`, whole point entries cut from an encoding at
    /// entry boundaries (`node/runs.rs`), or `None` when the run holds none for it. Everything
    /// read is checked as indexing checks it (lengths, key order, message structure, no message
    /// newer than `max_msn`): an error, never a wrong answer, for a damaged run.
    pub(crate) fn find_in_run(
        run: &[u8],
        key: &[u8],
        max_key: usize,
        max_value: usize,
        max_msn: Msn,
    ) -> Result<Option<KeyMsgs>> {
        let mut d = Dec::new(run, "message buffer run");
        let mut prev: Option<&[u8]> = None;
        while d.remaining() > 0 {
            let k = d.bytes(max_key)?;
            if prev.is_some_and(|p| p >= k) {
                return Err(d.corrupt("buffer keys out of order"));
            }
            prev = Some(k);
            let from = d.pos();
            KeyMsgs::check(&mut d, max_value, max_msn)?;
            match k.cmp(key) {
                std::cmp::Ordering::Less => {}
                std::cmp::Ordering::Equal => {
                    let mut m = Dec::new(&run[from..d.pos()], "message buffer run");
                    let km = KeyMsgs::decode(&mut m, max_value)?;
                    m.finish()?;
                    return Ok(Some(km));
                }
                std::cmp::Ordering::Greater => return Ok(None),
            }
        }
        Ok(None)
    }

    /// Every range delete (MSN, lo, hi), in `lo` order.
    pub(crate) fn range_deletes(&self) -> impl Iterator<Item = (Msn, &[u8], &[u8])> + '_ {
        (0..self.ranges.len()).map(|i| self.range_at(i))
    }

    /// The MSN of the range delete covering `key` and the folded point messages of `key`.
    pub fn lookup(&self, key: &[u8]) -> Result<(Option<Msn>, Option<KeyMsgs>)> {
        let range = self.range_covering(key).map(|(msn, _)| msn);
        let j = self.points.partition_point(|&off| self.key_at(off) < key);
        let mut point = None;
        if let Some(&off) = self.points.get(j) {
            let mut d = self.at(off);
            if d.bytes(self.max_key)? == key {
                point = Some(KeyMsgs::decode(&mut d, self.max_value)?);
            }
        }
        Ok((range, point))
    }
}

/// Writes an [`EncodedBuffer`] from pieces of others: range deletes, then points copied as they
/// are encoded.
struct EncodedBuilder {
    e: Enc,
    ranges: Vec<u32>,
    points: Vec<u32>,
    longest: usize,
}

impl EncodedBuilder {
    fn new(max_msn: Msn, capacity: usize) -> EncodedBuilder {
        let mut e = Enc::with_capacity(capacity);
        e.u64(max_msn);
        EncodedBuilder {
            e,
            ranges: Vec::new(),
            points: Vec::new(),
            longest: 0,
        }
    }

    /// The range deletes, sorted and disjoint (asserted).
    fn ranges(&mut self, ranges: &[(Msn, &[u8], &[u8])]) {
        self.e.u32(ranges.len() as u32);
        let mut prev: Option<&[u8]> = None;
        for &(msn, lo, hi) in ranges {
            assert!(
                lo < hi && prev.is_none_or(|p| p <= lo),
                "range deletes out of order"
            );
            prev = Some(hi);
            self.ranges.push(self.e.len() as u32);
            self.e.u64(msn);
            self.e.bytes(lo);
            self.e.bytes(hi);
        }
    }

    /// Points `js` of `from`, in order, copied as they are.
    fn points_from(&mut self, from: &EncodedBuffer, js: std::ops::Range<usize>) {
        self.e.u32(js.len() as u32);
        for j in js {
            self.points.push(self.e.len() as u32);
            self.longest = self.longest.max(from.key_at(from.points[j]).len());
            self.e.raw(from.point_bytes(j));
        }
    }

    fn finish(self, like: &EncodedBuffer) -> EncodedBuffer {
        like.assembled(self.e.buf, self.ranges, self.points, self.longest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer::testing::{encoding, random_messages, seeded_rng};
    use crate::msg::tests::w;
    use crate::msg::{Patch, PointOp};

    #[test]
    fn encoded_lookup_matches_the_built_buffer() {
        let mut b = Buffer::new();
        let mut msn = 0;
        for i in 0..300u32 {
            msn += 1;
            let key = format!("k{:05}", i * 7);
            match i % 3 {
                0 => {
                    let _ = b.add_point(key.as_bytes(), msn, PointOp::Put(vec![i as u8; 5]));
                }
                1 => {
                    let _ = b.add_point(key.as_bytes(), msn, PointOp::Delete);
                }
                _ => {
                    let _ = b.add_point(key.as_bytes(), msn, PointOp::Upsert(w(2, b"xy")));
                    msn += 1;
                    let _ = b.add_point(
                        key.as_bytes(),
                        msn,
                        PointOp::Upsert(Patch::Truncate { len: 1 }),
                    );
                }
            }
        }
        msn += 1;
        let _ = b.add_range(msn, b"k00100", b"k00200");
        msn += 1;
        let _ = b.add_range(msn, b"k01000", b"k01001");
        let mut e = Enc::default();
        b.encode(&mut e);
        let enc = EncodedBuffer::index(e.buf.clone(), 100, 100).unwrap();
        assert_eq!(enc.max_msn(), b.max_msn());
        for i in 0..2200u32 {
            let key = format!("k{i:05}");
            let want = (
                b.range_covering(key.as_bytes()).map(|r| r.msn),
                b.point(key.as_bytes()).cloned(),
            );
            assert_eq!(enc.lookup(key.as_bytes()).unwrap(), want, "key {key}");
        }
        assert_eq!(enc.lookup(b"").unwrap(), (None, None));
        assert_eq!(enc.lookup(b"\xff").unwrap(), (None, None));
        // Damage: keys out of order, a truncated encoding.
        let mut bad = e.buf.clone();
        let at = bad.windows(6).position(|w| w == b"k00007").unwrap();
        bad[at + 5] = b'0';
        assert!(EncodedBuffer::index(bad, 100, 100).is_err());
        let short = e.buf[..e.buf.len() - 3].to_vec();
        assert!(EncodedBuffer::index(short, 100, 100).is_err());
    }

    /// A random buffer of up to 120 messages over 400 keys.
    fn random_buffer(rng: &mut rand::rngs::SmallRng) -> Buffer {
        use rand::Rng;
        let n = rng.gen_range(0..120);
        random_messages(rng, &mut 0, n, 400)
    }

    /// Indexing accepts exactly what decoding accepts: random buffers, then their encodings
    /// with random bytes changed (message numbers, lengths, tags, keys); what indexes builds to
    /// what decodes, byte for byte.
    #[test]
    fn indexing_accepts_what_decoding_accepts() {
        use rand::Rng;
        let mut rng = seeded_rng();
        let (mut ok, mut bad) = (0, 0);
        for _ in 0..300 {
            let b = random_buffer(&mut rng);
            let good = encoding(&b);
            for round in 0..40 {
                let mut raw = good.clone();
                if round > 0 {
                    for _ in 0..rng.gen_range(1..3) {
                        let at = rng.gen_range(0..raw.len());
                        raw[at] = match rng.gen_range(0..3) {
                            0 => raw[at].wrapping_add(1),
                            1 => raw[at].wrapping_sub(1),
                            _ => rng.gen(),
                        };
                    }
                }
                let mut d = Dec::new(&raw, "buf");
                let decoded = Buffer::decode(&mut d, 100, 100).and_then(|b| d.finish().map(|_| b));
                let indexed = EncodedBuffer::index(raw.clone(), 100, 100);
                assert_eq!(
                    decoded.is_ok(),
                    indexed.is_ok(),
                    "decode {decoded:?} against index {indexed:?}"
                );
                if let (Ok(d), Ok(i)) = (decoded, indexed) {
                    ok += 1;
                    assert_eq!(encoding(&i.build()), encoding(&d));
                    assert_eq!(i.raw().len(), d.bytes() + 16, "size as the built buffer's");
                    assert_eq!(i.counts(), d.counts());
                    assert_eq!(i.longest_point_key(), d.longest_point_key_held());
                    let mut refs: Vec<u64> = i.ref_blocks().collect();
                    let mut want: Vec<u64> = d.ref_blocks().collect();
                    refs.sort_unstable();
                    want.sort_unstable();
                    assert_eq!(refs, want);
                } else {
                    bad += 1;
                }
            }
        }
        assert!(ok > 1000 && bad > 1000, "{ok} accepted, {bad} refused");
    }

    /// A re-key, a window and the range checks answer from the encoding as from the built
    /// buffer.
    #[test]
    fn encoded_rekey_window_and_bounds_match_the_built_buffer() {
        use rand::Rng;
        let mut rng = seeded_rng();
        for _ in 0..400 {
            let b = random_buffer(&mut rng);
            let enc = EncodedBuffer::index(encoding(&b), 100, 100).unwrap();
            // A re-key that moves every key under another prefix of another length.
            let to: &[u8] = [&b"q"[..], b"longer/", b""][rng.gen_range(0..3)];
            let f = |k: &[u8]| [to, &k[1..]].concat();
            let want = encoding(&b.clone().rekeyed(f));
            let got = enc.rekeyed(f);
            assert_eq!(got.raw(), want.as_slice());
            assert_eq!(got.counts(), enc.counts());
            assert_eq!(got.max_msn(), enc.max_msn());
            assert_eq!(got.build().bytes(), want.len() - 16);
            // Windows, with and without a high bound.
            let (a, z) = (rng.gen_range(0..420u32), rng.gen_range(0..420u32));
            let lo = format!("k{:05}", a.min(z)).into_bytes();
            let hi = format!("k{:05}", a.max(z)).into_bytes();
            let hi = (rng.gen_bool(0.8)).then_some(hi.as_slice());
            let w = enc.window(&lo, hi);
            let pts: Vec<_> = b
                .points_in(&lo, hi)
                .map(|(k, m)| (k.clone(), m.clone()))
                .collect();
            let wpts: Vec<_> = w
                .points_in(&[], None)
                .map(|(k, m)| (k.clone(), m.clone()))
                .collect();
            assert_eq!(wpts, pts);
            let want: Vec<_> = b
                .ranges_in(&lo, hi)
                .into_iter()
                .filter(|r| r.lo < r.hi)
                .collect();
            assert_eq!(w.ranges_in(&[], None), want);
            assert_eq!(w.max_msn(), b.max_msn());
            // Bounds.
            let within = b
                .points_in(&[], None)
                .all(|(k, _)| k.as_slice() >= lo.as_slice() && hi.is_none_or(|h| k.as_slice() < h))
                && b.ranges_in(&[], None).iter().all(|r| {
                    r.lo.as_slice() >= lo.as_slice() && hi.is_none_or(|h| r.hi.as_slice() <= h)
                });
            assert_eq!(enc.within(&lo, hi), within);
            assert_eq!(
                enc.longest_point_in(&lo, hi.unwrap_or(b"\xff")),
                b.points_in(&lo, Some(hi.unwrap_or(b"\xff")))
                    .map(|(k, _)| k.len())
                    .max()
                    .unwrap_or(0)
            );
        }
    }
}
