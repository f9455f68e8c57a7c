//! Writing out-of-line data without making the writer wait for the device (docs/WRITEONCE.md §2):
//! a batch's blocks are handed to worker threads, and its record is logged and applied at once.
//! What that asks of everything else, and how it is kept:
//! - **No flush makes a record durable before its data**: every device flush of the log
//!   (`Log::set_flush_barrier`) and of a checkpoint (`Store::flush`) first waits for the data
//!   writes submitted before it ([`DataWriter::barrier`]). A record without its data can then
//!   only be on the device unflushed, which replay's data check catches (it ends the prefix).
//! - **No read sees a block before its write completes**: reads of out-of-line blocks wait for
//!   the writes in flight over them ([`DataWriter::wait_range`]).
//! - **No block is freed under a write in flight**: released blocks are freed only when a
//!   checkpoint completes, after its flush's barrier; an extent whose record was never logged is
//!   freed only once its write is done ([`crate::store::Store::settle_data`]).
//! - **Bounded memory**: at most [`MAX_IN_FLIGHT`] bytes are in flight; a writer past it waits.
//! - **A failed write** makes the engine refuse writes (the store's write failure) and every later
//!   barrier fail, so `sync` reports it; a read of its blocks fails with an I/O error.
//!
//! Without workers (tests that want every step in the calling thread, or between a stop and a
//! start) the write happens in the caller, as before.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::thread::JoinHandle;

use amaranth_device::BlockDevice;
use parking_lot::{Condvar, Mutex};

use crate::error::{Error, Result};
use crate::superblock::Extent;
use crate::writebuf::PooledBuf;

/// Bytes of data in flight at most (writers past it wait for a write to complete).
pub const MAX_IN_FLIGHT: u64 = 32 << 20;

/// One write handed to the workers.
struct Job {
    seq: u64,
    ext: Extent,
    buf: Arc<PooledBuf>,
    len: usize,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Job>,
    /// Writes submitted and not completed, by submission number.
    pending: BTreeMap<u64, Extent>,
    next_seq: u64,
    bytes: u64,
    /// The first failure, and the extents whose writes failed.
    failed: Option<Error>,
    failed_extents: Vec<Extent>,
    stop: bool,
}

struct Shared {
    state: Mutex<State>,
    cond: Condvar,
}

/// The data writers: worker threads and what is in flight.
pub struct DataWriter {
    shared: Arc<Shared>,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

impl Default for DataWriter {
    fn default() -> DataWriter {
        DataWriter {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                cond: Condvar::new(),
            }),
            workers: Mutex::new(Vec::new()),
        }
    }
}

impl DataWriter {
    /// Starts `n` workers writing to `dev` (none when `n` is 0).
    pub fn start(&self, dev: Arc<dyn BlockDevice>, n: usize) {
        let mut workers = self.workers.lock();
        if !workers.is_empty() || n == 0 {
            return;
        }
        self.shared.state.lock().stop = false;
        for i in 0..n {
            let shared = self.shared.clone();
            let dev = dev.clone();
            workers.push(
                std::thread::Builder::new()
                    .name(format!("amaranth-data{i}"))
                    .spawn(move || work(&shared, &*dev))
                    .expect("spawning a data writer"),
            );
        }
    }

    /// Lets the workers finish what was submitted, then stops them (writes go back to the
    /// callers' threads).
    pub fn stop(&self) {
        let workers: Vec<JoinHandle<()>> = self.workers.lock().drain(..).collect();
        if workers.is_empty() {
            return;
        }
        self.shared.state.lock().stop = true;
        self.shared.cond.notify_all();
        for w in workers {
            let _ = w.join();
        }
    }

    /// Writes `len` bytes of `buf` at `ext`: handed to the workers (returns at once, unless
    /// [`MAX_IN_FLIGHT`] bytes are in flight), or in this thread when none runs.
    pub fn write(
        &self,
        dev: &dyn BlockDevice,
        ext: Extent,
        buf: Arc<PooledBuf>,
        len: usize,
    ) -> Result<()> {
        // Held until the job is queued: a stop drains the workers only after it, and they take
        // every queued job before they exit.
        let workers = self.workers.lock();
        if workers.is_empty() {
            drop(workers);
            return dev
                .write_at(ext.offset(), &buf[..len])
                .map_err(|e| Error::io("writing data blocks", e));
        }
        let mut st = self.shared.state.lock();
        if let Some(e) = &st.failed {
            return Err(e.clone());
        }
        while st.bytes > 0 && st.bytes + len as u64 > MAX_IN_FLIGHT {
            self.shared.cond.wait(&mut st);
        }
        let seq = st.next_seq;
        st.next_seq += 1;
        st.pending.insert(seq, ext);
        st.bytes += len as u64;
        st.queue.push_back(Job { seq, ext, buf, len });
        drop(st);
        drop(workers);
        self.shared.cond.notify_all();
        Ok(())
    }

    /// Waits until every write submitted before the call is complete; fails if one failed.
    pub fn barrier(&self) -> Result<()> {
        let mut st = self.shared.state.lock();
        let target = st.next_seq;
        while st.pending.keys().next().is_some_and(|&s| s < target) {
            self.shared.cond.wait(&mut st);
        }
        match &st.failed {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Waits until no write in flight covers a block of `[start, start + len)`; fails if a write
    /// of one of them failed.
    pub fn wait_range(&self, start: u64, len: u64) -> Result<()> {
        let overlaps = |e: &Extent| e.block < start + len && start < e.block + e.blocks;
        let mut st = self.shared.state.lock();
        while st.pending.values().any(overlaps) {
            self.shared.cond.wait(&mut st);
        }
        if st.failed_extents.iter().any(overlaps) {
            return Err(st
                .failed
                .clone()
                .expect("a failed write recorded its error"));
        }
        Ok(())
    }
}

impl Drop for DataWriter {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A worker: takes the next write, does it, records its end.
fn work(shared: &Shared, dev: &dyn BlockDevice) {
    loop {
        let job = {
            let mut st = shared.state.lock();
            loop {
                if let Some(j) = st.queue.pop_front() {
                    break j;
                }
                if st.stop {
                    return;
                }
                shared.cond.wait(&mut st);
            }
        };
        let r = dev.write_at(job.ext.offset(), &job.buf[..job.len]);
        let mut st = shared.state.lock();
        st.pending.remove(&job.seq);
        st.bytes -= job.len as u64;
        if let Err(e) = r {
            st.failed_extents.push(job.ext);
            st.failed
                .get_or_insert_with(|| Error::io("writing data blocks", e));
        }
        drop(st);
        shared.cond.notify_all();
    }
}
