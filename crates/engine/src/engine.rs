//! The engine's public API: [`Engine`], a write-optimized key-value store on a block device.
//!
//! Each of the engine's jobs lives in a submodule of its own (all private to the engine):
//! - `open.rs`: creating an image and opening one (loading the checkpoint, replaying the log);
//! - `write.rs`: the write path (admission to the log, logging and applying a batch, the
//!   housekeeping after a write, `sync`);
//! - `checkpoint.rs`: the checkpoint protocol, owned by [`Checkpointer`](checkpoint::Checkpointer),
//!   the only code that writes a superblock;
//! - `failure.rs`: failures and damage (when the engine refuses writes, what it records);
//! - `reclaim.rs`: pushing range deletes down so that deleted data's space comes back;
//! - `threads.rs`: the background threads (log flusher, checkpointer, cleaner);
//! - `stats.rs`, `range.rs`: [`Stats`] and the range iterator;
//! - `snapshots.rs`: taking, listing and deleting snapshots, and their read-only views;
//! - `atomic.rs`: atomic groups; `mode.rs`: switching between read-only and writable.

mod atomic;
mod checkpoint;
mod data;
mod failure;
mod mode;
mod open;
mod range;
mod reclaim;
mod sharing;
mod snapshots;
mod stats;
mod threads;
mod write;

use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use amaranth_device::{BlockDevice, BLOCK_SIZE};
use parking_lot::{Condvar, Mutex};

use crate::config::{Format, Options};
use crate::error::{Error, Result};
use crate::load::load_checkpoint;
use crate::msg::Patch;
use crate::node::ROOT_ID;
#[cfg(test)]
use crate::ops;
use crate::ops::{Batch, Op};
use crate::salvage::{self, SalvageReport};
use crate::space::SpaceUse;
use crate::tree::Tree;
use crate::wal::{Log, Lsn};

pub(crate) use checkpoint::write_backups;
#[cfg(test)]
pub(crate) use checkpoint::write_copy;
pub(crate) use checkpoint::write_primary;
pub(crate) use checkpoint::Checkpointer;
pub use data::{BlockRead, BlockRef, StoredValue};
pub use range::RangeIter;
pub use sharing::Sharing;
pub use snapshots::View;
pub use stats::Stats;

/// A write-optimized key-value store on a block device.
///
/// Share it between threads with an `Arc`; every method takes `&self`. Dropping it without
/// [`Engine::close`] stops the background threads and makes acknowledged operations durable in the
/// log, but leaves recovery work for the next open.
pub struct Engine {
    inner: Arc<Inner>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// For a handle that reads a snapshot ([`Engine::snapshot_engine`]): the view it reads
    /// through. Such a handle refuses every change and runs no thread.
    snap: Option<View>,
}

struct Inner {
    dev: Arc<dyn BlockDevice>,
    tree: Tree,
    log: Log,
    options: Options,
    /// The checkpoint protocol and the current superblock (`checkpoint.rs`).
    ckpt: Checkpointer,
    failed: Mutex<Option<Error>>,
    closed: AtomicBool,
    stop: AtomicBool,
    wake: Condvar,
    wake_state: Mutex<WakeState>,
    counters: EngineCounters,
    /// Range deletes (and moves, which delete their source) applied so far, and how many of them
    /// the last completed pass pushed down to the leaves ([`Inner::push_deletes_down`]): until
    /// then the deleted data still takes space on the device.
    deletes_seen: AtomicU64,
    deletes_pushed: AtomicU64,
    /// Bytes used (see [`SpaceUse::used`]) after the last checkpoint that followed a complete
    /// pass pushing range deletes down: roughly the live data then. Deleted and moved data that
    /// grows use past 1.5 times that (plus [`reclaim::GARBAGE_SLACK_NODES`] nodes) forces another pass
    /// and checkpoint.
    space_baseline: AtomicU64,
    opened_after_crash: bool,
    recovered_records: u64,
    recovery_stop: String,
    /// Log records skipped at open because they could not be applied.
    skipped_records: u64,
    /// Held shared by every modification from its check to its end, exclusive while the engine
    /// switches between read-only and writable (see `mode.rs`).
    mode: parking_lot::RwLock<()>,
    /// Damage is known: a read found it (or the superblock said so at open).
    damage: AtomicBool,
    /// What the first damage found was.
    damage_detail: Mutex<Option<String>>,
    /// What was wrong with the superblock copies at open (empty when nothing was).
    superblock_notes: Vec<String>,
    /// What a repair open found and did.
    salvaged: Option<SalvageReport>,
    /// Atomic groups (`engine/atomic.rs`).
    groups: atomic::Groups,
}

#[derive(Default)]
struct WakeState {
    flush_wanted: bool,
    checkpoint_wanted: bool,
    /// The log buffer is past its write threshold: the log thread writes it.
    log_write_wanted: bool,
    /// A durable flush left its end marker to the log thread.
    marker_wanted: bool,
    last_write: Option<Instant>,
}

#[derive(Default)]
struct EngineCounters {
    syncs: AtomicU64,
    writes: AtomicU64,
    user_bytes: AtomicU64,
    /// Requests for a checkpoint that the checkpointer dropped: when it came to them, a checkpoint
    /// that ran meanwhile had already done what they asked for.
    checkpoint_requests_dropped: AtomicU64,
}

impl Engine {
    /// The root reads start from: the live tree's, or the snapshot's this handle reads.
    fn root(&self) -> crate::node::NodeId {
        self.snap.as_ref().map_or(ROOT_ID, View::root)
    }

    /// Refuses a change through a handle that reads a snapshot.
    fn refuse_if_snapshot(&self) -> Result<()> {
        match &self.snap {
            Some(v) => Err(Error::ReadOnly(format!(
                "snapshot {:?} is read-only",
                v.name()
            ))),
            None => Ok(()),
        }
    }

    /// The write path of every batch through this handle.
    fn write_ops(&self, ops: Vec<Op>) -> Result<Lsn> {
        self.refuse_if_snapshot()?;
        self.inner.write_ops(ops)
    }

    /// Sets `key` to `value`.
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<Lsn> {
        self.write_ops(vec![Op::Put {
            key: key.to_vec(),
            value: value.to_vec(),
        }])
    }

    /// Removes `key` (a no-op if absent).
    pub fn delete(&self, key: &[u8]) -> Result<Lsn> {
        self.write_ops(vec![Op::Delete { key: key.to_vec() }])
    }

    /// Patches the value of `key` without reading it.
    pub fn upsert(&self, key: &[u8], patch: Patch) -> Result<Lsn> {
        self.write_ops(vec![Op::Upsert {
            key: key.to_vec(),
            patch,
        }])
    }

    /// Removes every key in `[lo, hi)`.
    pub fn range_delete(&self, lo: &[u8], hi: &[u8]) -> Result<Lsn> {
        self.write_ops(vec![Op::RangeDelete {
            lo: lo.to_vec(),
            hi: hi.to_vec(),
        }])
    }

    /// Applies a batch atomically (one log record) and returns its LSN.
    pub fn write(&self, batch: &Batch) -> Result<Lsn> {
        self.write_ops(batch.ops.clone())
    }

    /// Records `bytes` of memory held outside the engine that the cache bound covers as well (the
    /// file system's inode table): the nodes then keep to the bound less these bytes, but never to
    /// less than half of it (see [`Engine::external_memory_allowance`]). Takes effect at the next
    /// eviction.
    pub fn set_external_memory(&self, bytes: usize) {
        // The live tree's owner sets it (a snapshot's handle shares its cache).
        if self.snap.is_some() {
            return;
        }
        self.inner.tree.cache.set_external(bytes);
    }

    /// How many bytes held outside the engine the cache bound can cover: the bound less the half
    /// the nodes always keep. Beyond it, memory held outside adds to the bound.
    pub fn external_memory_allowance(&self) -> usize {
        self.inner.tree.cache.external_allowance()
    }

    /// [`Engine::write`] of a batch the caller gives up (its keys and values are not copied).
    pub fn write_owned(&self, batch: Batch) -> Result<Lsn> {
        self.write_ops(batch.ops)
    }

    /// The value of `key`.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.inner.get_checked(self.root(), key)
    }

    /// Calls `f(key, value)` for every live entry of the range in key order until it returns false.
    /// Not a snapshot: each leaf's range is read consistently, and every key is visited at most once.
    /// Out-of-line blocks are read in batches, one device request per run of consecutive blocks
    /// ([`Engine::scan_stored`] leaves them to the caller).
    pub fn scan(
        &self,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
        mut f: impl FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<()> {
        self.inner.scan_values(self.root(), lo, hi, &mut f)
    }

    /// Waits until the leaves being read ahead for sequential scans are in memory (tests and
    /// tools that check read-ahead; readers never need to).
    pub fn wait_read_ahead(&self) {
        self.inner.tree.wait_read_ahead();
    }

    /// An upper bound on the length of every key in `[lo, hi)` (`lo < hi`), in O(height): from
    /// the key-length bounds the tree keeps per child (docs/SURGERY.md §2.6). Never below the
    /// longest key; above it when longer keys were deleted or the range shares a subtree with
    /// longer ones. For a caller that scans only when the bound says a limit may be passed.
    pub fn longest_key_bound(&self, lo: &[u8], hi: &[u8]) -> Result<usize> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        if lo >= hi {
            return Ok(0);
        }
        let r = self.inner.seen(self.inner.tree.longest_bound(lo, hi));
        let _ = self.inner.tree.make_room();
        r
    }

    /// Iterates over the range in increasing key order (owned copies; see [`Engine::scan`]).
    pub fn range(&self, lo: Bound<&[u8]>, hi: Bound<&[u8]>) -> RangeIter<'_> {
        RangeIter::new(&self.inner, self.root(), lo, hi, true)
    }

    /// Iterates over the range in decreasing key order.
    pub fn range_rev(&self, lo: Bound<&[u8]>, hi: Bound<&[u8]>) -> RangeIter<'_> {
        RangeIter::new(&self.inner, self.root(), lo, hi, false)
    }

    /// Returns once every operation acknowledged before the call is on stable storage (and will
    /// survive a crash: if an atomic group's first record precedes the call, this waits for the
    /// group's commit, see [`Engine::begin_atomic`]).
    pub fn sync(&self) -> Result<()> {
        if self.snap.is_some() {
            return Ok(());
        }
        self.inner.settle_before(self.inner.log.next_lsn())?;
        self.inner.sync()
    }

    /// Returns once the operation with LSN `lsn` (and everything before it) is on stable storage
    /// (waiting, like [`Engine::sync`], for an atomic group that began before it).
    pub fn sync_to(&self, lsn: Lsn) -> Result<()> {
        if self.snap.is_some() {
            return Ok(());
        }
        self.inner.settle_before(lsn + 1)?;
        let target = self.inner.log.next_lsn();
        self.inner
            .log
            .flush_to(target, true)
            .inspect_err(|e| self.inner.fail(e))?;
        self.inner.wake_for_marker();
        Ok(())
    }

    /// Writes a checkpoint now (every dirty node, the table, a superblock), freeing log space.
    pub fn checkpoint(&self) -> Result<()> {
        self.refuse_if_snapshot()?;
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        self.inner.checkpoint(false)
    }

    /// Flushes buffers until none holds more than `threshold` bytes along the heaviest paths
    /// (what the background cleaner does when idle). Returns the number of flush steps.
    pub fn flush_buffers(&self, threshold: usize, max_steps: usize) -> Result<usize> {
        self.refuse_if_snapshot()?;
        self.inner.check_writable()?;
        let mut n = 0;
        while n < max_steps {
            let did = {
                let _w = self.inner.tree.writers.read();
                self.inner.seen(self.inner.tree.flush_step(threshold))?
            };
            self.inner.seen(self.inner.tree.make_room())?;
            if !did {
                break;
            }
            n += 1;
        }
        Ok(n)
    }

    /// Makes leaf splits prefer to cut just after one of `bytes` (the separators of the caller's
    /// key structure: path components, the end of a file's key), between a quarter and three
    /// quarters of the leaf, so that later range operations find their boundaries at pivots
    /// (docs/SURGERY.md §3.5). Where a node splits changes no key; the setting is not stored.
    pub fn set_split_boundaries(&self, bytes: &[u8]) {
        if self.snap.is_some() {
            return;
        }
        *self.inner.tree.split_boundaries.write() = bytes.to_vec();
    }

    /// Heals up to `max` of the fringes that range operations left under-full (docs/SURGERY.md
    /// §3.2, step 7): what the background cleaner does between other work. Returns how many it
    /// healed (0 when none waits).
    pub fn heal_fringes(&self, max: usize) -> Result<usize> {
        self.refuse_if_snapshot()?;
        self.inner.check_writable()?;
        let n = {
            let _w = self.inner.tree.writers.read();
            self.inner.seen(self.inner.tree.heal_step(max, true))?
        };
        self.inner.seen(self.inner.tree.make_room())?;
        Ok(n)
    }

    /// Slices `[lo, hi)` (`lo < hi`) into whole child slots of one node (docs/SURGERY.md §3.2,
    /// steps 1–2) and queues its fringe for healing, changing no key: for tests of slicing.
    /// Returns the height of the node and how many of its slots the range took.
    #[doc(hidden)]
    pub fn slice_for_tests(&self, lo: &[u8], hi: &[u8]) -> Result<(u32, usize)> {
        self.refuse_if_snapshot()?;
        self.inner.check_writable()?;
        let tree = &self.inner.tree;
        let r = {
            let _w = tree.writers.write();
            tree.slice(lo, hi, 1)
                .map(|s| (s.node.read().height, s.slots.1 - s.slots.0))
        };
        tree.queue_heal(lo);
        tree.queue_heal(hi);
        let r = self.inner.seen(r)?;
        self.inner.seen(tree.make_room())?;
        Ok(r)
    }

    /// Unallocated and total bytes of the data area (the allocator's view: data in dirty nodes
    /// is not counted; [`Engine::space_use`] counts it).
    pub fn space(&self) -> (u64, u64) {
        let b = self.inner.tree.store.btt.lock();
        (
            b.alloc.free_blocks() * BLOCK_SIZE as u64,
            b.alloc.total_blocks() * BLOCK_SIZE as u64,
        )
    }

    /// How the data area is used, dirty nodes included (cheap: no walk of the cache).
    pub fn space_use(&self) -> SpaceUse {
        self.inner.space_use()
    }

    /// Frees the space of deleted data until `target_free` bytes are free or nothing more can be
    /// reclaimed: flushes pending messages down to the leaves a few at a time, with a checkpoint after
    /// each round (old node images are freed only once a checkpoint no longer needs them, so working in
    /// rounds keeps the temporary space small). Readers wait while a round runs. Returns free bytes.
    pub fn reclaim_space(&self, target_free: u64) -> Result<u64> {
        self.refuse_if_snapshot()?;
        self.inner.check_writable()?;
        let mut from: Vec<u8> = Vec::new();
        let node_size = self.inner.tree.format.node_size as u64;
        loop {
            // A flush step can dirty a few nodes, and evicting them writes new images while the
            // old ones stay until the checkpoint that ends the round, which itself needs room for
            // what is still dirty: a round's flushes are sized by the free space, so that
            // reclaiming does not use up the space it is meant to give back.
            let steps = (self.space().0 / (16 * node_size)).clamp(1, 32) as usize;
            let round = {
                let _w = self.inner.tree.writers.read();
                // And frees the subtrees range deletes let go of.
                self.inner
                    .tree
                    .drain_from(&from, steps, false)
                    .and_then(|r| self.inner.tree.collect(usize::MAX).map(|_| r))
            };
            let (_, resume) = match round {
                Ok(r) => r,
                Err(Error::NoSpace(_)) => (0, None),
                Err(e) => {
                    self.inner.fail(&e);
                    return Err(e);
                }
            };
            match self.inner.tree.make_room() {
                Ok(()) | Err(Error::NoSpace(_)) => {}
                Err(e) => {
                    self.inner.fail(&e);
                    return Err(e);
                }
            }
            self.inner.checkpoint(false)?;
            let free = self.space().0;
            match resume {
                Some(r) if free < target_free => from = r,
                _ => return Ok(free),
            }
        }
    }

    /// Checks that the running totals behind [`Engine::space_use`] equal a recount of the dirty
    /// nodes (walks the cache; meant for tests). Writers and checkpoints are held off; a write-back
    /// by the background threads may still change the totals meanwhile, then the check is tried
    /// again. Panics if they differ.
    pub fn check_space_accounting(&self) {
        let _c = self.inner.ckpt.lock();
        let _w = self.inner.tree.writers.write();
        let cache = &self.inner.tree.cache;
        for _ in 0..100 {
            let before = cache.dirty_space();
            let recount = cache.recount_dirty_space();
            if cache.dirty_space() == before {
                assert_eq!(
                    before, recount,
                    "dirty-node space totals differ from a recount"
                );
                return;
            }
        }
        panic!("the dirty-node space totals kept changing");
    }

    /// The largest batch [`Engine::write`] accepts, in [`Batch::log_bytes`] (one log record holds
    /// one batch; a larger one is refused with [`Error::InvalidArgument`], nothing changed).
    pub fn max_batch_bytes(&self) -> usize {
        self.inner.log.max_record()
    }

    /// Clears the superblock flag that asks for a check ([`Stats::needs_check`]), once a check
    /// has found (or repaired) the image whole. The next checkpoint, at the latest at close,
    /// writes it.
    pub fn clear_needs_check(&self) -> Result<()> {
        self.refuse_if_snapshot()?;
        self.inner.check_writable()?;
        self.inner.ckpt.clear_needs_check();
        Ok(())
    }

    /// The image's uuid and label (as of the last checkpoint, or as set since).
    pub fn identity(&self) -> ([u8; 16], String) {
        self.inner.ckpt.identity()
    }

    /// Sets the image's uuid and label (`mkfs -U`, `-L`); they are written with the next checkpoint
    /// (at the latest when the engine is closed).
    pub fn set_identity(&self, uuid: [u8; 16], label: &str) -> Result<()> {
        self.refuse_if_snapshot()?;
        crate::superblock::check_label(label).map_err(Error::InvalidArgument)?;
        self.inner.check_writable()?;
        self.inner.ckpt.set_identity(uuid, label);
        Ok(())
    }

    /// The format parameters of the open image.
    pub fn format(&self) -> &Format {
        &self.inner.tree.format
    }

    /// Whether the engine stopped accepting writes after a failure (and why).
    pub fn failure(&self) -> Option<Error> {
        self.inner.failure()
    }

    /// Stops the background threads, writes a final checkpoint and marks the image clean.
    pub fn close(self) -> Result<()> {
        if self.snap.is_some() {
            // The engine goes on: a snapshot's handle only lets go of its view.
            return Ok(());
        }
        self.stop_threads();
        let failure = self.inner.failure();
        let r = if self.inner.tree.is_read_only() || failure.is_some() {
            match failure {
                Some(e) => Err(e),
                None => Ok(()),
            }
        } else {
            // An atomic group still open is cut first: nothing after it may wait for it.
            let cut = self.inner.cut_open_group();
            // Leave no deleted data behind in the image: the next session would not know it is
            // there (only deletes it applies itself trigger the passes that push them down).
            if cut.is_ok() && self.inner.deletes_pending() {
                match self.inner.push_deletes_down(|| false) {
                    Ok(_) | Err(Error::NoSpace(_)) => {}
                    Err(e) => self.inner.fail(&e),
                }
            }
            // Dead nodes left are freed too: the image closes with no garbage.
            let collected = cut.and_then(|()| {
                let _w = self.inner.tree.writers.read();
                self.inner.tree.collect(usize::MAX).map(drop)
            });
            collected.and_then(|()| self.inner.checkpoint(true))
        };
        self.inner.closed.store(true, Ordering::Release);
        r
    }

    /// Simulates a crash for tests: stops the threads and abandons everything in memory without
    /// writing anything more.
    pub fn abandon(self) {
        if self.snap.is_some() {
            return;
        }
        self.stop_threads();
        self.inner.closed.store(true, Ordering::Release);
    }

    /// Appends a record of `ops` to the log without applying it, as a writer with a bug might
    /// have, after taking `msns_used` message numbers for it (what such a writer may have applied
    /// before it failed). For tests of replay.
    #[cfg(test)]
    pub(crate) fn log_unapplied_for_tests(
        &self,
        payload: Option<&[u8]>,
        ops: &[Op],
        msns_used: u64,
    ) -> Lsn {
        let tree = &self.inner.tree;
        let _w = tree.writers.write();
        let first = tree.next_msn.fetch_add(msns_used, Ordering::Relaxed);
        let mut rec = ops::encode_record(ops);
        rec[..8].copy_from_slice(&first.to_le_bytes());
        self.inner
            .log
            .append(payload.unwrap_or(&rec))
            .expect("append")
    }

    /// The tree, for tests that break it on purpose.
    #[cfg(test)]
    pub(crate) fn tree(&self) -> &Tree {
        &self.inner.tree
    }

    /// What a repair open (`Options::salvage`) found and did; `None` for other opens.
    pub fn salvage_report(&self) -> Option<&SalvageReport> {
        self.inner.salvaged.as_ref()
    }

    /// Walks the last checkpoint's tree on `dev` and reports every damaged node, partition and
    /// buffer, without replaying the log or writing anything (what `fsck` runs first: a normal
    /// open would stop at the first damaged node).
    pub fn survey(dev: Arc<dyn BlockDevice>, options: Options) -> Result<SalvageReport> {
        let options = Options {
            read_only: true,
            salvage: false,
            ..options
        };
        let loaded = load_checkpoint(&dev, &options)?;
        let mut report = salvage::survey(&loaded.tree)?;
        report.superblock = loaded.located.describe();
        Ok(report)
    }

    /// Where every node of the last checkpoint lies: `(node id, first block, blocks)`, by block.
    /// For checkers and tests (which blocks belong to which node).
    pub fn node_extents(&self) -> Vec<(u64, u64, u64)> {
        let btt = self.inner.tree.store.btt.lock();
        let mut v: Vec<(u64, u64, u64)> = btt
            .checkpointed
            .iter()
            .map(|(id, e)| (*id, e.block, e.blocks))
            .collect();
        v.sort_by_key(|&(_, b, _)| b);
        v
    }

    /// Checks every invariant of the tree on disk and in memory: node checksums, pivot order, message
    /// placement, heights, entry counts and the table. Returns the number of nodes and entries seen.
    pub fn verify(&self) -> Result<crate::verify::Report> {
        self.inner.seen(crate::verify::verify(&self.inner.tree))
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if self.snap.is_some() || self.inner.closed.load(Ordering::Acquire) {
            return;
        }
        self.stop_threads();
        if !self.inner.tree.is_read_only() && self.inner.failure().is_none() {
            let _ = self.inner.log.flush(true);
        }
        self.inner.closed.store(true, Ordering::Release);
    }
}
