//! Writing nodes: eviction under the memory bound and the node writes of a checkpoint.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::cache::{CachedNode, WriteGuard};
use crate::error::Result;
use crate::node::{self, Body, NodeId, SubLoc};
use crate::store::Placement;
use crate::superblock::Extent;
use crate::tree::{SavedImage, Tree};

impl Tree {
    /// Once usage is over the eviction point (the bound less the headroom of one operation),
    /// sheds clean sub-blocks least recently used first until usage is [`crate::bufpool::POOL_BYTES`]
    /// below the point (or 90% of it, whichever is lower), and if that is not enough evicts least
    /// recently used nodes (writing dirty ones back) until usage is below 90% of the point.
    ///
    /// Never waits for a victim's latch, so it may be called with latches held (a flush loads a
    /// child under its parent's write latch): a victim is a node nobody pinned when the list was
    /// taken, but another thread may pin and latch it right after, and then wait for a latch the
    /// caller holds. Waiting for the victim closed that cycle (seen: the cleaner, write-latching
    /// a node it had descended to, loaded that node's child and waited here for the root's read
    /// latch, while a writer held the root and waited for that node). A victim latched by someone
    /// is in use: it is skipped, as `evict_if_idle` would refuse it anyway.
    pub fn make_room(&self) -> Result<()> {
        if !self.cache.over_budget() {
            return Ok(());
        }
        let ep = self.cache.eviction_point();
        // Clean sub-blocks go in steps no larger than the partition buffer pool, so that the
        // memory of the partitions shed is handed to the next ones decoded rather than unmapped
        // (`bufpool.rs`: a cold sequential read sheds as fast as it loads).
        let shed_target = (ep / 10 * 9).max(ep.saturating_sub(crate::bufpool::POOL_BYTES));
        self.evict_to(shed_target, Some(ep / 10 * 9), false)
    }

    /// Makes room, before a batch is applied, for the memory its messages will take in the root
    /// (`mem`), when that is more than a node: the headroom below the bound
    /// ([`crate::cache::HEADROOM_NODES`]) covers what one operation adds between two calls of
    /// [`Tree::make_room`], and a batch larger than a node (possible with small nodes: a batch may
    /// fill a log record) would otherwise pass the bound by its own size. Evicts whole nodes
    /// (writing dirty ones back) as [`Tree::make_room`] does.
    pub(crate) fn make_room_for_batch(&self, mem: usize) -> Result<()> {
        if mem <= self.format.node_size {
            return Ok(());
        }
        let ep = self.cache.eviction_point();
        if self.cache.used() + mem <= ep {
            return Ok(());
        }
        let target = ep.saturating_sub(mem) / 10 * 9;
        self.evict_to(target, Some(target), false)
    }

    /// Makes room for `bytes` more below the eviction point by shedding clean sub-blocks only,
    /// least recently used first (never writing a node back). For read-ahead, which loads only
    /// into room below the eviction point: once the cache is full, a sequential read would
    /// otherwise find no room and load its leaves itself. Returns whether the room is there.
    pub(crate) fn make_room_for(&self, bytes: usize) -> Result<bool> {
        let ep = self.cache.eviction_point();
        if self.cache.used() + bytes <= ep {
            return Ok(true);
        }
        self.evict_to(ep.saturating_sub(bytes), None, true)?;
        Ok(self.cache.used() + bytes <= ep)
    }

    /// Sheds clean sub-blocks until usage is at most `shed_target`; then, if `target` is given,
    /// evicts whole nodes (writing dirty ones back) until usage is at most `target`.
    ///
    /// The leaves sequential readers are in or about to read
    /// ([`crate::tree::ReadAhead::readers_windows`]) go after every other node, and leaves read
    /// ahead and not yet used after those; neither is shed when `keep_read_ahead` (read-ahead
    /// making room for its next leaf: shedding what a reader is reading or will read next, for a
    /// leaf further on, only read it twice).
    fn evict_to(
        &self,
        shed_target: usize,
        target: Option<usize>,
        keep_read_ahead: bool,
    ) -> Result<()> {
        // Least recently used first, and within that order leaves before internal nodes: every
        // query passes through the internal levels (a small fraction of the tree), so their
        // buffers are worth far more per byte than a leaf partition.
        let (victims, heights): (Vec<Arc<CachedNode>>, Vec<u32>) = self
            .cache
            .victims()
            .into_iter()
            .filter_map(|cn| {
                let h = cn.try_read()?.height;
                Some((cn, h))
            })
            .unzip();
        let max_height = heights.iter().copied().max().unwrap_or(0);
        let by_level = || {
            (0..=max_height).flat_map(|h| {
                victims
                    .iter()
                    .zip(&heights)
                    .filter(move |(_, &vh)| vh == h)
                    .map(|(cn, _)| cn)
            })
        };
        // First drop the partitions and buffers of cold clean nodes (their skeletons stay: a later
        // point query reads just the sub-block it needs), then whole nodes.
        let readers = self.readahead.readers_windows();
        let rank = |cn: &Arc<CachedNode>| {
            if cn.prefetched.load(Ordering::Relaxed) {
                2
            } else if readers.contains(&cn.id) {
                1
            } else {
                0
            }
        };
        let ranked: Vec<(&Arc<CachedNode>, u8)> = by_level().map(|cn| (cn, rank(cn))).collect();
        let in_order = || (0..3u8).flat_map(|r| ranked.iter().filter(move |(_, k)| *k == r));
        let sheddable = in_order().filter(|(_, k)| *k == 0 || !keep_read_ahead);
        for (cn, _) in sheddable {
            if self.cache.used() <= shed_target {
                return Ok(());
            }
            self.shed(cn);
        }
        let Some(target) = target else {
            return Ok(());
        };
        // Nodes written back here go one after another into one run of free space (in the
        // order they are evicted), rather than each into the smallest hole that holds it.
        let mut run = Placement::new(self.cache.dirty_space().next_blocks);
        for (cn, _) in in_order() {
            if self.cache.used() <= target {
                break;
            }
            let (deleted, pending) = {
                let m = cn.meta.lock();
                (m.deleted, m.pending)
            };
            if deleted {
                continue;
            }
            if pending {
                // The running checkpoint still has to write it: do that for it, or a cache full
                // of such nodes (all dirty when the checkpoint began) could evict nothing until
                // the checkpoint got to them.
                if self.is_read_only() {
                    continue;
                }
                self.write_pending_for_eviction(cn)?;
            }
            if cn.is_dirty() {
                if self.is_read_only() {
                    // Nothing is written: a dirty node (replayed from the log) stays in memory.
                    continue;
                }
                self.write_back(cn, Some(&mut run))?;
                self.cache
                    .counters
                    .writebacks
                    .fetch_add(1, Ordering::Relaxed);
            }
            self.cache.evict_if_idle(cn);
        }
        Ok(())
    }

    /// Drops the in-memory copies of a clean node's sub-blocks that are on disk. Returns whether
    /// anything was dropped.
    fn shed(&self, cn: &Arc<CachedNode>) -> bool {
        // Not waiting: see `make_room`. The write latch, and no pin but the map's and the
        // caller's (checked under the map's lock, where pins are taken): a thread that pinned the
        // node has made it whole, or is about to check that under a latch, and then changes it
        // under its write latch. Shedding behind its back between the two (under a read latch, as
        // before) left a node being changed without its partitions: the cleaner's pass pushing
        // range deletes down panicked in the middle of a delivery (aging run, 2026-11-27).
        let Some(g) = cn.try_write() else {
            return false;
        };
        if self.cache.pinned_by_others(cn, 1) {
            return false;
        }
        {
            let m = cn.meta.lock();
            if m.dirty || m.pending || m.deleted {
                return false;
            }
        }
        let mut dropped = false;
        match &g.body {
            Body::Leaf(l) => {
                for slot in &l.parts {
                    let mut st = slot.state.lock();
                    if let (Some(data), Some(loc)) = (&st.data, st.loc) {
                        // What a point query needs to read only a run of it later, if a
                        // point query read it (`PartState::point_loaded`).
                        st.runs = if st.point_loaded {
                            crate::node::ShedRuns::build(data, loc).map(Arc::new)
                        } else {
                            None
                        };
                        st.point_loaded = false;
                        st.data = None;
                        dropped = true;
                    }
                }
            }
            Body::Internal(n) => {
                for slot in &n.buffers {
                    dropped |= slot.drop_if_written();
                }
            }
        }
        if dropped {
            if cn.prefetched.swap(false, Ordering::Relaxed) {
                self.cache
                    .counters
                    .prefetch_shed
                    .fetch_add(1, Ordering::Relaxed);
            }
            self.cache.remeasure(cn, &g);
        }
        dropped
    }

    /// Writes a dirty node to a new extent (the next of `run` if given) and, if it did not change
    /// meanwhile, marks it clean there. For eviction: it never waits for the node's latch (see
    /// [`Tree::make_room`]); a node latched by someone is left dirty, to be written later.
    pub fn write_back(&self, cn: &Arc<CachedNode>, run: Option<&mut Placement>) -> Result<()> {
        let Some(g) = cn.try_read() else {
            return Ok(());
        };
        let version = {
            let m = cn.meta.lock();
            if !m.dirty || m.deleted || m.pending {
                return Ok(());
            }
            m.version
        };
        // The meta says dirty under the read latch, and only a write latch makes a node clean
        // (`install`) or drops its sub-blocks (`shed` takes clean nodes only).
        assert!(g.fully_resident(), "a dirty node is always fully resident");
        let img = node::serialize(cn.id, &g, self.format.compression);
        drop(g);
        // The image is memory too while it is written (up to a node per writing thread).
        self.cache.add_used(img.buf.len() as isize);
        let r = self
            .store
            .write_placed(&img.buf, &format!("node {}", cn.id), run);
        self.cache.add_used(-(img.buf.len() as isize));
        let ext = r?;
        // Not waiting for the write latch either: a reader may hold the node's read latch while it
        // waits for a child this thread's caller holds. The image is then dropped, as when the
        // node changed during the write.
        match cn.try_write() {
            Some(g) => self.install(cn, g, version, ext, &img.sublocs, false),
            None => {
                let mut btt = self.store.btt.lock();
                btt.written(ext);
                btt.release(cn.id, ext);
            }
        }
        Ok(())
    }

    /// Records a written image of `cn` taken at `version`. If the node is unchanged it becomes clean
    /// at `ext`; otherwise the image is dropped (or, for a checkpoint image, kept only by the
    /// checkpoint's table).
    /// `g` is the node's write latch: taking it waited for partition loads that read the old
    /// extent.
    fn install(
        &self,
        cn: &CachedNode,
        g: WriteGuard,
        version: u64,
        ext: Extent,
        sublocs: &[SubLoc],
        for_checkpoint: bool,
    ) {
        let mut m = cn.meta.lock();
        let mut btt = self.store.btt.lock();
        btt.written(ext);
        if for_checkpoint {
            btt.set_in_progress(cn.id, ext);
        }
        if m.version == version && !m.deleted {
            if m.pending && !for_checkpoint {
                // The checkpoint began after this image was taken and the node has not changed since:
                // the image is exactly what the checkpoint needs.
                if btt.in_progress.is_some() {
                    btt.set_in_progress(cn.id, ext);
                    m.pending = false;
                }
            }
            m.dirty = false;
            m.disk_blocks = ext.blocks;
            self.cache.recharge(&mut m, 0);
            btt.relocate(cn.id, ext);
            match &g.body {
                Body::Leaf(l) => {
                    assert_eq!(
                        l.parts.len(),
                        sublocs.len(),
                        "leaf layout changed under an unchanged version"
                    );
                    for (slot, loc) in l.parts.iter().zip(sublocs) {
                        slot.state.lock().loc = Some(*loc);
                    }
                }
                Body::Internal(n) => {
                    assert_eq!(
                        n.buffers.len(),
                        sublocs.len(),
                        "node layout changed under an unchanged version"
                    );
                    for (slot, loc) in n.buffers.iter().zip(sublocs) {
                        slot.set_loc(*loc);
                    }
                }
            }
        } else if !for_checkpoint {
            btt.release(cn.id, ext);
        }
    }

    /// Writes a node that was dirty when the running checkpoint began, unless a modifier already
    /// saved it.
    /// Returns what [`Tree::drain_checkpoint_queue`] returns for the image, if one was written.
    /// The image goes to the next extent of `run` (the checkpoint's nodes in key order).
    pub fn checkpoint_write(
        &self,
        cn: &Arc<CachedNode>,
        run: &mut Placement,
    ) -> Result<Option<(NodeId, Extent, Option<Extent>)>> {
        let g = cn.read();
        let version = {
            let mut m = cn.meta.lock();
            if !m.pending || m.deleted {
                return Ok(None);
            }
            m.pending = false;
            m.version
        };
        assert!(g.fully_resident(), "a dirty node is always fully resident");
        let was_at = self.store.location(cn.id);
        let img = node::serialize(cn.id, &g, self.format.compression);
        drop(g);
        self.cache.add_used(img.buf.len() as isize);
        let r =
            self.store
                .write_placed(&img.buf, &format!("node {} (checkpoint)", cn.id), Some(run));
        self.cache.add_used(-(img.buf.len() as isize));
        let ext = r?;
        self.install(cn, cn.write(), version, ext, &img.sublocs, true);
        {
            // Changed between the image and its installation: the image waits in the
            // checkpoint's table for adoption at completion, like a saved one.
            let m = cn.meta.lock();
            let mut btt = self.store.btt.lock();
            if m.dirty && !m.deleted && btt.current.get(&cn.id) != Some(&ext) {
                btt.hold_for_adoption(cn.id, ext, was_at);
            }
        }
        Ok(Some((cn.id, ext, was_at)))
    }

    /// Saves the image of node `cn` (`node`, under its write latch) as the running checkpoint
    /// needs it, before a change: the caller cleared its pending mark under the checkpoint queue's
    /// lock, `q`. The image is held in memory for the checkpoint to write, or written now once
    /// the cache is past its eviction point ([`SavedImage::Written`]).
    pub(crate) fn save_for_checkpoint(
        &self,
        q: &mut Vec<(NodeId, SavedImage, Option<Extent>)>,
        cn: &CachedNode,
        node: &node::Node,
    ) {
        assert!(
            node.fully_resident(),
            "a dirty node is always fully resident"
        );
        let img = node::serialize(cn.id, node, self.format.compression);
        let len = img.buf.len();
        let was_at = self.store.location(cn.id);
        // Held images cannot be evicted, and nodes still pending cannot either: when the cache
        // is full of nodes dirty at the checkpoint's start and writers change them faster than
        // the checkpoint writes them, held images took the daemon to twice its cache (seen: 1 to
        // 2 GiB in 9 s in the mail-server aging run). Past the eviction point the image is
        // written now instead, under the queue's lock, which the checkpoint takes to finish.
        self.cache.add_used(len as isize);
        if self.cache.used() > self.cache.eviction_point() {
            let r = self.store.write_placed(
                &img.buf,
                &format!("node {} (checkpoint, written early)", cn.id),
                None,
            );
            if let Ok(ext) = r {
                self.cache.add_used(-(len as isize));
                let mut btt = self.store.btt.lock();
                btt.written(ext);
                if btt.in_progress.is_none() {
                    // The checkpoint failed meanwhile (its abort clears the pending marks
                    // after its table): nothing needs the image.
                    btt.alloc.free(ext);
                    return;
                }
                btt.checkpoint_wrote_saved(cn.id, ext, was_at);
                drop(btt);
                q.push((cn.id, SavedImage::Written(ext), was_at));
                self.counters
                    .checkpoint_images_written_early
                    .fetch_add(1, Ordering::Relaxed);
                return;
            }
            // A failed write: the image is held as before; the checkpoint's own write of it
            // reports the error (dropping it would lose the node's state from the checkpoint).
        }
        q.push((cn.id, SavedImage::Held(img.buf), was_at));
    }

    /// Writes a node the running checkpoint has still to write, for eviction: the image goes to
    /// the checkpoint's table as [`Tree::checkpoint_write`] would put it there, and to the
    /// checkpoint's queue as written, so that the checkpoint adopts it like its own. Done under the
    /// queue's lock, which the checkpoint takes before it finishes: it cannot end without this
    /// image. Never waits for the node's latches (see [`Tree::make_room`]): a node latched by
    /// someone is left to the checkpoint. The read latch is held across the write, so the image
    /// is the node's state when the checkpoint began; a failed write leaves the node pending.
    fn write_pending_for_eviction(&self, cn: &Arc<CachedNode>) -> Result<()> {
        let mut q = self.ckpt_queue.lock();
        let Some(g) = cn.try_read() else {
            return Ok(());
        };
        let version = {
            let mut m = cn.meta.lock();
            if !m.pending || m.deleted {
                return Ok(());
            }
            m.pending = false;
            m.version
        };
        assert!(g.fully_resident(), "a dirty node is always fully resident");
        let was_at = self.store.location(cn.id);
        let img = node::serialize(cn.id, &g, self.format.compression);
        let len = img.buf.len() as isize;
        self.cache.add_used(len);
        let r = self.store.write_placed(
            &img.buf,
            &format!("node {} (checkpoint, for eviction)", cn.id),
            None,
        );
        self.cache.add_used(-len);
        let ext = match r {
            Ok(ext) => ext,
            Err(e) => {
                // Unchanged (the read latch is still held): the checkpoint writes it itself.
                cn.meta.lock().pending = true;
                return Err(e);
            }
        };
        drop(g);
        // Clean at the image if it did not change since (a write latch keeps it so).
        let unchanged = cn.try_write().filter(|_| {
            let m = cn.meta.lock();
            m.version == version && !m.deleted
        });
        {
            let mut btt = self.store.btt.lock();
            if btt.in_progress.is_none() {
                // The checkpoint failed meanwhile: nothing needs the image.
                btt.written(ext);
                btt.alloc.free(ext);
                return Ok(());
            }
            btt.set_in_progress(cn.id, ext);
            if unchanged.is_none() {
                // `install` settles the write otherwise.
                btt.written(ext);
            }
        }
        match unchanged {
            Some(wg) => self.install(cn, wg, version, ext, &img.sublocs, false),
            None => {
                let m = cn.meta.lock();
                let mut btt = self.store.btt.lock();
                if m.dirty && !m.deleted && btt.current.get(&cn.id) != Some(&ext) {
                    btt.hold_for_adoption(cn.id, ext, was_at);
                }
            }
        }
        q.push((cn.id, SavedImage::Written(ext), was_at));
        self.cache
            .counters
            .checkpoint_writes_for_eviction
            .fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Sorts nodes into the order a checkpoint writes them: leaves in key order (by their lowest
    /// key), then internal nodes from the root down, each level in key order. A scan in key order
    /// then finds the leaves a checkpoint wrote one after another on the device.
    pub fn sort_for_placement(&self, nodes: &mut [Arc<CachedNode>]) {
        nodes.sort_by_cached_key(|cn| placement_key(&cn.read()));
    }

    /// Writes the images modifiers saved for the running checkpoint. Returns, for each, the node,
    /// where its image went and the extent the node was at when the image was saved (for
    /// [`Tree::adopt_checkpoint_images`]).
    /// They join `run` where they come.
    pub fn drain_checkpoint_queue(
        &self,
        run: &mut Placement,
    ) -> Result<Vec<(NodeId, Extent, Option<Extent>)>> {
        let mut written = Vec::new();
        loop {
            let item = self.ckpt_queue.lock().pop();
            let Some((id, saved, was_at)) = item else {
                return Ok(written);
            };
            let buf = match saved {
                SavedImage::Held(buf) => buf,
                SavedImage::Written(ext) => {
                    // Written and recorded by its modifier ([`Tree::begin_modify`]).
                    written.push((id, ext, was_at));
                    continue;
                }
            };
            let len = buf.len();
            let r = self
                .store
                .write_placed(&buf, &format!("node {id} (checkpoint)"), Some(run));
            self.cache.add_used(-(len as isize));
            let ext = r?;
            let mut btt = self.store.btt.lock();
            btt.written(ext);
            btt.checkpoint_wrote_saved(id, ext, was_at);
            written.push((id, ext, was_at));
        }
    }

    /// After a checkpoint completed: a node changed while it ran (its image saved for the
    /// checkpoint by [`Tree::begin_modify`]) becomes current at that image, unless it was written
    /// since. Its old image, older than that one, is then freed now instead of at the next
    /// checkpoint: nothing reads it (a dirty node is fully resident, and is written before it is
    /// evicted).
    pub fn adopt_checkpoint_images(&self, images: &[(NodeId, Extent, Option<Extent>)]) {
        for &(id, ext, was_at) in images {
            let Some(cn) = self.cache.get(id) else {
                continue;
            };
            let mut m = cn.meta.lock();
            let mut btt = self.store.btt.lock();
            if !m.dirty || m.deleted || btt.current.get(&id).copied() != was_at {
                continue;
            }
            btt.relocate(id, ext);
            drop(btt);
            self.cache.set_disk_blocks(&mut m, ext.blocks);
        }
    }

    /// Forgets queued checkpoint images (after a failed checkpoint).
    pub fn clear_checkpoint_queue(&self) {
        let items = std::mem::take(&mut *self.ckpt_queue.lock());
        for (_, saved, _) in items {
            // A written one is in the aborted checkpoint's table, which the abort releases.
            if let SavedImage::Held(buf) = saved {
                self.cache.add_used(-(buf.len() as isize));
            }
        }
    }
}

/// Where a node goes in a checkpoint's run: leaves first (class 0) by their lowest key, then
/// internal nodes by decreasing height (`u32::MAX - height`) and the lowest key they name. Keys
/// are full keys: the node's prefix ([`node::Node::prefix`]) in front of the stored key.
fn placement_key(node: &node::Node) -> (u32, Vec<u8>) {
    let (class, stored) = placement_stored_key(node);
    (class, [node.prefix.as_slice(), &stored].concat())
}

/// [`placement_key`] with the key as the node stores it.
fn placement_stored_key(node: &node::Node) -> (u32, Vec<u8>) {
    match &node.body {
        Body::Leaf(l) => {
            let lowest = l
                .parts
                .iter()
                .find_map(|slot| {
                    slot.data()
                        .filter(|p| !p.is_empty())
                        .map(|p| p.key(0).to_vec())
                })
                .or_else(|| l.pivots.first().cloned())
                .unwrap_or_default();
            (0, lowest)
        }
        Body::Internal(n) => (
            u32::MAX - node.height,
            n.pivots.first().cloned().unwrap_or_default(),
        ),
    }
}
