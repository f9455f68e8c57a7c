//! The names of hard-linked files (schema 6), and moving a file back from its home to its path
//! when its link count returns to one.
//!
//! A file that gets a second name moves to its home, keyed by inode number, so that every name
//! reaches it (`namespace.rs`, `link`). Once all names but one are gone, its data would stay in
//! inode order while the names around its remaining path lie in path order: a `grep -r` or a
//! `find | xargs cat` reads it out of place. That is what git does to every object it writes
//! (a temporary name, `link()` to the final name, `unlink()` of the temporary one), and aged git
//! repositories read with a layout score of ~0.25 instead of ~0.9 (docs/AGING.md).
//!
//! So the batch that takes a link count from two to one also moves the file back: data and
//! extended attributes from the home to the remaining path, the inode itself to that path, the
//! inode index to "at parent/name". To find the remaining name without a walk, the *names index*
//! (`'l' ino parent name`, one empty-valued entry per name of a homed inode) is written in the
//! same batch as every change of those names: the link that homes a file (both names), each
//! further link, each unlink and rename of a redirect, and the un-homing itself (its last entry
//! goes). The data moves as a range move (copied when small, by tree surgery otherwise: O(height)
//! whatever the file's size). The move is skipped, and the file stays homed (correct, only out of
//! place), when:
//! - a key at the path would be too long (an extended attribute with a long name under a long
//!   path: the name itself fitted, since the redirect is there);
//! - the names index does not give exactly one other name, or that name does not hold a redirect
//!   to the inode (a damaged index: `fsck` reports and rewrites it).

use amaranth_engine::Batch;

use super::{handles, Found, Fs};
use crate::error::{Errno, Result};
use crate::inode::{Inode, Kind, Meta};
use crate::keys;
use crate::table::ROOT_INO;

/// The first schema with the names index.
pub const NAMES_SCHEMA: u32 = 6;
/// Value of a names-index entry (its version; the key says everything).
const NAME_VALUE: u8 = 1;

/// Puts into `b` that `name` in directory `parent` redirects to the home of `ino`.
pub(super) fn name_put(b: &mut Batch, ino: u64, parent: u64, name: &[u8]) {
    b.put(keys::name_key(ino, parent, name), vec![NAME_VALUE]);
}

/// Deletes from the names index, in `b`, the name `name` in directory `parent` of `ino`.
pub(super) fn name_drop(b: &mut Batch, ino: u64, parent: u64, name: &[u8]) {
    b.delete(keys::name_key(ino, parent, name));
}

/// Where a file moved back from its home lives now.
#[derive(Debug)]
pub(super) struct Unhomed {
    /// Its directory.
    pub parent: u64,
    /// Its name there.
    pub name: Vec<u8>,
}

impl Fs {
    /// Whether this image has the names index (schema 6 and later).
    pub(super) fn has_names(&self) -> bool {
        self.schema() >= NAMES_SCHEMA
    }

    /// The names of `ino` in the names index, as the engine holds them (before `b`).
    fn names_of(&self, ino: u64) -> Result<Vec<(u64, Vec<u8>)>> {
        let lo = keys::names_prefix(ino);
        let hi = amaranth_engine::prefix_end(&lo, self.max_key());
        let mut out = Vec::new();
        self.engine.scan(
            std::ops::Bound::Included(&lo),
            std::ops::Bound::Excluded(&hi),
            |k, _| {
                if let Some((_, parent, name)) = keys::name_of_name_key(k) {
                    out.push((parent, name));
                }
                out.len() <= 2
            },
        )?;
        Ok(out)
    }

    /// The path key of directory `dir`: from the table if it holds it, else up the inode index
    /// to an inode the table holds (the root at the latest). `None` if the index does not lead
    /// there.
    fn dir_key_of(&self, dir: u64) -> Result<Option<Vec<u8>>> {
        let mut names: Vec<Vec<u8>> = Vec::new();
        let mut cur = dir;
        let base = loop {
            if let Some(k) = self.table.lock().file_key(cur) {
                break k;
            }
            if cur == ROOT_INO || names.len() > 1 << 16 {
                return Ok(None);
            }
            let Some(v) = self.engine.get(&keys::ino_key(cur))? else {
                return Ok(None);
            };
            match handles::Place::decode(&v)? {
                handles::Place::At { parent, name } => {
                    names.push(name);
                    cur = parent;
                }
                handles::Place::Home => return Ok(None),
            }
        };
        Ok(Some(
            names.iter().rev().fold(base, |k, n| keys::child_key(&k, n)),
        ))
    }

    /// The one name of `ino` left once `removed` goes, with its path key, if the names index
    /// gives exactly one and it holds a redirect to `ino`.
    fn remaining_name(
        &self,
        ino: u64,
        removed: (u64, &[u8]),
    ) -> Result<Option<(Unhomed, Vec<u8>)>> {
        let mut names = self.names_of(ino)?;
        names.retain(|(p, n)| (*p, &n[..]) != removed);
        let [(parent, name)] = &names[..] else {
            log::warn!("amaranth: inode {ino}: {} other names indexed", names.len());
            return Ok(None);
        };
        let Some(dir_key) = self.dir_key_of(*parent)? else {
            return Ok(None);
        };
        let path = keys::child_key(&dir_key, name);
        let holds = match self.engine.get(&keys::meta_key(&path))? {
            Some(v) => Some(Meta::decode(&v)?),
            None => None,
        };
        if !matches!(holds, Some(Meta::Redirect(i)) if i == ino) {
            log::warn!("amaranth: inode {ino}: its indexed name does not redirect to it");
            return Ok(None);
        }
        let at = Unhomed {
            parent: *parent,
            name: name.clone(),
        };
        Ok(Some((at, path)))
    }

    /// Operations moving the homed file `after` (its state once the name `removed` is gone, link
    /// count 1) back to its one remaining name, if it can move (see the module's comment).
    /// `after` is updated (not homed). Returns where it went.
    pub(super) fn unhome_ops(
        &self,
        b: &mut Batch,
        after: &mut Inode,
        removed: (u64, &[u8]),
    ) -> Result<Option<Unhomed>> {
        let ino = after.ino;
        assert_eq!(after.nlink, 1, "inode {ino}: moved back with other names");
        if !after.homed || !(after.target.is_empty() || after.kind == Kind::Symlink) {
            // Read from the image through a redirect: damage, which fsck reports.
            log::error!("amaranth: inode {ino} has a name redirecting to it but is not homed");
            return Ok(None);
        }
        if !self.has_names() {
            return Ok(None);
        }
        let Some((at, path)) = self.remaining_name(ino, removed)? else {
            return Ok(None);
        };
        let home = keys::home_key(ino);
        let at_home = Found {
            key: home.clone(),
            inode: after.clone(),
            redirect: false,
        };
        match self.check_move_fits(&at_home, &path) {
            Ok(()) => {}
            Err(Errno::ENAMETOOLONG) => return Ok(None),
            Err(e) => return Err(e),
        }
        let known = self.table.lock().get(ino).is_some();
        let parent = at.parent;
        if known && parent != ROOT_INO && self.table.lock().get(parent).is_none() {
            // The table keeps an inode at a path only under a directory it holds: enter the
            // directory (and its ancestors) without kernel lookups, as a file handle would.
            if self.bring_in(parent, false)?.is_none() {
                return Ok(None);
            }
        }
        after.homed = false;
        b.delete(keys::meta_key(&home));
        self.move_range(b, keys::data_prefix(&home), keys::data_prefix(&path));
        self.move_range(b, keys::xattr_prefix(&home), keys::xattr_prefix(&path));
        b.put(keys::meta_key(&path), after.encode());
        name_drop(b, ino, parent, &at.name);
        handles::index_at(b, ino, parent, &at.name);
        Ok(Some(at))
    }

    /// After an upgrade built the names index: files that older versions left at their homes
    /// with one name move back to it, one batch each (a crash in between leaves the rest at their
    /// homes, which is correct). Returns how many moved.
    pub(super) fn unhome_single_names(&self) -> Result<u64> {
        let mut moved = 0;
        for ino in self.homes()? {
            let Some((mut inode, _)) = self.load(&keys::home_key(ino))? else {
                continue;
            };
            let plain = inode.target.is_empty() || inode.kind == Kind::Symlink;
            if inode.nlink != 1 || !inode.homed || !plain {
                continue;
            }
            let mut b = Batch::new();
            if self.unhome_ops(&mut b, &mut inode, (0, &[]))?.is_some() {
                self.engine.write(&b)?;
                moved += 1;
            }
        }
        Ok(moved)
    }

    /// After the batch of [`Fs::unhome_ops`] is committed: the table keeps the inode at its path.
    pub(super) fn note_unhomed(&self, ino: u64, at: &Unhomed) {
        self.table.lock().unhome(ino, at.parent, &at.name);
    }
}
