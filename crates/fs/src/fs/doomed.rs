//! Files the kernel forgot after their last name went, deleted later and together.
//!
//! A file whose last name is removed while the kernel holds it lives until the kernel's last
//! FORGET (`fs/orphans.rs`), which in an `rm` or an unlink loop follows each UNLINK at once.
//! Deleted by the FORGET, every unlink cost two commits, the second on another thread contending
//! with the next request for the engine (measured on an unlink loop: 43 µs per UNLINK handler
//! beside 43 µs per FORGET, against 10.6 µs per UNLINK when the FORGET deleted nothing). With
//! deferral on ([`Fs::defer_deletions`], which the FUSE session turns on and drives with a thread
//! of its own), the last FORGET only *dooms* the file: it joins a set that the session's thread
//! deletes a moment later in batches of [`BATCH_FILES`] ([`Fs::reap_forgotten_batch`]), or the
//! FORGET itself once [`DOOMED_MAX`] files wait. Measured (same runs, deleting at each FORGET → deferred): an
//! unlink loop 52-74 → 39-43 µs a call, the daemon's CPU 51-72 → 31-38 µs a call; the harness's
//! `rm -rf` of the Linux tree 5.9-6.7 → 3.9-4.8 s (batches of 32; the slowest 1%, a request
//! waiting for a batch, is why they are now smaller and paced: [`BATCH_FILES`]).
//!
//! A doomed file is what it was before the FORGET on disk (a home with link count 0, its data at
//! its parked path if it has one), and gone from the table: nothing but this set knows it. What it
//! means for the others:
//! - *Names at its parked path.* A make or a file rename under the shared namespace lock that
//!   finds the path parked deletes the doomed files first ([`Fs::clear_doomed_at`]) and goes on;
//!   an operation under the exclusive lock evicts what is parked at or below its paths, and a
//!   doomed file there is deleted in the operation's own batch instead of being moved
//!   ([`Fs::evict_parked_ops`]). So a path never holds two files' data, as before.
//! - *Counters and space.* `statfs` deletes the doomed files first: `df` counts what is left.
//! - *Ends.* The end of a session and a remount read-only delete them first; a crash leaves them
//!   as any unfinished FORGET did: homes with link count 0, deleted by the next writable mount.
//!
//! Locking: the set's lock is innermost (never held while taking another); the deletion runs
//! under the namespace lock (either mode: no exclusive eviction meanwhile) and takes each doomed
//! inode's lock briefly (nothing else reaches those: the table no longer holds them).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use amaranth_engine::Batch;
use parking_lot::{Condvar, Mutex};

use super::{handles, orphans, Fs};
use crate::inode::{Inode, Kind};
use crate::keys;
use crate::patchgroup::CallerScope;

/// Most doomed files waiting: the FORGET that dooms one more deletes them all itself (memory
/// stays bounded however slow the reaper is).
pub const DOOMED_MAX: usize = 1024;
/// Most files deleted by one batch: the batch holds the engine's root while it is applied, and
/// requests wait meanwhile. Measured on an unlink loop, the reaper deleting everything that waits
/// in batches of 32: the slowest 1% of unlinks took 0.33-0.40 ms; batches of 16 with 50 µs
/// between them ([`Fs::reap_forgotten_batch`]): 0.17-0.22 ms, the mean 46-59 µs against 58-59
/// (batches of 8: 0.18-0.24 ms, the mean 59-68; batches of 64: 0.6-0.9 ms); `rm -rf` level.
const BATCH_FILES: usize = 16;

/// The doomed files, and whether FORGETs doom at all.
#[derive(Debug, Default)]
pub(super) struct Doomed {
    set: Mutex<HashMap<u64, Arc<Mutex<Inode>>>>,
    /// Signalled when the set stops being empty.
    filled: Condvar,
    /// How many are in the set (read without its lock).
    count: AtomicUsize,
    deferred: AtomicBool,
}

impl Doomed {
    /// Takes up to `max` doomed files out of the set.
    fn take(&self, max: usize) -> Vec<(u64, Arc<Mutex<Inode>>)> {
        let mut s = self.set.lock();
        let taken: Vec<(u64, Arc<Mutex<Inode>>)> = if max >= s.len() {
            s.drain().collect()
        } else {
            let keys: Vec<u64> = s.keys().take(max).copied().collect();
            keys.into_iter()
                .map(|k| (k, s.remove(&k).expect("a key of the set")))
                .collect()
        };
        self.count.store(s.len(), Ordering::Relaxed);
        taken
    }
}

impl Fs {
    /// Whether files the kernel forgot after their last name went are deleted later, in
    /// batches, by [`Fs::reap_forgotten`] (on), or by the FORGET itself (off, the default).
    /// Turning it off deletes those waiting.
    pub fn defer_deletions(&self, on: bool) {
        self.doomed.deferred.store(on, Ordering::Relaxed);
        if !on {
            self.reap_forgotten();
        }
    }

    /// Deletes the files waiting since the kernel forgot them; returns how many.
    pub fn reap_forgotten(&self) -> usize {
        self.reap_some_forgotten(usize::MAX)
    }

    /// Deletes one batch (16 files) of the files waiting since the kernel forgot them;
    /// returns how many. Between two calls, requests find the engine's root free (a batch holds
    /// it while it is applied) and the namespace lock not held.
    pub fn reap_forgotten_batch(&self) -> usize {
        self.reap_some_forgotten(BATCH_FILES)
    }

    fn reap_some_forgotten(&self, max: usize) -> usize {
        if self.doomed.count.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        let _ns = self.ns.read();
        self.delete_some_doomed(max)
    }

    /// Waits until a file is waiting to be deleted or `timeout` passes; returns how many wait.
    pub fn wait_forgotten(&self, timeout: Duration) -> usize {
        let mut s = self.doomed.set.lock();
        if s.is_empty() {
            self.doomed.filled.wait_for(&mut s, timeout);
        }
        s.len()
    }

    /// How many files wait to be deleted.
    pub fn forgotten_waiting(&self) -> usize {
        self.doomed.count.load(Ordering::Relaxed)
    }

    /// Whether FORGETs doom files rather than deleting them.
    pub(super) fn deletions_deferred(&self) -> bool {
        self.doomed.deferred.load(Ordering::Relaxed)
    }

    /// The kernel forgot `ino` (gone from the table) after its last name went: it waits for
    /// [`Fs::reap_forgotten`]. The caller holds the namespace lock shared, not the inode's lock.
    pub(super) fn doom(&self, ino: u64, shared: Arc<Mutex<Inode>>) {
        Self::assert_doomed(ino, &shared.lock());
        let n = {
            let mut s = self.doomed.set.lock();
            let old = s.insert(ino, shared);
            assert!(old.is_none(), "inode {ino} doomed twice");
            self.doomed.count.store(s.len(), Ordering::Relaxed);
            s.len()
        };
        if n == 1 {
            self.doomed.filled.notify_all();
        }
        if n >= DOOMED_MAX {
            self.delete_doomed();
        }
    }

    /// The doomed inode `ino`, if it is doomed.
    pub(super) fn doomed_inode(&self, ino: u64) -> Option<Arc<Mutex<Inode>>> {
        if self.doomed.count.load(Ordering::Relaxed) == 0 {
            return None;
        }
        self.doomed.set.lock().get(&ino).cloned()
    }

    /// A file is parked at `path`: if it is doomed, deletes the doomed files. Returns whether
    /// nothing is parked at `path` now (else the caller starts over with the namespace lock
    /// exclusive, and eviction handles it). The caller holds the namespace lock shared.
    pub(super) fn clear_doomed_at(&self, path: &[u8]) -> bool {
        let Some(ino) = self.parked_ino_at(path) else {
            return true;
        };
        if self.doomed_inode(ino).is_none() {
            return false;
        }
        self.delete_doomed();
        !self.is_parked_at(path)
    }

    fn assert_doomed(ino: u64, inode: &Inode) {
        assert_eq!(inode.ino, ino);
        assert!(
            inode.nlink == 0 && inode.homed && inode.kind != Kind::Dir,
            "doomed inode {ino} is {:?} with {} links, homed {}",
            inode.kind,
            inode.nlink,
            inode.homed
        );
    }

    /// Operations deleting the forgotten file `inode` (link count 0, at its home): its home
    /// record, data and extended attributes wherever they are, its index entry and its count.
    pub(super) fn forgotten_ops(&self, b: &mut Batch, inode: &Inode) {
        let home = keys::home_key(inode.ino);
        match orphans::parked_path(inode) {
            // A parked file's data and extended attributes are all at its parked path (writes
            // find them there, and an eviction moves them home and clears the path), so its
            // home holds only the record: two range deletes fewer for every file of an `rm`.
            Some(p) => {
                self.count_reserved(b, -(inode.reserved_holes() as i64));
                b.delete(keys::meta_key(&home));
                self.delete_data_ops(b, p);
            }
            None => self.delete_file_ops(b, &home, inode),
        }
        handles::index_drop(b, inode.ino);
        self.count_inodes(b, -1);
    }

    /// After a committed batch deleted the doomed `ino` (built by [`Fs::forgotten_ops`]): it
    /// leaves the set and the parked files, and its inode says it is deleted.
    pub(super) fn note_doomed_deleted(&self, ino: u64) {
        let shared = {
            let mut s = self.doomed.set.lock();
            let shared = s.remove(&ino);
            self.doomed.count.store(s.len(), Ordering::Relaxed);
            shared
        };
        let shared = shared.unwrap_or_else(|| panic!("inode {ino} deleted but not doomed"));
        shared.lock().homed = false;
        self.note_unparked(ino);
    }

    /// Deletes every doomed file, in batches of at most [`BATCH_FILES`] (and a quarter of the
    /// largest batch the engine takes); returns how many. The caller holds the namespace lock
    /// (either mode). A batch that fails to commit leaves its files to the next writable mount
    /// (their homes say link count 0), as an unfinished FORGET does.
    pub(super) fn delete_doomed(&self) -> usize {
        self.delete_some_doomed(usize::MAX)
    }

    /// [`Fs::delete_doomed`] for at most `max` files.
    fn delete_some_doomed(&self, max: usize) -> usize {
        let taken = self.doomed.take(max);
        if taken.is_empty() {
            return 0;
        }
        // Not the caller's: a deletion joins no application's patchgroup.
        let _scope = CallerScope::enter(0);
        let budget = self.engine.max_batch_bytes() / 4;
        let mut done = 0;
        for chunk in taken.chunks(BATCH_FILES) {
            let mut b = Batch::new();
            let mut sent = 0;
            for (i, (ino, shared)) in chunk.iter().enumerate() {
                let inode = shared.lock().clone();
                Self::assert_doomed(*ino, &inode);
                self.forgotten_ops(&mut b, &inode);
                let last = i + 1 == chunk.len();
                if last || (i % 16 == 15 && b.log_bytes() > budget) {
                    done += self.commit_forgotten(&mut b, &chunk[sent..=i]);
                    sent = i + 1;
                }
            }
        }
        done
    }

    fn commit_forgotten(&self, b: &mut Batch, files: &[(u64, Arc<Mutex<Inode>>)]) -> usize {
        if self.engine.is_read_only() {
            // The next writable mount or remount deletes them (`Fs::remove_orphans`).
            return 0;
        }
        let ok = match self.commit(b) {
            Ok(()) => true,
            Err(e) => {
                log::warn!(
                    "amaranth: deleting {} files unlinked while in use: {e} (the next mount \
                     deletes them)",
                    files.len()
                );
                false
            }
        };
        for (ino, shared) in files {
            if ok {
                shared.lock().homed = false;
            }
            self.note_unparked(*ino);
        }
        if ok {
            files.len()
        } else {
            0
        }
    }
}
