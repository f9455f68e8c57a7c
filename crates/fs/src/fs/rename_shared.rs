//! Rename of a non-directory under the namespace lock shared, and what readers do so that a
//! file's keys moving under them does not go unnoticed.
//!
//! The common renames (a mail server's `tmp/x` to `new/x` and `cur/x:2,S` to `cur/x:2,ST`, an
//! editor's or a lock file's `x.tmp` to `x`) move one file, perhaps over another. They run under
//! the namespace lock shared, beside reads, writes, makes and removals elsewhere:
//!
//! - The parent directories' locks (one, or two: the one with the lower inode number first, the
//!   other only if it is free, else the rename starts over exclusive: an rmdir holds a parent
//!   before its child, and waiting in another order could close a cycle) order the rename with
//!   every other change of a name in those directories, as for makes and unlinks.
//! - The moved file's lock (and the replaced file's, in inode order), held from reading its
//!   attributes until the table knows where it lives, keeps writes, attribute changes and
//!   xattr changes out: they find its key through the table under that lock.
//! - Readers that take a file's key and then read the engine without the file's lock (read,
//!   getxattr, listxattr) check the move counter [`Fs::moves`]: a shared rename adds one under the
//!   file's lock before its batch is committed, and a reader took its key and the counter under
//!   the file's lock, so a reader that saw moved-away keys sees the counter changed and reads
//!   again (after [`MOVE_RETRIES`] tries, under the file's lock). `lseek` and `copy_file_range`
//!   take the `moving` lock exclusively instead, shared renames take it shared.
//!
//! A rename that moves a directory (its subtree's keys move, ancestry may change), exchanges two
//! names, moves a name holding a redirect (a hard-linked file), replaces a file the kernel does
//! not hold or a hard-linked one, lands on a path where an unlinked file is parked, or finds the
//! second directory busy, runs under the lock exclusive (`rename.rs`).

use std::sync::atomic::Ordering;

use amaranth_engine::Batch;

use super::test_points::Point;
use super::{handles, Found, Fs, RENAME_EXCHANGE, RENAME_NOREPLACE};
use crate::error::{Errno, Result};
use crate::inode::{Inode, Kind, Time};
use crate::keys;

/// Reads that saw a file's keys move try again this many times before they read under the
/// file's lock.
pub(super) const MOVE_RETRIES: u32 = 3;

impl Fs {
    /// [`Fs::rename`] under the namespace lock shared (see the module's comment); `Ok(false)`,
    /// with nothing changed, when it needs the lock exclusive.
    pub(super) fn rename_shared(
        &self,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        flags: u32,
    ) -> Result<bool> {
        if flags & RENAME_EXCHANGE != 0 {
            return Ok(false);
        }
        let _moving = self.moving.read();
        let (src_dkey, src_dir) = self.dir(parent)?;
        let (dst_dkey, dst_dir) = self.dir(new_parent)?;
        // A directory on either side goes exclusive, decided before the parents are locked: a
        // lookup locks the inode it finds, which could be one of them (a directory moved into
        // itself). Directories keep their names under the shared lock, so whatever these names
        // hold once the parents are locked is no parent either.
        let is_dir = |p: u64, k: &[u8], n: &[u8]| -> Result<bool> {
            Ok(self
                .find(p, k, n)?
                .is_some_and(|f| f.inode.kind == Kind::Dir))
        };
        if is_dir(parent, &src_dkey, name)? || is_dir(new_parent, &dst_dkey, new_name)? {
            return Ok(false);
        }
        let same_parent = parent == new_parent;
        let (mut sg, mut dg) = if same_parent {
            (src_dir.lock(), None)
        } else if parent < new_parent {
            let s = src_dir.lock();
            let Some(d) = dst_dir.try_lock() else {
                return Ok(false);
            };
            (s, Some(d))
        } else {
            let d = dst_dir.lock();
            let Some(s) = src_dir.try_lock() else {
                return Ok(false);
            };
            (s, Some(d))
        };
        // A directory removed meanwhile takes no new names.
        if sg.nlink == 0 || dg.as_ref().is_some_and(|d| d.nlink == 0) {
            return Err(Errno::ENOENT);
        }
        let src = self.find(parent, &src_dkey, name)?.ok_or(Errno::ENOENT)?;
        if src.inode.kind == Kind::Dir || src.redirect {
            return Ok(false);
        }
        let dst = self.find(new_parent, &dst_dkey, new_name)?;
        let dst_key = keys::child_key(&dst_dkey, new_name);
        self.check_key_len(&dst_key)?;
        if same_parent && name == new_name {
            return Ok(true);
        }
        if flags & RENAME_NOREPLACE != 0 && dst.is_some() {
            return Err(Errno::EEXIST);
        }
        let src_ino = src.inode.ino;
        let src_shared = self.table.lock().inode(src_ino);
        let src_shared = match src_shared {
            Some(s) if self.kernel_knows(src_ino) => s,
            _ => return Ok(false),
        };
        let mut victim_shared = None;
        if let Some(d) = &dst {
            if d.inode.ino == src_ino {
                // Two names of one file: nothing to do (POSIX).
                return Ok(true);
            }
            if d.inode.kind == Kind::Dir {
                return Err(Errno::EISDIR);
            }
            let ino = d.inode.ino;
            let held = self.table.lock().inode(ino);
            match held {
                Some(v) if !d.redirect && d.inode.kind == Kind::File && self.kernel_knows(ino) => {
                    victim_shared = Some(v)
                }
                _ => return Ok(false),
            }
        }
        if self.is_parked_at(&dst_key) && !self.clear_doomed_at(&dst_key) {
            return Ok(false);
        }
        self.check_move_fits(&src, &dst_key)?;
        self.check_space(0)?;
        if victim_shared.is_some() {
            self.test_points.reach(Point::RenameBeforeLocks);
        }
        // The files' locks, in inode order.
        let dst_ino = dst.as_ref().map_or(0, |d| d.inode.ino);
        let (mut si, mut vi) = match &victim_shared {
            None => (src_shared.lock(), None),
            Some(v) if src_ino < dst_ino => {
                let s = src_shared.lock();
                (s, Some(v.lock()))
            }
            Some(v) => {
                let vg = v.lock();
                (src_shared.lock(), Some(vg))
            }
        };
        // Again under the files' locks: a last FORGET of the file replaced may have run since
        // the check above (see `Fs::still_known`; for the file renamed, a FORGET changes nothing
        // of its names).
        if let Some(v) = &victim_shared {
            if !self.still_known(dst_ino, v) {
                return Ok(false);
            }
        }
        self.test_points.reach(Point::RenameHoldingVictimLock);
        // Only an operation under the exclusive lock gives a file a second name (and its home).
        assert!(
            !si.homed,
            "inode {src_ino} became homed under the shared lock"
        );
        if !self.moves_by_copy(&si, &src.key)? {
            return Ok(false);
        }
        if let (Some(v), Some(d)) = (&vi, &dst) {
            if !self.moves_by_copy(v, &d.key)? {
                return Ok(false);
            }
        }
        if let Some(v) = &vi {
            assert!(
                !v.homed,
                "inode {dst_ino} became homed under the shared lock"
            );
        }
        let now = Time::now();
        let mut b = Batch::new();
        let mut sdir = sg.clone();
        let mut ddir = dg.as_ref().map(|g| (**g).clone());
        Self::touch_dir(&mut sdir, now);
        if let Some(d) = ddir.as_mut() {
            Self::touch_dir(d, now);
        }
        let removal = match (&dst, &vi) {
            (Some(d), Some(v)) => {
                let d = Found {
                    inode: (**v).clone(),
                    key: d.key.clone(),
                    redirect: false,
                };
                let at = (new_parent, new_name);
                let r = self.remove_file_ops(&mut b, &d, now, true, at, true)?;
                assert!(
                    r.unhomed.is_none() && r.after.homed,
                    "inode {dst_ino}: a file replaced under the shared lock goes to its home"
                );
                Some(r)
            }
            _ => None,
        };
        let moved = Found {
            inode: (*si).clone(),
            ..src
        };
        self.move_entry_ops(&mut b, &moved, &dst_key);
        handles::index_at(&mut b, src_ino, new_parent, new_name);
        b.put(keys::meta_key(&src_dkey), sdir.encode());
        if let Some(d) = &ddir {
            b.put(keys::meta_key(&dst_dkey), d.encode());
        }
        // Readers that took a key before this point see the count change (module comment).
        self.moves.fetch_add(1, Ordering::SeqCst);
        self.commit(&mut b)?;
        *sg = sdir;
        if let (Some(g), Some(d)) = (dg.as_mut(), ddir) {
            **g = d;
        }
        si.ctime = now;
        if let (Some(v), Some(r)) = (vi.as_mut(), removal) {
            **v = r.after;
        }
        let mut t = self.table.lock();
        if dst.is_some() {
            t.set_homed(dst_ino);
        }
        t.rename(src_ino, new_parent, new_name);
        drop(t);
        drop(vi);
        drop(si);
        drop(dg);
        drop(sg);
        Ok(true)
    }

    /// Whether the engine copies the keys of `inode` (at `key`) when they move: its data and its
    /// extended attributes each well below
    /// [`FsOptions::rename_copy_max`](crate::FsOptions::rename_copy_max) with their keys. Larger
    /// ones move by tree surgery, which stays under the exclusive lock.
    fn moves_by_copy(&self, inode: &Inode, key: &[u8]) -> Result<bool> {
        let max = u64::from(self.opts.rename_copy_max) / 2;
        if inode.size > max {
            return Ok(false);
        }
        if self.table.lock().has_no_xattrs(inode.ino) {
            return Ok(true);
        }
        let p = keys::xattr_prefix(key);
        let end = amaranth_engine::prefix_end(&p, self.max_key());
        let mut bytes = 0u64;
        self.engine.scan(
            std::ops::Bound::Included(&p),
            std::ops::Bound::Excluded(&end),
            |k, v| {
                bytes += (k.len() + v.len()) as u64;
                bytes <= max
            },
        )?;
        Ok(bytes <= max)
    }

    /// Whether a shared rename moved some file's keys since the move count was `m`.
    pub(super) fn moved_since(&self, m: u64) -> bool {
        self.moves.load(Ordering::SeqCst) != m
    }

    /// Runs `f` on the file key of `ino` such that no rename moved the file's keys meanwhile: the
    /// key and the move count are taken under the file's lock, `f` runs again if the count
    /// changed, and after [`MOVE_RETRIES`] tries under the file's lock.
    pub(super) fn with_file_key<T>(
        &self,
        ino: u64,
        mut f: impl FnMut(&[u8]) -> Result<T>,
    ) -> Result<T> {
        let shared = self.node_inode(ino)?;
        for _ in 0..MOVE_RETRIES {
            let (fk, m) = {
                let _i = shared.lock();
                (self.file_key(ino)?, self.moves.load(Ordering::SeqCst))
            };
            let out = f(&fk)?;
            if !self.moved_since(m) {
                return Ok(out);
            }
        }
        let _i = shared.lock();
        let fk = self.file_key(ino)?;
        f(&fk)
    }
}
