//! File handles that outlive the kernel's memory (NFS export, `open_by_handle_at`): finding an
//! inode from its number alone.
//!
//! Keys are paths, so an inode number does not lead to a key by itself. The *inode index* does:
//! one entry per inode, `'i' ino` (big-endian), holding where the inode is: its parent directory's
//! inode number and its name, or "at its home" (hard-linked or unlinked-while-open files, whose key
//! is the inode number). Every batch that creates, renames, links or removes a name updates the
//! index in the same batch, so the index is exactly as durable as the names; renaming a directory
//! changes one entry however large its subtree (the children point at the directory's number, which
//! does not change). Resolving an inode walks up the index to an inode the table holds (at the
//! latest the root) and comes back down, reading one index entry and one inode per level.
//!
//! Inode numbers are never reused (the counter only grows, reserved ahead in the log), so a number
//! names one inode for the life of the file system; the handle's generation is the same for every
//! inode of an image and differs between images (from the uuid), so a handle kept across a mkfs at
//! the same place is stale rather than naming an unrelated file.

use amaranth_engine::Batch;

use super::{u64_value, Fs, SCHEMA_VERSION};
use crate::error::{Errno, Result};
use crate::inode::{Inode, Kind, Meta};
use crate::keys;
use crate::table::ROOT_INO;

/// The first schema with the inode index (older images get it at their first writable mount).
pub const INDEX_SCHEMA: u32 = 3;
/// Index entries written per batch while an older image is upgraded.
const UPGRADE_BATCH: usize = 512;
/// Version byte of an index value.
const INDEX_VERSION: u8 = 1;

/// Where an inode is, according to the index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Place {
    /// Named `name` in directory `parent`.
    At {
        /// The directory's inode number.
        parent: u64,
        /// The name in it.
        name: Vec<u8>,
    },
    /// At its home (hard-linked, or unlinked while open).
    Home,
}

impl Place {
    /// The index value.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Place::At { parent, name } => {
                let mut v = Vec::with_capacity(10 + name.len());
                v.extend_from_slice(&[INDEX_VERSION, b'P']);
                v.extend_from_slice(&parent.to_le_bytes());
                v.extend_from_slice(name);
                v
            }
            Place::Home => vec![INDEX_VERSION, b'H'],
        }
    }

    /// Parses an index value.
    pub fn decode(v: &[u8]) -> Result<Place> {
        match v {
            [INDEX_VERSION, b'H'] => Ok(Place::Home),
            [INDEX_VERSION, b'P', rest @ ..] if rest.len() > 8 => Ok(Place::At {
                parent: u64::from_le_bytes(rest[..8].try_into().expect("8 bytes")),
                name: rest[8..].to_vec(),
            }),
            _ => {
                log::error!("amaranth: an inode index entry does not decode: {v:?}");
                Err(Errno::EIO)
            }
        }
    }
}

/// Puts into `b` that inode `ino` is named `name` in directory `parent`.
pub(super) fn index_at(b: &mut Batch, ino: u64, parent: u64, name: &[u8]) {
    let place = Place::At {
        parent,
        name: name.to_vec(),
    };
    b.put(keys::ino_key(ino), place.encode());
}

/// Puts into `b` that inode `ino` lives at its home.
pub(super) fn index_home(b: &mut Batch, ino: u64) {
    b.put(keys::ino_key(ino), Place::Home.encode());
}

/// Puts into `b` that inode `ino` is gone.
pub(super) fn index_drop(b: &mut Batch, ino: u64) {
    b.delete(keys::ino_key(ino));
}

impl Fs {
    /// The generation of every inode of this image, for file handles (from the image's uuid).
    pub fn generation(&self) -> u64 {
        let (uuid, _) = self.engine.identity();
        let g = uuid.chunks(4).fold(0u32, |acc, c| {
            acc ^ u32::from_le_bytes(c.try_into().expect("4 bytes"))
        });
        // Never zero: zero is what a handle from before export support would carry.
        u64::from(g.max(1))
    }

    /// The inode `ino` for a kernel lookup of `ino` itself (`.`), also when the kernel forgot it
    /// (a file handle presented after its inode left the kernel's cache): found through the inode
    /// index and entered into the table with one lookup. `ESTALE` if it does not exist (any more).
    pub(super) fn lookup_by_number(&self, ino: u64) -> Result<Inode> {
        if let Some(shared) = {
            let mut t = self.table.lock();
            t.get_mut(ino).map(|n| {
                n.lookups += 1;
                n.inode.clone()
            })
        } {
            let out = shared.lock().clone();
            return Ok(out);
        }
        if !self.has_index() {
            return Err(Errno::ESTALE);
        }
        self.bring_in(ino, true)?.ok_or(Errno::ESTALE)
    }

    /// Puts inode `ino` into the table (its ancestors too, without kernel lookups) from the index;
    /// `None` if the index has no such inode. `count`: the kernel gets a lookup of it.
    pub(super) fn bring_in(&self, ino: u64, count: bool) -> Result<Option<Inode>> {
        // Walk up to an inode the table holds, remembering the way.
        let mut chain: Vec<(u64, u64, Vec<u8>)> = Vec::new();
        let mut cur = ino;
        let home = loop {
            if cur == ROOT_INO || self.table.lock().get(cur).is_some() {
                break false;
            }
            let Some(v) = self.engine.get(&keys::ino_key(cur))? else {
                return Ok(None);
            };
            match Place::decode(&v)? {
                Place::Home if cur == ino => break true,
                Place::Home => {
                    log::error!(
                        "amaranth: inode {cur} is the parent of {ino} but lives at its home"
                    );
                    return Err(Errno::EIO);
                }
                Place::At { parent, name } => {
                    chain.push((cur, parent, name));
                    if chain.len() > 1 << 16 {
                        log::error!("amaranth: the inode index loops above inode {ino}");
                        return Err(Errno::EIO);
                    }
                    cur = parent;
                }
            }
        };
        if home {
            let Some((inode, _)) = self.load(&keys::home_key(ino))? else {
                return Ok(None);
            };
            if inode.nlink == 0 {
                // Unlinked, and the kernel no longer holds it (the table would): its last FORGET
                // is deleting it (`orphans.rs`), or a crash left it for the next mount.
                return Ok(None);
            }
            return Ok(Some(self.remember_found(0, b"", inode, count)));
        }
        // Come back down, entering each level into the table.
        let mut found = None;
        while let Some((child, parent, name)) = chain.pop() {
            let dir_key = self.table.lock().file_key(parent).ok_or(Errno::ESTALE)?;
            let Some((inode, _)) = self.load(&keys::child_key(&dir_key, &name))? else {
                return Ok(None);
            };
            if inode.ino != child {
                // The index and the names disagree: the handle is stale, not the file system.
                log::warn!(
                    "amaranth: inode index: {child} should be {name:?} in {parent}, which holds {}",
                    inode.ino
                );
                return Ok(None);
            }
            let last = chain.is_empty();
            found = Some(self.remember_found(parent, &name, inode, last && count));
        }
        Ok(found)
    }

    fn remember_found(&self, parent: u64, name: &[u8], inode: Inode, count: bool) -> Inode {
        let shared = self.table.lock().remember(parent, name, inode, count);
        let out = shared.lock().clone();
        out
    }

    /// The inode numbers of every home.
    pub(super) fn homes(&self) -> Result<Vec<u64>> {
        let (lo, hi) = keys::homes_range();
        let mut homes = Vec::new();
        self.engine.scan(
            std::ops::Bound::Included(&lo),
            std::ops::Bound::Excluded(&hi),
            |k, _| {
                if let Some(ino) = keys::home_ino(&k[1..]) {
                    homes.push(ino);
                }
                true
            },
        )?;
        Ok(homes)
    }

    /// Whether this image has the inode index (schema 3 and later).
    pub(super) fn has_index(&self) -> bool {
        self.schema() >= INDEX_SCHEMA
    }

    /// Builds the names index (schema 6, `links.rs`) of an image from before it and, when
    /// `inodes` (schema 2), the inode index, walking the directories from the root, then records
    /// the new schema. Idempotent: a crash in the middle leaves the old schema, and the next mount
    /// starts again.
    pub(super) fn build_index(&self, inodes: bool) -> Result<u64> {
        let mut b = Batch::new();
        let mut entries = 0u64;
        let mut dirs = vec![(ROOT_INO, Vec::<u8>::new())];
        while let Some((dir_ino, dir_key)) = dirs.pop() {
            let prefix = keys::meta_key(&keys::children_prefix(&dir_key));
            let end = amaranth_engine::prefix_end(&prefix, self.max_key());
            let mut children = Vec::new();
            self.engine.scan(
                std::ops::Bound::Included(&prefix),
                std::ops::Bound::Excluded(&end),
                |k, v| {
                    children.push((k.to_vec(), v.to_vec()));
                    true
                },
            )?;
            for (k, v) in children {
                let Some(name) = keys::name_of_child(&k, prefix.len()) else {
                    continue;
                };
                match Meta::decode(&v)? {
                    Meta::Inode(i) => {
                        if inodes {
                            index_at(&mut b, i.ino, dir_ino, &name);
                        }
                        if i.kind == Kind::Dir {
                            dirs.push((i.ino, keys::child_key(&dir_key, &name)));
                        }
                    }
                    Meta::Redirect(ino) => {
                        if inodes {
                            index_home(&mut b, ino);
                        }
                        super::links::name_put(&mut b, ino, dir_ino, &name);
                    }
                }
                entries += 1;
                if b.len() >= UPGRADE_BATCH {
                    self.engine.write(&b)?;
                    b = Batch::new();
                }
            }
        }
        // Homes without names: files unlinked while open.
        if inodes {
            for ino in self.homes()? {
                index_home(&mut b, ino);
            }
        }
        b.put(
            keys::system_key("format"),
            SCHEMA_VERSION.to_le_bytes().to_vec(),
        );
        self.engine.write(&b)?;
        self.engine.sync()?;
        Ok(entries)
    }
}

/// The schema of an image, if it is one this build reads.
pub(super) fn schema_of(v: Option<Vec<u8>>) -> Option<u32> {
    let v = u64_value(v.map(|mut b| {
        b.resize(8, 0);
        b
    }))? as u32;
    (2..=SCHEMA_VERSION).contains(&v).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_round_trip() {
        for p in [
            Place::Home,
            Place::At {
                parent: 7,
                name: b"a name".to_vec(),
            },
        ] {
            assert_eq!(Place::decode(&p.encode()).unwrap(), p);
        }
        assert!(Place::decode(b"").is_err());
        assert!(Place::decode(&[1, b'P', 1, 2]).is_err());
    }
}
