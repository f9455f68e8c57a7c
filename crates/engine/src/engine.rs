//! The engine: public API, write path, checkpoints, recovery and background threads.

mod mode;

use std::collections::{HashMap, VecDeque};
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use amaranth_device::{BlockDevice, IoStats, BLOCK_SIZE};
use parking_lot::{Condvar, Mutex};

use crate::apply::{self, apply_ops, flush_root, scan_tree};
use crate::config::{Format, Options};
use crate::copies;
use crate::error::{Error, Result};
use crate::load::{self, load_checkpoint, Loaded};
use crate::msg::Patch;
use crate::node::{Node, ROOT_ID};
use crate::ops::{self, Batch, Op};
use crate::read::Target;
use crate::salvage::{self, SalvageReport};
use crate::space::SpaceUse;
use crate::store::{self, Allocator, Btt, Store};
use crate::superblock::{backup_blocks, Extent, Superblock, FORMAT_VERSION};
use crate::tree::Tree;
use crate::wal::{self, Log, LogPosition, LogStats, Lsn, Space};

mod atomic;

/// The log buffer is written (not synced) once it holds this much.
const LOG_WRITE_THRESHOLD: usize = 1 << 20;
/// How often the cleaner hands the allocator's free pages back to the system.
const TRIM_INTERVAL: Duration = Duration::from_secs(1);
/// Nodes' worth of space deleted data may hold beyond 1.5 times the baseline use before a pass that
/// pushes range deletes down and a checkpoint are forced (see `Inner::space_baseline`).
const GARBAGE_SLACK_NODES: u64 = 16;

/// A write-optimized key-value store on a block device.
///
/// Share it between threads with an `Arc`; every method takes `&self`. Dropping it without
/// [`Engine::close`] stops the background threads and makes acknowledged operations durable in the
/// log, but leaves recovery work for the next open.
pub struct Engine {
    inner: Arc<Inner>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

struct Inner {
    dev: Arc<dyn BlockDevice>,
    tree: Tree,
    log: Log,
    options: Options,
    sb: Mutex<Superblock>,
    ckpt_lock: Mutex<()>,
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
    /// grows use past 1.5 times that (plus [`GARBAGE_SLACK_NODES`] nodes) forces another pass
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
    last_write: Option<Instant>,
}

#[derive(Default)]
struct EngineCounters {
    checkpoints: AtomicU64,
    checkpoint_nanos: AtomicU64,
    syncs: AtomicU64,
    writes: AtomicU64,
    user_bytes: AtomicU64,
}

/// A snapshot of the engine's state and activity.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Height of the tree (0: the root is a leaf).
    pub height: u32,
    /// Nodes with an on-disk location plus nodes not yet written.
    pub nodes: u64,
    /// Nodes in memory.
    pub cached_nodes: usize,
    /// Dirty nodes in memory.
    pub dirty_nodes: usize,
    /// Bytes of nodes accounted in memory.
    pub cache_bytes: usize,
    /// Highest cache usage seen.
    pub cache_peak_bytes: usize,
    /// The cache bound.
    pub cache_budget: usize,
    /// Memory held outside the engine that the bound covers (set by
    /// [`Engine::set_external_memory`]); the nodes get the rest, down to half the bound.
    pub cache_external_bytes: usize,
    /// Node loads answered from memory / from disk.
    pub cache_hits: u64,
    /// Node loads from disk.
    pub cache_misses: u64,
    /// Partition loads from disk.
    pub partition_loads: u64,
    /// Nodes evicted.
    pub evictions: u64,
    /// Dirty nodes written by eviction.
    pub writebacks: u64,
    /// Operations written.
    pub writes: u64,
    /// Bytes of keys and values the user wrote.
    pub user_bytes_written: u64,
    /// Device I/O.
    pub device: IoStats,
    /// Node images written / bytes.
    pub node_writes: u64,
    /// Bytes of node images written.
    pub node_bytes_written: u64,
    /// Node reads / bytes.
    pub node_reads: u64,
    /// Bytes read for nodes.
    pub node_bytes_read: u64,
    /// Device bytes written per byte of user data.
    pub write_amplification: f64,
    /// Log activity.
    pub log: LogStats,
    /// Buffer flushes.
    pub flushes: u64,
    /// Bytes moved by flushes.
    pub bytes_flushed: u64,
    /// Leaf pieces created by splits.
    pub leaf_splits: u64,
    /// Internal pieces created by splits.
    pub internal_splits: u64,
    /// Merges.
    pub merges: u64,
    /// Completed checkpoints (this session).
    pub checkpoints: u64,
    /// Time spent in checkpoints (this session).
    pub checkpoint_seconds: f64,
    /// `sync` calls.
    pub syncs: u64,
    /// Checkpoint generation on disk.
    pub generation: u64,
    /// Free bytes in the data area.
    pub free_bytes: u64,
    /// Size of the data area.
    pub data_bytes: u64,
    /// Free extents (fragmentation).
    pub free_extents: usize,
    /// The data area's use, dirty nodes included.
    pub space: SpaceUse,
    /// Size of the device.
    pub device_bytes: u64,
    /// The image was not closed cleanly before this open.
    pub opened_after_crash: bool,
    /// Log records replayed at open.
    pub recovered_records: u64,
    /// Why log replay stopped where it did at open.
    pub recovery_stop: String,
    /// Log records skipped at open because they could not be applied (only a writer with a bug
    /// logs such a record; see [`Engine::open`]).
    pub skipped_records: u64,
    /// The image is flagged for a check: records were skipped at some open since the flag was
    /// last cleared ([`Engine::clear_needs_check`]).
    pub needs_check: bool,
    /// The error that made the engine read-only, if any.
    pub failure: Option<String>,
    /// Damage is known (found by a read, or recorded in the superblock): what was found, if this
    /// session found it.
    pub known_damage: Option<String>,
    /// What was wrong with the superblock copies at open (damaged or overwritten copies, a
    /// fallback to a backup copy); empty when nothing was.
    pub superblock_notes: Vec<String>,
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most 8 bytes into b.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), 8, 0) };
    if n != 8 {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        return t.as_nanos() as u64 ^ (std::process::id() as u64) << 32;
    }
    u64::from_le_bytes(b)
}

impl Inner {
    fn check_writable(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        if self.tree.is_read_only() {
            return Err(Error::ReadOnly("read-only".into()));
        }
        if let Some(e) = self.failure() {
            return Err(Error::ReadOnly(e.to_string()));
        }
        Ok(())
    }

    /// Records that a read found damage: in memory, and (read-write) in the superblock copies of
    /// the current checkpoint at once, so that the next read-write open is refused until a repair.
    fn note_damage(&self, e: &Error) {
        if !e.is_damage() || self.damage.swap(true, Ordering::AcqRel) {
            return;
        }
        log::error!(
            "amaranth engine: damage found: {e}; the image needs `amaranth fsck --repair` \
             (until then it mounts read-only only)"
        );
        *self.damage_detail.lock() = Some(e.to_string());
        if self.tree.is_read_only() {
            return;
        }
        // A running checkpoint records it itself (it looks at the flag once its superblock is
        // written): never wait for it here, the checkpoint may be the reader that found it.
        if let Some(_c) = self.ckpt_lock.try_lock() {
            self.persist_damage();
        }
    }

    /// Rewrites the current checkpoint's superblock copies with the damage flag set. Call with
    /// `ckpt_lock` held.
    fn persist_damage(&self) {
        let mut sb = self.sb.lock().clone();
        // Read-only writes nothing (a switch to read-only sets the mode before it takes
        // `ckpt_lock` for its last checkpoint, which records the flag itself).
        if sb.damaged || !self.damage.load(Ordering::Acquire) || self.tree.is_read_only() {
            return;
        }
        sb.damaged = true;
        // Backups first: a torn write of the primary copy still leaves this checkpoint in them.
        let dev = &*self.dev;
        let r = sb
            .write_backups(dev)
            .and_then(|_| self.tree.store.flush("superblock backups (damage flag)"))
            .and_then(|_| sb.write(dev))
            .and_then(|_| self.tree.store.flush("superblock (damage flag)"));
        match r {
            Ok(()) => *self.sb.lock() = sb,
            Err(e) => {
                log::error!("amaranth engine: cannot record the damage in the superblock: {e}")
            }
        }
    }

    /// Passes `r` through, noting damage it reports.
    fn seen<T>(&self, r: Result<T>) -> Result<T> {
        if let Err(e) = &r {
            self.note_damage(e);
        }
        r
    }

    /// The failure that made the engine refuse writes, if any. Node writes happen on read paths
    /// too (a read making room in the cache writes dirty nodes back), where the error goes to the
    /// reader only: the store records the first failed write, and it fails the engine here, so
    /// that every check sees it before the next write.
    fn failure(&self) -> Option<Error> {
        let write_failure = self.tree.store.write_failure.lock().clone();
        if let Some(e) = write_failure {
            self.fail(&e);
        }
        self.failed.lock().clone()
    }

    fn fail(&self, e: &Error) {
        self.note_damage(e);
        if matches!(
            e,
            Error::Io { .. } | Error::Corrupt(_) | Error::Checksum { .. }
        ) {
            let mut f = self.failed.lock();
            if f.is_none() {
                log::error!("amaranth engine: refusing further writes after: {e}");
                *f = Some(e.clone());
            }
        }
    }

    fn note(&self, r: Result<()>) -> Result<()> {
        if let Err(e) = &r {
            self.fail(e);
        }
        r
    }

    /// Makes room in the log for `len` more bytes, checkpointing if needed.
    fn admit(&self, len: usize) -> Result<()> {
        match self.log.space(len) {
            Space::Ok => Ok(()),
            Space::CheckpointSoon => {
                if self.options.background_threads {
                    self.request(false, true);
                    Ok(())
                } else if self.groups.has_records() {
                    // Not needed yet; it would wait for the open atomic group.
                    Ok(())
                } else {
                    self.checkpoint(false)
                }
            }
            Space::Full => {
                if !self.options.background_threads {
                    return self.checkpoint(false);
                }
                self.request(false, true);
                match self.log.wait_space(len, Duration::from_secs(120)) {
                    Space::Full => Err(Error::NoSpace(
                        "the redo log stayed full (checkpoints are failing?)".into(),
                    )),
                    _ => Ok(()),
                }
            }
        }
    }

    fn request(&self, flush: bool, checkpoint: bool) {
        let mut w = self.wake_state.lock();
        w.flush_wanted |= flush;
        w.checkpoint_wanted |= checkpoint;
        self.wake.notify_all();
    }

    fn write_ops(&self, ops: Vec<Op>) -> Result<Lsn> {
        self.write_marked(ops, None)
    }

    /// Validates, admits, logs and applies a batch; `group` marks a record of an atomic group.
    fn write_marked(&self, ops: Vec<Op>, group: Option<apply::Gate<'_>>) -> Result<Lsn> {
        let _mode = self.mode.read();
        self.check_writable()?;
        for op in &ops {
            op.validate(&self.tree.format)?;
        }
        let estimate = ops::record_bytes(&ops) + if group.is_some() { ops::MARK_BYTES } else { 0 };
        if estimate > self.log.max_record() {
            return Err(Error::InvalidArgument(format!(
                "a batch of {estimate} bytes exceeds the largest log record ({} bytes)",
                self.log.max_record()
            )));
        }
        self.admit(estimate)?;
        let user_bytes: u64 = ops.iter().map(|o| o.user_bytes() as u64).sum();
        let deletes = ops
            .iter()
            .filter(|o| matches!(o, Op::RangeDelete { .. } | Op::MovePrefix { .. }))
            .count() as u64;
        let r = apply_ops(&self.tree, Some(&self.log), ops, None, group);
        let lsn = match r {
            Ok(l) => l.expect("a logged batch has an LSN"),
            Err(e) => {
                self.fail(&e);
                return Err(e);
            }
        };
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        self.counters
            .user_bytes
            .fetch_add(user_bytes, Ordering::Relaxed);
        if deletes > 0 {
            self.deletes_seen.fetch_add(deletes, Ordering::Relaxed);
        }
        self.after_write();
        Ok(lsn)
    }

    /// Housekeeping after an operation was applied: flush an overfull root, keep the memory bound,
    /// write a large log buffer. The operation is already applied and logged, so a failure here is
    /// not the operation's failure: it is recorded (an I/O failure makes the engine refuse later
    /// writes, and `sync` reports it) and, for lack of space, the memory bound is exceeded for a
    /// while instead.
    fn after_write(&self) {
        let node_size = self.tree.format.node_size;
        let r = (|| -> Result<()> {
            let root_bytes = self.tree.root_bytes()?;
            if root_bytes > node_size {
                if self.options.background_threads && root_bytes <= 2 * node_size {
                    self.request(true, false);
                } else {
                    flush_root(&self.tree, false)?;
                }
            }
            self.tree.make_room()?;
            if self.log.buffered() > LOG_WRITE_THRESHOLD.min(self.log.max_record()) {
                self.log.flush(false)?;
            }
            if self.garbage_over_bound() {
                if self.options.background_threads {
                    self.request(false, true);
                } else {
                    self.push_deletes_down(|| false)?;
                    self.checkpoint(false)?;
                    self.note_space_baseline();
                }
            }
            Ok(())
        })();
        match r {
            Ok(()) => {}
            Err(Error::NoSpace(m)) => log::warn!(
                "amaranth engine: cannot write back nodes ({m}); the cache is over its bound"
            ),
            Err(e) => self.fail(&e),
        }
        if self.options.background_threads {
            self.wake_state.lock().last_write = Some(Instant::now());
        }
    }

    fn sync(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        if self.tree.is_read_only() {
            return Ok(());
        }
        self.counters.syncs.fetch_add(1, Ordering::Relaxed);
        let r = self.log.flush(true);
        if let Err(e) = &r {
            self.fail(e);
        }
        r
    }

    /// Writes every dirty node copy-on-write, then the table and a superblock that points at them.
    fn checkpoint(&self, clean: bool) -> Result<()> {
        if self.tree.is_read_only() {
            return Ok(());
        }
        self.checkpoint_now(clean)
    }

    /// `checkpoint` whatever the mode (a switch to read-only writes its last checkpoint with this).
    fn checkpoint_now(&self, clean: bool) -> Result<()> {
        if let Some(e) = self.failure() {
            return Err(Error::ReadOnly(e.to_string()));
        }
        let _c = self.ckpt_lock.lock();
        let started = Instant::now();
        let tree = &self.tree;
        // Records buffered now are covered by this checkpoint; writing them first lets the log's
        // tail move past them.
        self.log.flush(false)?;
        let (tail_voff, tail_lsn, ckpt_lsn, next_msn, next_node_id, pending) = loop {
            // A checkpoint keeps no part of an uncommitted atomic group (engine/atomic.rs).
            self.settle_for_checkpoint()?;
            let _w = tree.writers.write();
            if self.groups.has_records() {
                continue;
            }
            let (tail_voff, tail_lsn) = self.log.replay_start();
            let ckpt_lsn = self.log.next_lsn();
            let mut btt = tree.store.btt.lock();
            btt.in_progress = Some(btt.current.clone());
            drop(btt);
            let mut pending = Vec::new();
            for cn in tree.cache.all() {
                let mut m = cn.meta.lock();
                if m.dirty && !m.deleted {
                    m.pending = true;
                    drop(m);
                    pending.push(cn);
                }
            }
            break (
                tail_voff,
                tail_lsn,
                ckpt_lsn,
                tree.next_msn.load(Ordering::Relaxed),
                tree.next_node_id.load(Ordering::Relaxed),
                pending,
            );
        };
        let mut table_ext: Option<Extent> = None;
        let mut pending = pending;
        let saved = &mut Vec::new();
        let result = (|| -> Result<Superblock> {
            // Each node is let go once written, so eviction can take it (clean now) while the
            // checkpoint goes on: under memory pressure the cache must not hold every node that
            // was dirty when the checkpoint began until it ends.
            // Images that modifiers saved meanwhile are written as they come, not held to the end.
            for cn in pending.drain(..) {
                saved.extend(tree.checkpoint_write(&cn)?);
                saved.extend(tree.drain_checkpoint_queue()?);
            }
            saved.extend(tree.drain_checkpoint_queue()?);
            let (table, count) = {
                let btt = tree.store.btt.lock();
                let ip = btt.in_progress.as_ref().expect("checkpoint in progress");
                if !ip.contains_key(&ROOT_ID) {
                    return Err(Error::Corrupt("checkpoint without a root".into()));
                }
                (store::encode_btt(ip), ip.len() as u64)
            };
            let ext = tree.store.write_new(&table, "block translation table")?;
            table_ext = Some(ext);
            tree.store.flush("checkpoint nodes")?;
            let mut sb = self.sb.lock().clone();
            sb.generation += 1;
            sb.clean = clean;
            sb.log_epoch = self.log.epoch();
            sb.log_tail_voff = tail_voff;
            sb.log_tail_lsn = tail_lsn;
            sb.ckpt_lsn = ckpt_lsn;
            sb.next_msn = next_msn;
            sb.next_node_id = next_node_id;
            sb.btt = ext;
            sb.btt_crc = store::table_crc(&table[..32 + count as usize * 24]);
            sb.btt_count = count;
            sb.checkpoint_unix = now_unix();
            sb.damaged = self.damage.load(Ordering::Acquire);
            sb.write(&*self.dev)?;
            tree.store.flush("superblock")?;
            // The backups follow once the primary copy is durable, and are durable themselves
            // before the previous checkpoint's extents are freed: a backup always describes a
            // checkpoint whose blocks are intact.
            if !sb.backups.is_empty() {
                sb.write_backups(&*self.dev)?;
                tree.store.flush("superblock backups")?;
            }
            Ok(sb)
        })();
        match result {
            Ok(sb) => {
                tree.store.btt.lock().complete_checkpoint(sb.btt);
                tree.adopt_checkpoint_images(saved);
                self.log.set_tail(tail_voff);
                *self.sb.lock() = sb;
                // Damage found while this checkpoint ran and not in its superblock: record it.
                self.persist_damage();
                self.counters.checkpoints.fetch_add(1, Ordering::Relaxed);
                self.counters
                    .checkpoint_nanos
                    .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                tree.store.btt.lock().abort_checkpoint(table_ext);
                // Only a checkpoint marks nodes pending, and this one holds `ckpt_lock`.
                for cn in tree.cache.all() {
                    cn.meta.lock().pending = false;
                }
                tree.clear_checkpoint_queue();
                self.fail(&e);
                Err(e)
            }
        }
    }

    fn background_checkpointer(self: &Arc<Inner>) {
        let mut last = Instant::now();
        loop {
            let wanted = {
                let mut w = self.wake_state.lock();
                let deadline = last + self.options.checkpoint_interval;
                while !self.stop.load(Ordering::Acquire)
                    && !w.checkpoint_wanted
                    && Instant::now() < deadline
                {
                    self.wake.wait_until(&mut w, deadline);
                }
                std::mem::take(&mut w.checkpoint_wanted)
            };
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            if self.failure().is_some() {
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
            let _ = wanted;
            // Deleted data leaves the device only once its range deletes reach the leaves: do
            // that before every checkpoint, so that space freed before a checkpoint starts is
            // free when it completes (unless the log is filling up: then the checkpoint first).
            let mut pushed = !self.deletes_pending();
            if !pushed {
                let log_limit = self.log.stats().capacity / 8 * 5;
                let give_up =
                    || self.stop.load(Ordering::Acquire) || self.log.stats().used > log_limit;
                match self.push_deletes_down(give_up) {
                    Ok(complete) => pushed = complete,
                    Err(e) => self.fail(&e),
                }
            }
            if self.checkpoint(false).is_ok() && pushed {
                self.note_space_baseline();
            }
            last = Instant::now();
        }
    }

    fn background_log_flusher(self: &Arc<Inner>) {
        loop {
            {
                let mut w = self.wake_state.lock();
                if !self.stop.load(Ordering::Acquire) {
                    self.wake.wait_for(&mut w, self.options.log_flush_interval);
                }
            }
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            let st = self.log.stats();
            if st.durable_lsn < st.next_lsn && self.failure().is_none() {
                let _ = self.sync();
            }
        }
    }

    /// Whether deleted data may hold more space than the bound allows: deletes are pending and
    /// use is past 1.5 times the baseline plus [`GARBAGE_SLACK_NODES`] nodes.
    fn garbage_over_bound(&self) -> bool {
        if !self.deletes_pending() {
            return false;
        }
        let slack = GARBAGE_SLACK_NODES * self.tree.format.node_size as u64;
        let base = self.space_baseline.load(Ordering::Relaxed);
        let bound = base + base / 2 + slack;
        self.space_use().used() > bound
    }

    /// Records the use now as the baseline (call after a checkpoint that followed a complete pass).
    fn note_space_baseline(&self) {
        self.space_baseline
            .store(self.space_use().used(), Ordering::Relaxed);
    }

    fn space_use(&self) -> SpaceUse {
        let t = &self.tree;
        let (total, free, entries) = {
            let b = t.store.btt.lock();
            (
                b.alloc.total_blocks(),
                b.alloc.free_blocks(),
                b.current.len() as u64,
            )
        };
        SpaceUse::new(total, free, t.cache.dirty_space(), entries)
    }

    /// Whether range deletes were applied since the last complete pass pushed them down.
    fn deletes_pending(&self) -> bool {
        self.deletes_seen.load(Ordering::Relaxed) > self.deletes_pushed.load(Ordering::Relaxed)
    }

    /// One round of a pass that pushes range deletes down to the leaves (merging emptied
    /// leaves), resuming at `from`, with at most `flushes` flushes. Returns where the next round
    /// resumes (`None`: the pass is complete).
    fn push_deletes_round(&self, from: &[u8], flushes: usize) -> Result<Option<Vec<u8>>> {
        let round = {
            let _w = self.tree.writers.read();
            self.tree.drain_from(from, flushes, true)
        };
        let (_, resume) = round?;
        self.tree.make_room()?;
        Ok(resume)
    }

    /// A whole pass (unless `give_up` says stop between rounds; returns whether it completed):
    /// afterwards every range delete applied before it began is in the leaves, whose next images
    /// no longer hold the deleted data; the next checkpoint frees the old images.
    /// The nodes a pass dirties need new extents before the old ones are freed: when they would
    /// take more than half the unallocated space, a checkpoint comes between rounds.
    fn push_deletes_down(&self, give_up: impl Fn() -> bool) -> Result<bool> {
        let counted = self.deletes_seen.load(Ordering::Relaxed);
        let mut from = Vec::new();
        while let Some(next) = self.push_deletes_round(&from, 32)? {
            if give_up() {
                return Ok(false);
            }
            let s = self.space_use();
            if s.dirty_next + s.table > (s.total - s.allocated) / 2 {
                self.checkpoint(false)?;
            }
            from = next;
        }
        self.deletes_pushed.fetch_max(counted, Ordering::Relaxed);
        Ok(true)
    }

    fn background_cleaner(self: &Arc<Inner>) {
        let node_size = self.tree.format.node_size;
        // Where the running pass that pushes range deletes down resumes, and how many deletes
        // had been counted when it began (those are the ones it will have pushed down).
        let mut reclaim: Option<(Vec<u8>, u64)> = None;
        let mut last_trim = Instant::now();
        loop {
            let (flush, idle) = {
                let mut w = self.wake_state.lock();
                // A pass pushing range deletes down goes on without pausing while idle.
                if !self.stop.load(Ordering::Acquire) && !w.flush_wanted && reclaim.is_none() {
                    self.wake.wait_for(&mut w, Duration::from_secs(1));
                }
                let idle = w
                    .last_write
                    .is_none_or(|t| t.elapsed() > Duration::from_secs(1));
                (std::mem::take(&mut w.flush_wanted), idle)
            };
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            if self.failure().is_some() {
                continue;
            }
            if flush {
                let _ = self.note(flush_root(&self.tree, false));
            } else if idle && (reclaim.is_some() || self.deletes_pending()) {
                // Idle after deletes: push range deletes down to the leaves, a few flushes per
                // tick, so that the deleted data's space comes back without waiting for the
                // next checkpoint; a checkpoint at the end of the pass frees the old images.
                let (from, counted) = reclaim
                    .take()
                    .unwrap_or_else(|| (Vec::new(), self.deletes_seen.load(Ordering::Relaxed)));
                match self.push_deletes_round(&from, 8) {
                    Ok(Some(next)) => reclaim = Some((next, counted)),
                    Ok(None) => {
                        self.deletes_pushed.fetch_max(counted, Ordering::Relaxed);
                        if self.checkpoint(false).is_ok() {
                            self.note_space_baseline();
                        }
                    }
                    Err(e) => self.fail(&e),
                }
            } else if idle {
                // Idle: drain heavy buffers a little at a time (bounded work per tick).
                for _ in 0..8 {
                    let step = {
                        let _w = self.tree.writers.read();
                        self.tree.flush_step(node_size / 2)
                    };
                    // Each step can load a child: keep the bound between steps, not after eight.
                    let step = step.and_then(|did| self.tree.make_room().map(|()| did));
                    match step {
                        Ok(true) => {}
                        Ok(false) => break,
                        Err(e) => {
                            self.fail(&e);
                            break;
                        }
                    }
                    if self.stop.load(Ordering::Acquire)
                        || self
                            .wake_state
                            .lock()
                            .last_write
                            .is_some_and(|t| t.elapsed() <= Duration::from_secs(1))
                    {
                        break;
                    }
                }
            }
            let _ = self.note(self.tree.make_room());
            if last_trim.elapsed() >= TRIM_INTERVAL {
                crate::heap::give_back_free_memory();
                last_trim = Instant::now();
            }
        }
    }
}

impl Engine {
    /// Creates a new, empty store on `dev` (everything on the device is lost).
    pub fn create(dev: Arc<dyn BlockDevice>, format: Format, options: Options) -> Result<Engine> {
        format.validate()?;
        options.validate(&format)?;
        let dev_len = dev.len();
        let dev_blocks = dev_len / BLOCK_SIZE as u64;
        let backups = backup_blocks(dev_blocks);
        // The log lies before the first backup copy (a quarter of the device).
        let max_log = backups[0].saturating_sub(2) * BLOCK_SIZE as u64;
        let log_size = format
            .log_size
            .unwrap_or_else(|| (dev_len / 16).clamp(4 << 20, 256 << 20).min(max_log))
            .max(16 * BLOCK_SIZE as u64)
            / BLOCK_SIZE as u64
            * BLOCK_SIZE as u64;
        let log_blocks = log_size / BLOCK_SIZE as u64;
        let data_start = 2 + log_blocks;
        let min_data = (8 * format.node_size / BLOCK_SIZE) as u64;
        if dev_blocks < data_start + min_data {
            return Err(Error::TooSmall(format!(
                "{} has {} bytes; an image with a {} MiB log and {} KiB nodes needs at least {} bytes",
                dev.describe(),
                dev_len,
                log_size >> 20,
                format.node_size >> 10,
                (data_start + min_data) * BLOCK_SIZE as u64
            )));
        }
        if log_size > max_log {
            return Err(Error::TooSmall(format!(
                "{} has {} bytes; a {} KiB log must fit in the first quarter of the device (the \
                 first backup superblock follows it), so the device needs at least {} bytes",
                dev.describe(),
                dev_len,
                log_size >> 10,
                4 * (log_size + 2 * BLOCK_SIZE as u64)
            )));
        }
        // Invalidate whatever image was there before, backups included.
        let zero = amaranth_device::AlignedBuf::zeroed(BLOCK_SIZE);
        for b in [0, 1].iter().chain(&backups) {
            dev.write_at(b * BLOCK_SIZE as u64, &zero)
                .map_err(|e| Error::io("clearing the superblocks", e))?;
        }
        dev.flush()
            .map_err(|e| Error::io("clearing the superblocks", e))?;
        let mut uuid = [0u8; 16];
        uuid[..8].copy_from_slice(&random_u64().to_le_bytes());
        uuid[8..].copy_from_slice(&random_u64().to_le_bytes());
        let epoch = random_u64() >> 1;
        let sb = Superblock {
            version: FORMAT_VERSION,
            generation: 0,
            uuid,
            device_blocks: dev_blocks,
            node_size: format.node_size as u32,
            partition_size: format.partition_size as u32,
            max_fanout: format.max_fanout as u32,
            max_key_len: format.max_key_len as u32,
            max_value_len: format.max_value_len as u32,
            compression: format.compression.code(),
            clean: false,
            needs_check: false,
            log_start_block: 2,
            log_blocks,
            log_epoch: epoch,
            log_tail_voff: 0,
            log_tail_lsn: 1,
            ckpt_lsn: 1,
            next_msn: 1,
            next_node_id: ROOT_ID + 1,
            root_id: ROOT_ID,
            btt: Extent {
                block: data_start,
                blocks: 1,
            },
            btt_crc: 0,
            btt_count: 0,
            created_unix: now_unix(),
            checkpoint_unix: 0,
            label: String::new(),
            damaged: false,
            backups: backups.clone(),
        };
        let mut alloc = Allocator::new(data_start, dev_blocks);
        for &b in &backups {
            assert!(
                alloc.claim(Extent {
                    block: b,
                    blocks: 1
                }),
                "backup block {b} outside the free data area"
            );
        }
        let btt = Btt {
            current: HashMap::new(),
            checkpointed: HashMap::new(),
            in_progress: None,
            checkpointed_table: None,
            alloc,
        };
        let store = Arc::new(Store::new(dev.clone(), btt));
        let mut tree = Tree::new(format, store, options.cache_size, ROOT_ID + 1, 1);
        tree.check_invariants |= options.check_invariants;
        tree.cache.insert(ROOT_ID, Node::empty_leaf(), true, 0);
        let log = Log::new(
            dev.clone(),
            2 * BLOCK_SIZE as u64,
            log_size,
            options.checkpoint_log_fraction,
            LogPosition {
                epoch,
                voff: 0,
                next_lsn: 1,
            },
        );
        let engine = Engine::assemble(dev, tree, log, options, sb, false, 0);
        engine.inner.checkpoint(false)?;
        engine.start_threads();
        Ok(engine)
    }

    /// Opens an existing store, replaying the log after its last checkpoint.
    ///
    /// A log record that cannot be applied (it does not decode, or it would write a key or value
    /// past the format's limits; only a writer with a bug logs one, since every batch is checked
    /// before it is logged) does not make the image unopenable: it is skipped whole, with an error
    /// in the log, counted in [`Stats::skipped_records`], and the image is flagged for a check
    /// ([`Stats::needs_check`], kept in the superblock).
    pub fn open(dev: Arc<dyn BlockDevice>, options: Options) -> Result<Engine> {
        let Loaded {
            located,
            mut sb,
            tree,
            ..
        } = load_checkpoint(&dev, &options)?;
        if sb.damaged && !options.read_only && !options.salvage {
            return Err(Error::Damaged(format!(
                "recorded by checkpoint {} when a read found a damaged node",
                sb.generation
            )));
        }
        if !options.read_only {
            // Before anything is written: the backups must describe this checkpoint before the
            // allocator hands out blocks an older one still uses.
            copies::heal(&*dev, &located)?;
            load::upgrade_v1(&mut sb, &tree.store);
        }
        let mut salvaged = None;
        if options.salvage {
            let mut report = salvage::survey(&tree)?;
            if !report.damage.is_empty() {
                log::warn!(
                    "amaranth engine: {} damaged nodes, partitions or buffers; rebuilding the tree \
                     from what is intact",
                    report.damage.len()
                );
                report = salvage::rebuild(&tree)?;
            }
            report.superblock = located.describe();
            salvaged = Some(report);
        }
        let region_start = sb.log_start_block * BLOCK_SIZE as u64;
        let region_len = sb.log_blocks * BLOCK_SIZE as u64;
        let ckpt_lsn = sb.ckpt_lsn;
        let mut skipped = 0u64;
        // A repair replays what it can: a record whose application hits damage ends the replay.
        let mut replay_stop: Option<String> = None;
        let mut replay = atomic::Replay::default();
        let recovered = wal::recover(
            &*dev,
            region_start,
            region_len,
            sb.log_epoch,
            sb.log_tail_voff,
            sb.log_tail_lsn,
            !sb.clean,
            |lsn, payload| {
                replay.record(lsn, payload, &mut |lsn, payload| {
                    if lsn < ckpt_lsn || replay_stop.is_some() {
                        return Ok(());
                    }
                    match apply::replay_record(&tree, lsn, payload, &mut skipped) {
                        Err(e) if options.salvage && e.is_damage() => {
                            replay_stop =
                                Some(format!("log record {lsn} could not be replayed: {e}"));
                            Ok(())
                        }
                        r => r,
                    }
                })
            },
        )?;
        let dropped = match replay.finish() {
            Some((group, records)) => {
                log::warn!(
                    "amaranth engine: atomic group {group} never committed: its records and \
                     everything logged after its first one ({records} records) were dropped"
                );
                records as u64
            }
            None => 0,
        };
        if skipped > 0 {
            // Kept in the superblock (the next checkpoint writes it) until a check clears it.
            sb.needs_check = true;
            log::error!(
                "amaranth engine: {skipped} log records could not be applied; run `amaranth fsck`"
            );
        }
        if let Some(e) = recovered.damage.clone() {
            match &mut salvaged {
                Some(report) => report.log = Some(e.to_string()),
                None => return Err(e),
            }
        }
        if let (Some(report), Some(stop)) = (&mut salvaged, replay_stop) {
            report.log = Some(stop);
        }
        let replayed = (recovered.records - dropped).min(
            recovered
                .next_lsn
                .saturating_sub(ckpt_lsn)
                .saturating_sub(dropped),
        );
        let epoch = if options.read_only {
            sb.log_epoch
        } else {
            sb.log_epoch.wrapping_add(1)
        };
        let log = Log::new(
            dev.clone(),
            region_start,
            region_len,
            options.checkpoint_log_fraction,
            LogPosition {
                epoch,
                voff: recovered.resume_voff,
                next_lsn: recovered.next_lsn.max(ckpt_lsn),
            },
        );
        let after_crash = !sb.clean;
        let read_only = options.read_only;
        let damaged = sb.damaged;
        let mut engine = Engine::assemble(dev, tree, log, options, sb, after_crash, replayed);
        if let Some(inner) = Arc::get_mut(&mut engine.inner) {
            inner.recovery_stop = recovered.stop_reason;
            inner.skipped_records = skipped;
            inner.superblock_notes = located.describe();
            inner.damage = AtomicBool::new(damaged && !inner.options.salvage);
            inner.salvaged = salvaged;
        }
        if !read_only {
            // A checkpoint starts a new log epoch: chunks left from before can never be replayed.
            engine.inner.checkpoint(false)?;
            engine.inner.note_space_baseline();
            engine.start_threads();
        }
        Ok(engine)
    }

    fn assemble(
        dev: Arc<dyn BlockDevice>,
        tree: Tree,
        log: Log,
        options: Options,
        sb: Superblock,
        opened_after_crash: bool,
        recovered_records: u64,
    ) -> Engine {
        Engine {
            inner: Arc::new(Inner {
                dev,
                tree,
                log,
                options,
                sb: Mutex::new(sb),
                ckpt_lock: Mutex::new(()),
                failed: Mutex::new(None),
                closed: AtomicBool::new(false),
                stop: AtomicBool::new(false),
                wake: Condvar::new(),
                wake_state: Mutex::new(WakeState::default()),
                counters: EngineCounters::default(),
                // After a crash the tree may hold range deletes nobody pushed down yet.
                deletes_seen: AtomicU64::new(opened_after_crash as u64),
                deletes_pushed: AtomicU64::new(0),
                space_baseline: AtomicU64::new(0),
                opened_after_crash,
                recovered_records,
                recovery_stop: String::new(),
                skipped_records: 0,
                mode: parking_lot::RwLock::new(()),
                damage: AtomicBool::new(false),
                damage_detail: Mutex::new(None),
                superblock_notes: Vec::new(),
                salvaged: None,
                groups: atomic::Groups::default(),
            }),
            threads: Mutex::new(Vec::new()),
        }
    }

    fn start_threads(&self) {
        if !self.inner.options.background_threads || self.inner.tree.is_read_only() {
            return;
        }
        self.inner.stop.store(false, Ordering::Release);
        let mut t = self.threads.lock();
        let spawn = |name: &str, f: fn(&Arc<Inner>)| {
            let inner = self.inner.clone();
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || f(&inner))
                .expect("spawning an engine thread")
        };
        t.push(spawn("amaranth-log", Inner::background_log_flusher));
        t.push(spawn("amaranth-ckpt", Inner::background_checkpointer));
        t.push(spawn("amaranth-clean", Inner::background_cleaner));
    }

    fn stop_threads(&self) {
        self.inner.stop.store(true, Ordering::Release);
        {
            let _w = self.inner.wake_state.lock();
            self.inner.wake.notify_all();
        }
        for h in self.threads.lock().drain(..) {
            let _ = h.join();
        }
    }

    /// Sets `key` to `value`.
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<Lsn> {
        self.inner.write_ops(vec![Op::Put {
            key: key.to_vec(),
            value: value.to_vec(),
        }])
    }

    /// Removes `key` (a no-op if absent).
    pub fn delete(&self, key: &[u8]) -> Result<Lsn> {
        self.inner.write_ops(vec![Op::Delete { key: key.to_vec() }])
    }

    /// Patches the value of `key` without reading it.
    pub fn upsert(&self, key: &[u8], patch: Patch) -> Result<Lsn> {
        self.inner.write_ops(vec![Op::Upsert {
            key: key.to_vec(),
            patch,
        }])
    }

    /// Removes every key in `[lo, hi)`.
    pub fn range_delete(&self, lo: &[u8], hi: &[u8]) -> Result<Lsn> {
        self.inner.write_ops(vec![Op::RangeDelete {
            lo: lo.to_vec(),
            hi: hi.to_vec(),
        }])
    }

    /// Applies a batch atomically (one log record) and returns its LSN.
    pub fn write(&self, batch: &Batch) -> Result<Lsn> {
        self.inner.write_ops(batch.ops.clone())
    }

    /// Records `bytes` of memory held outside the engine that the cache bound covers as well (the
    /// file system's inode table): the nodes then keep to the bound less these bytes, but never to
    /// less than half of it (see [`Engine::external_memory_allowance`]). Takes effect at the next
    /// eviction.
    pub fn set_external_memory(&self, bytes: usize) {
        self.inner.tree.cache.set_external(bytes);
    }

    /// How many bytes held outside the engine the cache bound can cover: the bound less the half
    /// the nodes always keep. Beyond it, memory held outside adds to the bound.
    pub fn external_memory_allowance(&self) -> usize {
        self.inner.tree.cache.external_allowance()
    }

    /// The value of `key`.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        if key.len() > self.inner.tree.format.max_key_len {
            return Err(Error::KeyTooLong {
                len: key.len(),
                max: self.inner.tree.format.max_key_len,
            });
        }
        let r = self.inner.seen(self.inner.tree.get(key));
        let _ = self.inner.tree.make_room();
        r
    }

    /// Calls `f(key, value)` for every live entry of the range in key order until it returns false.
    /// Not a snapshot: each leaf's range is read consistently, and every key is visited at most once.
    pub fn scan(
        &self,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
        mut f: impl FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<()> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        let (lo, hi) = normalize(lo, hi);
        let Some(lo) = lo else { return Ok(()) };
        self.inner
            .seen(scan_tree(&self.inner.tree, &lo, hi.as_deref(), &mut f))?;
        self.inner.tree.make_room()
    }

    /// Iterates over the range in increasing key order (owned copies; see [`Engine::scan`]).
    pub fn range(&self, lo: Bound<&[u8]>, hi: Bound<&[u8]>) -> RangeIter<'_> {
        RangeIter::new(self, lo, hi, true)
    }

    /// Iterates over the range in decreasing key order.
    pub fn range_rev(&self, lo: Bound<&[u8]>, hi: Bound<&[u8]>) -> RangeIter<'_> {
        RangeIter::new(self, lo, hi, false)
    }

    /// Returns once every operation acknowledged before the call is on stable storage (and will
    /// survive a crash: if an atomic group's first record precedes the call, this waits for the
    /// group's commit, see [`Engine::begin_atomic`]).
    pub fn sync(&self) -> Result<()> {
        self.inner.settle_before(self.inner.log.next_lsn())?;
        self.inner.sync()
    }

    /// Returns once the operation with LSN `lsn` (and everything before it) is on stable storage
    /// (waiting, like [`Engine::sync`], for an atomic group that began before it).
    pub fn sync_to(&self, lsn: Lsn) -> Result<()> {
        self.inner.settle_before(lsn + 1)?;
        let target = self.inner.log.next_lsn();
        self.inner
            .log
            .flush_to(target, true)
            .inspect_err(|e| self.inner.fail(e))
    }

    /// Writes a checkpoint now (every dirty node, the table, a superblock), freeing log space.
    pub fn checkpoint(&self) -> Result<()> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        self.inner.checkpoint(false)
    }

    /// Flushes buffers until none holds more than `threshold` bytes along the heaviest paths
    /// (what the background cleaner does when idle). Returns the number of flush steps.
    pub fn flush_buffers(&self, threshold: usize, max_steps: usize) -> Result<usize> {
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
                self.inner.tree.drain_from(&from, steps, false)
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
        let _c = self.inner.ckpt_lock.lock();
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

    /// A snapshot of counters and sizes.
    pub fn stats(&self) -> Stats {
        let i = &self.inner;
        let t = &i.tree;
        let height = t.pin(ROOT_ID).map(|r| r.read().height).unwrap_or(0);
        let (nodes_on_disk, free, total, frag) = {
            let b = t.store.btt.lock();
            (
                b.current.len() as u64,
                b.alloc.free_blocks(),
                b.alloc.total_blocks(),
                b.alloc.free_extents(),
            )
        };
        let all = t.cache.all();
        let dirty = all.iter().filter(|c| c.is_dirty()).count();
        let unwritten = all
            .iter()
            .filter(|c| t.store.location(c.id).is_none())
            .count() as u64;
        let (generation, needs_check) = {
            let sb = i.sb.lock();
            (sb.generation, sb.needs_check)
        };
        let device = i.dev.io_stats();
        let user = i.counters.user_bytes.load(Ordering::Relaxed);
        let sc = &t.store.counters;
        let cc = &t.cache.counters;
        let tc = &t.counters;
        Stats {
            height,
            nodes: nodes_on_disk + unwritten,
            cached_nodes: all.len(),
            dirty_nodes: dirty,
            cache_bytes: t.cache.used(),
            cache_peak_bytes: cc.peak.load(Ordering::Relaxed),
            cache_budget: t.cache.budget(),
            cache_external_bytes: t.cache.external(),
            cache_hits: cc.hits.load(Ordering::Relaxed),
            cache_misses: cc.misses.load(Ordering::Relaxed),
            partition_loads: cc.partition_loads.load(Ordering::Relaxed),
            evictions: cc.evictions.load(Ordering::Relaxed),
            writebacks: cc.writebacks.load(Ordering::Relaxed),
            writes: i.counters.writes.load(Ordering::Relaxed),
            user_bytes_written: user,
            device,
            node_writes: sc.nodes_written.load(Ordering::Relaxed),
            node_bytes_written: sc.node_bytes_written.load(Ordering::Relaxed),
            node_reads: sc.node_reads.load(Ordering::Relaxed),
            node_bytes_read: sc.node_bytes_read.load(Ordering::Relaxed),
            write_amplification: if user > 0 {
                device.bytes_written as f64 / user as f64
            } else {
                0.0
            },
            log: i.log.stats(),
            flushes: tc.flushes.load(Ordering::Relaxed),
            bytes_flushed: tc.bytes_flushed.load(Ordering::Relaxed),
            leaf_splits: tc.leaf_splits.load(Ordering::Relaxed),
            internal_splits: tc.internal_splits.load(Ordering::Relaxed),
            merges: tc.merges.load(Ordering::Relaxed),
            checkpoints: i.counters.checkpoints.load(Ordering::Relaxed),
            checkpoint_seconds: i.counters.checkpoint_nanos.load(Ordering::Relaxed) as f64 / 1e9,
            syncs: i.counters.syncs.load(Ordering::Relaxed),
            generation,
            free_bytes: free * BLOCK_SIZE as u64,
            data_bytes: total * BLOCK_SIZE as u64,
            free_extents: frag,
            space: self.space_use(),
            device_bytes: i.dev.len(),
            opened_after_crash: i.opened_after_crash,
            recovered_records: i.recovered_records,
            recovery_stop: i.recovery_stop.clone(),
            skipped_records: i.skipped_records,
            needs_check,
            failure: i.failure().map(|e| e.to_string()),
            known_damage: if i.damage.load(Ordering::Acquire) {
                Some(
                    i.damage_detail.lock().clone().unwrap_or_else(|| {
                        "recorded in the superblock by an earlier session".into()
                    }),
                )
            } else {
                None
            },
            superblock_notes: i.superblock_notes.clone(),
        }
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
        self.inner.check_writable()?;
        // Not while a checkpoint runs: it would put back the copy it started from.
        let _c = self.inner.ckpt_lock.lock();
        self.inner.sb.lock().needs_check = false;
        Ok(())
    }

    /// The image's uuid and label (as of the last checkpoint, or as set since).
    pub fn identity(&self) -> ([u8; 16], String) {
        let sb = self.inner.sb.lock();
        (sb.uuid, sb.label.clone())
    }

    /// Sets the image's uuid and label (`mkfs -U`, `-L`); they are written with the next checkpoint
    /// (at the latest when the engine is closed).
    pub fn set_identity(&self, uuid: [u8; 16], label: &str) -> Result<()> {
        crate::superblock::check_label(label).map_err(Error::InvalidArgument)?;
        self.inner.check_writable()?;
        let mut sb = self.inner.sb.lock();
        sb.uuid = uuid;
        sb.label = label.to_string();
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
            cut.and_then(|()| self.inner.checkpoint(true))
        };
        self.inner.closed.store(true, Ordering::Release);
        r
    }

    /// Simulates a crash for tests: stops the threads and abandons everything in memory without
    /// writing anything more.
    pub fn abandon(self) {
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
        if self.inner.closed.load(Ordering::Acquire) {
            return;
        }
        self.stop_threads();
        if !self.inner.tree.is_read_only() && self.inner.failure().is_none() {
            let _ = self.inner.log.flush(true);
        }
        self.inner.closed.store(true, Ordering::Release);
    }
}

/// Converts bounds to an inclusive low key and an exclusive high key (`None` low: empty range).
fn normalize(lo: Bound<&[u8]>, hi: Bound<&[u8]>) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
    let lo = match lo {
        Bound::Included(k) => Some(k.to_vec()),
        Bound::Excluded(k) => {
            let mut v = k.to_vec();
            v.push(0);
            Some(v)
        }
        Bound::Unbounded => Some(Vec::new()),
    };
    let hi = match hi {
        Bound::Included(k) => {
            let mut v = k.to_vec();
            v.push(0);
            Some(v)
        }
        Bound::Excluded(k) => Some(k.to_vec()),
        Bound::Unbounded => None,
    };
    match (&lo, &hi) {
        (Some(l), Some(h)) if l >= h => (None, hi),
        _ => (lo, hi),
    }
}

/// An iterator over a key range, one leaf at a time.
pub struct RangeIter<'a> {
    engine: &'a Engine,
    lo: Vec<u8>,
    hi: Option<Vec<u8>>,
    forward: bool,
    /// Next position: forward, the inclusive start; reverse, the exclusive end.
    cursor: Option<Option<Vec<u8>>>,
    buf: VecDeque<(Vec<u8>, Vec<u8>)>,
}

impl<'a> RangeIter<'a> {
    fn new(engine: &'a Engine, lo: Bound<&[u8]>, hi: Bound<&[u8]>, forward: bool) -> RangeIter<'a> {
        let (lo, hi) = normalize(lo, hi);
        let cursor = lo
            .as_ref()
            .map(|l| if forward { Some(l.clone()) } else { hi.clone() });
        RangeIter {
            engine,
            lo: lo.unwrap_or_default(),
            hi,
            forward,
            cursor,
            buf: VecDeque::new(),
        }
    }

    fn refill(&mut self) -> Result<()> {
        let tree = &self.engine.inner.tree;
        while self.buf.is_empty() {
            let Some(cur) = self.cursor.take() else {
                return Ok(());
            };
            let buf = &mut self.buf;
            let mut push = |k: &[u8], v: &[u8]| {
                buf.push_back((k.to_vec(), v.to_vec()));
                true
            };
            if self.forward {
                let start = cur.expect("forward cursor");
                let chunk = tree.chunk(Target::AtOrAfter(&start), &start, self.hi.as_deref())?;
                chunk.walk(&start, self.hi.as_deref(), true, &mut push);
                self.cursor = match &chunk.hi {
                    Some(h) if self.hi.as_ref().is_none_or(|e| h < e) => Some(Some(h.clone())),
                    _ => None,
                };
            } else {
                let chunk = tree.chunk(Target::Before(cur.as_deref()), &self.lo, cur.as_deref())?;
                chunk.walk(&self.lo, cur.as_deref(), false, &mut push);
                self.cursor = if !chunk.lo.is_empty() && chunk.lo > self.lo {
                    Some(Some(chunk.lo.clone()))
                } else {
                    None
                };
            }
            tree.make_room()?;
        }
        Ok(())
    }
}

impl Iterator for RangeIter<'_> {
    type Item = Result<(Vec<u8>, Vec<u8>)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.buf.is_empty() {
            if let Err(e) = self.refill() {
                self.engine.inner.note_damage(&e);
                self.cursor = None;
                return Some(Err(e));
            }
        }
        self.buf.pop_front().map(Ok)
    }
}
