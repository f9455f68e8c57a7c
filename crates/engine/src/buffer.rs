//! The per-child message buffers of internal nodes: [`Buffer`] in memory (points folded per key,
//! non-overlapping range deletes) with its encoding, and [`EncodedBuffer`], a buffer read from disk
//! and looked up in its encoded form without being decoded. The messages themselves and their
//! semantics are in `msg.rs`.

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

/// A buffer kept in its encoding (as [`Buffer::encode`] writes it) with an index of where each
/// range delete and each key starts: a point query binary-searches it in place instead of building
/// the map of thousands of keys (which costs far more than reading the sub-block), and it takes
/// about as much memory as the encoding itself. Indexing checks everything decoding checks, so
/// an indexed encoding always builds ([`EncodedBuffer::build`]); a node being changed may keep
/// its untouched buffers in this form and write them back as they are (`node/slot.rs`).
#[derive(Debug)]
pub struct EncodedBuffer {
    raw: Box<[u8]>,
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
    pub fn index(raw: Vec<u8>, max_key: usize, max_value: usize) -> Result<EncodedBuffer> {
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
            raw: raw.into_boxed_slice(),
            ranges,
            points,
            longest,
            max_key,
            max_value,
        })
    }

    /// Memory held.
    pub fn mem(&self) -> usize {
        self.raw.len() + (self.ranges.len() + self.points.len()) * 4 + 64
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
        EncodedBuffer {
            raw: e.buf.into_boxed_slice(),
            ranges,
            points,
            longest,
            max_key: self.max_key,
            max_value: self.max_value,
        }
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

    /// The out-of-line blocks the messages reference, one per reference (as
    /// [`Buffer::ref_blocks`]), read from the encoding.
    pub(crate) fn ref_blocks(&self) -> impl Iterator<Item = u64> + '_ {
        self.points.iter().filter_map(|&off| {
            let mut d = self.at(off);
            d.bytes(self.max_key).expect("indexed");
            KeyMsgs::encoded_ref_block(&mut d, self.max_value)
        })
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

    /// A random buffer: puts, deletes, upsert runs, references and a few range deletes over keys
    /// `k00000`..`k00400` (every message older than the buffer's max MSN).
    fn random_buffer(rng: &mut rand::rngs::SmallRng) -> Buffer {
        use rand::Rng;
        let mut b = Buffer::new();
        let mut msn = 0;
        for _ in 0..rng.gen_range(0..120) {
            msn += 1;
            let key = format!("k{:05}", rng.gen_range(0..400u32));
            if rng.gen_bool(0.05) {
                let hi = format!("k{:05}", rng.gen_range(0..420u32));
                if key.as_bytes() < hi.as_bytes() {
                    let _ = b.add_range(msn, key.as_bytes(), hi.as_bytes());
                }
                continue;
            }
            let op = match rng.gen_range(0..5) {
                0 => PointOp::Put(vec![7; rng.gen_range(0..20)]),
                1 => PointOp::Delete,
                2 => PointOp::PutRef(DataRef::new(rng.gen_range(1..1000), 40)),
                3 => PointOp::Upsert(Patch::Truncate {
                    len: rng.gen_range(0..50),
                }),
                _ => PointOp::Upsert(w(rng.gen_range(0..40), b"abc")),
            };
            let _ = b.add_point(key.into_bytes(), msn, op);
        }
        b
    }

    fn encoding(b: &Buffer) -> Vec<u8> {
        let mut e = Enc::default();
        b.encode(&mut e);
        e.buf
    }

    fn seed() -> u64 {
        let s = std::env::var("AMARANTH_SEED")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(rand::random);
        eprintln!("seed {s} (AMARANTH_SEED={s} repeats it)");
        s
    }

    /// Indexing accepts exactly what decoding accepts: random buffers, then their encodings
    /// with random bytes changed (message numbers, lengths, tags, keys); what indexes builds to
    /// what decodes, byte for byte.
    #[test]
    fn indexing_accepts_what_decoding_accepts() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed());
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
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed());
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
