//! Namespace operations: lookup, creating names (mknod, mkdir, symlink, create), hard links,
//! readlink, and removing names (unlink, rmdir). Rename is in `rename.rs`.

use std::ops::Bound;

use amaranth_engine::Batch;

use super::links::{self, Unhomed};
use super::test_points::Point;
use super::{check_name, handles, orphans, Ctx, Found, Fs, NewNode, NAME_MAX, SYMLINK_MAX};
use crate::error::{Errno, Result};
use crate::inode::{Inode, Kind, Meta, Time};
use crate::keys;
use crate::table::ROOT_INO;

impl Fs {
    /// Looks up `name` in `parent`, counting one kernel lookup.
    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Inode> {
        let _ns = self.ns.read();
        if name == b"." {
            return self.lookup_by_number(parent);
        }
        if name == b".." {
            let p = self
                .table
                .lock()
                .get(parent)
                .map(|n| n.parent)
                .ok_or(Errno::ENOENT)?;
            return self.lookup_ino(if p == 0 { ROOT_INO } else { p });
        }
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        let (dkey, _) = self.dir(parent)?;
        let found = self.find(parent, &dkey, name)?.ok_or(Errno::ENOENT)?;
        let shared = self.table.lock().remember(parent, name, found.inode, true);
        let out = shared.lock().clone();
        Ok(out)
    }

    fn lookup_ino(&self, ino: u64) -> Result<Inode> {
        let shared = {
            let mut t = self.table.lock();
            let n = t.get_mut(ino).ok_or(Errno::ENOENT)?;
            n.lookups += 1;
            n.inode.clone()
        };
        let out = shared.lock().clone();
        Ok(out)
    }

    // ----- creating names --------------------------------------------------------------------

    /// Creates a node of `kind` (file, fifo, socket, device, directory, symlink).
    ///
    /// Under the namespace lock shared, so that makes in different directories (and reads and
    /// writes anywhere) run in parallel: the directory's attribute lock, held from the check that
    /// the name is free until the table knows the new name, orders the changes to one directory.
    /// Nothing else puts a name at the new path meanwhile (every other change of a name holds the
    /// namespace lock exclusively), except a file parked at that path by an earlier unlink: its
    /// eviction moves another inode's data, so such a make starts over with the lock exclusive
    /// (unless the kernel forgot the file and it waits to be deleted: then the deletion comes
    /// first, `fs/doomed.rs`).
    fn make(&self, parent: u64, name: &[u8], new: NewNode<'_>, ctx: Ctx) -> Result<Inode> {
        check_name(name)?;
        {
            let _ns = self.ns.read();
            if let Some(made) = self.make_locked(parent, name, &new, ctx, false)? {
                return Ok(made);
            }
        }
        let _ns = self.ns.write();
        let made = self.make_locked(parent, name, &new, ctx, true)?;
        Ok(made.expect("a make under the exclusive lock evicts what it must"))
    }

    /// [`Fs::make`] under the namespace lock, `exclusive` or shared; `None` (and nothing changed)
    /// when the lock is shared and a file is parked at the new path.
    fn make_locked(
        &self,
        parent: u64,
        name: &[u8],
        new: &NewNode<'_>,
        ctx: Ctx,
        exclusive: bool,
    ) -> Result<Option<Inode>> {
        let (dkey, dir_shared) = self.dir(parent)?;
        let key = keys::child_key(&dkey, name);
        self.check_key_len(&key)?;
        let mut dir = dir_shared.lock();
        if self.find(parent, &dkey, name)?.is_some() {
            return Err(Errno::EEXIST);
        }
        self.check_space(0)?;
        let mut b = Batch::new();
        let evicted = if exclusive {
            self.evict_parked_ops(&mut b, &key, false)
        } else if self.is_parked_at(&key) && !self.clear_doomed_at(&key) {
            return Ok(None);
        } else {
            Vec::new()
        };
        let ino = self.alloc_ino(&mut b);
        let NewNode {
            kind,
            mode,
            rdev,
            target,
        } = *new;
        let mut perm = (mode & 0o7777) as u16;
        let mut gid = ctx.gid;
        if dir.perm & libc::S_ISGID as u16 != 0 {
            gid = dir.gid;
            if kind == Kind::Dir {
                perm |= libc::S_ISGID as u16;
            }
        }
        let mut inode = Inode::new(ino, kind, perm, ctx.uid, gid);
        inode.rdev = rdev;
        if kind == Kind::Symlink {
            inode.target = target.to_vec();
            inode.size = target.len() as u64;
        }
        let mut next_dir = dir.clone();
        Self::touch_dir(&mut next_dir, inode.ctime);
        if kind == Kind::Dir {
            next_dir.nlink += 1;
        }
        b.put(keys::meta_key(&key), inode.encode());
        b.put(keys::meta_key(&dkey), next_dir.encode());
        handles::index_at(&mut b, ino, parent, name);
        self.count_inodes(&mut b, 1);
        self.commit(&mut b)?;
        self.note_evicted(&evicted);
        *dir = next_dir;
        let mut t = self.table.lock();
        t.remember(parent, name, inode.clone(), true);
        // A new inode has no extended attributes (nothing is left at a new name's keys).
        t.set_no_xattrs(ino, true);
        drop(t);
        drop(dir);
        Ok(Some(inode))
    }

    /// Creates a special file or a regular file without opening it.
    pub fn mknod(&self, parent: u64, name: &[u8], mode: u32, rdev: u32, ctx: Ctx) -> Result<Inode> {
        let kind = Kind::from_mode(mode).unwrap_or(Kind::File);
        if kind == Kind::Dir || kind == Kind::Symlink {
            return Err(Errno::EINVAL);
        }
        self.make(
            parent,
            name,
            NewNode {
                kind,
                mode,
                rdev,
                target: &[],
            },
            ctx,
        )
    }

    /// Creates a directory.
    pub fn mkdir(&self, parent: u64, name: &[u8], mode: u32, ctx: Ctx) -> Result<Inode> {
        self.make(
            parent,
            name,
            NewNode {
                kind: Kind::Dir,
                mode,
                rdev: 0,
                target: &[],
            },
            ctx,
        )
    }

    /// Creates a symbolic link.
    pub fn symlink(&self, parent: u64, name: &[u8], target: &[u8], ctx: Ctx) -> Result<Inode> {
        if target.is_empty() {
            return Err(Errno::ENOENT);
        }
        if target.len() > SYMLINK_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        self.make(
            parent,
            name,
            NewNode {
                kind: Kind::Symlink,
                mode: 0o777,
                rdev: 0,
                target,
            },
            ctx,
        )
    }

    /// Creates and opens a regular file. Returns its attributes and a file handle.
    pub fn create(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        flags: i32,
        ctx: Ctx,
    ) -> Result<(Inode, u64)> {
        let inode = self.make(
            parent,
            name,
            NewNode {
                kind: Kind::File,
                mode,
                rdev: 0,
                target: &[],
            },
            ctx,
        )?;
        let fh = self.open_handle(inode.ino, flags)?;
        Ok((inode, fh))
    }

    /// The target of a symbolic link.
    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        let i = self.getattr(ino)?;
        if i.kind != Kind::Symlink {
            return Err(Errno::EINVAL);
        }
        Ok(i.target)
    }

    // ----- removing names -----------------------------------------------------------------

    /// Removes the name of a non-directory.
    ///
    /// Under the namespace lock shared in the common case, a file the kernel holds with one name
    /// (it looked the name up to unlink it): the file is parked where it is, nothing moves, and
    /// its own lock, held until the table says where it lives now, keeps writes and attribute
    /// changes out meanwhile (they find its key through the table); the directory's lock orders
    /// it with the directory's other changes. A hard-linked file (its data moves) or one the
    /// table does not hold (a lookup by handle could give the kernel the inode being deleted)
    /// starts over with the lock exclusive.
    pub fn unlink(&self, parent: u64, name: &[u8]) -> Result<()> {
        check_name(name)?;
        {
            let _ns = self.ns.read();
            if self.unlink_shared(parent, name)? {
                return Ok(());
            }
        }
        let _ns = self.ns.write();
        let (dkey, dir_shared) = self.dir(parent)?;
        let found = self.find(parent, &dkey, name)?.ok_or(Errno::ENOENT)?;
        if found.inode.kind == Kind::Dir {
            return Err(Errno::EISDIR);
        }
        let mut dir = dir_shared.lock();
        let mut b = Batch::new();
        let now = Time::now();
        // Stable here: a FORGET takes the namespace lock shared.
        let known = self.kernel_knows(found.inode.ino);
        let removal = self.remove_file_ops(&mut b, &found, now, false, (parent, name), known)?;
        let mut next_dir = dir.clone();
        Self::touch_dir(&mut next_dir, now);
        b.put(keys::meta_key(&dkey), next_dir.encode());
        self.commit(&mut b)?;
        *dir = next_dir;
        drop(dir);
        self.apply_removal(&found, removal, None);
        Ok(())
    }

    /// [`Fs::unlink`] under the namespace lock shared; false (nothing changed) when it needs the
    /// lock exclusive.
    fn unlink_shared(&self, parent: u64, name: &[u8]) -> Result<bool> {
        let (dkey, dir_shared) = self.dir(parent)?;
        let mut dir = dir_shared.lock();
        let found = self.find(parent, &dkey, name)?.ok_or(Errno::ENOENT)?;
        if found.inode.kind == Kind::Dir {
            return Err(Errno::EISDIR);
        }
        let ino = found.inode.ino;
        let Some(victim) = self.table.lock().inode(ino) else {
            return Ok(false);
        };
        if found.redirect || found.inode.kind != Kind::File || !self.kernel_knows(ino) {
            return Ok(false);
        }
        self.test_points.reach(Point::UnlinkBeforeInodeLock);
        let mut inode = victim.lock();
        // Again under the inode's lock: the kernel's last FORGET may have taken the inode out of
        // the table since the check above, and seen the link count before this unlink (the file
        // parked here would then be deleted by nobody until the next mount: counted as used, its
        // space held). The exclusive path decides again. From here on the entry stays (a FORGET
        // takes it out only under this lock), and a FORGET waiting for the lock sees the file
        // unlinked and parked, and deletes it.
        if !self.still_known(ino, &victim) {
            return Ok(false);
        }
        self.test_points.reach(Point::UnlinkHoldingInodeLock);
        // As it is now (a write may have changed it since `find`); only an exclusive operation
        // could have given it a second name.
        assert!(
            !inode.homed,
            "inode {ino} became homed under the shared namespace lock"
        );
        let found = Found {
            inode: inode.clone(),
            ..found
        };
        let mut b = Batch::new();
        let now = Time::now();
        let removal = self.remove_file_ops(&mut b, &found, now, false, (parent, name), true)?;
        assert!(
            removal.unhomed.is_none() && removal.after.homed,
            "inode {ino}: an unlink under the shared lock parks the file"
        );
        let mut next_dir = dir.clone();
        Self::touch_dir(&mut next_dir, now);
        b.put(keys::meta_key(&dkey), next_dir.encode());
        self.commit(&mut b)?;
        *dir = next_dir;
        self.apply_removal(&found, removal, Some(&mut inode));
        drop(inode);
        drop(dir);
        Ok(true)
    }

    /// Operations removing the name `found` (`at`: its directory and name) of a non-directory.
    /// Returns the inode's state after. A file the kernel still holds (`known`: decided by the
    /// caller, under the exclusive namespace lock or the inode's lock) keeps existing, with link
    /// count 0, until the kernel forgets it (`fs/orphans.rs`): a regular file is parked at its
    /// path (nothing moves) or, when `reused` (a rename puts another file at that path in the same
    /// batch), moved to its home. A homed file left with one name moves back to it when it can
    /// (`fs/links.rs`).
    pub(super) fn remove_file_ops(
        &self,
        b: &mut Batch,
        found: &Found,
        now: Time,
        reused: bool,
        at: (u64, &[u8]),
        known: bool,
    ) -> Result<Removal> {
        let ino = found.inode.ino;
        let mut after = found.inode.clone();
        after.nlink = after.nlink.saturating_sub(1);
        after.ctime = now;
        let mut unhomed = None;
        if found.redirect {
            b.delete(keys::meta_key(&found.key));
            links::name_drop(b, ino, at.0, at.1);
            let home = keys::home_key(ino);
            if after.nlink == 0 && !known {
                self.delete_file_ops(b, &home, &found.inode);
                handles::index_drop(b, ino);
                self.count_inodes(b, -1);
                after.homed = false;
            } else {
                if after.nlink == 1 {
                    unhomed = self.unhome_ops(b, &mut after, at)?;
                }
                if unhomed.is_none() {
                    b.put(keys::meta_key(&home), after.encode());
                }
            }
        } else if known && found.inode.kind == Kind::File {
            after.homed = true;
            if reused {
                self.home_ops(b, &found.key, ino);
            } else {
                after.target = found.key.clone();
            }
            b.delete(keys::meta_key(&found.key));
            b.put(keys::meta_key(&keys::home_key(ino)), after.encode());
            handles::index_home(b, ino);
        } else {
            self.delete_file_ops(b, &found.key, &found.inode);
            handles::index_drop(b, ino);
            self.count_inodes(b, -1);
        }
        Ok(Removal { after, unhomed })
    }

    /// Operations moving a file's data and xattrs from its path to its home.
    pub(super) fn home_ops(&self, b: &mut Batch, path: &[u8], ino: u64) {
        let home = keys::home_key(ino);
        self.move_range(b, keys::data_prefix(path), keys::data_prefix(&home));
        self.move_range(b, keys::xattr_prefix(path), keys::xattr_prefix(&home));
    }

    /// Updates the table after a name of `found` was removed; `locked`: the inode's attributes,
    /// when the caller holds its lock.
    fn apply_removal(&self, found: &Found, removal: Removal, locked: Option<&mut Inode>) {
        let ino = found.inode.ino;
        let Removal { after, unhomed } = removal;
        let Some(shared) = self.table.lock().inode(ino) else {
            // An inode the kernel does not hold (deleted by the batch). A caller holding the
            // inode's lock found its entry under that lock, and a FORGET takes an entry out only
            // under it (`Fs::forget`).
            assert!(
                locked.is_none(),
                "inode {ino}: its table entry went while its lock was held"
            );
            return;
        };
        let homed = after.homed;
        if let Some(p) = orphans::parked_path(&after) {
            self.note_parked(ino, p.to_vec());
        }
        match locked {
            Some(i) => *i = after,
            None => *shared.lock() = after,
        }
        if let Some(u) = &unhomed {
            self.note_unhomed(ino, u);
            return;
        }
        let mut t = self.table.lock();
        if homed {
            t.set_homed(ino);
        } else {
            t.set_deleted(ino);
        }
    }

    /// Removes an empty directory: under the namespace lock shared when the table holds it (its
    /// own lock, held from the check that it is empty until the table knows it is gone, keeps
    /// makes inside it out), else exclusive.
    pub fn rmdir(&self, parent: u64, name: &[u8]) -> Result<()> {
        check_name(name)?;
        if name == b"." {
            return Err(Errno::EINVAL);
        }
        {
            let _ns = self.ns.read();
            if self.rmdir_locked(parent, name, false)? {
                return Ok(());
            }
        }
        let _ns = self.ns.write();
        let done = self.rmdir_locked(parent, name, true)?;
        assert!(done, "an rmdir under the exclusive lock");
        Ok(())
    }

    /// [`Fs::rmdir`] under the namespace lock, `exclusive` or shared; false (nothing changed)
    /// when the lock is shared and the table does not hold the directory.
    fn rmdir_locked(&self, parent: u64, name: &[u8], exclusive: bool) -> Result<bool> {
        let (dkey, dir_shared) = self.dir(parent)?;
        let mut dir = dir_shared.lock();
        let found = self.find(parent, &dkey, name)?.ok_or(Errno::ENOENT)?;
        if found.inode.kind != Kind::Dir {
            return Err(Errno::ENOTDIR);
        }
        let victim = self.table.lock().inode(found.inode.ino);
        if victim.is_none() && !exclusive {
            return Ok(false);
        }
        let mut held = victim.as_ref().map(|v| v.lock());
        if !self.dir_is_empty(&found.key)? {
            return Err(Errno::ENOTEMPTY);
        }
        let now = Time::now();
        let mut b = Batch::new();
        // Files parked below stay where they are (nothing moves at an `rm -rf`, whose rmdirs
        // often come before the kernel's FORGETs of the files): a name made at a parked path
        // later evicts exactly that file, a directory renamed to this path its whole subtree.
        b.delete(keys::meta_key(&found.key));
        handles::index_drop(&mut b, found.inode.ino);
        let x = keys::xattr_prefix(&found.key);
        b.range_delete(x.clone(), amaranth_engine::prefix_end(&x, self.max_key()));
        let mut next_dir = dir.clone();
        Self::touch_dir(&mut next_dir, now);
        next_dir.nlink = next_dir.nlink.saturating_sub(1);
        b.put(keys::meta_key(&dkey), next_dir.encode());
        self.count_inodes(&mut b, -1);
        self.commit(&mut b)?;
        *dir = next_dir;
        let mut after = match &held {
            Some(i) => (**i).clone(),
            None => found.inode.clone(),
        };
        after.nlink = 0;
        after.ctime = now;
        let removal = Removal {
            after,
            unhomed: None,
        };
        self.apply_removal(&found, removal, held.as_deref_mut());
        drop(held);
        drop(dir);
        Ok(true)
    }

    pub(super) fn dir_is_empty(&self, dir_key: &[u8]) -> Result<bool> {
        let p = keys::meta_key(&keys::children_prefix(dir_key));
        let end = amaranth_engine::prefix_end(&p, self.max_key());
        let mut empty = true;
        self.engine
            .scan(Bound::Included(&p), Bound::Excluded(&end), |_, _| {
                empty = false;
                false
            })?;
        Ok(empty)
    }

    // ----- rename and link ------------------------------------------------------------------

    /// Adds the name `new_parent/new_name` to inode `ino` (a hard link).
    pub fn link(&self, ino: u64, new_parent: u64, new_name: &[u8]) -> Result<Inode> {
        check_name(new_name)?;
        let _ns = self.ns.write();
        let (dkey, dir_shared) = self.dir(new_parent)?;
        let shared = self.node_inode(ino)?;
        if shared.lock().kind == Kind::Dir {
            return Err(Errno::EPERM);
        }
        if self.find(new_parent, &dkey, new_name)?.is_some() {
            return Err(Errno::EEXIST);
        }
        let new_key = keys::child_key(&dkey, new_name);
        self.check_key_len(&new_key)?;
        self.check_space(0)?;
        let path = self.file_key(ino)?;
        let mut dir = dir_shared.lock();
        let mut inode = shared.lock();
        if inode.nlink == 0 {
            // Unlinked while in use: it cannot get a name again (as `linkat` on Linux).
            return Err(Errno::ENOENT);
        }
        if inode.nlink >= u32::MAX - 1 {
            return Err(Errno::EMLINK);
        }
        let now = Time::now();
        let mut next = inode.clone();
        next.nlink += 1;
        next.ctime = now;
        let mut b = Batch::new();
        let evicted = self.evict_parked_ops(&mut b, &new_key, false);
        let home = keys::home_key(ino);
        if !inode.homed {
            // The first extra name: the file moves to its inode-keyed home and its path becomes a
            // redirect, like every later name.
            let (parent, name) = self.table.lock().place(ino).ok_or(Errno::ENOENT)?;
            next.homed = true;
            self.home_ops(&mut b, &path, ino);
            b.put(keys::meta_key(&path), Meta::redirect(ino));
            handles::index_home(&mut b, ino);
            links::name_put(&mut b, ino, parent, &name);
        }
        links::name_put(&mut b, ino, new_parent, new_name);
        b.put(keys::meta_key(&home), next.encode());
        b.put(keys::meta_key(&new_key), Meta::redirect(ino));
        let mut next_dir = dir.clone();
        Self::touch_dir(&mut next_dir, now);
        b.put(keys::meta_key(&dkey), next_dir.encode());
        self.commit(&mut b)?;
        self.note_evicted(&evicted);
        let was_homed = inode.homed;
        *inode = next.clone();
        *dir = next_dir;
        drop(inode);
        drop(dir);
        let mut t = self.table.lock();
        if !was_homed {
            t.set_homed(ino);
        }
        if let Some(n) = t.get_mut(ino) {
            n.lookups += 1;
        }
        Ok(next)
    }
}

/// What removing a name did to its inode.
pub(super) struct Removal {
    /// The inode's state after.
    pub after: Inode,
    /// Where it lives now, if it moved back from its home to its one remaining name.
    pub unhomed: Option<Unhomed>,
}
