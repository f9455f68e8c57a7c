//! The node cache: nodes in memory, their latches, and the byte accounting behind the memory bound.
//!
//! Every resident node is an `Arc<CachedNode>` in one map. Holding a clone of the `Arc` pins the
//! node (the evictor only removes nodes nobody else holds). Content is behind a reader-writer latch;
//! bookkeeping (dirty, version, pending-checkpoint, accounted bytes) is behind a small mutex so it
//! can change without the latch.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::lock_api::{ArcRwLockReadGuard, ArcRwLockWriteGuard};
use parking_lot::{Condvar, Mutex, RawRwLock, RwLock};

use crate::node::{Node, NodeId};

/// Nodes' worth of headroom below the bound before eviction starts: what the accounted usage can
/// grow by between two calls of `make_room`, since none of it waits for eviction.
/// - One flush step: up to four nodes (the child loaded whole, the delivered messages rebuilt into
///   partitions before the old ones go, the nodes a split makes): measured 14 MiB above the point
///   with 4 MiB nodes.
/// - Node images being written, counted while they are in memory: the checkpoint's current one
///   and the one eviction is writing back, each up to two nodes (a root may hold twice a node's
///   bytes before it must flush; a 9.7 MiB write-back image was recorded).
///
/// With four nodes of headroom the accounted peak passed the bound by 0.7 MiB in one CI run of
/// `memory_bound::memory_held_outside_shrinks_the_nodes_budget` (48 MiB budget), and instrumented
/// runs found the largest excursions above the point (13-17 MiB) while the checkpoint or an
/// eviction was writing an image beside a flush step.
pub const HEADROOM_NODES: usize = 8;

/// Blocks of the image a node would be written as.
fn image_blocks(node: &Node) -> u64 {
    node.image_len().div_ceil(amaranth_device::BLOCK_SIZE) as u64
}

/// A read latch on a node, owned (can be held while moving to the next node).
pub type ReadGuard = ArcRwLockReadGuard<RawRwLock, Node>;
/// A write latch on a node.
pub type WriteGuard = ArcRwLockWriteGuard<RawRwLock, Node>;

/// Bookkeeping of a cached node.
#[derive(Debug, Default)]
pub struct NodeMeta {
    /// Changed since last written.
    pub dirty: bool,
    /// Dirty when the running checkpoint began and not yet written for it.
    pub pending: bool,
    /// Incremented by every modification.
    pub version: u64,
    /// Bytes currently counted against the cache bound.
    pub mem: usize,
    /// Merged away: must never be written or reloaded.
    pub deleted: bool,
    /// Blocks of the node's current image on disk (0: never written).
    pub disk_blocks: u64,
    /// What this node adds to the cache's dirty totals now: (estimated blocks of its next image,
    /// blocks of its current image) while dirty, (0, 0) otherwise. See [`Cache::recharge`].
    charged: (u64, u64),
}

/// A node in the cache.
#[derive(Debug)]
pub struct CachedNode {
    /// The node's id.
    pub id: NodeId,
    /// The contents.
    pub latch: Arc<RwLock<Node>>,
    /// Bookkeeping.
    pub meta: Mutex<NodeMeta>,
    /// Logical time of the last use (for LRU eviction).
    pub last_used: AtomicU64,
    /// Held while sub-blocks are read into the node, so that two readers wanting parts of the same
    /// node (concurrent FUSE reads of one file) do not both read it: the second waits and finds
    /// them loaded.
    pub subblock_load: Mutex<()>,
    /// Read ahead (whole, in the background) and not yet used by a scan.
    pub prefetched: AtomicBool,
}

impl CachedNode {
    /// Read latch that never queues behind a waiting writer (readers must not wait for writers).
    pub fn read(&self) -> ReadGuard {
        self.latch.read_arc_recursive()
    }
    /// Write latch.
    pub fn write(&self) -> WriteGuard {
        self.latch.write_arc()
    }
    /// Read latch if it can be had without waiting (eviction: see [`crate::tree::Tree::make_room`]).
    pub fn try_read(&self) -> Option<ReadGuard> {
        self.latch.try_read_recursive_arc()
    }
    /// Write latch if it can be had without waiting.
    pub fn try_write(&self) -> Option<WriteGuard> {
        self.latch.try_write_arc()
    }
    /// Whether the node is dirty.
    pub fn is_dirty(&self) -> bool {
        self.meta.lock().dirty
    }
}

/// Counters of cache activity.
#[derive(Debug, Default)]
pub struct CacheCounters {
    /// Node lookups answered from memory.
    pub hits: AtomicU64,
    /// Node loads from disk.
    pub misses: AtomicU64,
    /// Sub-block loads from disk (leaf partitions and internal-node buffers).
    pub partition_loads: AtomicU64,
    /// Of those, internal-node buffers.
    pub buffer_loads: AtomicU64,
    /// Point queries answered from one run of a shed partition (`node/runs.rs`).
    pub run_reads: AtomicU64,
    /// Point queries that read one run of a shed child buffer (`node/runs.rs`).
    pub buffer_run_reads: AtomicU64,
    /// Nodes evicted.
    pub evictions: AtomicU64,
    /// Dirty nodes written back by eviction.
    pub writebacks: AtomicU64,
    /// Nodes the running checkpoint had still to write, written for it by eviction.
    pub checkpoint_writes_for_eviction: AtomicU64,
    /// Highest accounted usage seen.
    pub peak: AtomicUsize,
    /// Leaves read ahead for a sequential scan.
    pub prefetch_loads: AtomicU64,
    /// Leaves read ahead that a scan then used (first use only).
    pub prefetch_hits: AtomicU64,
    /// Leaves read ahead whose partitions were shed (or the node evicted) before any use.
    pub prefetch_shed: AtomicU64,
}

/// What the dirty nodes will take on disk once written (in blocks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirtySpace {
    /// Blocks the dirty nodes' next images will take (exact without compression, else an upper
    /// bound).
    pub next_blocks: u64,
    /// Blocks of the dirty nodes' current images: rewriting a node leaves its old image allocated
    /// until the next checkpoint completes (when the last checkpoint references it).
    pub current_blocks: u64,
}

/// The cache of nodes.
#[derive(Debug)]
pub struct Cache {
    map: Mutex<HashMap<NodeId, Arc<CachedNode>>>,
    loading: Mutex<HashSet<NodeId>>,
    loaded: Condvar,
    used: AtomicUsize,
    /// Sum of every node's `charged.0` and `charged.1`.
    dirty_next: AtomicU64,
    dirty_current: AtomicU64,
    budget: usize,
    /// Memory held outside the engine that the bound covers too (the file system's inode table):
    /// nodes get the budget less this, down to `floor`.
    external: AtomicUsize,
    /// The least the nodes keep of the budget, however much is held outside.
    floor: usize,
    node_size: usize,
    tick: AtomicU64,
    /// Activity counters.
    pub counters: CacheCounters,
}

impl Cache {
    /// An empty cache bounded to `budget` bytes.
    pub fn new(budget: usize, node_size: usize) -> Cache {
        Cache {
            map: Mutex::new(HashMap::new()),
            loading: Mutex::new(HashSet::new()),
            loaded: Condvar::new(),
            used: AtomicUsize::new(0),
            dirty_next: AtomicU64::new(0),
            dirty_current: AtomicU64::new(0),
            budget,
            external: AtomicUsize::new(0),
            floor: (budget / 2).max((8 * node_size).min(budget)),
            node_size,
            tick: AtomicU64::new(0),
            counters: CacheCounters::default(),
        }
    }

    /// The memory bound.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Bytes accounted now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Whether usage is above the bound.
    pub fn over_budget(&self) -> bool {
        self.used() > self.eviction_point()
    }

    /// Records the bytes held outside the engine that the bound covers as well.
    pub fn set_external(&self, bytes: usize) {
        self.external.store(bytes, Ordering::Relaxed);
    }

    /// Bytes held outside the engine, as last recorded.
    pub fn external(&self) -> usize {
        self.external.load(Ordering::Relaxed)
    }

    /// How much of the budget memory held outside may take before the nodes reach their floor.
    pub fn external_allowance(&self) -> usize {
        self.budget - self.floor
    }

    /// What the nodes may use now: the budget less what is held outside, at least the floor.
    pub fn node_budget(&self) -> usize {
        self.budget - self.external().min(self.external_allowance())
    }

    /// Usage above which eviction starts: the nodes' budget less the headroom for what can grow
    /// between two calls of `make_room` ([`HEADROOM_NODES`] nodes, up to half the nodes' budget).
    pub fn eviction_point(&self) -> usize {
        let nodes = self.node_budget();
        nodes - (nodes / 2).min(HEADROOM_NODES * self.node_size)
    }

    /// Marks `cn` as just used (it goes last in the eviction order).
    pub(crate) fn touch(&self, cn: &CachedNode) {
        cn.last_used
            .store(self.tick.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
    }

    /// The node if it is in memory, without counting a use (pinned by the returned `Arc`).
    pub fn peek(&self, id: NodeId) -> Option<Arc<CachedNode>> {
        self.map.lock().get(&id).cloned()
    }

    /// The node if it is in memory (a use: it becomes the most recently used, and counts a hit).
    pub fn get(&self, id: NodeId) -> Option<Arc<CachedNode>> {
        let cn = self.map.lock().get(&id).cloned();
        if let Some(c) = &cn {
            self.touch(c);
            self.counters.hits.fetch_add(1, Ordering::Relaxed);
        }
        cn
    }

    /// Inserts a node (new, or just loaded from an image of `disk_blocks` blocks) and accounts
    /// its memory and, if dirty, its space.
    pub fn insert(&self, id: NodeId, node: Node, dirty: bool, disk_blocks: u64) -> Arc<CachedNode> {
        self.insert_with(id, node, dirty, disk_blocks, false)
    }

    /// Inserts a clean leaf just read ahead: marked before anyone can see it, so that the first
    /// scan to use it counts a hit.
    pub(crate) fn insert_read_ahead(
        &self,
        id: NodeId,
        node: Node,
        disk_blocks: u64,
    ) -> Arc<CachedNode> {
        self.insert_with(id, node, false, disk_blocks, true)
    }

    fn insert_with(
        &self,
        id: NodeId,
        node: Node,
        dirty: bool,
        disk_blocks: u64,
        read_ahead: bool,
    ) -> Arc<CachedNode> {
        node.unshare_sparse_images();
        let mem = node.mem();
        let next = image_blocks(&node);
        let mut meta = NodeMeta {
            dirty,
            pending: false,
            version: 1,
            mem,
            deleted: false,
            disk_blocks,
            charged: (0, 0),
        };
        self.recharge(&mut meta, next);
        let cn = Arc::new(CachedNode {
            id,
            latch: Arc::new(RwLock::new(node)),
            meta: Mutex::new(meta),
            last_used: AtomicU64::new(0),
            subblock_load: Mutex::new(()),
            prefetched: AtomicBool::new(read_ahead),
        });
        self.touch(&cn);
        let prev = self.map.lock().insert(id, cn.clone());
        assert!(prev.is_none(), "node {id} inserted twice into the cache");
        self.add_used(mem as isize);
        cn
    }

    /// Adjusts the accounted bytes.
    pub fn add_used(&self, delta: isize) {
        if delta >= 0 {
            let now = self.used.fetch_add(delta as usize, Ordering::Relaxed) + delta as usize;
            self.counters.peak.fetch_max(now, Ordering::Relaxed);
        } else {
            self.used.fetch_sub((-delta) as usize, Ordering::Relaxed);
        }
    }

    /// Re-measures a node after a change and adjusts the accounting (memory, and space if dirty).
    pub fn remeasure(&self, cn: &CachedNode, node: &Node) {
        node.unshare_sparse_images();
        let new = node.mem();
        let next = image_blocks(node);
        let mut m = cn.meta.lock();
        let old = std::mem::replace(&mut m.mem, new);
        self.recharge(&mut m, next);
        drop(m);
        self.add_used(new as isize - old as isize);
    }

    /// Brings the dirty totals up to date with `m` (after its dirty, deleted or disk image
    /// changed): a dirty node counts `next_blocks` (its next image) and its current image's
    /// blocks; a clean or deleted one nothing.
    pub fn recharge(&self, m: &mut NodeMeta, next_blocks: u64) {
        let now = if m.dirty && !m.deleted {
            (next_blocks, m.disk_blocks)
        } else {
            (0, 0)
        };
        let (old_next, old_cur) = std::mem::replace(&mut m.charged, now);
        self.dirty_next.fetch_add(now.0, Ordering::Relaxed);
        self.dirty_next.fetch_sub(old_next, Ordering::Relaxed);
        self.dirty_current.fetch_add(now.1, Ordering::Relaxed);
        self.dirty_current.fetch_sub(old_cur, Ordering::Relaxed);
    }

    /// Records that the node's current image now has `blocks` blocks (its next image unchanged).
    pub fn set_disk_blocks(&self, m: &mut NodeMeta, blocks: u64) {
        m.disk_blocks = blocks;
        let next = m.charged.0;
        self.recharge(m, next);
    }

    /// What the dirty nodes will take on disk (a moment's view: writers change it concurrently).
    pub fn dirty_space(&self) -> DirtySpace {
        // Add before subtract in `recharge`: a concurrent reader may see a transient excess,
        // never a wrap below zero.
        DirtySpace {
            next_blocks: self.dirty_next.load(Ordering::Relaxed),
            current_blocks: self.dirty_current.load(Ordering::Relaxed),
        }
    }

    /// Recounts what the dirty nodes will take from the nodes themselves (walks the cache, taking
    /// each node's read latch: for checks only).
    pub fn recount_dirty_space(&self) -> DirtySpace {
        let mut d = DirtySpace::default();
        for cn in self.all() {
            let g = cn.read();
            let m = cn.meta.lock();
            if m.dirty && !m.deleted {
                d.next_blocks += image_blocks(&g);
                d.current_blocks += m.disk_blocks;
            }
        }
        d
    }

    /// Removes a node from the map (merged away); its memory and space are no longer counted.
    pub fn forget(&self, cn: &CachedNode) {
        self.map.lock().remove(&cn.id);
        let mut m = cn.meta.lock();
        assert!(m.deleted, "forgetting node {} that is not deleted", cn.id);
        self.recharge(&mut m, 0);
        let mem = std::mem::take(&mut m.mem);
        drop(m);
        self.add_used(-(mem as isize));
    }

    /// Removes `cn` if nobody but the caller (holding `cn`) pins it and it is clean and not pending.
    pub fn evict_if_idle(&self, cn: &Arc<CachedNode>) -> bool {
        let mut map = self.map.lock();
        // One reference in the map, one held by the caller.
        if Arc::strong_count(cn) != 2 {
            return false;
        }
        let mut m = cn.meta.lock();
        if m.dirty || m.pending {
            return false;
        }
        map.remove(&cn.id);
        if cn.prefetched.swap(false, Ordering::Relaxed) {
            self.counters.prefetch_shed.fetch_add(1, Ordering::Relaxed);
        }
        let mem = std::mem::take(&mut m.mem);
        drop(m);
        drop(map);
        self.add_used(-(mem as isize));
        self.counters.evictions.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Whether `cn` is pinned by anyone but the map and the `held` references the caller knows
    /// of. Checked under the map's lock, where every pin is taken ([`Cache::get`],
    /// [`Cache::peek`]), as [`Cache::evict_if_idle`] does.
    pub fn pinned_by_others(&self, cn: &Arc<CachedNode>, held: usize) -> bool {
        let _map = self.map.lock();
        Arc::strong_count(cn) > 1 + held
    }

    /// Eviction candidates, least recently used first: nodes nobody pins.
    pub fn victims(&self) -> Vec<Arc<CachedNode>> {
        let map = self.map.lock();
        let v: Vec<Arc<CachedNode>> = map
            .values()
            .filter(|c| Arc::strong_count(c) == 1)
            .cloned()
            .collect();
        drop(map);
        // Keys read once: readers bump `last_used` concurrently, and a sort whose keys change
        // under it has no total order (the standard sort may panic on that).
        let mut keyed: Vec<(u64, Arc<CachedNode>)> = v
            .into_iter()
            .map(|c| (c.last_used.load(Ordering::Relaxed), c))
            .collect();
        keyed.sort_by_key(|(t, _)| *t);
        keyed.into_iter().map(|(_, c)| c).collect()
    }

    /// Every resident node.
    pub fn all(&self) -> Vec<Arc<CachedNode>> {
        self.map.lock().values().cloned().collect()
    }

    /// Claims the right to load `id`. Returns `Ok(node)` if it became resident meanwhile, `Err(())`
    /// when the caller must load it (and then call [`Cache::finish_load`]).
    pub fn begin_load(&self, id: NodeId) -> Result<Arc<CachedNode>, ()> {
        let mut loading = self.loading.lock();
        loop {
            if let Some(cn) = self.get(id) {
                return Ok(cn);
            }
            if !loading.contains(&id) {
                loading.insert(id);
                self.counters.misses.fetch_add(1, Ordering::Relaxed);
                return Err(());
            }
            self.loaded.wait(&mut loading);
        }
    }

    /// Starts a load of node `id` only if it is neither in memory nor being loaded by someone
    /// else (read-ahead never loads what a reader is loading). End it with [`Cache::finish_load`].
    pub(crate) fn try_begin_load(&self, id: NodeId) -> bool {
        let mut loading = self.loading.lock();
        if self.map.lock().contains_key(&id) || !loading.insert(id) {
            return false;
        }
        self.counters.misses.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Ends a load started by [`Cache::begin_load`] (successful or not).
    pub fn finish_load(&self, id: NodeId) {
        self.loading.lock().remove(&id);
        self.loaded.notify_all();
    }
}
