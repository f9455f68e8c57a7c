//! The per-child message buffers of internal nodes: [`Buffer`] in memory (points folded per key,
//! non-overlapping range deletes) with its encoding; [`EncodedBuffer`] (`buffer/encoded.rs`) is a
//! buffer kept in that encoding. The messages themselves and their semantics are in `msg.rs`.

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;
use std::ops::Bound;

use crate::codec::{Dec, Enc};
use crate::error::Result;
use crate::msg::{KeyMsgs, Msn, PointOp, RangeDel};

/// Per-entry bookkeeping overhead counted in memory estimates (map node, vector headers, the
/// allocator's chunk headers and rounding of the key and the messages): measured against glibc's
/// malloc in `buffer_mem_tests` (96 before: 55-64 bytes short per entry).
pub(crate) const ENTRY_OVERHEAD: usize = 160;

/// A buffer's messages taken out of it to be delivered to its child: range deletes in `lo`
/// order, points in key order.
#[derive(Debug)]
pub(crate) struct Taken {
    /// The buffer's max MSN.
    pub max_msn: Msn,
    pub ranges: Vec<RangeDel>,
    pub points: Vec<(Vec<u8>, KeyMsgs)>,
    /// Serialized size of the messages.
    pub bytes: usize,
    /// An upper bound on the length of the point keys.
    pub longest: usize,
}

impl Taken {
    /// Whether no message was taken.
    pub(crate) fn is_empty(&self) -> bool {
        self.ranges.is_empty() && self.points.is_empty()
    }
}

/// The messages an internal node holds for one child.
#[derive(Clone, Debug, Default)]
pub struct Buffer {
    points: BTreeMap<Vec<u8>, KeyMsgs>,
    /// Non-overlapping, keyed by `lo` (a map, not a sorted vector: range deletes land anywhere
    /// in a buffer of tens of thousands, and inserting into a vector moved its tail each time,
    /// 8% of the daemon's CPU while it deleted 15,000 unlinked files).
    ranges: BTreeMap<Vec<u8>, RangeDel>,
    /// Serialized size of the messages held.
    bytes: usize,
    /// Bytes of the `ranges` map's keys (each a copy of its range's `lo`), counted in `mem`.
    range_keys: usize,
    max_msn: Msn,
    /// Length of the longest point key added (never lowered: an upper bound on those held).
    longest: usize,
}

impl Buffer {
    /// An empty buffer.
    pub fn new() -> Buffer {
        Buffer::default()
    }

    /// Serialized size of the messages held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// A buffer of messages already in order: disjoint range deletes sorted by `lo`, points
    /// sorted by key, none newer than `max_msn` (asserted).
    pub(crate) fn from_sorted(
        max_msn: Msn,
        ranges: Vec<RangeDel>,
        points: Vec<(Vec<u8>, KeyMsgs)>,
    ) -> Buffer {
        let mut b = Buffer {
            max_msn,
            ..Buffer::default()
        };
        let mut prev_hi: Option<Vec<u8>> = None;
        for r in ranges {
            assert!(
                r.lo < r.hi && r.msn <= max_msn && prev_hi.as_ref().is_none_or(|p| *p <= r.lo),
                "range deletes out of order"
            );
            prev_hi = Some(r.hi.clone());
            b.insert_range(r);
        }
        for w in points.windows(2) {
            assert!(w[0].0 < w[1].0, "buffer keys out of order");
        }
        for (k, km) in &points {
            assert!(km.max_msn() <= max_msn, "a message newer than its buffer");
            b.bytes += k.len() + 4 + km.size();
            b.longest = b.longest.max(k.len());
        }
        b.points = points.into_iter().collect();
        b
    }

    /// Range deletes held.
    pub(crate) fn range_count(&self) -> usize {
        self.ranges.len()
    }

    /// Keys stored: one per point, two per range delete (a re-key changes each by as much).
    pub(crate) fn keys_stored(&self) -> usize {
        self.points.len() + 2 * self.ranges.len()
    }

    /// Estimated memory footprint.
    pub fn mem(&self) -> usize {
        self.bytes + self.range_keys + (self.points.len() + self.ranges.len()) * ENTRY_OVERHEAD
    }

    /// Whether the buffer holds nothing.
    pub fn is_empty(&self) -> bool {
        self.points.is_empty() && self.ranges.is_empty()
    }

    /// Newest MSN ever added.
    pub fn max_msn(&self) -> Msn {
        self.max_msn
    }

    /// An upper bound on the length of the keys with point messages: the longest ever added
    /// (0 when none was; kept up as messages arrive, not recomputed). It depends on the
    /// buffer's history (a decoded buffer's is exact, one whose longest key was flushed down
    /// keeps it): for what is written, [`Buffer::longest_point_key_held`].
    pub fn longest_point_key(&self) -> usize {
        self.longest
    }

    /// The exact length of the longest key with point messages held now (0 when none):
    /// computed from the keys, a pass over them. What a node image records
    /// ([`crate::node::Node::longest_stored`]), so that an image depends on the node's contents
    /// only.
    pub fn longest_point_key_held(&self) -> usize {
        self.points.keys().map(Vec::len).max().unwrap_or(0)
    }

    /// Number of keys with point messages, and number of range deletes.
    pub fn counts(&self) -> (usize, usize) {
        (self.points.len(), self.ranges.len())
    }

    /// Adds a point message (newer than everything held). Returns the block whose reference it
    /// dropped (a buffered reference put the message replaces).
    #[must_use]
    pub fn add_point(&mut self, key: impl Into<Vec<u8>>, msn: Msn, op: PointOp) -> Option<u64> {
        let key: Vec<u8> = key.into();
        assert!(
            msn > self.max_msn,
            "buffer messages out of order: {msn} after {}",
            self.max_msn
        );
        self.max_msn = msn;
        self.longest = self.longest.max(key.len());
        // One search of the map (the entry), not a lookup and then an insert.
        match self.points.entry(key) {
            Entry::Occupied(mut o) => {
                let km = o.get_mut();
                self.bytes -= km.size();
                let dropped = km.push(msn, op);
                self.bytes += km.size();
                dropped
            }
            Entry::Vacant(v) => {
                let km = KeyMsgs::from_op(msn, op);
                self.bytes += v.key().len() + 4 + km.size();
                v.insert(km);
                None
            }
        }
    }

    /// Adds folded messages for a key (all newer than what the buffer holds for it). Returns the
    /// block whose reference they dropped.
    #[must_use]
    pub fn add_key_msgs(&mut self, key: Vec<u8>, km: KeyMsgs) -> Option<u64> {
        let max = km.max_msn();
        assert!(km.min_msn() > 0 && max >= km.min_msn(), "bad message MSNs");
        self.longest = self.longest.max(key.len());
        let dropped = match self.points.entry(key) {
            Entry::Occupied(mut o) => {
                let old = o.get_mut();
                assert!(km.min_msn() > old.max_msn(), "key messages out of order");
                self.bytes -= old.size();
                let dropped = old.push_all(km);
                self.bytes += old.size();
                dropped
            }
            Entry::Vacant(v) => {
                self.bytes += v.key().len() + 4 + km.size();
                v.insert(km);
                None
            }
        };
        self.max_msn = self.max_msn.max(max);
        dropped
    }

    /// Adds a range delete of `[lo, hi)` (newer than everything held): removes the older point
    /// messages it covers and trims older range deletes. Returns the blocks whose references the
    /// removed messages held.
    #[must_use]
    pub fn add_range(&mut self, msn: Msn, lo: &[u8], hi: &[u8]) -> Vec<u64> {
        // Equal numbers happen: a range trimmed by a newer one leaves two pieces of one message.
        assert!(
            msn >= self.max_msn,
            "buffer messages out of order: {msn} after {}",
            self.max_msn
        );
        assert!(lo < hi, "empty range delete");
        self.max_msn = msn;
        // Annihilate covered point messages.
        let covered: Vec<Vec<u8>> = self
            .points
            .range::<[u8], _>((Bound::Included(lo), Bound::Excluded(hi)))
            .map(|(k, _)| k.clone())
            .collect();
        let mut dropped = Vec::new();
        for k in covered {
            let km = self.points.remove(&k).expect("key just seen");
            self.bytes -= k.len() + 4 + km.size();
            dropped.extend(km.ref_block());
        }
        // Trim the overlapping older ranges (a contiguous run: ranges are sorted and disjoint):
        // the one starting at or before `lo` if it reaches past it, and those starting in the new
        // range.
        let before = self
            .ranges
            .range::<[u8], _>((Bound::Unbounded, Bound::Included(lo)))
            .next_back()
            .filter(|(_, r)| r.hi.as_slice() > lo)
            .map(|(k, _)| k.clone());
        let inside: Vec<Vec<u8>> = self
            .ranges
            .range::<[u8], _>((Bound::Excluded(lo), Bound::Excluded(hi)))
            .map(|(k, _)| k.clone())
            .collect();
        let old: Vec<RangeDel> = before
            .into_iter()
            .chain(inside)
            .map(|k| self.ranges.remove(&k).expect("range just seen"))
            .collect();
        for r in &old {
            self.bytes -= r.size();
            self.range_keys -= r.lo.len();
        }
        if let Some(head) = old.first().filter(|r| r.lo.as_slice() < lo) {
            self.insert_range(RangeDel {
                msn: head.msn,
                lo: head.lo.clone(),
                hi: lo.to_vec(),
            });
        }
        if let Some(tail) = old.last().filter(|r| r.hi.as_slice() > hi) {
            self.insert_range(RangeDel {
                msn: tail.msn,
                lo: hi.to_vec(),
                hi: tail.hi.clone(),
            });
        }
        self.insert_range(RangeDel {
            msn,
            lo: lo.to_vec(),
            hi: hi.to_vec(),
        });
        self.check_ranges_around(lo, hi);
        dropped
    }

    /// The blocks the buffer's messages reference (one per reference).
    pub fn ref_blocks(&self) -> impl Iterator<Item = u64> + '_ {
        self.points.values().filter_map(KeyMsgs::ref_block)
    }

    /// Inserts a range delete known not to overlap any held.
    fn insert_range(&mut self, r: RangeDel) {
        self.bytes += r.size();
        self.range_keys += r.lo.len();
        let prev = self.ranges.insert(r.lo.clone(), r);
        assert!(prev.is_none(), "two range deletes start at one key");
    }

    /// Asserts that the ranges around `[lo, hi)` (where a change happened; the rest was sorted
    /// and disjoint before) are non-empty and disjoint: cheap, so always on.
    fn check_ranges_around(&self, lo: &[u8], hi: &[u8]) {
        let from = self
            .ranges
            .range::<[u8], _>((Bound::Unbounded, Bound::Excluded(lo)))
            .next_back()
            .map(|(k, _)| k.clone())
            .unwrap_or_default();
        let mut prev: Option<&RangeDel> = None;
        for (k, r) in self
            .ranges
            .range::<[u8], _>((Bound::Included(from.as_slice()), Bound::Unbounded))
        {
            assert!(k == &r.lo, "range delete filed under another key");
            assert!(r.lo < r.hi, "empty range delete in a buffer");
            if let Some(p) = prev {
                assert!(p.hi <= r.lo, "range deletes overlap in a buffer");
            }
            if r.lo.as_slice() > hi {
                break;
            }
            prev = Some(r);
        }
    }

    /// The range delete covering `key`, if any.
    pub fn range_covering(&self, key: &[u8]) -> Option<&RangeDel> {
        let (_, r) = self
            .ranges
            .range::<[u8], _>((Bound::Unbounded, Bound::Included(key)))
            .next_back()?;
        r.covers(key).then_some(r)
    }

    /// Removes the range delete that covers all of `[lo, hi)`, if one does (the pieces of it
    /// outside stay, with its number); returns whether it did. For a child whose whole range the
    /// range delete covers and that is let go instead of flushed into: the older messages the
    /// range covered in this buffer are gone already ([`Buffer::add_range`]), so with nothing
    /// left below it the range has no effect left.
    pub fn remove_covering(&mut self, lo: &[u8], hi: &[u8]) -> bool {
        let Some(start) = self
            .ranges
            .range::<[u8], _>((Bound::Unbounded, Bound::Included(lo)))
            .next_back()
            .filter(|(_, r)| r.hi.as_slice() >= hi)
            .map(|(k, _)| k.clone())
        else {
            return false;
        };
        let r = self.ranges.remove(&start).expect("range just seen");
        self.bytes -= r.size();
        self.range_keys -= r.lo.len();
        if r.lo.as_slice() < lo {
            self.insert_range(RangeDel {
                msn: r.msn,
                lo: r.lo.clone(),
                hi: lo.to_vec(),
            });
        }
        if r.hi.as_slice() > hi {
            self.insert_range(RangeDel {
                msn: r.msn,
                lo: hi.to_vec(),
                hi: r.hi,
            });
        }
        true
    }

    /// The folded point messages for `key`, if any.
    pub fn point(&self, key: &[u8]) -> Option<&KeyMsgs> {
        self.points.get(key)
    }

    /// Point messages with keys in `[lo, hi)` (`hi = None`: unbounded), in key order.
    pub fn points_in<'a>(
        &'a self,
        lo: &'a [u8],
        hi: Option<&'a [u8]>,
    ) -> impl Iterator<Item = (&'a Vec<u8>, &'a KeyMsgs)> + 'a {
        let upper = match hi {
            Some(h) => Bound::Excluded(h),
            None => Bound::Unbounded,
        };
        self.points.range::<[u8], _>((Bound::Included(lo), upper))
    }

    /// Range deletes intersecting `[lo, hi)`, clipped to it.
    pub fn ranges_in(&self, lo: &[u8], hi: Option<&[u8]>) -> Vec<RangeDel> {
        // The range starting at or before `lo` (it may reach into the window), then the rest.
        let start = self
            .ranges
            .range::<[u8], _>((Bound::Unbounded, Bound::Included(lo)))
            .next_back()
            .map(|(k, _)| k.clone())
            .unwrap_or_default();
        self.ranges
            .range::<[u8], _>((Bound::Included(start.as_slice()), Bound::Unbounded))
            .map(|(_, r)| r)
            .take_while(|r| hi.is_none_or(|h| r.lo.as_slice() < h))
            .filter(|r| r.hi.as_slice() > lo && hi.is_none_or(|h| r.lo.as_slice() < h))
            .map(|r| RangeDel {
                msn: r.msn,
                lo: r.lo.clone().max(lo.to_vec()),
                hi: match hi {
                    Some(h) if r.hi.as_slice() > h => h.to_vec(),
                    _ => r.hi.clone(),
                },
            })
            .collect()
    }

    /// Takes every message out, leaving the buffer empty (its max MSN is kept).
    pub fn take(&mut self) -> Buffer {
        let max = self.max_msn;
        let out = std::mem::take(self);
        self.max_msn = max;
        out
    }

    /// The messages, for delivery.
    pub(crate) fn into_taken(self) -> Taken {
        Taken {
            max_msn: self.max_msn,
            bytes: self.bytes,
            longest: self.longest,
            ranges: self.ranges.into_values().collect(),
            points: self.points.into_iter().collect(),
        }
    }

    /// Cuts the buffer at `k`: messages for keys below `k` stay, the others go to the returned
    /// buffer; a range delete across `k` is cut in two with its number. Both keep the max MSN
    /// (slicing a child's slot, docs/SURGERY.md §3.2: each half stays newer than its child).
    pub fn split_off(&mut self, k: &[u8]) -> Buffer {
        let mut right = Buffer {
            max_msn: self.max_msn,
            longest: self.longest,
            points: self.points.split_off(k),
            ranges: self.ranges.split_off(k),
            ..Buffer::default()
        };
        let across = self
            .ranges
            .last_key_value()
            .filter(|(_, r)| r.hi.as_slice() > k)
            .map(|(lo, _)| lo.clone());
        if let Some(lo) = across {
            let r = self.ranges.get_mut(&lo).expect("range just seen");
            let tail = RangeDel {
                msn: r.msn,
                lo: k.to_vec(),
                hi: std::mem::replace(&mut r.hi, k.to_vec()),
            };
            right.ranges.insert(tail.lo.clone(), tail);
        }
        for b in [&mut *self, &mut right] {
            b.bytes = b
                .points
                .iter()
                .map(|(k, km)| k.len() + 4 + km.size())
                .sum::<usize>()
                + b.ranges.values().map(RangeDel::size).sum::<usize>();
            b.range_keys = b.ranges.keys().map(Vec::len).sum();
        }
        right
    }

    /// The same messages with every key (point keys, range bounds) passed through `f`, which must
    /// keep their order (re-lifting a node whose prefix changes). The max MSN is kept.
    pub fn rekeyed(self, f: impl Fn(&[u8]) -> Vec<u8>) -> Buffer {
        let mut b = Buffer {
            max_msn: self.max_msn,
            ..Buffer::default()
        };
        // The order is kept, so both maps are built from sorted runs in one pass (inserting one
        // key at a time compared each with a path of the map: the most of a directory rename's
        // time went there).
        let mut ranges = Vec::with_capacity(self.ranges.len());
        for r in self.ranges.into_values() {
            let (lo, hi) = (f(&r.lo), f(&r.hi));
            assert!(lo < hi, "a re-keyed range delete became empty");
            assert!(
                ranges
                    .last()
                    .is_none_or(|(_, p): &(Vec<u8>, RangeDel)| p.hi <= lo),
                "re-keyed range deletes out of order"
            );
            let r = RangeDel { msn: r.msn, lo, hi };
            b.bytes += r.size();
            b.range_keys += r.lo.len();
            ranges.push((r.lo.clone(), r));
        }
        let mut points = Vec::with_capacity(self.points.len());
        for (k, km) in self.points {
            let k = f(&k);
            assert!(
                points
                    .last()
                    .is_none_or(|(p, _): &(Vec<u8>, KeyMsgs)| *p < k),
                "re-keyed messages out of order"
            );
            b.bytes += k.len() + 4 + km.size();
            b.longest = b.longest.max(k.len());
            points.push((k, km));
        }
        b.ranges = ranges.into_iter().collect();
        b.points = points.into_iter().collect();
        b
    }

    /// Consumes the buffer into (range deletes, point messages), both sorted by key.
    pub fn into_parts(self) -> (Vec<RangeDel>, Vec<(Vec<u8>, KeyMsgs)>) {
        (
            self.ranges.into_values().collect(),
            self.points.into_iter().collect(),
        )
    }

    /// Serializes the buffer.
    pub fn encode(&self, e: &mut Enc) {
        e.u64(self.max_msn);
        e.u32(self.ranges.len() as u32);
        for r in self.ranges.values() {
            e.u64(r.msn);
            e.bytes(&r.lo);
            e.bytes(&r.hi);
        }
        e.u32(self.points.len() as u32);
        for (k, km) in &self.points {
            e.bytes(k);
            km.encode(e);
        }
    }

    /// Parses a serialized buffer, checking order and bounds.
    pub fn decode(d: &mut Dec<'_>, max_key: usize, max_value: usize) -> Result<Buffer> {
        let mut b = Buffer {
            max_msn: d.u64()?,
            ..Buffer::default()
        };
        let nr = d.u32()? as usize;
        if nr > d.remaining() {
            return Err(d.corrupt(format!("bad range count {nr}")));
        }
        for _ in 0..nr {
            let msn = d.u64()?;
            let lo = d.bytes(max_key)?.to_vec();
            let hi = d.bytes(max_key)?.to_vec();
            if lo >= hi || msn > b.max_msn {
                return Err(d.corrupt("bad range delete"));
            }
            if let Some((_, prev)) = b.ranges.last_key_value() {
                if prev.hi > lo {
                    return Err(d.corrupt("range deletes overlap"));
                }
            }
            b.insert_range(RangeDel { msn, lo, hi });
        }
        let np = d.u32()? as usize;
        if np > d.remaining() {
            return Err(d.corrupt(format!("bad message count {np}")));
        }
        // Keys arrive sorted: collect them and build the map in one pass (no per-key search).
        let mut points: Vec<(Vec<u8>, KeyMsgs)> = Vec::with_capacity(np);
        for _ in 0..np {
            let k = d.bytes(max_key)?;
            if points.last().is_some_and(|(l, _)| l.as_slice() >= k) {
                return Err(d.corrupt("buffer keys out of order"));
            }
            let k = k.to_vec();
            let km = KeyMsgs::decode(d, max_value)?;
            if km.max_msn() > b.max_msn {
                return Err(d.corrupt("message newer than its buffer"));
            }
            b.bytes += k.len() + 4 + km.size();
            b.longest = b.longest.max(k.len());
            points.push((k, km));
        }
        b.points = points.into_iter().collect();
        Ok(b)
    }
}

mod encoded;
#[cfg(test)]
pub(crate) mod testing;

pub use encoded::EncodedBuffer;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataref::{DataRef, Val};
    use crate::msg::tests::w;
    use crate::msg::Patch;

    /// Every way a buffer drops a reference put reports its block once: a later put, delete or
    /// reference over it, a range delete over it, and folded messages from a parent that replace
    /// it; an upsert onto it keeps it (patched).
    #[test]
    fn a_buffer_reports_each_reference_it_drops() {
        let r = |b: u64| PointOp::PutRef(DataRef::new(b, 0));
        let mut b = Buffer::new();
        assert_eq!(b.add_point(b"a", 1, r(10)), None);
        assert_eq!(b.add_point(b"a", 2, PointOp::Upsert(w(3, b"x"))), None);
        assert_eq!(b.add_point(b"a", 3, PointOp::Put(b"v".to_vec())), Some(10));
        assert_eq!(b.add_point(b"b", 4, r(11)), None);
        assert_eq!(b.add_point(b"b", 5, r(12)), Some(11));
        assert_eq!(b.add_point(b"b", 6, PointOp::Delete), Some(12));
        assert_eq!(b.add_point(b"c", 7, r(13)), None);
        assert_eq!(b.add_point(b"d", 8, r(14)), None);
        assert_eq!(b.ref_blocks().collect::<Vec<_>>(), vec![13, 14]);
        assert_eq!(b.add_range(9, b"c", b"d"), vec![13]);
        let later = KeyMsgs::PutRef {
            msn: 10,
            r: DataRef::new(15, 0),
        };
        assert_eq!(b.add_key_msgs(b"d".to_vec(), later), Some(14));
        let patch = KeyMsgs::Upserts(vec![(11, w(0, b"y"))]);
        assert_eq!(b.add_key_msgs(b"d".to_vec(), patch), None);
        let Some(KeyMsgs::PutRef { r, .. }) = b.point(b"d") else {
            panic!("still a reference")
        };
        assert_eq!((r.block, r.patches.len()), (15, 1));
        // The reference survives the encoding, patches and all.
        let mut e = Enc::default();
        b.encode(&mut e);
        let back = Buffer::decode(&mut Dec::new(&e.buf, "buf"), 100, 100).unwrap();
        assert_eq!(back.point(b"d"), b.point(b"d"));
        assert_eq!(back.bytes(), b.bytes());
        let enc = EncodedBuffer::index(e.buf, 100, 100).unwrap();
        assert_eq!(enc.lookup(b"d").unwrap().1.as_ref(), b.point(b"d"));
    }

    #[test]
    fn folding_matches_sequential_application() {
        let base = Some(b"0123456789".to_vec());
        let ops = [
            w(0, b"ab"),
            w(2, b"cd"),
            w(8, b"XYZW"),
            Patch::Truncate { len: 5 },
            w(1, b"q"),
        ];
        let mut expect = base.clone();
        for p in &ops {
            expect = p.apply(expect);
        }
        let mut b = Buffer::new();
        for (i, p) in ops.iter().enumerate() {
            let _ = b.add_point(b"k", i as u64 + 1, PointOp::Upsert(p.clone()));
        }
        assert_eq!(
            b.point(b"k").unwrap().apply(base.map(Val::Bytes)),
            expect.map(Val::Bytes)
        );
    }

    #[test]
    fn range_delete_annihilates_and_trims() {
        let mut b = Buffer::new();
        let _ = b.add_point(b"a", 1, PointOp::Put(b"1".to_vec()));
        let _ = b.add_point(b"c", 2, PointOp::Put(b"2".to_vec()));
        let _ = b.add_range(3, b"a", b"d");
        let _ = b.add_range(4, b"b", b"z");
        assert!(b.point(b"a").is_none());
        assert_eq!(b.range_covering(b"a").unwrap().msn, 3);
        assert_eq!(b.range_covering(b"c").unwrap().msn, 4);
        assert!(b.range_covering(b"z").is_none());
        let _ = b.add_point(b"c", 5, PointOp::Put(b"3".to_vec()));
        let mut e = Enc::default();
        b.encode(&mut e);
        let back = Buffer::decode(&mut Dec::new(&e.buf, "buf"), 100, 100).unwrap();
        assert_eq!(back.bytes(), b.bytes());
        assert_eq!(back.point(b"c"), b.point(b"c"));
    }
}
