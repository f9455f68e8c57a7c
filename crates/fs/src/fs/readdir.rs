//! Directory listing: directory handles and offsets.
//!
//! A directory's children are stored in the order of their names' 56-bit hashes (see
//! [`keys`](crate::keys)), so the position after an entry depends on that entry alone: the offset
//! handed out with a child whose name hashes to `h` is `h + 3`, and a listing from offset `o >= 2`
//! resumes at the first child whose hash is at least `o - 2` (`.` is at 1, `..` at 2). Such an
//! offset means the same thing in every handle, after any change of the directory (entries added
//! or removed before or after it, the entry itself removed) and after a remount, and resuming is
//! one scan from a key computed from the offset.
//!
//! Two names with the same hash (a collision: 2^-56 for a given pair) share a position. The first
//! of them gets the offset `h + 2` instead (resume *at* `h`), so a listing resumed from it repeats
//! an entry rather than skipping one.
//!
//! Nothing is remembered per open directory: an offset says everything (the handle argument is
//! accepted and ignored; `opendir` hands out 0).

use std::ops::Bound;

use super::{DirEntry, Fs};
use crate::error::{Errno, Result};
use crate::inode::{Inode, Kind, Meta};
use crate::keys;
use crate::table::ROOT_INO;

/// Offset of the entry after `.`.
const DOT: u64 = 1;
/// Offset of the entry after `..`: the first child.
const DOTDOT: u64 = 2;
/// Entries read from the engine per call (one more is read to see the next entry's hash).
const WINDOW: usize = 256;

/// The offset handed out with a child whose name hashes to `hash`; `next_same` says whether the
/// next child's name has the same hash.
fn offset_after(hash: u64, next_same: bool) -> u64 {
    assert!(hash < keys::HASH_LIMIT);
    hash + 3 - u64::from(next_same)
}

/// The lowest hash a listing from `offset` (at least [`DOTDOT`]) returns; `None` past the end.
fn first_hash(offset: u64) -> Option<u64> {
    assert!(offset >= DOTDOT);
    let h = offset - DOTDOT;
    (h < keys::HASH_LIMIT).then_some(h)
}

impl Fs {
    /// Opens a directory for listing: checks that it is one. The handle carries nothing (offsets
    /// say where a listing is).
    pub fn opendir(&self, ino: u64) -> Result<u64> {
        self.dir(ino)?;
        Ok(0)
    }

    /// Closes a directory handle (nothing to forget).
    pub fn releasedir(&self, _fh: u64) {}

    /// Lists a directory from `offset`: 0 at the start, otherwise the offset of the last entry
    /// consumed, from this handle or any other, before or after the directory changed (see the
    /// module documentation). `emit` returns false when it cannot take the entry (its buffer is
    /// full); with `plus`, each accepted entry except `.` and `..` counts as a kernel lookup.
    pub fn readdir(
        &self,
        ino: u64,
        _fh: u64,
        offset: u64,
        plus: bool,
        mut emit: impl FnMut(&DirEntry) -> bool,
    ) -> Result<()> {
        let _ns = self.ns.read();
        let (dkey, _) = self.dir(ino)?;
        let parent_ino = self
            .table
            .lock()
            .get(ino)
            .map(|n| if n.parent == 0 { ROOT_INO } else { n.parent })
            .unwrap_or(ROOT_INO);
        let dots = [(".", ino, DOT), ("..", parent_ino, DOTDOT)];
        for (name, dino, off) in dots {
            if offset < off {
                let e = DirEntry {
                    ino: dino,
                    offset: off,
                    kind: Kind::Dir,
                    name: name.as_bytes().to_vec(),
                    attr: None,
                };
                if !emit(&e) {
                    return Ok(());
                }
            }
        }
        let prefix = keys::meta_key(&keys::children_prefix(&dkey));
        let Some(start) = resume_key(&prefix, offset) else {
            return Ok(());
        };
        let end = amaranth_engine::prefix_end(&prefix, self.max_key());
        // Collect a window of entries, then emit them (emission may need engine reads for
        // redirects); one more entry tells whether the last one's hash is shared.
        let mut window: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        self.engine
            .scan(Bound::Included(&start), Bound::Excluded(&end), |k, v| {
                window.push((k.to_vec(), v.to_vec()));
                window.len() <= WINDOW
            })?;
        let hash = |k: &[u8]| keys::hash_of(&k[prefix.len()..]).ok_or(Errno::EIO);
        for i in 0..window.len().min(WINDOW) {
            let (k, v) = &window[i];
            let Some(name) = keys::name_of_child(&k[1..], prefix.len() - 1) else {
                log::error!("amaranth: undecodable directory entry under inode {ino}");
                return Err(Errno::EIO);
            };
            let this = hash(k)?;
            let next_same = match window.get(i + 1) {
                Some((n, _)) => hash(n)? == this,
                None => false,
            };
            let inode = self.listed_inode(v)?;
            let attr = plus.then(|| {
                let cached = self.table.lock().inode(inode.ino);
                cached.map_or_else(|| inode.clone(), |s| s.lock().clone())
            });
            let e = DirEntry {
                ino: inode.ino,
                offset: offset_after(this, next_same),
                kind: inode.kind,
                name,
                attr,
            };
            if !emit(&e) {
                break;
            }
            if plus {
                self.table.lock().remember(ino, &e.name, inode, true);
            }
        }
        Ok(())
    }

    /// The inode a directory entry's value names (following a redirect to a home).
    fn listed_inode(&self, value: &[u8]) -> Result<Inode> {
        match Meta::decode(value)? {
            Meta::Inode(i) => Ok(i),
            Meta::Redirect(target) => {
                let hv = self
                    .engine
                    .get(&keys::meta_key(&keys::home_key(target)))?
                    .ok_or(Errno::EIO)?;
                match Meta::decode(&hv)? {
                    Meta::Inode(i) => Ok(i),
                    Meta::Redirect(_) => Err(Errno::EIO),
                }
            }
        }
    }
}

/// The first key a listing of the children under `prefix` from `offset` may return (`None`: the
/// offset is past every possible child).
fn resume_key(prefix: &[u8], offset: u64) -> Option<Vec<u8>> {
    let mut start = prefix.to_vec();
    if offset <= DOTDOT {
        return Some(start);
    }
    keys::hash_into(first_hash(offset)?, &mut start);
    Some(start)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn comp(h: u64, name: &[u8]) -> Vec<u8> {
        let mut c = Vec::new();
        keys::hash_into(h, &mut c);
        keys::escape_into(name, &mut c);
        c
    }

    #[test]
    fn offsets_map_back_to_the_position_after_their_entry() {
        let p = b"mP".to_vec();
        for h in [0, 1, 77, keys::HASH_LIMIT - 1] {
            // A unique hash resumes strictly above it; a shared one resumes at it.
            let after = resume_key(&p, offset_after(h, false));
            let mut want = p.clone();
            if h + 1 < keys::HASH_LIMIT {
                keys::hash_into(h + 1, &mut want);
                assert_eq!(after, Some(want));
            } else {
                assert_eq!(after, None, "the last possible hash ends the listing");
            }
            let mut at = p.clone();
            if h > 0 {
                keys::hash_into(h, &mut at);
            } // else the offset is `..`'s: from the first child, the same place.
            assert_eq!(resume_key(&p, offset_after(h, true)), Some(at));
        }
        assert_eq!(resume_key(&p, DOT), Some(p.clone()));
        assert_eq!(resume_key(&p, DOTDOT), Some(p.clone()));
        assert_eq!(resume_key(&p, u64::MAX), None);
    }

    #[test]
    fn a_collision_resumes_at_the_shared_hash_and_never_skips() {
        let p = b"mP".to_vec();
        // Two names with hash 9 and one with hash 8: the first of the pair shares its offset
        // (9 + 2) with the entry of hash 8, and resuming from it lists both names of hash 9.
        assert_eq!(offset_after(8, false), offset_after(9, true));
        let b = comp(9, b"b");
        let mut at9 = p.clone();
        keys::hash_into(9, &mut at9);
        let start = resume_key(&p, offset_after(9, true)).unwrap();
        assert_eq!(start, at9);
        assert!(
            start < [&p[..], &b].concat(),
            "the first name of hash 9 would be skipped"
        );
        // After the last name of hash 9: hash 10 on.
        let mut at10 = p.clone();
        keys::hash_into(10, &mut at10);
        assert_eq!(resume_key(&p, offset_after(9, false)), Some(at10));
    }
}
