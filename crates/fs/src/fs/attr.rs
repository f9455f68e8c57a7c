//! Attributes and extended attributes: getattr, setattr (a mode change keeps the access ACL in
//! step) and the xattr operations (set, get, list, remove).

use std::ops::Bound;

use amaranth_engine::Batch;

use super::{Ctx, Fs, SetAttr, SetTime, MAX_FILE_SIZE, NAME_MAX, XATTR_VALUE_MAX};
use crate::acl;
use crate::error::{Errno, Result};
use crate::inode::{Inode, Kind, Time};
use crate::keys;
use crate::space;

impl Fs {
    /// Attributes of `ino`.
    pub fn getattr(&self, ino: u64) -> Result<Inode> {
        let inode = self.node_inode(ino)?;
        let out = inode.lock().clone();
        Ok(out)
    }

    /// Changes attributes (mode, owner, size, times).
    pub fn setattr(&self, ino: u64, set: &SetAttr, ctx: Ctx) -> Result<Inode> {
        let _ns = self.ns.read();
        let shared = self.node_inode(ino)?;
        let mut inode = shared.lock();
        let (fk, meta) = self.locate(ino)?;
        let mut next = inode.clone();
        let now = Time::now();
        let mut b = Batch::new();
        if let Some(size) = set.size {
            match next.kind {
                Kind::File => {}
                Kind::Dir => return Err(Errno::EISDIR),
                _ => return Err(Errno::EINVAL),
            }
            if size > MAX_FILE_SIZE {
                return Err(Errno::EFBIG);
            }
            if size < next.size {
                self.truncate_ops(&mut b, &fk, size);
                let released = space::account_truncate(&self.engine, &fk, &mut next, size)?;
                self.count_reserved(&mut b, -(released as i64));
            }
            next.size = size;
            next.mtime = now;
            if ctx.uid != 0 {
                Self::kill_suidgid(&mut next);
            }
        }
        if let Some(mode) = set.mode {
            next.perm = (mode & 0o7777) as u16;
            // A stored access ACL follows the mode (its owner, group or mask, other entries).
            if !self.table.lock().has_no_xattrs(ino) {
                let acl_key = keys::xattr_key(&fk, acl::ACCESS);
                if let Some(old) = self.engine.get(&acl_key)? {
                    b.put(acl_key, acl::chmod(&old, next.perm)?);
                }
            }
        }
        if set.uid.is_some() || set.gid.is_some() {
            let changes =
                set.uid.is_some_and(|u| u != next.uid) || set.gid.is_some_and(|g| g != next.gid);
            if let Some(u) = set.uid {
                next.uid = u;
            }
            if let Some(g) = set.gid {
                next.gid = g;
            }
            if changes && next.kind != Kind::Dir && set.mode.is_none() {
                Self::kill_suidgid(&mut next);
            }
        }
        match set.atime {
            Some(SetTime::Now) => next.atime = now,
            Some(SetTime::At(t)) => next.atime = t,
            None => {}
        }
        match set.mtime {
            Some(SetTime::Now) => next.mtime = now,
            Some(SetTime::At(t)) => next.mtime = t,
            None => {}
        }
        if let Some(t) = set.crtime {
            next.crtime = t;
        }
        next.ctime = set.ctime.unwrap_or(now);
        b.put(meta, next.encode());
        if set.size.is_some_and(|s| s > inode.size) {
            self.check_space(0)?;
        }
        self.commit(&mut b)?;
        *inode = next.clone();
        Ok(next)
    }

    pub(super) fn kill_suidgid(i: &mut Inode) {
        i.perm &= !(libc::S_ISUID as u16);
        if i.perm & libc::S_IXGRP as u16 != 0 {
            i.perm &= !(libc::S_ISGID as u16);
        }
    }

    // ----- extended attributes ------------------------------------------------------------

    /// Sets an extended attribute (`flags`: `XATTR_CREATE`, `XATTR_REPLACE`).
    pub fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], flags: i32) -> Result<()> {
        if name.is_empty() || name.len() > NAME_MAX {
            return Err(Errno::ERANGE);
        }
        if value.len() > XATTR_VALUE_MAX {
            return Err(Errno::E2BIG);
        }
        let _ns = self.ns.read();
        let shared = self.node_inode(ino)?;
        let mut inode = shared.lock();
        let (fk, meta) = self.locate(ino)?;
        let key = keys::xattr_key(&fk, name);
        let exists = {
            // Unknown from here on, before the new attribute can be seen.
            let mut t = self.table.lock();
            let none = t.has_no_xattrs(ino);
            t.set_no_xattrs(ino, false);
            drop(t);
            !none && self.engine.get(&key)?.is_some()
        };
        if flags & libc::XATTR_CREATE != 0 && exists {
            return Err(Errno::EEXIST);
        }
        if flags & libc::XATTR_REPLACE != 0 && !exists {
            return Err(Errno::ENODATA);
        }
        self.check_space(value.len() as u64)?;
        let mut next = inode.clone();
        next.ctime = Time::now();
        let mut b = Batch::new();
        if name == acl::ACCESS {
            let (perm, store) = acl::apply_access(value, next.perm)?;
            next.perm = perm;
            if store {
                b.put(key, value.to_vec());
            } else if exists {
                b.delete(key);
            }
        } else {
            b.put(key, value.to_vec());
        }
        b.put(meta, next.encode());
        self.commit(&mut b)?;
        *inode = next;
        Ok(())
    }

    /// The value of an extended attribute.
    pub fn getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        if name.is_empty() || name.len() > NAME_MAX {
            return Err(Errno::ERANGE);
        }
        let _ns = self.ns.read();
        if self.table.lock().has_no_xattrs(ino) {
            return Err(Errno::ENODATA);
        }
        let value =
            self.with_file_key(ino, |fk| Ok(self.engine.get(&keys::xattr_key(fk, name))?))?;
        if value.is_none() {
            self.note_if_no_xattrs(ino)?;
        }
        value.ok_or(Errno::ENODATA)
    }

    /// After a probe found no attribute: if the inode has none at all, the table remembers it,
    /// so the kernel's next probes (`security.capability` at every write to a file) are answered
    /// without an engine lookup. Under the inode's lock, which `setxattr` holds from clearing the
    /// mark until its batch is in: the scan sees every attribute set before, and one set after
    /// clears the mark again.
    fn note_if_no_xattrs(&self, ino: u64) -> Result<()> {
        let shared = self.node_inode(ino)?;
        let _i = shared.lock();
        let p = keys::xattr_prefix(&self.file_key(ino)?);
        let end = amaranth_engine::prefix_end(&p, self.max_key());
        let mut any = false;
        self.engine
            .scan(Bound::Included(&p), Bound::Excluded(&end), |_, _| {
                any = true;
                false
            })?;
        if !any {
            self.table.lock().set_no_xattrs(ino, true);
        }
        Ok(())
    }

    /// Names of all extended attributes, each followed by a NUL byte.
    pub fn listxattr(&self, ino: u64) -> Result<Vec<u8>> {
        let _ns = self.ns.read();
        if self.table.lock().has_no_xattrs(ino) {
            return Ok(Vec::new());
        }
        self.with_file_key(ino, |fk| {
            let p = keys::xattr_prefix(fk);
            let end = amaranth_engine::prefix_end(&p, self.max_key());
            let mut out = Vec::new();
            self.engine
                .scan(Bound::Included(&p), Bound::Excluded(&end), |k, _| {
                    out.extend_from_slice(&k[p.len()..]);
                    out.push(0);
                    true
                })?;
            Ok(out)
        })
    }

    /// Removes an extended attribute.
    pub fn removexattr(&self, ino: u64, name: &[u8]) -> Result<()> {
        let _ns = self.ns.read();
        let shared = self.node_inode(ino)?;
        let mut inode = shared.lock();
        let (fk, meta) = self.locate(ino)?;
        let key = keys::xattr_key(&fk, name);
        if self.table.lock().has_no_xattrs(ino) || self.engine.get(&key)?.is_none() {
            return Err(Errno::ENODATA);
        }
        let mut next = inode.clone();
        next.ctime = Time::now();
        let mut b = Batch::new();
        b.delete(key);
        b.put(meta, next.encode());
        self.commit(&mut b)?;
        *inode = next;
        Ok(())
    }
}
