//! The write path: a batch is validated, admitted to the log (checkpointing when the log is
//! full), logged and applied in one step; the housekeeping after a write keeps the root, the
//! cache and the log buffer within their bounds; `sync` makes the log durable.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::Inner;
use crate::apply::{self, apply_ops, flush_root};
use crate::error::{Error, Result};
use crate::ops::{self, Op};
use crate::wal::{Lsn, Space};

/// The log buffer is written (not synced) once it holds this much: by the log thread when the
/// background threads run (the request that crossed it does not wait for the device), else by the
/// writer.
const LOG_WRITE_THRESHOLD: usize = 1 << 20;

/// With the background threads, a writer writes the log buffer itself only once it holds this
/// many times the threshold (the log thread is behind): the bound on the buffer. See
/// [`Inner::log_backstop`] for logs too small for it.
const LOG_WRITE_BACKSTOP: usize = 4;

impl Inner {
    /// Makes room in the log for `len` more bytes, checkpointing if needed.
    pub(super) fn admit(&self, len: usize) -> Result<()> {
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

    /// Whether a checkpoint is needed now: the log is past its checkpoint fraction, or deleted
    /// data holds more space than its bound (the two reasons writers request one for).
    pub(super) fn checkpoint_needed(&self) -> bool {
        self.log.space(0) != Space::Ok || self.garbage_over_bound()
    }

    pub(super) fn request(&self, flush: bool, checkpoint: bool) {
        let mut w = self.wake_state.lock();
        w.flush_wanted |= flush;
        w.checkpoint_wanted |= checkpoint;
        self.wake.notify_all();
    }

    pub(super) fn write_ops(&self, ops: Vec<Op>) -> Result<Lsn> {
        self.write_marked(ops, None)
    }

    /// Validates, admits, logs and applies a batch; `group` marks a record of an atomic group.
    /// Out-of-line blocks ([`Op::PutBlocks`]) are written first, and the record is appended only
    /// once their writes completed (docs/WRITEONCE.md §2): a `sync` that covers the record then
    /// covers the data.
    pub(super) fn write_marked(
        &self,
        mut ops: Vec<Op>,
        group: Option<apply::Gate<'_>>,
    ) -> Result<Lsn> {
        let _mode = self.mode.read();
        self.check_writable()?;
        for op in &ops {
            op.validate(&self.tree.format)?;
            if let Op::PutBlocks { data, .. } = op {
                if data.bytes().is_none() {
                    return Err(Error::InvalidArgument(
                        "out-of-line blocks read back from the log cannot be written again".into(),
                    ));
                }
            }
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
            // A range move deletes nothing by surgery (its dead destination subtrees go at
            // once), and only a range within its `copy_max` when it copies: not counted.
            .filter(|o| matches!(o, Op::RangeDelete { .. } | Op::MovePrefix { .. }))
            .count() as u64;
        // Room for what the messages will take in the root's buffers (as `Buffer::mem` counts
        // them; out-of-line blocks are not in the estimate, only their references). As after an
        // operation, a node that cannot be written back for want of space leaves the cache over
        // its bound rather than failing the write.
        let mem = estimate + ops.len() * crate::buffer::ENTRY_OVERHEAD;
        match self.tree.make_room_for_batch(mem) {
            Ok(()) => {}
            Err(Error::NoSpace(m)) => log::warn!(
                "amaranth engine: cannot write back nodes ({m}); the cache is over its bound"
            ),
            Err(e) => {
                self.fail(&e);
                return Err(e);
            }
        }
        self.write_blocks(&mut ops)?;
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

    /// Writes the blocks of the batch's [`Op::PutBlocks`] out of line, each to a fresh extent,
    /// and records where they went. On a failure the extents written so far are freed.
    fn write_blocks(&self, ops: &mut [Op]) -> Result<()> {
        let store = &self.tree.store;
        let mut written = Vec::new();
        for op in ops.iter_mut() {
            let Op::PutBlocks { data, .. } = op else {
                continue;
            };
            let (buf, len) = data.shared().expect("blocks from a caller are bytes");
            match store.write_data(buf, len) {
                Ok(ext) => {
                    data.place(ext.block);
                    written.push(ext);
                }
                Err(e) => {
                    for ext in written {
                        store.settle_data(ext, false);
                    }
                    if matches!(e, Error::Io { .. }) {
                        self.fail(&e);
                    }
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Housekeeping after an operation was applied: flush an overfull root, keep the memory bound,
    /// have a large log buffer written. The operation is already applied and logged, so a failure here is
    /// not the operation's failure: it is recorded (an I/O failure makes the engine refuse later
    /// writes, and `sync` reports it) and, for lack of space, the memory bound is exceeded for a
    /// while instead.
    pub(super) fn after_write(&self) {
        let node_size = self.tree.format.node_size;
        let mut wake_log = false;
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
            let threshold = LOG_WRITE_THRESHOLD.min(self.log.max_record());
            let buffered = self.log.buffered();
            if buffered > threshold {
                if self.options.background_threads && buffered <= self.log_backstop(threshold) {
                    wake_log = true;
                } else {
                    self.log.flush(false)?;
                }
            }
            if self.garbage_over_bound() {
                if self.options.background_threads {
                    self.request(false, true);
                } else if self.groups.has_records() {
                    // Not needed yet: the checkpoint would wait for the open atomic group (and
                    // cut it at its deadline, stalling this unrelated writer); a write after the
                    // group's commit takes it.
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
            let mut w = self.wake_state.lock();
            w.last_write = Some(Instant::now());
            if wake_log && !w.log_write_wanted {
                w.log_write_wanted = true;
                self.wake.notify_all();
            }
        }
    }

    /// The log buffer's size from which a writer writes it itself. A chunk that does not fit
    /// before the end of the log's region starts at its beginning, wasting up to its own length, so
    /// a buffer must stay under a quarter of the log: the backstop is at most a sixteenth of it (a
    /// buffer holds at most the backstop plus one record, an eighth), and never below the threshold
    /// (small logs write at the threshold, as before).
    fn log_backstop(&self, threshold: usize) -> usize {
        let sixteenth = self.log.max_record() / 2;
        threshold.max((LOG_WRITE_BACKSTOP * LOG_WRITE_THRESHOLD).min(sixteenth))
    }

    pub(super) fn sync(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        if self.tree.is_read_only() {
            return Ok(());
        }
        self.counters.syncs.fetch_add(1, Ordering::Relaxed);
        let r = self.log.flush(true);
        match &r {
            Err(e) => self.fail(e),
            Ok(()) => self.wake_for_marker(),
        }
        r
    }

    /// Wakes the log thread when a durable flush left it an end marker to write.
    pub(super) fn wake_for_marker(&self) {
        if self.log.marker_due() {
            let mut w = self.wake_state.lock();
            if !w.marker_wanted {
                w.marker_wanted = true;
                self.wake.notify_all();
            }
        }
    }
}
