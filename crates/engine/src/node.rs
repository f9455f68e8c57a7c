//! Tree nodes in memory and on disk.
//!
//! An internal node holds pivots, child ids and one message
//! [`Buffer`](crate::buffer::Buffer) per child. A leaf holds pivots and partitions ([`Partition`]) that can be loaded one at a time: the leaf "skeleton"
//! (header, pivots, partition locations) is small and stays cached while partitions come and go.
//!
//! This file holds the nodes in memory and their operations; applying messages to a leaf is in
//! `node/leaf_apply.rs`, the on-disk image (serializing, parsing and verifying headers, decoding
//! sub-blocks) in `node/layout.rs`.

use std::sync::Arc;

use amaranth_device::round_up;
use parking_lot::Mutex;

use crate::config::Format;
use crate::msg::Msn;
use crate::partition::Partition;

mod cut;
mod layout;
mod leaf_apply;
mod lift;
mod rekey;
mod runs;
mod slot;
mod summary;

pub use layout::{
    build_node, decode_buffer, decode_partition, header_span, parse_header, serialize, NodeHeader,
    SubLoc, HEADER_LEN, NODE_VERSION, NODE_VERSION_UNLIFTED,
};
pub(crate) use layout::{
    build_node_in, decode_partition_in, index_buffer_in, serialize_layout, SubSrc,
};
pub(crate) use rekey::RekeyPlan;
#[cfg(test)]
pub(crate) use runs::RUN_BYTES;
pub(crate) use runs::{RunAt, ShedRuns};
pub use slot::BufSlot;
pub(crate) use slot::{BufAnswer, Resident};

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
    /// While the partition is shed: its runs, for point queries (`node/runs.rs`). Only with
    /// `data` unset and `loc` set to the place the runs describe.
    pub(crate) runs: Option<Arc<ShedRuns>>,
    /// Whether the entries in memory were read on their own, for a point query (not with their
    /// whole node: a scan, read-ahead or a flush). Only such a partition keeps runs when shed:
    /// one read with its whole leaf is being read in order, and runs would only hold memory.
    pub(crate) point_loaded: bool,
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
                runs: None,
                point_loaded: false,
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

/// The loosest key-length bound (a slot read from an image that did not record one).
pub const LONGEST_UNKNOWN: u16 = u16::MAX;

/// A key-length bound clamped into its stored field.
pub fn longest_field(len: usize) -> u16 {
    len.min(LONGEST_UNKNOWN as usize) as u16
}

/// Encoding overhead of a buffer sub-block beyond [`Buffer::bytes`](crate::buffer::Buffer::bytes) (max MSN and two counts).
pub const BUFFER_HEADER: usize = 16;

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
    /// The full-key prefix its stored keys omit (docs/SURGERY.md §2.1), as of its load or its last
    /// re-lift: read from the image's prefix hint, kept by [`Node::relift`], written back as the
    /// hint (salvage places orphans by it, §2.7) and used to order nodes by full keys for
    /// placement. Exact as long as no subtree moves under other pivots.
    pub prefix: Vec<u8>,
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

    /// Estimated memory footprint of what is resident: each partition, and each node image its
    /// partitions are read in place from, whole and once (`subbytes.rs`).
    pub fn mem(&self) -> usize {
        let mut images = crate::subbytes::ImageCharge::default();
        let mut parts = 0;
        for p in &self.parts {
            let st = p.state.lock();
            if let Some(d) = &st.data {
                parts += d.mem();
                images.add(d.part_bytes());
            }
            parts += 96 + st.runs.as_ref().map_or(0, |r| r.mem());
        }
        parts + images.mem() + pivot_bytes(&self.pivots) + self.pivots.len() * 24 + 128
    }

    /// All partitions, which must be resident.
    pub(crate) fn resident_parts(&self) -> Vec<Arc<Partition>> {
        self.parts
            .iter()
            .map(|p| p.data().expect("leaf partition must be resident here"))
            .collect()
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

impl Internal {
    /// Serialized size of all buffers.
    pub fn buffered_bytes(&self) -> usize {
        self.buffers.iter().map(|b| b.bytes()).sum()
    }

    /// Total serialized size.
    pub fn bytes(&self) -> usize {
        self.buffered_bytes() + pivot_bytes(&self.pivots) + self.children.len() * 31
    }

    /// Estimated memory footprint: each buffer, and each node image buffers are read in place
    /// from, whole and once (`subbytes.rs`).
    pub fn mem(&self) -> usize {
        let mut images = crate::subbytes::ImageCharge::default();
        let buffers: usize = self
            .buffers
            .iter()
            .map(|b| {
                b.charge_image(&mut images);
                b.mem()
            })
            .sum();
        buffers + images.mem() + pivot_bytes(&self.pivots) + self.children.len() * 128 + 128
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
    /// A copy of this node, which must be wholly in memory, for another owner
    /// (docs/SURGERY.md §4.3): the same contents, sharing the partitions and buffers (both are
    /// copied when changed), located nowhere on disk yet.
    pub fn copy_resident(&self) -> Node {
        assert!(
            self.fully_resident(),
            "a node is copied only when wholly in memory"
        );
        let body = match &self.body {
            Body::Leaf(l) => Body::Leaf(Leaf {
                pivots: l.pivots.clone(),
                parts: l
                    .parts
                    .iter()
                    .map(|p| PartSlot {
                        state: Mutex::new(PartState {
                            data: p.data(),
                            loc: None,
                            runs: None,
                            point_loaded: false,
                        }),
                        bytes: p.bytes,
                        entries: p.entries,
                    })
                    .collect(),
            }),
            Body::Internal(n) => Body::Internal(Internal {
                pivots: n.pivots.clone(),
                children: n.children.clone(),
                buffers: n.buffers.iter().map(BufSlot::copy).collect(),
            }),
        };
        Node {
            height: self.height,
            max_msn: self.max_msn,
            body,
            prefix: self.prefix.clone(),
        }
    }

    /// The out-of-line blocks this node (wholly in memory) references, one per reference: its
    /// entries' for a leaf, its buffered messages' for an internal node.
    pub fn ref_blocks(&self) -> Vec<u64> {
        let mut out = Vec::new();
        match &self.body {
            Body::Leaf(l) => {
                for p in &l.parts {
                    let p = p.data().expect("a leaf wholly in memory");
                    out.extend(p.ref_blocks(0, p.len()));
                }
            }
            Body::Internal(n) => {
                for b in &n.buffers {
                    out.extend(b.ref_blocks());
                }
            }
        }
        out
    }

    /// An empty leaf.
    pub fn empty_leaf() -> Node {
        Node {
            height: 0,
            max_msn: 0,
            body: Body::Leaf(Leaf::empty()),
            prefix: Vec::new(),
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

    /// Copies out the sub-blocks that lie in a node image this node's sub-blocks use only
    /// sparsely (`subbytes.rs`, half of it or less: a node changed or cut since it
    /// was read), so that it no longer charges, and keeps mapped, an image it mostly does not
    /// use. The cache calls it before it measures a node. Returns whether anything was copied.
    pub(crate) fn unshare_sparse_images(&self) -> bool {
        let mut charge = crate::subbytes::ImageCharge::default();
        match &self.body {
            Body::Leaf(l) => {
                for p in &l.parts {
                    if let Some(d) = &p.state.lock().data {
                        charge.add(d.part_bytes());
                    }
                }
                if !charge.any_sparse() {
                    return false;
                }
                for p in &l.parts {
                    let mut st = p.state.lock();
                    let own = match &st.data {
                        Some(d) if charge.is_sparse(d.part_bytes()) => d.unshared(),
                        _ => continue,
                    };
                    st.data = Some(Arc::new(own));
                }
            }
            Body::Internal(n) => {
                for b in &n.buffers {
                    b.charge_image(&mut charge);
                }
                if !charge.any_sparse() {
                    return false;
                }
                for b in &n.buffers {
                    b.unshare_if_sparse(&charge);
                }
            }
        }
        true
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
        // Computed after every change (cache accounting): no allocation.
        fn sum(
            pivots: &[Vec<u8>],
            desc_len: usize,
            raw_lens: impl Iterator<Item = usize>,
        ) -> (usize, usize) {
            let (mut n, mut body) = (0, 0);
            for r in raw_lens {
                n += 1;
                body += round_up(r.max(1));
            }
            // The prefix hint, pivots, descriptors.
            (2 + pivot_bytes(pivots) + n * desc_len, body)
        }
        let (index_len, body) = match &self.body {
            Body::Leaf(l) => sum(&l.pivots, 21, l.parts.iter().map(|p| p.bytes)),
            Body::Internal(n) => sum(
                &n.pivots,
                8 + 2 + 21,
                n.buffers.iter().map(|b| b.bytes() + BUFFER_HEADER),
            ),
        };
        round_up(HEADER_LEN + index_len + self.prefix.len()) + body
    }

    /// The exact length of the longest key this node holds, in its stored form, with its
    /// children's bounds for what lies below them: leaf entries, or point messages and child
    /// bounds (docs/SURGERY.md §2.6). Needs the node fully resident. A function of the node's
    /// contents (the point messages' keys are measured, not taken from a buffer's running
    /// bound, which stays high after its longest key is flushed down): the header of an
    /// unchanged node's image is the same before and after an eviction and reload.
    pub fn longest_stored(&self) -> usize {
        match &self.body {
            Body::Leaf(l) => l
                .resident_parts()
                .iter()
                .map(|p| (0..p.len()).map(|i| p.key(i).len()).max().unwrap_or(0))
                .max()
                .unwrap_or(0),
            Body::Internal(n) => n
                .buffers
                .iter()
                .map(|b| b.longest_point_key_held().max(b.longest as usize))
                .max()
                .unwrap_or(0),
        }
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
                    let Some(b) = slot.view() else { continue };
                    assert_eq!(b.bytes(), slot.bytes(), "node {id}: buffer {i} size");
                    let (lo, hi) = n.child_bounds(i, &[], None);
                    assert!(b.within(lo, hi), "node {id}: message in the wrong buffer");
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::KeyMsgs;

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
        let released = l.apply(&[], &points, &fmt());
        assert!(released.is_empty());
        l
    }

    pub(super) fn all_entries(l: &Leaf) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut out = Vec::new();
        for s in &l.parts {
            let p = s.data().unwrap();
            for i in 0..p.len() {
                out.push((p.key(i).to_vec(), p.value(i).raw().to_vec()));
            }
        }
        out
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
            prefix: Vec::new(),
        }
        .check_invariants(1);
    }
}
