//! Rename: moving a name, or a directory with its whole subtree, in one batch (plain,
//! `RENAME_NOREPLACE`, `RENAME_EXCHANGE`).

use amaranth_engine::Batch;

use super::namespace::Removal;
use super::{check_name, handles, links, Found, Fs, RENAME_EXCHANGE, RENAME_NOREPLACE};
use crate::error::{Errno, Result};
use crate::inode::{Kind, Meta, Time};
use crate::keys;

impl Fs {
    /// Renames `parent/name` to `new_parent/new_name` (`flags`: [`RENAME_NOREPLACE`],
    /// [`RENAME_EXCHANGE`]). Atomic: one batch.
    pub fn rename(
        &self,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        flags: u32,
    ) -> Result<()> {
        check_name(name)?;
        check_name(new_name)?;
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE) != 0
            || flags & RENAME_NOREPLACE != 0 && flags & RENAME_EXCHANGE != 0
        {
            return Err(Errno::EINVAL);
        }
        {
            let _ns = self.ns.read();
            if self.rename_shared(parent, name, new_parent, new_name, flags)? {
                return Ok(());
            }
        }
        let _ns = self.ns.write();
        let (src_dkey, src_dir) = self.dir(parent)?;
        let (dst_dkey, dst_dir) = self.dir(new_parent)?;
        let src = self.find(parent, &src_dkey, name)?.ok_or(Errno::ENOENT)?;
        let dst = self.find(new_parent, &dst_dkey, new_name)?;
        let dst_key = keys::child_key(&dst_dkey, new_name);
        self.check_key_len(&dst_key)?;
        if parent == new_parent && name == new_name {
            return Ok(());
        }
        let exchange = flags & RENAME_EXCHANGE != 0;
        if flags & RENAME_NOREPLACE != 0 && dst.is_some() {
            return Err(Errno::EEXIST);
        }
        if exchange && dst.is_none() {
            return Err(Errno::ENOENT);
        }
        // A directory cannot move into itself or its own subtree.
        {
            let t = self.table.lock();
            if src.inode.kind == Kind::Dir && t.is_ancestor(src.inode.ino, new_parent) {
                return Err(Errno::EINVAL);
            }
            if exchange {
                if let Some(d) = &dst {
                    if d.inode.kind == Kind::Dir && t.is_ancestor(d.inode.ino, parent) {
                        return Err(Errno::EINVAL);
                    }
                }
            }
        }
        if let Some(d) = &dst {
            if d.inode.ino == src.inode.ino {
                // Two names of one file: nothing to do (POSIX).
                return Ok(());
            }
            if !exchange {
                match (src.inode.kind == Kind::Dir, d.inode.kind == Kind::Dir) {
                    (true, false) => return Err(Errno::ENOTDIR),
                    (false, true) => return Err(Errno::EISDIR),
                    (true, true) if !self.dir_is_empty(&d.key)? => return Err(Errno::ENOTEMPTY),
                    _ => {}
                }
            }
        }
        // Every moved key must fit (a deep subtree under a longer path may not).
        if let Some(d) = dst.as_ref().filter(|_| exchange) {
            self.check_move_fits(d, &src.key)?;
        }
        self.check_move_fits(&src, &dst_key)?;
        let now = Time::now();
        let mut b = Batch::new();
        // Parent directories (one or two), locked in inode order.
        let same_parent = parent == new_parent;
        let (mut g1, mut g2) = if same_parent {
            (src_dir.lock(), None)
        } else if parent < new_parent {
            let a = src_dir.lock();
            (a, Some(dst_dir.lock()))
        } else {
            let bg = dst_dir.lock();
            (src_dir.lock(), Some(bg))
        };
        let mut sdir = g1.clone();
        let mut ddir = g2.as_ref().map(|g| (**g).clone());
        // Files parked at the destination, or below either path when a directory moves (its
        // subtree's keys move, and a directory may land where a removed one left parked files),
        // go to their homes first (`fs/orphans.rs`).
        let mut evicted = self.evict_parked_ops(&mut b, &dst_key, false);
        let dirs_move = std::iter::once(&src)
            .chain(dst.as_ref())
            .any(|f| f.inode.kind == Kind::Dir);
        if dirs_move {
            for k in [&src.key, &dst_key] {
                evicted.extend(self.evict_parked_ops(&mut b, k, true));
            }
        }
        Self::touch_dir(&mut sdir, now);
        if let Some(d) = ddir.as_mut() {
            Self::touch_dir(d, now);
        }
        let mut replaced: Option<Removal> = None;
        // The names index follows the redirects that move (`fs/links.rs`).
        if src.redirect {
            links::name_drop(&mut b, src.inode.ino, parent, name);
        }
        if let Some(d) = dst.as_ref().filter(|d| exchange && d.redirect) {
            links::name_drop(&mut b, d.inode.ino, new_parent, new_name);
            links::name_put(&mut b, d.inode.ino, parent, name);
        }
        if exchange {
            let d = dst.as_ref().expect("checked");
            // Through a place whose keys are shorter than any path's: no key of either side is
            // ever longer than it is before or after the exchange.
            let tmp = keys::swap_key();
            self.move_entry_ops(&mut b, &src, &tmp);
            self.move_entry_ops(&mut b, d, &src.key);
            let src_at_tmp = Found {
                key: tmp,
                inode: src.inode.clone(),
                redirect: src.redirect,
            };
            self.move_entry_ops(&mut b, &src_at_tmp, &d.key);
            if !d.redirect {
                handles::index_at(&mut b, d.inode.ino, parent, name);
            }
            if !src.redirect {
                handles::index_at(&mut b, src.inode.ino, new_parent, new_name);
            }
            if !same_parent {
                let (sd, dd) = (src.inode.kind == Kind::Dir, d.inode.kind == Kind::Dir);
                let dd_ref = ddir.as_mut().expect("two parents");
                if sd && !dd {
                    sdir.nlink -= 1;
                    dd_ref.nlink += 1;
                } else if dd && !sd {
                    sdir.nlink += 1;
                    dd_ref.nlink -= 1;
                }
            }
        } else {
            if let Some(d) = &dst {
                if d.inode.kind == Kind::Dir {
                    b.delete(keys::meta_key(&d.key));
                    handles::index_drop(&mut b, d.inode.ino);
                    let x = keys::xattr_prefix(&d.key);
                    b.range_delete(x.clone(), amaranth_engine::prefix_end(&x, self.max_key()));
                    self.count_inodes(&mut b, -1);
                    let target_dir = ddir.as_mut().unwrap_or(&mut sdir);
                    target_dir.nlink -= 1;
                    let mut gone = d.inode.clone();
                    gone.nlink = 0;
                    replaced = Some(Removal {
                        after: gone,
                        unhomed: None,
                    });
                } else {
                    let at = (new_parent, new_name);
                    // Stable here: a FORGET takes the namespace lock shared.
                    let known = self.kernel_knows(d.inode.ino);
                    replaced = Some(self.remove_file_ops(&mut b, d, now, true, at, known)?);
                }
            }
            self.move_entry_ops(&mut b, &src, &dst_key);
            if !src.redirect {
                handles::index_at(&mut b, src.inode.ino, new_parent, new_name);
            }
            if src.inode.kind == Kind::Dir && !same_parent {
                sdir.nlink -= 1;
                ddir.as_mut().expect("two parents").nlink += 1;
            }
        }
        if src.redirect {
            links::name_put(&mut b, src.inode.ino, new_parent, new_name);
        }
        b.put(keys::meta_key(&src_dkey), sdir.encode());
        if let Some(d) = &ddir {
            b.put(keys::meta_key(&dst_dkey), d.encode());
        }
        self.check_space(0)?;
        self.commit(&mut b)?;
        self.note_evicted(&evicted);
        *g1 = sdir;
        if let (Some(g), Some(d)) = (g2.as_mut(), ddir) {
            **g = d;
        }
        drop(g1);
        drop(g2);
        // The table follows (attributes first: an inode lock is never taken under the table lock).
        let src_ino = src.inode.ino;
        let src_shared = self.table.lock().inode(src_ino);
        if let Some(shared) = src_shared {
            shared.lock().ctime = now;
        }
        if let Some(d) = &dst {
            let dst_shared = self.table.lock().inode(d.inode.ino);
            if let Some(shared) = dst_shared {
                let mut i = shared.lock();
                match &replaced {
                    Some(r) if !exchange => *i = r.after.clone(),
                    _ => i.ctime = now,
                }
            }
        }
        let mut t = self.table.lock();
        if let Some(d) = &dst {
            if exchange {
                t.detach(d.inode.ino);
                t.detach(src_ino);
                t.attach(d.inode.ino, parent, name);
            } else if let Some(u) = replaced.as_ref().and_then(|r| r.unhomed.as_ref()) {
                t.unhome(d.inode.ino, u.parent, &u.name);
            } else if replaced.as_ref().is_some_and(|r| r.after.homed) {
                t.set_homed(d.inode.ino);
            } else {
                t.set_deleted(d.inode.ino);
            }
        }
        if exchange {
            t.attach(src_ino, new_parent, new_name);
        } else {
            t.rename(src_ino, new_parent, new_name);
        }
        Ok(())
    }

    /// Operations moving the entry `found` (metadata, and for path-keyed inodes their data, xattrs
    /// and subtree) to the path key `to`.
    pub(super) fn move_entry_ops(&self, b: &mut Batch, found: &Found, to: &[u8]) {
        let from = &found.key;
        b.delete(keys::meta_key(from));
        if found.redirect {
            b.put(keys::meta_key(to), Meta::redirect(found.inode.ino));
            return;
        }
        let mut moved = found.inode.clone();
        moved.ctime = Time::now();
        b.put(keys::meta_key(to), moved.encode());
        self.move_range(b, keys::xattr_prefix(from), keys::xattr_prefix(to));
        match found.inode.kind {
            Kind::Dir => {
                for (f, t) in keys::subtree_prefixes(from)
                    .into_iter()
                    .zip(keys::subtree_prefixes(to))
                {
                    self.move_range(b, f, t);
                }
            }
            Kind::File => self.move_range(b, keys::data_prefix(from), keys::data_prefix(to)),
            _ => {}
        }
    }

    /// Moves every key under `from` to `to`, a range that holds no key when the operation
    /// applies (the engine refuses the batch otherwise): copied when small, by tree surgery
    /// otherwise ([`FsOptions::rename_copy_max`](crate::FsOptions::rename_copy_max)).
    pub(super) fn move_range(&self, b: &mut Batch, from: Vec<u8>, to: Vec<u8>) {
        b.range_move(from, to, self.opts.rename_copy_max);
    }
}
