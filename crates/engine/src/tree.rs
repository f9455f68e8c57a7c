//! The Bε-tree: its state, the modification protocol, and its jobs in submodules (an `impl Tree`
//! spans them):
//! - `tree/bounds.rs`: a node's key bounds during a descent and the lift of its keys;
//! - `tree/load.rs`: loading nodes, their partitions and buffers on demand;
//! - `tree/inject.rs`: message injection at the root and routing into child buffers;
//! - `tree/longest.rs`: the key-length bound of a key range, from the slots' bounds;
//! - `tree/flush.rs`: flushes of the heaviest child and passes over a key range (`drain_from`);
//! - `tree/split_merge.rs`: splits and merges (the root's shape and each child's after a flush);
//! - `tree/slice.rs`: slicing a key range into whole child slots of one node (docs/SURGERY.md);
//! - `tree/heal.rs`: merging the under-full fringe slicing leaves behind;
//! - `tree/share.rs`: shared nodes (reference counts above 1) and taking ownership of a child
//!   before changing it ([`Tree::own_child`]), and the test hook that shares subtrees;
//! - `tree/collect.rs`: freeing dead nodes (count 0) and what they reference, a bounded step at a
//!   time;
//! - `tree/snap.rs`: snapshots, copies of the root sharing its children (docs/SURGERY.md §4.7);
//! - `tree/surgery.rs`: tree surgery, operations that cut and graft whole subtrees (the range
//!   move, which moves every key under a prefix by swinging the subtrees that hold them to the
//!   other prefix's place), built on the modification protocol below ([`Tree::begin_modify`],
//!   [`Tree::end_modify`]), slicing and the helpers of `split_merge.rs`.
//!
//! Write-back and checkpoint images of nodes are in `writeback.rs`, reads in `read.rs`.
//!
//! Concurrency rules (see docs/DESIGN.md):
//! - Latches are taken top-down only. Readers couple read latches (parent held while the child is
//!   latched) and never hold a latch across a node load: on a miss they release everything, load, and
//!   restart from the root. Read latches are recursive, so readers never queue behind a writer.
//! - Every modifier holds `writers` shared; a checkpoint's start holds it exclusive, which gives the
//!   checkpoint a consistent cut between flush steps.
//! - A modification is bracketed by [`Tree::begin_modify`] (which first saves the node's image for a
//!   running checkpoint if the node is pending) and [`Tree::end_modify`] (dirty, version, memory).
//! - No latch is held during a node write; a written image is installed only if the node did not
//!   change meanwhile (version check).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use amaranth_device::AlignedBuf;
use parking_lot::{Mutex, RwLock};

use crate::cache::{Cache, CachedNode};
use crate::config::Format;
use crate::error::Result;
use crate::msg::{Msn, PointOp};
use crate::node::{Body, Leaf, Node, NodeId};
use crate::store::Store;
use crate::superblock::Extent;

mod bounds;
mod collect;
mod flush;
mod heal;
mod inject;
mod load;
mod longest;
mod readahead;
mod refs;
mod share;
mod slice;
mod snap;
mod split_merge;
mod surgery;

pub use readahead::ReadAhead;

pub(crate) use bounds::Bounds;
pub(crate) use bounds::{lift_len, LIFT_KEYS};

pub(crate) use load::check_header;

/// A message before it gets its sequence number.
#[derive(Clone, Debug)]
pub enum Msg {
    /// A message for one key.
    Point {
        /// The key.
        key: Vec<u8>,
        /// What to do.
        op: PointOp,
    },
    /// Delete `[lo, hi)`.
    Range {
        /// Inclusive low bound.
        lo: Vec<u8>,
        /// Exclusive high bound.
        hi: Vec<u8>,
    },
}

impl Msg {
    /// Serialized size, for accounting.
    pub fn size(&self) -> usize {
        match self {
            Msg::Point { key, op } => {
                key.len()
                    + match op {
                        PointOp::Put(v) => v.len() + 8,
                        PointOp::Delete => 8,
                        PointOp::Upsert(p) => p.size(),
                        PointOp::PutRef(r) => r.encoded_len() + 8,
                    }
            }
            Msg::Range { lo, hi } => lo.len() + hi.len() + 8,
        }
    }
}

/// Counters of tree activity.
#[derive(Debug, Default)]
pub struct TreeCounters {
    /// Buffer flushes into a child.
    pub flushes: AtomicU64,
    /// Bytes of messages moved by flushes.
    pub bytes_flushed: AtomicU64,
    /// Leaf splits (pieces created).
    pub leaf_splits: AtomicU64,
    /// Internal node splits.
    pub internal_splits: AtomicU64,
    /// Node merges.
    pub merges: AtomicU64,
    /// Range moves done by surgery.
    pub range_moves: AtomicU64,
    /// Nodes of dead destination subtrees released by range moves.
    pub range_move_released: AtomicU64,
    /// Range clones done by surgery (shared subtrees grafted).
    pub range_clones: AtomicU64,
    /// Shared nodes copied for one owner before a change (copy-on-write).
    pub cow_copies: AtomicU64,
    /// Dead nodes freed by the collector.
    pub collected: AtomicU64,
    /// Subtrees a range delete covered whole, let go instead of flushed into.
    pub subtrees_dropped: AtomicU64,
    /// Run slots queued to be flushed into their subtrees after a range move.
    pub range_move_drains: AtomicU64,
    /// Leaf entry bytes rewritten into another prefix by cuts, splits and merges.
    pub leaf_bytes_relifted: AtomicU64,
    /// Moved run slots whose messages' key rewrite was left pending (`node/slot.rs`).
    pub rekeys_deferred: AtomicU64,
    /// Moved run slots whose pending key rewrite the move undid (it composed to nothing).
    pub rekeys_cancelled: AtomicU64,
    /// Snapshots taken (roots copied).
    pub snapshots_taken: AtomicU64,
    /// Images of pending nodes that their modifiers wrote for the running checkpoint themselves,
    /// the cache being full (see [`Tree::begin_modify`]).
    pub checkpoint_images_written_early: AtomicU64,
    /// Messages injected at the root.
    pub messages: AtomicU64,
    /// Bytes of user data in injected messages.
    pub user_bytes: AtomicU64,
}

/// What a flush step needs loaded before it can go on.
enum Need {
    Node(NodeId),
    Partitions(Arc<CachedNode>),
}

/// The state a running checkpoint needs of a node that changed before the checkpoint wrote it.
pub enum SavedImage {
    /// Its image, held in memory (and charged to the cache) until the checkpoint writes it.
    Held(AlignedBuf),
    /// Its image, already written at this extent by the thread that changed the node, because
    /// holding it would have taken the cache past its eviction point; the extent is recorded in
    /// the checkpoint's table and held for adoption as the checkpoint would have done.
    Written(Extent),
}

/// The tree: its nodes (through the cache), its space and its counters.
pub struct Tree {
    /// Format parameters.
    pub format: Format,
    /// Device, table and allocator.
    pub store: Arc<Store>,
    /// Resident nodes.
    pub cache: Cache,
    /// Held shared by every modification; exclusive at a checkpoint's start and during prefix moves.
    pub writers: RwLock<()>,
    /// Next node id.
    pub next_node_id: AtomicU64,
    /// Next message sequence number (advanced under the root's write latch).
    pub next_msn: AtomicU64,
    /// Images of pending nodes saved by modifiers for the running checkpoint, with the extent
    /// each node was at then. The checkpoint takes this lock to write the last of them, so an
    /// image being written early under it (see [`SavedImage::Written`]) is in the checkpoint.
    pub ckpt_queue: Mutex<Vec<(NodeId, SavedImage, Option<Extent>)>>,
    /// Counters.
    pub counters: TreeCounters,
    /// Check each node's invariants whenever it changes ([`Options::check_invariants`]).
    ///
    /// [`Options::check_invariants`]: crate::Options::check_invariants
    pub check_invariants: bool,
    /// Nothing may be written to the device: modifications are refused and eviction keeps dirty
    /// nodes (a read-only open or remount).
    read_only: AtomicBool,
    /// Read-ahead for sequential scans (`tree/readahead.rs`).
    pub readahead: ReadAhead,
    /// Keys some node was cut at, whose under-full fringe waits to be healed (`tree/heal.rs`).
    heal: Mutex<BTreeSet<Vec<u8>>>,
    /// First keys of moved runs' heavy slots, flushed into their subtrees once writes pause
    /// (`tree/heal.rs`).
    drains: Mutex<BTreeSet<Vec<u8>>>,
    /// The bounds of ranges moved or cloned lately, where a heal merges only cheaply
    /// (`tree/heal.rs`).
    moved_edges: Mutex<heal::MovedEdges>,
    /// The ranges moves emptied lately, kept as slots of their own for a range moved back
    /// (`tree/heal.rs`).
    kept_holes: Mutex<heal::KeptHoles>,
    /// The bytes that end a unit of the caller's key structure, where leaf splits prefer to cut
    /// (docs/SURGERY.md §3.5); empty: plain splits.
    pub split_boundaries: RwLock<Vec<u8>>,
    /// Subtrees the test hook holds a reference to (`tree/share.rs`).
    holds: Mutex<Vec<share::Hold>>,
    /// Held by a collection of dead nodes for its whole step (`tree/collect.rs`): the cleaner,
    /// a pass pushing range deletes down and a range move all collect, and two of them taking
    /// the same dead ids freed a node twice.
    collecting: Mutex<()>,
    /// The snapshots and their roots (`snapshot.rs`), changed only under `writers` exclusive.
    pub(crate) snapshots: Mutex<crate::snapshot::Catalog>,
}

impl Tree {
    /// A tree over `store`.
    pub fn new(
        format: Format,
        store: Arc<Store>,
        cache_size: usize,
        next_node_id: u64,
        next_msn: Msn,
    ) -> Tree {
        let node_size = format.node_size;
        Tree {
            format,
            store,
            cache: Cache::new(cache_size, node_size),
            writers: RwLock::new(()),
            next_node_id: AtomicU64::new(next_node_id),
            next_msn: AtomicU64::new(next_msn),
            ckpt_queue: Mutex::new(Vec::new()),
            counters: TreeCounters::default(),
            check_invariants: cfg!(debug_assertions),
            read_only: AtomicBool::new(false),
            readahead: ReadAhead::default(),
            heal: Mutex::new(BTreeSet::new()),
            drains: Mutex::new(BTreeSet::new()),
            moved_edges: Mutex::new(heal::MovedEdges::default()),
            kept_holes: Mutex::new(heal::KeptHoles::default()),
            split_boundaries: RwLock::new(Vec::new()),
            holds: Mutex::new(Vec::new()),
            collecting: Mutex::new(()),
            snapshots: Mutex::new(crate::snapshot::Catalog::default()),
        }
    }

    /// Whether nothing may be written to the device.
    pub fn is_read_only(&self) -> bool {
        self.read_only.load(Ordering::Acquire)
    }

    /// Allows or forbids writing to the device (the engine switches modes with writers held off).
    pub fn set_read_only(&self, read_only: bool) {
        self.read_only.store(read_only, Ordering::Release);
    }

    // ----- node residency -------------------------------------------------------------------

    /// Call before changing a node under its write latch: if a running checkpoint still needs the
    /// node's current state, save its image first. The node must not be shared (asserted): the
    /// modifier took ownership of it first ([`Tree::own_child`]).
    pub fn begin_modify(&self, cn: &CachedNode, node: &Node) {
        assert!(
            !self.is_shared(cn.id),
            "node {} is shared: it is copied for its owner before a change (Tree::own_child)",
            cn.id
        );
        if !cn.meta.lock().pending {
            return;
        }
        let mut q = self.ckpt_queue.lock();
        {
            let mut m = cn.meta.lock();
            if !m.pending {
                return;
            }
            m.pending = false;
        }
        self.save_for_checkpoint(&mut q, cn, node);
    }

    /// Call after changing a node: marks it dirty, bumps its version, re-measures its memory.
    pub fn end_modify(&self, cn: &CachedNode, node: &Node) {
        if self.check_invariants {
            node.check_invariants(cn.id);
        }
        // A dirty node is written whole: every sub-block must be in memory (a modifier that
        // loaded only a skeleton must not get here).
        assert!(
            node.fully_resident(),
            "node {} changed while not wholly in memory",
            cn.id
        );
        {
            let mut m = cn.meta.lock();
            assert!(!m.deleted, "modifying deleted node {}", cn.id);
            m.dirty = true;
            m.version += 1;
        }
        self.cache.remeasure(cn, node);
    }

    pub(super) fn new_node(&self, node: Node) -> NodeId {
        let id = self.next_node_id.fetch_add(1, Ordering::Relaxed);
        if self.check_invariants {
            node.check_invariants(id);
        }
        self.cache.insert(id, node, true, 0);
        id
    }

    pub(super) fn delete_node(&self, cn: &CachedNode, node: &mut Node) -> Result<()> {
        self.begin_modify(cn, node);
        cn.meta.lock().deleted = true;
        node.body = Body::Leaf(Leaf::empty());
        self.cache.forget(cn);
        self.store.btt.lock().remove(cn.id);
        Ok(())
    }

    // ----- injection --------------------------------------------------------------------------
}
