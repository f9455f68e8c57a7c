//! Read-ahead for scans that continue one another (a file read in order, 1 MiB FUSE read after
//! 1 MiB FUSE read): the leaves that follow are read in the background, whole (one large device
//! request each), by a few worker threads, so that the device stays busy while the reader copies.
//!
//! A scan is *sequential* when it starts where a recent scan ended (the same key). After such a
//! scan, the leaves from the one holding its end key onwards (up to the window) that are not
//! wholly in memory are queued; only nodes already in the cache are walked to find them. The
//! window is bounded by the cache: at most a quarter of the cache bound is ever being read ahead,
//! and every node read ahead is an ordinary cache entry (counted, evictable). A leaf read ahead is
//! marked; the first scan that uses it counts a hit ([`crate::Stats::prefetch_hits`]).

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::Ordering;

use parking_lot::{Condvar, Mutex};

use super::Tree;
use crate::node::{child_index, Body, NodeId, ROOT_ID};
use crate::tree::Bounds;

/// How many recent scan ends are remembered (concurrent readers each continue their own).
const RECENT_ENDS: usize = 16;

/// Parents walked to fill one window (a window crossing into the next parent's children).
const MAX_PARENTS: usize = 4;

/// Windows of recent sequential scans kept as the leaves their readers are about to read.
const WINDOWS_KEPT: usize = 4;

/// Read-ahead state: recent scan ends, the queue of leaves to read, the workers' progress.
#[derive(Default)]
pub struct ReadAhead {
    recent: Mutex<VecDeque<Vec<u8>>>,
    /// The whole windows (resident leaves too) of the last [`WINDOWS_KEPT`] sequential scans: the
    /// leaf each reader is in and those it reads next. Read-ahead never sheds them to make room.
    windows: Mutex<VecDeque<Vec<NodeId>>>,
    queue: Mutex<Queue>,
    changed: Condvar,
}

#[derive(Default)]
struct Queue {
    /// Leaves read ahead after one another by ascending key.
    jobs: VecDeque<NodeId>,
    /// Leaves queued or being read (each is queued once).
    busy: HashSet<NodeId>,
    /// Leaves being read now.
    running: usize,
    /// Running jobs whose leaf a reader loaded itself meanwhile (the worker skips them).
    overtaken: HashSet<NodeId>,
    /// Leaves ahead of a scan (0: off).
    window: usize,
    stop: bool,
}

impl ReadAhead {
    /// Sets the window in leaves (0 turns read-ahead off) and lets workers run.
    pub(crate) fn start(&self, window: usize) {
        let mut q = self.queue.lock();
        q.window = window;
        q.stop = false;
    }

    /// Makes the workers return (queued leaves are dropped).
    pub(crate) fn stop(&self) {
        let mut q = self.queue.lock();
        q.stop = true;
        for id in std::mem::take(&mut q.jobs) {
            q.busy.remove(&id);
        }
        self.changed.notify_all();
    }

    fn window(&self) -> usize {
        self.queue.lock().window
    }

    /// A reader is loading leaf `id` itself: read-ahead has fallen behind it there. Its queued
    /// job is dropped; a running one not yet loading is marked, and its worker skips it. Without
    /// this a worker that lagged (a loaded machine: scheduled late) read the leaf again after the
    /// reader had used it and the cache had shed it, and nobody used that copy (the CLI's
    /// read-ahead test in CI: 12 leaves read ahead, 9 used, 1.2x the file's bytes read).
    pub(crate) fn reader_loads(&self, id: NodeId) {
        let mut q = self.queue.lock();
        if !q.busy.contains(&id) {
            return;
        }
        match q.jobs.iter().position(|&j| j == id) {
            Some(i) => {
                q.jobs.remove(i);
                q.busy.remove(&id);
                self.changed.notify_all();
            }
            None => {
                q.overtaken.insert(id);
            }
        }
    }

    /// The leaves of the recent sequential scans' windows, which read-ahead must not shed to
    /// make room: under a tight cache it otherwise shed the leaf a reader was in the middle of
    /// (its first 1 MiB read had made it the least recently used leaf but one), or one the
    /// kernel's own read-ahead was about to read, for a leaf further on, and the reader read it
    /// again (the CLI's read-ahead test in CI, 64 MiB cache: 1.34x the file's bytes read).
    pub(crate) fn readers_windows(&self) -> HashSet<NodeId> {
        self.windows.lock().iter().flatten().copied().collect()
    }

    /// The queued jobs, in order (tests).
    #[cfg(test)]
    pub(crate) fn queued(&self) -> Vec<NodeId> {
        self.queue.lock().jobs.iter().copied().collect()
    }

    /// Takes the next job as a worker does, without running it (tests: a worker scheduled late).
    #[cfg(test)]
    pub(crate) fn take_job(&self) -> Option<NodeId> {
        let mut q = self.queue.lock();
        let id = q.jobs.pop_front()?;
        q.running += 1;
        Some(id)
    }

    /// Ends a running job (a worker's, or one taken with [`ReadAhead::take_job`]).
    pub(crate) fn finish(&self, id: NodeId) {
        let mut q = self.queue.lock();
        q.running -= 1;
        q.busy.remove(&id);
        q.overtaken.remove(&id);
        self.changed.notify_all();
    }

    /// Whether a reader loaded running job `id`'s leaf itself ([`ReadAhead::reader_loads`]).
    fn overtaken(&self, id: NodeId) -> bool {
        self.queue.lock().overtaken.contains(&id)
    }
}

impl Tree {
    /// The window in leaves for a wish of `leaves`: at most a quarter of the cache bound in
    /// whole nodes, at least one leaf ahead.
    pub(crate) fn read_ahead_window(&self, leaves: usize) -> usize {
        if leaves == 0 {
            return 0;
        }
        let bound = self.cache.budget() / 4 / self.format.node_size;
        leaves.min(bound).max(1)
    }

    /// Records a scan of `[lo, hi)` about to run; returns whether it continues a recent scan (and
    /// read-ahead is on).
    pub(crate) fn note_scan(&self, lo: &[u8], hi: Option<&[u8]>) -> bool {
        if self.readahead.window() == 0 {
            return false;
        }
        let mut recent = self.readahead.recent.lock();
        let seq = match recent.iter().position(|e| e.as_slice() == lo) {
            Some(i) => {
                recent.remove(i);
                true
            }
            None => false,
        };
        if let Some(h) = hi {
            if recent.len() == RECENT_ENDS {
                recent.pop_front();
            }
            recent.push_back(h.to_vec());
        }
        seq
    }

    /// Queues the leaves from the one holding `key` onwards (up to the window) that are not
    /// wholly in memory. Walks only cached nodes; nothing is read here.
    pub(crate) fn read_ahead_from(&self, key: &[u8]) {
        let window = self.readahead.window();
        if window == 0 {
            return;
        }
        let mut want: Vec<NodeId> = Vec::new();
        let mut key = key.to_vec();
        for _ in 0..MAX_PARENTS {
            let Some(hi) = self.leaves_from(&key, window - want.len(), &mut want) else {
                break;
            };
            if want.len() >= window {
                break;
            }
            key = hi;
        }
        {
            let mut w = self.readahead.windows.lock();
            if w.len() == WINDOWS_KEPT {
                w.pop_front();
            }
            w.push_back(want.clone());
        }
        let missing: Vec<NodeId> = want
            .into_iter()
            .filter(|&id| !self.leaf_resident(id))
            .collect();
        if missing.is_empty() {
            return;
        }
        let mut q = self.readahead.queue.lock();
        if q.stop {
            return;
        }
        for id in missing {
            if q.busy.insert(id) {
                q.jobs.push_back(id);
            }
        }
        self.readahead.changed.notify_all();
    }

    /// Appends to `out` up to `n` leaves of the cached parent whose range holds `key`, from the
    /// one holding `key`; returns the parent's exclusive high bound (`None`: the last parent, or
    /// the path is not in memory).
    fn leaves_from(&self, key: &[u8], n: usize, out: &mut Vec<NodeId>) -> Option<Vec<u8>> {
        let mut cn = self.cache.get(ROOT_ID)?;
        let mut bounds = Bounds::root();
        loop {
            let g = cn.read();
            let Body::Internal(node) = &g.body else {
                return None;
            };
            let c = child_index(&node.pivots, bounds.lift(key));
            if g.height == 1 {
                out.extend(node.children[c..].iter().take(n));
                return bounds.full_hi();
            }
            let next = self.cache.get(node.children[c])?;
            bounds.descend(node, c);
            drop(g);
            cn = next;
        }
    }

    /// Whether node `id` is in memory with every partition.
    fn leaf_resident(&self, id: NodeId) -> bool {
        let Some(cn) = self.cache.peek(id) else {
            return false;
        };
        let g = cn.read();
        match &g.body {
            Body::Leaf(l) => l.parts.iter().all(|p| p.data().is_some()),
            Body::Internal(_) => true,
        }
    }

    /// A worker: reads queued leaves until [`ReadAhead::stop`]. Errors are left to the reader that
    /// later needs the node (a leaf merged away meanwhile has no location: nothing to read).
    pub(crate) fn read_ahead_worker(&self) {
        loop {
            let id = {
                let mut q = self.readahead.queue.lock();
                loop {
                    if q.stop {
                        return;
                    }
                    if let Some(id) = q.jobs.pop_front() {
                        q.running += 1;
                        break id;
                    }
                    self.readahead.changed.wait(&mut q);
                }
            };
            let _ = self.read_ahead_one(id);
            self.readahead.finish(id);
        }
    }

    pub(crate) fn read_ahead_one(&self, id: NodeId) -> crate::error::Result<()> {
        if self.leaf_resident(id) {
            return Ok(());
        }
        // Read ahead only into room below the eviction point, made by shedding clean sub-blocks
        // least recently used (the window is at most a quarter of the cache, and a sequential
        // reader has used the leaves before it): never by writing nodes back, and never past the
        // point. Without shedding, a cache filled by the read itself had room only after a
        // reader's own load evicted, and a fifth of the leaves of a 4 GiB read (1 GiB cache) were
        // loaded by the reader, not ahead of it.
        self.make_room()?;
        if !self.make_room_for(self.format.node_size)? {
            return Ok(());
        }
        // Checked last before loading: a reader that loads the leaf from here on holds its load
        // claim or its sub-block lock, which the load below only tries.
        if self.readahead.overtaken(id) {
            return Ok(());
        }
        // Only a leaf this worker reads itself is marked and counted, and never one a reader is
        // loading now (it would be read twice, or counted as read ahead after its use).
        let loaded = match self.cache.peek(id) {
            Some(cn) => {
                let loaded = self.read_ahead_partitions(&cn)?;
                // A skeleton kept from long ago is first in the eviction order: without this, the
                // next leaf read ahead shed the partitions just loaded, before the scan used them
                // (4 GiB read after its write: 1,862 leaves read ahead, 1,702 used).
                self.cache.touch(&cn);
                loaded
            }
            None => {
                if !self.cache.try_begin_load(id) {
                    return Ok(());
                }
                let result = self.read_node(id, true);
                let out = result.map(|(node, ext)| {
                    self.cache.insert_read_ahead(id, node, ext.blocks);
                });
                self.cache.finish_load(id);
                out?;
                true
            }
        };
        if loaded {
            self.cache
                .counters
                .prefetch_loads
                .fetch_add(1, Ordering::Relaxed);
        }
        self.make_room()
    }

    /// Waits until no leaf is queued or being read ahead.
    pub fn wait_read_ahead(&self) {
        let mut q = self.readahead.queue.lock();
        while !q.jobs.is_empty() || q.running > 0 {
            self.readahead.changed.wait(&mut q);
        }
    }

    /// Counts a hit if the leaf was read ahead and this is its first use since.
    pub(crate) fn note_leaf_use(&self, cn: &crate::cache::CachedNode) {
        if cn.prefetched.load(Ordering::Relaxed) && cn.prefetched.swap(false, Ordering::Relaxed) {
            self.cache
                .counters
                .prefetch_hits
                .fetch_add(1, Ordering::Relaxed);
        }
    }
}
