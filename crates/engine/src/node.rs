//! Tree nodes in memory and on disk.
//!
//! An internal node holds pivots, child ids and one message [`Buffer`] per child. A leaf holds
//! pivots and partitions ([`Partition`]) that can be loaded one at a time: the leaf "skeleton"
//! (header, pivots, partition locations) is small and stays cached while partitions come and go.
//!
//! This file holds the nodes in memory and their operations; the on-disk image (serializing,
//! parsing and verifying headers, decoding sub-blocks) is in `node/layout.rs`.

use std::sync::Arc;

use amaranth_device::round_up;
use parking_lot::Mutex;

use crate::config::Format;
use crate::error::Result;
use crate::msg::{Buffer, EncodedBuffer, KeyMsgs, Msn, RangeDel};
use crate::partition::{Partition, PartitionBuilder};

mod layout;

pub use layout::{
    build_node, decode_buffer, decode_buffer_payload, decode_partition, decode_sub, header_span,
    parse_header, serialize, NodeHeader, SubLoc, HEADER_LEN,
};

/// Identifies a node; the block translation table maps it to its current extent.
pub type NodeId = u64;

/// The root keeps this id for the life of the tree (splits move its contents into new children).
pub const ROOT_ID: NodeId = 1;

/// Residency and disk location of one leaf partition.
#[derive(Debug, Default)]
pub struct PartState {
    /// The entries, when in memory.
    pub data: Option<Arc<Partition>>,
    /// Where the partition lies in the node's current image (`None`: only in memory).
    pub loc: Option<SubLoc>,
}

/// One partition of a leaf.
#[derive(Debug)]
pub struct PartSlot {
    /// Residency and location, changed under the leaf's read latch (partition loads).
    pub state: Mutex<PartState>,
    /// Encoded size of the entries (known even when not resident).
    pub bytes: usize,
    /// Number of entries.
    pub entries: usize,
}

impl PartSlot {
    /// A resident partition not yet written anywhere.
    pub fn resident(p: Partition) -> PartSlot {
        PartSlot {
            bytes: p.bytes(),
            entries: p.len(),
            state: Mutex::new(PartState {
                data: Some(Arc::new(p)),
                loc: None,
            }),
        }
    }

    /// The partition if resident.
    pub fn data(&self) -> Option<Arc<Partition>> {
        self.state.lock().data.clone()
    }
}

/// A leaf: partitions of sorted entries.
#[derive(Debug)]
pub struct Leaf {
    /// `pivots[i]` is the lowest key of partition `i + 1`.
    pub pivots: Vec<Vec<u8>>,
    /// The partitions.
    pub parts: Vec<PartSlot>,
}

/// Residency and disk location of one child's message buffer.
#[derive(Debug, Default)]
pub struct BufState {
    /// The messages, when in memory.
    pub data: Option<Arc<Buffer>>,
    /// The checked, decompressed encoding of the messages, kept for point queries when `data` is
    /// not built (building the map costs far more than the read; the encoding is also smaller).
    /// Only ever the encoding of exactly the messages the slot holds.
    pub raw: Option<Arc<EncodedBuffer>>,
    /// Where the buffer lies in the node's current image (`None`: only in memory).
    pub loc: Option<SubLoc>,
}

/// The message buffer an internal node holds for one child. Like a leaf partition it can be read
/// from disk on its own (a point query needs one buffer per level, not the whole node) and dropped
/// from memory while the node's skeleton stays.
#[derive(Debug)]
pub struct BufSlot {
    /// Residency and location, changed under the node's read latch (loads, partial eviction).
    pub state: Mutex<BufState>,
    /// Serialized size of the messages (known even when not resident).
    bytes: usize,
}

/// Encoding overhead of a buffer sub-block beyond [`Buffer::bytes`] (max MSN and two counts).
pub const BUFFER_HEADER: usize = 16;

impl BufSlot {
    /// A resident buffer not yet written anywhere.
    pub fn resident(b: Buffer) -> BufSlot {
        BufSlot {
            bytes: b.bytes(),
            state: Mutex::new(BufState {
                data: Some(Arc::new(b)),
                raw: None,
                loc: None,
            }),
        }
    }

    /// An empty resident buffer.
    pub fn empty() -> BufSlot {
        BufSlot::resident(Buffer::new())
    }

    /// Serialized size of the messages.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether the buffer holds no message.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// The buffer if resident.
    pub fn data(&self) -> Option<Arc<Buffer>> {
        self.state.lock().data.clone()
    }

    /// Whether the buffer is in memory.
    pub fn is_resident(&self) -> bool {
        self.state.lock().data.is_some()
    }

    /// Changes the buffer (which must be resident; the caller holds the node's write latch).
    pub fn mutate<R>(&mut self, f: impl FnOnce(&mut Buffer) -> R) -> R {
        let st = self.state.get_mut();
        let arc = st
            .data
            .as_mut()
            .expect("a buffer being changed is resident");
        let b = Arc::make_mut(arc);
        let r = f(b);
        self.bytes = b.bytes();
        st.loc = None;
        st.raw = None;
        r
    }

    /// Takes every message out, leaving the buffer empty (its max MSN is kept).
    pub fn take(&mut self) -> Buffer {
        self.mutate(|b| b.take())
    }

    /// Memory held.
    pub fn mem(&self) -> usize {
        let st = self.state.lock();
        st.data.as_ref().map_or(0, |b| b.mem()) + st.raw.as_ref().map_or(0, |r| r.mem()) + 96
    }

    /// What the buffer holds for `key` (range-delete MSN, folded point messages), from the built
    /// buffer or its encoding; `None` when neither is in memory.
    pub fn lookup(&self, key: &[u8]) -> Result<Option<(Option<Msn>, Option<KeyMsgs>)>> {
        let st = self.state.lock();
        if let Some(b) = &st.data {
            return Ok(Some((
                b.range_covering(key).map(|r| r.msn),
                b.point(key).cloned(),
            )));
        }
        let Some(raw) = st.raw.clone() else {
            return Ok(None);
        };
        drop(st);
        raw.lookup(key).map(Some)
    }
}

/// An internal node: pivots, children and their buffers.
#[derive(Debug)]
pub struct Internal {
    /// `pivots[i]` is the lowest key of child `i + 1`.
    pub pivots: Vec<Vec<u8>>,
    /// Child node ids.
    pub children: Vec<NodeId>,
    /// Pending messages for each child.
    pub buffers: Vec<BufSlot>,
}

/// A node's contents.
#[derive(Debug)]
pub enum Body {
    /// Height 0.
    Leaf(Leaf),
    /// Height >= 1.
    Internal(Internal),
}

/// A node.
#[derive(Debug)]
pub struct Node {
    /// 0 for leaves.
    pub height: u32,
    /// Every message with a lower or equal MSN for this node's key range has been delivered into it.
    pub max_msn: Msn,
    /// Contents.
    pub body: Body,
}

/// Index of the child (or partition) whose range holds `key`, given `pivots`.
pub fn child_index(pivots: &[Vec<u8>], key: &[u8]) -> usize {
    pivots.partition_point(|p| p.as_slice() <= key)
}

/// The shortest key `s` with `left < s <= right` (a compact pivot between two runs).
pub fn separator(left: &[u8], right: &[u8]) -> Vec<u8> {
    assert!(left < right);
    let common = left.iter().zip(right).take_while(|(a, b)| a == b).count();
    right[..(common + 1).min(right.len())].to_vec()
}

fn pivot_bytes(pivots: &[Vec<u8>]) -> usize {
    pivots.iter().map(|p| p.len() + 2).sum()
}

impl Leaf {
    /// An empty leaf with one empty partition.
    pub fn empty() -> Leaf {
        Leaf {
            pivots: Vec::new(),
            parts: vec![PartSlot::resident(Partition::empty())],
        }
    }

    /// Encoded size of all entries and pivots.
    pub fn bytes(&self) -> usize {
        self.parts.iter().map(|p| p.bytes).sum::<usize>() + pivot_bytes(&self.pivots)
    }

    /// Number of entries.
    #[cfg(test)]
    pub fn entries(&self) -> usize {
        self.parts.iter().map(|p| p.entries).sum()
    }

    /// Whether every partition is in memory.
    pub fn fully_resident(&self) -> bool {
        self.parts.iter().all(|p| p.state.lock().data.is_some())
    }

    /// Estimated memory footprint of what is resident.
    pub fn mem(&self) -> usize {
        let parts: usize = self
            .parts
            .iter()
            .map(|p| p.state.lock().data.as_ref().map_or(0, |d| d.mem()) + 96)
            .sum();
        parts + pivot_bytes(&self.pivots) + self.pivots.len() * 24 + 128
    }

    /// All partitions, which must be resident.
    fn resident_parts(&self) -> Vec<Arc<Partition>> {
        self.parts
            .iter()
            .map(|p| p.data().expect("leaf partition must be resident here"))
            .collect()
    }

    /// Applies flushed messages (range deletes first, then point messages, both sorted by key and all
    /// newer than the leaf's contents). Partitions without messages are kept as they are; the others
    /// are rebuilt and re-cut at `format.partition_size`. Every touched partition must be resident.
    pub fn apply(&mut self, ranges: &[RangeDel], points: &[(Vec<u8>, KeyMsgs)], format: &Format) {
        if self.apply_in_place(ranges, points, format) {
            return;
        }
        let old_parts = std::mem::take(&mut self.parts);
        let old_pivots = std::mem::take(&mut self.pivots);
        let mut out = LeafBuilder::new(format.partition_size);
        let mut pi = 0usize; // next point message
        for (i, slot) in old_parts.into_iter().enumerate() {
            let lo: Option<&[u8]> = if i == 0 {
                None
            } else {
                Some(&old_pivots[i - 1])
            };
            let hi: Option<&[u8]> = old_pivots.get(i).map(|v| v.as_slice());
            let p_start = pi;
            while pi < points.len() && hi.is_none_or(|h| points[pi].0.as_slice() < h) {
                pi += 1;
            }
            let my_points = &points[p_start..pi];
            let my_ranges: Vec<&RangeDel> = ranges
                .iter()
                .filter(|r| {
                    hi.is_none_or(|h| r.lo.as_slice() < h) && lo.is_none_or(|l| r.hi.as_slice() > l)
                })
                .collect();
            if my_points.is_empty() && my_ranges.is_empty() {
                out.keep(lo, slot);
                continue;
            }
            // A partition wholly inside one range delete is dropped without being read.
            // (Range deletes are older than the point messages beside them, so the base is not needed.)
            let whole = my_ranges.iter().any(|r| {
                lo.is_some_and(|l| r.lo.as_slice() <= l) && hi.is_some_and(|h| r.hi.as_slice() >= h)
            });
            // A few messages: patch the partition in place (one memmove per entry or per run a
            // range delete removes) instead of rebuilding it, when it stays within its size and
            // does not become empty. The size check uses the exact new size (an overwrite of a
            // value by one of the same length grows nothing), so a full partition is patched too.
            if !whole && my_ranges.len() <= 4 && my_points.len() <= 16 {
                if let Some(base) = slot.data() {
                    let runs = covered_runs(&base, &my_ranges);
                    let cut: usize = runs.iter().map(|&(a, b)| base.run_bytes(a, b)).sum();
                    let (size, values) = patched_size(&base, cut, &my_ranges, my_points);
                    // An emptied partition (size 0) goes through the rebuild, which drops it.
                    if size > 0 && size <= format.partition_size {
                        // Without the leaf's own reference the partition is patched where it is
                        // (a reader holding it meanwhile gets its copy).
                        drop(slot);
                        let mut p =
                            Arc::try_unwrap(base).unwrap_or_else(|shared| (*shared).clone());
                        // Ranges first (they are older than the point messages), last run first.
                        for &(a, b) in runs.iter().rev() {
                            p.remove_run(a, b);
                        }
                        for ((k, _), v) in my_points.iter().zip(values) {
                            p.set(k, v.as_deref());
                        }
                        assert_eq!(p.bytes(), size, "patched partition size");
                        out.keep(lo, PartSlot::resident(p));
                        continue;
                    }
                }
            }
            let base = if whole {
                None
            } else {
                Some(slot.data().expect("touched partition must be resident"))
            };
            out.merge(lo, base.as_deref(), &my_ranges, my_points);
        }
        assert_eq!(
            pi,
            points.len(),
            "every point message belongs to a partition"
        );
        let (pivots, parts) = out.finish();
        self.pivots = pivots;
        self.parts = parts;
    }

    /// Applies the messages by patching each partition they touch where it is, when every one of
    /// them can be (resident, a few messages, staying non-empty and within its size): the leaf's
    /// other partitions and its pivots are left alone, so the cost does not grow with the number
    /// of partitions. Returns false, having changed nothing, otherwise.
    fn apply_in_place(
        &mut self,
        ranges: &[RangeDel],
        points: &[(Vec<u8>, KeyMsgs)],
        format: &Format,
    ) -> bool {
        type Plan = (
            usize,
            Vec<(usize, usize)>,
            Vec<Option<Vec<u8>>>,
            usize,
            usize,
        );
        let mut plan: Vec<Plan> = Vec::new();
        let mut pi = 0usize;
        for i in 0..self.parts.len() {
            let lo: Option<&[u8]> = (i > 0).then(|| self.pivots[i - 1].as_slice());
            let hi: Option<&[u8]> = self.pivots.get(i).map(|v| v.as_slice());
            let p_start = pi;
            while pi < points.len() && hi.is_none_or(|h| points[pi].0.as_slice() < h) {
                pi += 1;
            }
            let my_points = &points[p_start..pi];
            let my_ranges: Vec<&RangeDel> = ranges
                .iter()
                .filter(|r| {
                    hi.is_none_or(|h| r.lo.as_slice() < h) && lo.is_none_or(|l| r.hi.as_slice() > l)
                })
                .collect();
            if my_points.is_empty() && my_ranges.is_empty() {
                continue;
            }
            if my_ranges.len() > 4 || my_points.len() > 16 {
                return false;
            }
            let Some(base) = self.parts[i].data() else {
                return false;
            };
            let runs = covered_runs(&base, &my_ranges);
            let cut: usize = runs.iter().map(|&(a, b)| base.run_bytes(a, b)).sum();
            let (size, values) = patched_size(&base, cut, &my_ranges, my_points);
            if size == 0 || size > format.partition_size {
                return false;
            }
            plan.push((i, runs, values, size, p_start));
        }
        assert_eq!(
            pi,
            points.len(),
            "every point message belongs to a partition"
        );
        for (i, runs, values, size, p_start) in plan {
            let base = self.parts[i]
                .state
                .lock()
                .data
                .take()
                .expect("planned partitions are resident");
            // Without the leaf's own reference the partition is patched where it is (a reader
            // holding it meanwhile keeps its copy).
            let mut p = Arc::try_unwrap(base).unwrap_or_else(|shared| (*shared).clone());
            // Ranges first (they are older than the point messages), last run first.
            for &(a, b) in runs.iter().rev() {
                p.remove_run(a, b);
            }
            for ((k, _), v) in points[p_start..p_start + values.len()].iter().zip(values) {
                p.set(k, v.as_deref());
            }
            assert_eq!(p.bytes(), size, "patched partition size");
            self.parts[i] = PartSlot::resident(p);
        }
        true
    }

    /// Splits into pieces of at most about half a node each (at partition boundaries). Returns the
    /// pieces after the first, each with its lowest key; `self` keeps the first piece.
    pub fn split(&mut self, format: &Format) -> Vec<(Vec<u8>, Leaf)> {
        let target = format.node_size / 2;
        let mut pieces: Vec<(Vec<u8>, Leaf)> = Vec::new();
        let parts = std::mem::take(&mut self.parts);
        let mut pivots = std::mem::take(&mut self.pivots).into_iter();
        let mut cur = Leaf {
            pivots: Vec::new(),
            parts: Vec::new(),
        };
        let mut cur_low: Option<Vec<u8>> = None;
        let mut cur_bytes = 0usize;
        let mut first: Option<Leaf> = None;
        for (i, slot) in parts.into_iter().enumerate() {
            let low = if i == 0 { None } else { pivots.next() };
            if !cur.parts.is_empty() && cur_bytes + slot.bytes > target {
                let done = std::mem::replace(
                    &mut cur,
                    Leaf {
                        pivots: Vec::new(),
                        parts: Vec::new(),
                    },
                );
                match cur_low.take() {
                    None => first = Some(done),
                    Some(l) => pieces.push((l, done)),
                }
                cur_low = low.clone();
                cur_bytes = 0;
            } else if let Some(l) = low {
                cur.pivots.push(l);
            }
            cur_bytes += slot.bytes;
            cur.parts.push(slot);
        }
        match (first.is_none(), cur_low) {
            (true, _) => first = Some(cur),
            (false, Some(l)) => pieces.push((l, cur)),
            (false, None) => unreachable!("a later piece always has a low key"),
        }
        *self = first.expect("first piece");
        pieces
    }

    /// Appends `right` (whose keys are all `>= pivot`) to this leaf.
    pub fn absorb(&mut self, pivot: Vec<u8>, right: Leaf) {
        self.pivots.push(pivot);
        self.pivots.extend(right.pivots);
        self.parts.extend(right.parts);
        self.drop_empty_partitions();
    }

    /// Removes empty partitions (a leaf keeps one only when it has no entries at all): searches
    /// assume every partition of a multi-partition leaf holds its pivot range's keys.
    fn drop_empty_partitions(&mut self) {
        if self.parts.len() < 2 || self.parts.iter().all(|p| p.entries > 0) {
            return;
        }
        let parts = std::mem::take(&mut self.parts);
        let pivots = std::mem::take(&mut self.pivots);
        let mut lows = std::iter::once(None).chain(pivots.into_iter().map(Some));
        for slot in parts {
            let low = lows.next().expect("a low key per partition");
            if slot.entries == 0 {
                continue;
            }
            if !self.parts.is_empty() {
                self.pivots
                    .push(low.expect("a non-first partition has a low key"));
            }
            self.parts.push(slot);
        }
        if self.parts.is_empty() {
            self.parts.push(PartSlot::resident(Partition::empty()));
        }
    }
}

/// Assembles the partitions of a rebuilt leaf.
struct LeafBuilder {
    partition_size: usize,
    /// Bytes a partition being built is filled to before the next one starts (at most
    /// `partition_size`; less while a merge splits a partition, see [`LeafBuilder::merge`]).
    fill: usize,
    pivots: Vec<Vec<u8>>,
    parts: Vec<PartSlot>,
    cur: Option<(Option<Vec<u8>>, PartitionBuilder)>,
    last_key: Option<Vec<u8>>,
}

impl LeafBuilder {
    fn new(partition_size: usize) -> LeafBuilder {
        LeafBuilder {
            partition_size,
            fill: partition_size,
            pivots: Vec::new(),
            parts: Vec::new(),
            cur: None,
            last_key: None,
        }
    }

    fn seal(&mut self) {
        if let Some((low, b)) = self.cur.take() {
            if b.is_empty() {
                return;
            }
            self.push_slot(low, PartSlot::resident(b.finish()));
        }
    }

    fn push_slot(&mut self, low: Option<Vec<u8>>, slot: PartSlot) {
        if !self.parts.is_empty() {
            // The first partition of a leaf has no pivot; later ones need one.
            self.pivots
                .push(low.expect("a non-first partition has a low key"));
        }
        self.parts.push(slot);
    }

    /// Keeps an untouched partition whose range starts at `lo`.
    fn keep(&mut self, lo: Option<&[u8]>, slot: PartSlot) {
        self.seal();
        if slot.entries == 0 {
            return;
        }
        let low = if self.parts.is_empty() {
            None
        } else {
            Some(lo.expect("non-first partition").to_vec())
        };
        self.push_slot(low, slot);
        self.last_key = None;
    }

    fn push_entry(&mut self, range_lo: Option<&[u8]>, key: &[u8], value: &[u8]) {
        let size = crate::partition::entry_size(key, value);
        let full = self
            .cur
            .as_ref()
            .is_some_and(|(_, b)| !b.is_empty() && b.bytes() + size > self.fill);
        if full {
            // Remember only the last key of each sealed partition (for the next pivot).
            let prev = self
                .cur
                .as_ref()
                .and_then(|(_, b)| b.last_key())
                .map(|k| k.to_vec());
            self.seal();
            self.last_key = prev;
        }
        if self.cur.is_none() {
            let low = if self.parts.is_empty() {
                None
            } else {
                Some(match (&self.last_key, range_lo) {
                    // Inside a rebuilt partition: a short separator from the previous entry.
                    (Some(prev), _) => separator(prev, key),
                    // First entry of a rebuilt partition: keep the old lower bound.
                    (None, Some(l)) => l.to_vec(),
                    (None, None) => key.to_vec(),
                })
            };
            self.cur = Some((low, PartitionBuilder::with_capacity(self.partition_size)));
        }
        self.cur
            .as_mut()
            .expect("current partition")
            .1
            .push(key, value);
    }

    /// Merges a partition's base entries with messages and appends the result.
    fn merge(
        &mut self,
        lo: Option<&[u8]>,
        base: Option<&Partition>,
        ranges: &[&RangeDel],
        points: &[(Vec<u8>, KeyMsgs)],
    ) {
        self.seal();
        self.last_key = None;
        let covered = |k: &[u8]| ranges.iter().any(|r| r.covers(k));
        let empty = Partition::empty();
        let base = base.unwrap_or(&empty);
        // A partition that overflows is split into parts filled to about three quarters, not
        // into full ones and a remainder: a full partition would be rebuilt again by the next
        // insert into it, where one with room takes it in place (`Leaf::apply`).
        let total = base.bytes() + points.iter().map(|(k, km)| grow_hint(k, km)).sum::<usize>();
        if total > self.partition_size {
            let parts = total.div_ceil(self.partition_size * 3 / 4);
            self.fill = total.div_ceil(parts).min(self.partition_size);
        }
        let (mut bi, mut pi) = (0usize, 0usize);
        // The first entry of this range keeps the partition's old lower bound as its pivot.
        let mut range_lo = lo;
        while bi < base.len() || pi < points.len() {
            let take_base =
                pi >= points.len() || (bi < base.len() && base.key(bi) < points[pi].0.as_slice());
            if take_base {
                let k = base.key(bi);
                if !covered(k) {
                    self.push_entry(range_lo, k, base.value(bi));
                    range_lo = None;
                }
                bi += 1;
            } else {
                let (k, km) = &points[pi];
                let old = if bi < base.len() && base.key(bi) == k.as_slice() {
                    bi += 1;
                    if covered(k) {
                        None
                    } else {
                        Some(base.value(bi - 1).to_vec())
                    }
                } else {
                    None
                };
                if let Some(v) = km.apply(old) {
                    self.push_entry(range_lo, k, &v);
                    range_lo = None;
                }
                pi += 1;
            }
        }
        self.seal();
        self.last_key = None;
        self.fill = self.partition_size;
    }

    fn finish(mut self) -> (Vec<Vec<u8>>, Vec<PartSlot>) {
        self.seal();
        if self.parts.is_empty() {
            self.parts.push(PartSlot::resident(Partition::empty()));
        }
        // Coalesce neighbours that fit together in one partition (both resident).
        let mut pivots = Vec::with_capacity(self.pivots.len());
        let mut parts: Vec<PartSlot> = Vec::with_capacity(self.parts.len());
        for (i, slot) in self.parts.into_iter().enumerate() {
            let low = if i == 0 {
                None
            } else {
                Some(self.pivots[i - 1].clone())
            };
            if let Some(prev) = parts.last_mut() {
                let small = prev.bytes + slot.bytes <= self.partition_size
                    && (prev.bytes < self.partition_size / 4
                        || slot.bytes < self.partition_size / 4);
                if small {
                    if let (Some(a), Some(b)) = (prev.data(), slot.data()) {
                        let mut bld = PartitionBuilder::with_capacity(prev.bytes + slot.bytes);
                        for j in 0..a.len() {
                            bld.push(a.key(j), a.value(j));
                        }
                        for j in 0..b.len() {
                            bld.push(b.key(j), b.value(j));
                        }
                        *prev = PartSlot::resident(bld.finish());
                        continue;
                    }
                }
            }
            if let Some(l) = low {
                if !parts.is_empty() {
                    pivots.push(l);
                }
            }
            parts.push(slot);
        }
        assert_eq!(pivots.len() + 1, parts.len());
        (pivots, parts)
    }
}

impl Internal {
    /// Serialized size of all buffers.
    pub fn buffered_bytes(&self) -> usize {
        self.buffers.iter().map(|b| b.bytes()).sum()
    }

    /// Total serialized size.
    pub fn bytes(&self) -> usize {
        self.buffered_bytes() + pivot_bytes(&self.pivots) + self.children.len() * 29
    }

    /// Estimated memory footprint.
    pub fn mem(&self) -> usize {
        self.buffers.iter().map(|b| b.mem()).sum::<usize>()
            + pivot_bytes(&self.pivots)
            + self.children.len() * 128
            + 128
    }

    /// Index of the child with the most buffered bytes.
    pub fn heaviest_child(&self) -> usize {
        let mut best = 0;
        for (i, b) in self.buffers.iter().enumerate() {
            if b.bytes() > self.buffers[best].bytes() {
                best = i;
            }
        }
        best
    }

    /// Low (inclusive) and high (exclusive, `None` = unbounded) keys of child `i`, within the node's
    /// own bounds `lo`/`hi`.
    pub fn child_bounds<'a>(
        &'a self,
        i: usize,
        lo: &'a [u8],
        hi: Option<&'a [u8]>,
    ) -> (&'a [u8], Option<&'a [u8]>) {
        let l = if i == 0 {
            lo
        } else {
            self.pivots[i - 1].as_slice()
        };
        let h = if i < self.pivots.len() {
            Some(self.pivots[i].as_slice())
        } else {
            hi
        };
        (l, h)
    }

    /// Appends `right` (whose keys are all `>= pivot`).
    pub fn absorb(&mut self, pivot: Vec<u8>, right: Internal) {
        self.pivots.push(pivot);
        self.pivots.extend(right.pivots);
        self.children.extend(right.children);
        self.buffers.extend(right.buffers);
    }

    /// Whether every buffer is in memory.
    pub fn fully_resident(&self) -> bool {
        self.buffers.iter().all(|b| b.is_resident())
    }
}

impl Node {
    /// An empty leaf.
    pub fn empty_leaf() -> Node {
        Node {
            height: 0,
            max_msn: 0,
            body: Body::Leaf(Leaf::empty()),
        }
    }

    /// Total serialized size (entries or buffered messages, plus pivots).
    pub fn bytes(&self) -> usize {
        match &self.body {
            Body::Leaf(l) => l.bytes(),
            Body::Internal(n) => n.bytes(),
        }
    }

    /// Estimated memory footprint of what is resident.
    pub fn mem(&self) -> usize {
        match &self.body {
            Body::Leaf(l) => l.mem(),
            Body::Internal(n) => n.mem(),
        }
    }

    /// Whether every partition (leaf) or buffer (internal node) is in memory.
    pub fn fully_resident(&self) -> bool {
        match &self.body {
            Body::Leaf(l) => l.fully_resident(),
            Body::Internal(n) => n.fully_resident(),
        }
    }

    /// Length of the image [`serialize`] writes for this node without compression (with
    /// compression it is an upper bound: a sub-block is stored compressed only when smaller).
    /// Needs no resident sub-block: sizes are known from the skeleton.
    pub fn image_len(&self) -> usize {
        let (pivots, desc_len, raw_lens): (&[Vec<u8>], usize, Vec<usize>) = match &self.body {
            Body::Leaf(l) => (&l.pivots, 21, l.parts.iter().map(|p| p.bytes).collect()),
            Body::Internal(n) => (
                &n.pivots,
                8 + 21,
                n.buffers
                    .iter()
                    .map(|b| b.bytes() + BUFFER_HEADER)
                    .collect(),
            ),
        };
        let index_len = pivot_bytes(pivots) + raw_lens.len() * desc_len;
        round_up(HEADER_LEN + index_len)
            + raw_lens.iter().map(|&r| round_up(r.max(1))).sum::<usize>()
    }

    /// The leaf, if this is one.
    #[cfg(test)]
    pub fn leaf(&self) -> Option<&Leaf> {
        match &self.body {
            Body::Leaf(l) => Some(l),
            Body::Internal(_) => None,
        }
    }

    /// Checks structural invariants (pivot order, buffer placement, sizes). Panics when broken:
    /// a broken invariant must stop the engine before it writes anything wrong.
    pub fn check_invariants(&self, id: NodeId) {
        match &self.body {
            Body::Leaf(l) => {
                assert_eq!(
                    self.height, 0,
                    "node {id}: leaf with height {}",
                    self.height
                );
                assert_eq!(
                    l.pivots.len() + 1,
                    l.parts.len(),
                    "node {id}: leaf pivot count"
                );
                for w in l.pivots.windows(2) {
                    assert!(w[0] < w[1], "node {id}: leaf pivots out of order");
                }
                for (i, slot) in l.parts.iter().enumerate() {
                    assert!(
                        slot.entries > 0 || l.parts.len() == 1,
                        "node {id}: empty partition {i} in a multi-partition leaf"
                    );
                    if let Some(p) = slot.data() {
                        assert_eq!(
                            p.len(),
                            slot.entries,
                            "node {id}: partition {i} entry count"
                        );
                        assert_eq!(p.bytes(), slot.bytes, "node {id}: partition {i} size");
                        if p.is_empty() {
                            continue;
                        }
                        if i > 0 {
                            assert!(
                                p.key(0) >= l.pivots[i - 1].as_slice(),
                                "node {id}: partition {i} below its pivot"
                            );
                        }
                        if i < l.pivots.len() {
                            assert!(
                                p.key(p.len() - 1) < l.pivots[i].as_slice(),
                                "node {id}: partition {i} above next pivot"
                            );
                        }
                    }
                }
            }
            Body::Internal(n) => {
                assert!(self.height >= 1, "node {id}: internal node with height 0");
                assert_eq!(
                    n.pivots.len() + 1,
                    n.children.len(),
                    "node {id}: pivot count"
                );
                assert_eq!(n.children.len(), n.buffers.len(), "node {id}: buffer count");
                for w in n.pivots.windows(2) {
                    assert!(w[0] < w[1], "node {id}: pivots out of order");
                }
                for (i, slot) in n.buffers.iter().enumerate() {
                    let Some(b) = slot.data() else { continue };
                    assert_eq!(b.bytes(), slot.bytes(), "node {id}: buffer {i} size");
                    let (lo, hi) = n.child_bounds(i, &[], None);
                    for (k, _) in b.points_in(&[], None) {
                        assert!(
                            k.as_slice() >= lo && hi.is_none_or(|h| k.as_slice() < h),
                            "node {id}: message in the wrong buffer"
                        );
                    }
                    assert!(
                        b.max_msn() <= self.max_msn || b.is_empty(),
                        "node {id}: buffer newer than node"
                    );
                }
            }
        }
    }
}

/// Low and high bounds of child `i` given a node's pivots (the node's own bounds left open).
pub fn child_bounds_of(pivots: &[Vec<u8>], i: usize) -> (&[u8], Option<&[u8]>) {
    let lo: &[u8] = if i == 0 { &[] } else { &pivots[i - 1] };
    (lo, pivots.get(i).map(|p| p.as_slice()))
}

/// The encoded size of `base` after `points` (distinct keys) are applied, and the new values.
/// About how many bytes the messages of `key` add to a partition (their value's size; an upsert
/// counts its patches' data).
fn grow_hint(key: &[u8], km: &KeyMsgs) -> usize {
    match km {
        KeyMsgs::Put { value, .. } => crate::partition::entry_size(key, value),
        KeyMsgs::Delete { .. } => 0,
        KeyMsgs::Upserts(ps) => {
            let data: usize = ps
                .iter()
                .map(|(_, p)| match p {
                    crate::msg::Patch::Write { data, .. } => data.len(),
                    crate::msg::Patch::Truncate { .. } => 0,
                })
                .sum();
            crate::partition::entry_size(key, &[]) + data
        }
    }
}

/// The runs of entries of `base` (by index, sorted, disjoint) that `ranges` delete.
fn covered_runs(base: &Partition, ranges: &[&RangeDel]) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = ranges
        .iter()
        .map(|r| (base.lower_bound(&r.lo), base.lower_bound(&r.hi)))
        .filter(|(a, b)| a < b)
        .collect();
    runs.sort_unstable();
    let mut merged: Vec<(usize, usize)> = Vec::with_capacity(runs.len());
    for (a, b) in runs {
        match merged.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    merged
}

/// The size of `base` after removing `cut` bytes of entries deleted by `ranges` and applying
/// `points` (each key's old value is gone if a range covers it), and each key's new value.
fn patched_size(
    base: &Partition,
    cut: usize,
    ranges: &[&RangeDel],
    points: &[(Vec<u8>, KeyMsgs)],
) -> (usize, Vec<Option<Vec<u8>>>) {
    let mut size = base.bytes() - cut;
    let mut values = Vec::with_capacity(points.len());
    for (k, km) in points {
        let old = if ranges.iter().any(|r| r.covers(k)) {
            None
        } else {
            base.get(k)
        };
        if let Some(o) = old {
            size -= crate::partition::entry_size(k, o);
        }
        // Only upserts read the old value (a put or delete would copy it for nothing).
        let new = match km {
            KeyMsgs::Upserts(_) => km.apply(old.map(|v| v.to_vec())),
            _ => km.apply(None),
        };
        if let Some(n) = &new {
            size += crate::partition::entry_size(k, n);
        }
        values.push(new);
    }
    (size, values)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn fmt() -> Format {
        Format::small_for_tests()
    }

    pub(super) fn leaf_with(n: u32) -> Leaf {
        let mut l = Leaf::empty();
        let points: Vec<(Vec<u8>, KeyMsgs)> = (0..n)
            .map(|i| {
                (
                    format!("key{i:05}").into_bytes(),
                    KeyMsgs::Put {
                        msn: 1,
                        value: vec![i as u8; 50],
                    },
                )
            })
            .collect();
        l.apply(&[], &points, &fmt());
        l
    }

    pub(super) fn all_entries(l: &Leaf) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut out = Vec::new();
        for s in &l.parts {
            let p = s.data().unwrap();
            for i in 0..p.len() {
                out.push((p.key(i).to_vec(), p.value(i).to_vec()));
            }
        }
        out
    }

    /// Overwriting a value with one of the same size in a full partition patches it in place
    /// (the partition's buffer stays where it was) instead of re-encoding the leaf.
    /// Inserts keys into the first partition one at a time (each patched in place) until it is
    /// full.
    fn fill_first(l: &mut Leaf) {
        for j in 0.. {
            if l.parts[0].data().unwrap().bytes() + 70 > fmt().partition_size {
                return;
            }
            let points = vec![(
                format!("key00000.{j:04}").into_bytes(),
                KeyMsgs::Put {
                    msn: 2,
                    value: vec![1u8; 40],
                },
            )];
            l.apply(&[], &points, &fmt());
        }
    }

    /// A partition split by a merge keeps room: the next insert into it is patched in place.
    #[test]
    fn an_overflowing_partition_splits_with_room_to_insert_in_place() {
        let mut l = leaf_with(300);
        let first = l.parts[0].data().unwrap();
        assert!(
            first.bytes() <= fmt().partition_size * 3 / 4 + 70,
            "built partitions keep a quarter free: {} of {}",
            first.bytes(),
            fmt().partition_size
        );
        drop(first);
        fill_first(&mut l);
        let parts = l.parts.len();
        // Full: the next insert splits it...
        let put = |j: u32| {
            vec![(
                format!("key00000.x{j}").into_bytes(),
                KeyMsgs::Put {
                    msn: 3,
                    value: vec![2u8; 40],
                },
            )]
        };
        l.apply(&[], &put(0), &fmt());
        assert_eq!(l.parts.len(), parts + 1, "the full partition split");
        // ...and the one after that goes in place.
        let before = l.parts[0].data().unwrap().raw().as_ptr();
        l.apply(&[], &put(1), &fmt());
        let p = l.parts[0].data().unwrap();
        assert_eq!(
            p.raw().as_ptr(),
            before,
            "the split partition was rebuilt again"
        );
        assert!(p.get(b"key00000.x1").is_some());
    }

    #[test]
    fn same_size_overwrite_in_a_full_partition_is_patched() {
        let mut l = leaf_with(300);
        fill_first(&mut l);
        let full = l.parts[0].data().unwrap();
        assert!(
            full.bytes() + 70 > fmt().partition_size,
            "the first partition is full"
        );
        let key = full.key(1).to_vec();
        let before = full.raw().as_ptr();
        drop(full);
        let points = vec![(
            key.clone(),
            KeyMsgs::Put {
                msn: 2,
                value: vec![9u8; 50],
            },
        )];
        l.apply(&[], &points, &fmt());
        let p = l.parts[0].data().unwrap();
        assert_eq!(p.raw().as_ptr(), before, "the partition was rebuilt");
        assert_eq!(p.get(&key), Some(&[9u8; 50][..]));
    }

    /// Range deletes inside a partition (with point messages beside them, some in the ranges'
    /// gaps, one for a key a range deleted) are patched in place and give what a rebuild gives.
    #[test]
    fn range_deletes_in_a_partition_are_patched_in_place_like_a_rebuild() {
        let key = |i: u32| format!("key{i:05}").into_bytes();
        let ranges = vec![
            RangeDel {
                msn: 2,
                lo: key(3),
                hi: key(7),
            },
            RangeDel {
                msn: 3,
                lo: key(5),
                hi: key(9),
            },
            RangeDel {
                msn: 4,
                lo: key(20),
                hi: key(21),
            },
        ];
        let points = vec![
            (
                key(4),
                KeyMsgs::Put {
                    msn: 5,
                    value: vec![1; 10],
                },
            ),
            (
                key(12),
                KeyMsgs::Put {
                    msn: 6,
                    value: vec![2; 10],
                },
            ),
        ];
        let mut patched = leaf_with(300);
        let before = patched.parts[0].data().unwrap().raw().as_ptr();
        patched.apply(&ranges, &points, &fmt());
        let p = patched.parts[0].data().unwrap();
        assert_eq!(p.raw().as_ptr(), before, "the partition was rebuilt");
        // The same messages through the rebuild.
        let mut rebuilt = leaf_with(300);
        let slot = &rebuilt.parts[0];
        let base = slot.data().unwrap();
        let refs: Vec<&RangeDel> = ranges.iter().collect();
        let mut out = LeafBuilder::new(fmt().partition_size);
        out.merge(None, Some(&base), &refs, &points);
        let (_, parts) = out.finish();
        drop(base);
        rebuilt.parts[0] = parts.into_iter().next().unwrap();
        let q = rebuilt.parts[0].data().unwrap();
        assert_eq!(p.raw(), q.raw());
        assert_eq!(p.get(&key(4)), Some(&[1u8; 10][..]));
        assert_eq!(p.get(&key(5)), None);
        assert_eq!(p.get(&key(9)).map(|v| v.len()), Some(50));
        assert_eq!(p.get(&key(20)), None);
    }

    #[test]
    fn leaf_apply_partitions_and_deletes() {
        let l = leaf_with(300);
        assert!(l.parts.len() > 3, "entries were cut into partitions");
        let node = Node {
            height: 0,
            max_msn: 1,
            body: Body::Leaf(l),
        };
        node.check_invariants(7);
        let Body::Leaf(mut l) = node.body else {
            unreachable!()
        };
        let ranges = vec![RangeDel {
            msn: 2,
            lo: b"key00010".to_vec(),
            hi: b"key00290".to_vec(),
        }];
        let points = vec![(
            b"key00100".to_vec(),
            KeyMsgs::Put {
                msn: 3,
                value: b"x".to_vec(),
            },
        )];
        l.apply(&ranges, &points, &fmt());
        let e = all_entries(&l);
        assert_eq!(e.len(), 10 + 1 + 10);
        assert_eq!(e[10], (b"key00100".to_vec(), b"x".to_vec()));
        let node = Node {
            height: 0,
            max_msn: 3,
            body: Body::Leaf(l),
        };
        node.check_invariants(7);
    }

    #[test]
    fn split_and_absorb() {
        let mut l = leaf_with(600);
        let total = l.entries();
        let pieces = l.split(&fmt());
        assert!(!pieces.is_empty());
        let mut n = l.entries();
        for (low, p) in &pieces {
            n += p.entries();
            assert!(p.parts[0].data().unwrap().key(0) >= low.as_slice());
        }
        assert_eq!(n, total);
        for (low, p) in pieces {
            l.absorb(low, p);
        }
        assert_eq!(l.entries(), total);
        Node {
            height: 0,
            max_msn: 1,
            body: Body::Leaf(l),
        }
        .check_invariants(1);
    }
}
