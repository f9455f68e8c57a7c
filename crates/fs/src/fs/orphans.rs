//! Files whose last name is gone while the kernel still uses them, and their end.
//!
//! The kernel holds a reference to an inode as long as anything uses it (an open file, a working
//! directory, a cached dentry) and says when it drops the last one: FORGET brings the inode's
//! lookup count to zero. That count is the lifetime of a file whose last name was removed: the
//! file system needs no OPEN or RELEASE (the FUSE transport answers OPEN with `ENOSYS`, so the
//! kernel sends neither), and an unlinked file stays readable and writable through any descriptor
//! until the kernel forgets it.
//!
//! *Parking.* When `unlink` removes the last name of a regular file the kernel knows (it always
//! does: it looked the name up to unlink it), the name's metadata key is deleted and the inode is
//! written at its home with link count 0 and, in its `target` field, the path key where its data
//! blocks and extended attributes stay: the file is *parked* there. Nothing is moved (moving data
//! costs as much as the file is large), so an `rm -rf` stays cheap; the usual FORGET a moment
//! later deletes the home record and the data where it is. Until then, the parked path is not a
//! name (no metadata key), so nothing lists or finds it.
//!
//! *Eviction.* Before anything puts a name at a parked path (create, mkdir, link, rename to it)
//! or a directory rename moves keys from or to a path above one (its subtree's keys move), the
//! same batch moves the parked file's data and extended attributes to its home and clears the back
//! pointer: a path never holds two files' data, and a back pointer stored durably always names
//! data that is still the parked file's. Eviction costs a move, but only in those rare cases. An
//! rmdir moves nothing: the files parked below stay parked (an `rm -rf` removes the directories
//! before the kernel's FORGETs of their files arrive), and a later name or directory at their
//! paths evicts them as above.
//!
//! *Crash.* At the next mount, every home with link count 0 is deleted, with the data at its
//! parked path if it has one (`remove_orphans`); `fsck` knows parked data's owner.
//!
//! Locking: parking, eviction and the orphan deletions run under the namespace lock: parking
//! shared by an unlink (holding the directory's lock and the parked file's own until the table and
//! the parked map know it) or exclusive by a rename, eviction exclusive, FORGET's deletion shared
//! (no eviction meanwhile; the file's lock orders it after its unlink). A make, which holds it
//! shared, never evicts: it checks under its directory's lock that nothing is parked at its path
//! (only an unlink or a rename in that directory can park a file there, the unlink under that
//! same lock) and starts over exclusively if something is. The parked map's lock is innermost,
//! like the table's, and never held with it.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use amaranth_engine::Batch;
use parking_lot::Mutex;

use super::{handles, Fs};
use crate::error::Result;
use crate::inode::{Inode, Kind, Meta};
use crate::keys;
use crate::table::ROOT_INO;

/// Parked files: path key → inode, and back.
#[derive(Debug, Default)]
pub(super) struct Parked {
    by_path: BTreeMap<Vec<u8>, u64>,
    by_ino: HashMap<u64, Vec<u8>>,
}

impl Parked {
    fn insert(&mut self, ino: u64, path: Vec<u8>) {
        assert!(
            !path.is_empty() && !keys::is_home(&path),
            "parked at {path:?}"
        );
        let old = self.by_path.insert(path.clone(), ino);
        assert!(old.is_none(), "two files parked at {path:?}");
        self.by_ino.insert(ino, path);
    }

    fn remove(&mut self, ino: u64) -> Option<Vec<u8>> {
        let path = self.by_ino.remove(&ino)?;
        self.by_path.remove(&path);
        Some(path)
    }

    /// Parked files at `path` or, with `subtree`, anywhere below the directory at `path`.
    fn under(&self, path: &[u8], subtree: bool) -> Vec<(Vec<u8>, u64)> {
        if !subtree {
            return self
                .by_path
                .get(path)
                .map(|&ino| vec![(path.to_vec(), ino)])
                .unwrap_or_default();
        }
        let lo = keys::subtree_prefix(path);
        self.by_path
            .range::<[u8], _>((Bound::Included(&lo[..]), Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(&lo))
            .map(|(k, &ino)| (k.clone(), ino))
            .collect()
    }
}

/// Whether a home inode is a regular file parked at a path (its `target` names the path).
pub(crate) fn parked_path(i: &Inode) -> Option<&[u8]> {
    (i.kind == Kind::File && i.nlink == 0 && i.homed && !i.target.is_empty())
        .then_some(&i.target[..])
}

impl Fs {
    /// Where the data blocks and extended attributes of `ino` are: its parked path, or its file
    /// key (home or path).
    pub(super) fn data_key_of(&self, ino: u64) -> Option<Vec<u8>> {
        self.parked_data_key(ino)
            .or_else(|| self.table.lock().file_key(ino))
    }

    /// The parked path of `ino`, if it is parked.
    pub(super) fn parked_data_key(&self, ino: u64) -> Option<Vec<u8>> {
        if self.parked_count.load(Ordering::Relaxed) == 0 {
            return None;
        }
        self.parked.lock().by_ino.get(&ino).cloned()
    }

    /// Whether a file is parked at exactly `path`.
    pub(super) fn is_parked_at(&self, path: &[u8]) -> bool {
        self.parked_ino_at(path).is_some()
    }

    /// The file parked at exactly `path`, if one is.
    pub(super) fn parked_ino_at(&self, path: &[u8]) -> Option<u64> {
        if self.parked_count.load(Ordering::Relaxed) == 0 {
            return None;
        }
        self.parked.lock().by_path.get(path).copied()
    }

    /// `ino` is no longer parked (deleted, or evicted to its home).
    pub(super) fn note_unparked(&self, ino: u64) {
        if self.parked.lock().remove(ino).is_some() {
            self.parked_count.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Whether the kernel holds `ino` (its lookup count is not zero).
    pub(super) fn kernel_knows(&self, ino: u64) -> bool {
        self.table.lock().get(ino).is_some_and(|n| n.lookups > 0)
    }

    /// Whether the kernel still knows `ino` and the table still holds `shared` for it: checked
    /// under `shared`'s lock by an operation under the shared namespace lock, where a last FORGET
    /// may run. While that lock is held the entry stays (a FORGET takes it out only under it,
    /// [`Fs::forget`]), and a FORGET waiting for it then sees what the operation made of the
    /// inode.
    pub(super) fn still_known(&self, ino: u64, shared: &Arc<Mutex<Inode>>) -> bool {
        let t = self.table.lock();
        t.get(ino).is_some_and(|n| n.lookups > 0)
            && t.inode(ino).is_some_and(|s| Arc::ptr_eq(&s, shared))
    }

    /// Records that `ino` was parked at `path` by a committed batch.
    pub(super) fn note_parked(&self, ino: u64, path: Vec<u8>) {
        self.parked.lock().insert(ino, path);
        self.parked_count.fetch_add(1, Ordering::Relaxed);
    }

    /// Adds to `b` the eviction of every file parked at `path` (or below the directory at `path`,
    /// with `subtree`): data and extended attributes to its home, the back pointer cleared; or,
    /// for a file the kernel forgot that waits to be deleted (`fs/doomed.rs`), its deletion.
    /// Returns the evicted inodes, for [`Fs::note_evicted`] once the batch is committed. The
    /// caller holds the namespace lock exclusively.
    pub(super) fn evict_parked_ops(&self, b: &mut Batch, path: &[u8], subtree: bool) -> Vec<u64> {
        if self.parked_count.load(Ordering::Relaxed) == 0 {
            return Vec::new();
        }
        let found = self.parked.lock().under(path, subtree);
        let mut out = Vec::new();
        for (p, ino) in found {
            if let Some(doomed) = self.doomed_inode(ino) {
                let inode = doomed.lock().clone();
                assert_eq!(parked_path(&inode), Some(&p[..]), "doomed inode {ino}");
                self.forgotten_ops(b, &inode);
                out.push(ino);
                continue;
            }
            // Not held by the table: a FORGET found the file system read-only, or failed to
            // commit; the next writable mount deletes it.
            let Some(shared) = self.table.lock().inode(ino) else {
                continue;
            };
            let mut next = shared.lock().clone();
            assert_eq!(parked_path(&next), Some(&p[..]), "parked inode {ino}");
            next.target.clear();
            self.home_ops(b, &p, ino);
            b.put(keys::meta_key(&keys::home_key(ino)), next.encode());
            out.push(ino);
        }
        out
    }

    /// After the batch of [`Fs::evict_parked_ops`] is committed: the files live at their homes.
    pub(super) fn note_evicted(&self, evicted: &[u64]) {
        for &ino in evicted {
            // Stable: the caller still holds the namespace lock exclusively.
            if self.doomed_inode(ino).is_some() {
                self.note_doomed_deleted(ino);
                continue;
            }
            self.note_unparked(ino);
            if let Some(shared) = self.table.lock().inode(ino) {
                shared.lock().target.clear();
            }
        }
    }

    /// The kernel forgot `n` lookups of `ino`. When it no longer holds a file whose last name is
    /// gone, the file is deleted (home record, data and extended attributes, wherever they are,
    /// its index entry and reservation) and counted once: the inode then says it is deleted
    /// (link count 0, not homed), under its lock, so no later forget or close deletes it again.
    pub fn forget(&self, ino: u64, n: u64) {
        if ino == ROOT_INO {
            return;
        }
        self.write_lazy_atime(ino);
        // Shared: no name changes meanwhile, so no eviction moves the file under us.
        let _ns = self.ns.read();
        let shared = {
            let mut t = self.table.lock();
            if t.drop_lookups(ino, n) > 0 {
                return;
            }
            t.inode(ino)
        };
        let Some(shared) = shared else {
            return;
        };
        // The entry leaves the table only under the inode's lock: an operation holding that lock
        // (an unlink or a rename under the shared namespace lock) finishes first, and a lookup
        // meanwhile finds the entry and counts on it (the inode it returns is the one the
        // operation changes). Taken out before the lock, as before, a lookup in between made a
        // second entry from the name still on disk, which the operation then did not update:
        // the file was deleted here under a name the kernel had just been given (and a write
        // through it brought an uncounted inode record back), or left for nobody to delete.
        let mut inode = shared.lock();
        {
            let mut t = self.table.lock();
            match t.get(ino) {
                Some(e) if e.lookups == 0 && Arc::ptr_eq(&e.inode, &shared) => t.reap(ino),
                // Looked up again meanwhile, or already forgotten by another FORGET.
                _ => return,
            }
            if t.get(ino).is_some() {
                // Something still depends on the entry (a directory's cached children).
                return;
            }
        }
        if inode.nlink != 0 || !inode.homed || inode.kind == Kind::Dir {
            return;
        }
        if self.engine.is_read_only() {
            // The next writable mount deletes it (its home says link count 0).
            return;
        }
        if self.deletions_deferred() {
            drop(inode);
            self.doom(ino, shared);
            return;
        }
        let mut b = Batch::new();
        self.forgotten_ops(&mut b, &inode);
        match self.commit(&mut b) {
            Ok(()) => {
                inode.homed = false;
                debug_assert!(inode.is_deleted());
            }
            // The next mount deletes it (its home says link count 0).
            Err(e) => log::warn!("amaranth: deleting unlinked inode {ino}: {e}"),
        }
        drop(inode);
        self.note_unparked(ino);
    }

    /// The FUSE session ended (unmounted: the kernel holds nothing any more, and its last
    /// FORGETs may never have been delivered): deletes the files whose last name is gone.
    pub fn end_session(&self) -> Result<()> {
        let _ns = self.ns.write();
        self.delete_doomed();
        if !self.engine.is_read_only() {
            self.remove_orphans(false)?;
        }
        let mut p = self.parked.lock();
        self.parked_count.store(0, Ordering::Relaxed);
        *p = Parked::default();
        Ok(())
    }

    /// Deletes the files whose last name was removed while the kernel held them (homes with link
    /// count 0), with the data at their parked paths: at a mount, those the previous session left
    /// (it ended before the kernel forgot them), or at the end of a session.
    pub(super) fn remove_orphans(&self, at_mount: bool) -> Result<()> {
        let (lo, hi) = keys::homes_range();
        let mut orphans = Vec::new();
        self.engine
            .scan(Bound::Included(&lo), Bound::Excluded(&hi), |_, v| {
                if let Ok(Meta::Inode(i)) = Meta::decode(v) {
                    if i.nlink == 0 {
                        orphans.push(i);
                    }
                }
                true
            })?;
        for i in orphans {
            let mut b = Batch::new();
            self.delete_file_ops(&mut b, &keys::home_key(i.ino), &i);
            handles::index_drop(&mut b, i.ino);
            if let Some(p) = parked_path(&i) {
                if self.engine.get(&keys::meta_key(p))?.is_some() {
                    // Eviction makes this impossible; never delete a live file's data.
                    log::error!(
                        "amaranth: inode {} is parked at {p:?}, which is a name: its data is left",
                        i.ino
                    );
                } else {
                    self.delete_data_ops(&mut b, p);
                }
            }
            self.count_inodes(&mut b, -1);
            self.commit(&mut b)?;
            // The kernel may still know it (end of session): it is deleted now.
            let known = self.table.lock().inode(i.ino);
            if let Some(shared) = known {
                shared.lock().homed = false;
            }
            if at_mount {
                log::info!(
                    "amaranth: removed inode {} (unlinked while in use before the last shutdown)",
                    i.ino
                );
            }
        }
        Ok(())
    }

    /// Operations deleting the data blocks and extended attributes at `file_key`.
    pub(super) fn delete_data_ops(&self, b: &mut Batch, file_key: &[u8]) {
        let d = keys::data_prefix(file_key);
        b.range_delete(d.clone(), amaranth_engine::prefix_end(&d, self.max_key()));
        let x = keys::xattr_prefix(file_key);
        b.range_delete(x.clone(), amaranth_engine::prefix_end(&x, self.max_key()));
    }
}
