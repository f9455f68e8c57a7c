//! The background threads: the log flusher (group commit at `Options::log_flush_interval`), the
//! checkpointer (at `Options::checkpoint_interval` or when asked) and the cleaner (flushes an
//! overfull root, drains heavy buffers and pushes range deletes down while idle, heals fringes,
//! collects dead nodes, gives free memory back).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Engine, Inner};
use crate::apply::flush_root;

/// Threads reading ahead (each has one leaf read in flight).
const READ_AHEAD_WORKERS: usize = 2;

/// Dead nodes the cleaner frees per tick (docs/SURGERY.md §4.4: bounded work per step).
const COLLECT_PER_TICK: usize = 64;

/// Fringes the cleaner heals per tick.
const HEAL_PER_TICK: usize = 8;

/// How often the cleaner hands the allocator's free pages back to the system.
const TRIM_INTERVAL: Duration = Duration::from_secs(1);

/// How long after the last durable flush that left an end marker the log thread writes it: a
/// sync that follows sooner writes its chunk there instead (the marker would cost each of a
/// stream of syncs a third device request).
const MARKER_DELAY: Duration = Duration::from_millis(5);

impl Engine {
    pub(super) fn start_threads(&self) {
        if !self.inner.tree.is_read_only() {
            let store = &self.inner.tree.store;
            store
                .writer
                .start(self.inner.dev.clone(), self.inner.options.data_writers);
        }
        self.start_read_ahead();
        if !self.inner.options.background_threads || self.inner.tree.is_read_only() {
            return;
        }
        self.inner.stop.store(false, Ordering::Release);
        // The log thread writes the end markers after durable flushes (`sync` wakes it).
        self.inner.log.defer_end_markers();
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

    /// Read-ahead workers run in read-only mode too (they only read), but not when the background
    /// threads are off (tests that want every step in the calling thread).
    fn start_read_ahead(&self) {
        if !self.inner.options.background_threads {
            return;
        }
        let tree = &self.inner.tree;
        let window = tree.read_ahead_window(self.inner.options.read_ahead);
        if window == 0 {
            return;
        }
        tree.readahead.start(window);
        let mut t = self.threads.lock();
        for i in 0..READ_AHEAD_WORKERS {
            let inner = self.inner.clone();
            t.push(
                std::thread::Builder::new()
                    .name(format!("amaranth-ra{i}"))
                    .spawn(move || inner.tree.read_ahead_worker())
                    .expect("spawning a read-ahead thread"),
            );
        }
    }

    pub(super) fn stop_threads(&self) {
        self.inner.tree.readahead.stop();
        self.inner.tree.store.writer.stop();
        self.inner.stop.store(true, Ordering::Release);
        {
            let _w = self.inner.wake_state.lock();
            self.inner.wake.notify_all();
        }
        for h in self.threads.lock().drain(..) {
            let _ = h.join();
        }
    }
}

impl Inner {
    fn background_checkpointer(self: &Arc<Inner>) {
        let mut last = Instant::now();
        loop {
            let (wanted, due) = {
                let mut w = self.wake_state.lock();
                let deadline = last + self.options.checkpoint_interval;
                while !self.stop.load(Ordering::Acquire)
                    && !w.checkpoint_wanted
                    && Instant::now() < deadline
                {
                    self.wake.wait_until(&mut w, deadline);
                }
                (
                    std::mem::take(&mut w.checkpoint_wanted),
                    Instant::now() >= deadline,
                )
            };
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            if self.failure().is_some() {
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
            // Writers ask again at every write while the log is past its checkpoint fraction, so
            // a request made while a checkpoint ran is usually one that checkpoint satisfied (it
            // moved the log's tail): run another only if the reason still holds. Without this, a
            // second full checkpoint followed every one the log's fill started.
            if wanted && !due && !self.checkpoint_needed() {
                self.counters
                    .checkpoint_requests_dropped
                    .fetch_add(1, Ordering::Relaxed);
                continue;
            }
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

    /// Makes the log durable every `log_flush_interval` (and when woken for another reason),
    /// writes (without a device flush) a log buffer that a writer found past its threshold, and
    /// writes the end marker a durable flush left ([`MARKER_DELAY`] after the last one asked for
    /// it, so that under a stream of syncs the next chunk takes the marker's place instead).
    fn background_log_flusher(self: &Arc<Inner>) {
        let mut last_sync = Instant::now();
        let mut marker_at: Option<Instant> = None;
        loop {
            let (write_wanted, sync_due) = {
                let mut w = self.wake_state.lock();
                let sync_at = last_sync + self.options.log_flush_interval;
                let deadline = marker_at.map_or(sync_at, |m| m.min(sync_at));
                if !self.stop.load(Ordering::Acquire) && !w.log_write_wanted && !w.marker_wanted {
                    self.wake.wait_until(&mut w, deadline);
                }
                let write_wanted = std::mem::take(&mut w.log_write_wanted);
                let marker_wanted = std::mem::take(&mut w.marker_wanted);
                if marker_wanted {
                    marker_at = Some(Instant::now() + MARKER_DELAY);
                }
                let now = Instant::now();
                let timer = marker_at.is_some_and(|m| now >= m) && now < sync_at;
                let early = write_wanted || marker_wanted || timer;
                (write_wanted, !early || now >= sync_at)
            };
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            if marker_at.is_some_and(|m| Instant::now() >= m) {
                marker_at = None;
                self.log.write_due_marker();
            }
            if write_wanted && self.failure().is_none() {
                if let Err(e) = self.log.flush(false) {
                    self.fail(&e);
                }
            }
            if sync_due {
                let st = self.log.stats();
                if st.durable_lsn < st.next_lsn && self.failure().is_none() {
                    let _ = self.sync();
                }
                last_sync = Instant::now();
            }
        }
    }

    /// Whether dead nodes wait for the cleaner, and it may free them.
    fn collecting(&self) -> bool {
        self.tree.garbage_nodes() > 0 && !self.tree.is_read_only() && self.failure().is_none()
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
                if !self.stop.load(Ordering::Acquire)
                    && !w.flush_wanted
                    && reclaim.is_none()
                    && !self.collecting()
                {
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
            if (self.tree.heal_pending() || idle && self.tree.drains_pending())
                && self.failure().is_none()
            {
                // The fringes range operations left (a few per tick: each is two paths), and
                // once writes pause the heavy slots of moved runs. Flushing those at once made
                // the next rename of a cold directory wait for them (28 ms in the dirrename
                // benchmark), and a range moved back and forth finds its slots as it left them.
                let healed = {
                    let _w = self.tree.writers.read();
                    self.tree.heal_step(HEAL_PER_TICK, idle)
                };
                if let Err(e) = healed {
                    self.fail(&e);
                }
            }
            if self.collecting() {
                // Dead nodes (a bounded step per tick; the next tick comes at once while
                // garbage is left, as for a pass pushing range deletes down).
                let collected = {
                    let _w = self.tree.writers.read();
                    self.tree.collect(COLLECT_PER_TICK)
                };
                if let Err(e) = collected {
                    self.fail(&e);
                }
            }
            let _ = self.note(self.tree.make_room());
            if last_trim.elapsed() >= TRIM_INTERVAL {
                crate::heap::give_back_free_memory();
                crate::writebuf::POOL.trim(crate::writebuf::TRIM_AFTER);
                last_trim = Instant::now();
            }
        }
    }
}
