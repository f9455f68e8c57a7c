//! The checker's scans: the engine's own check, the schema record, every metadata record (names,
//! homes, redirects, inode numbers claimed twice), parked names, data blocks and extended
//! attributes, each noted against the file it belongs to (see `check.rs`).

use std::ops::Bound;

use amaranth_engine::{Op, StoredValue};

use crate::check::{scan_tag, split_file_key, valid_path_key, Checker, Class, Info};
use crate::check_fix::Found;
use crate::inode::{Kind, Meta};
use crate::keys::{self, BLOCK};

impl Checker<'_> {
    pub(crate) fn engine_pass(&mut self) -> bool {
        if !self.references() {
            return false;
        }
        match self.engine.verify() {
            Ok(rep) => {
                if !rep.leaked_nodes.is_empty() {
                    let n = rep.leaked_nodes.len();
                    self.problem(Class::LeakedNodes, format!("{n} unreferenced nodes"));
                }
                self.r.tree = Some(rep);
                true
            }
            Err(e) => {
                self.problem(Class::EngineCorruption, e.to_string());
                false
            }
        }
    }

    /// The engine's data table against the references its tree holds (repaired in place when
    /// repairing: counts lowered or raised, referenced free blocks claimed). Returns false when a
    /// reference may lose its block and nothing repaired it: the check stops there.
    fn references(&mut self) -> bool {
        let found = if self.repair {
            self.engine.repair_references()
        } else {
            self.engine.check_references()
        };
        let r = match found {
            Ok(r) => r,
            Err(e) => {
                self.problem(Class::EngineCorruption, e.to_string());
                return false;
            }
        };
        if r.leaked > 0 {
            let i = self.problem(
                Class::LeakedData,
                format!(
                    "{} out-of-line data blocks counted but not referenced",
                    r.leaked
                ),
            );
            self.r.problems[i].repaired = self.repair;
        }
        if r.is_dangerous() {
            let i = self.problem(Class::DataReferences, r.describe());
            self.r.problems[i].repaired = self.repair && r.overlapping == 0;
            return self.r.problems[i].repaired;
        }
        true
    }

    pub(crate) fn schema(&mut self) {
        let want = crate::fs::SCHEMA_VERSION.to_le_bytes();
        match self.engine.get(&keys::system_key("format")) {
            Ok(Some(v)) if v == want => self.schema = Some(crate::fs::SCHEMA_VERSION),
            // Schema 2 (before the inode index): a writable mount builds the index. Schemas 2
            // and 3 have no block counts (a writable mount upgrades them).
            Ok(Some(v)) if v == 2u32.to_le_bytes() => self.schema = Some(2),
            Ok(Some(v)) if v == 3u32.to_le_bytes() => self.schema = Some(3),
            // Schema 4 has no parked files (a writable mount records 5).
            Ok(Some(v)) if v == 4u32.to_le_bytes() => self.schema = Some(4),
            // Schema 5 has no names index (a writable mount builds it).
            Ok(Some(v)) if v == 5u32.to_le_bytes() => self.schema = Some(5),
            Ok(other) => {
                let missing = other.is_none();
                let i = self.problem(Class::BadSchema, format!("schema record is {other:?}"));
                if missing {
                    let ops = vec![Op::Put {
                        key: keys::system_key("format"),
                        value: want.to_vec(),
                    }];
                    self.fix(i, ops);
                }
            }
            Err(e) => {
                self.problem(Class::EngineCorruption, e.to_string());
            }
        }
    }

    /// Records that inode `ino` lives at meta key `key`. A second place for one number is a
    /// duplicate: if one of the two is the inode's home, the name is a stale copy of the inode
    /// (a hard link whose redirect was lost) and becomes a redirect; otherwise the path whose
    /// inode changed last keeps the number and the other gets a new one. Two paths with one number
    /// come from a lost delete (a rename or unlink whose delete of the old name sat in a damaged
    /// node): the old name is the stale copy, and its status changed before the rename or unlink
    /// wrote the live one, so the live file, whose records may all be intact, keeps its number.
    pub(crate) fn note_ino(&mut self, ino: u64, key: &[u8], meta: &Meta) {
        let Some(prev) = self.seen_inos.insert(ino, key.to_vec()) else {
            return;
        };
        let detail = format!(
            "inode {ino} at {} and {}",
            crate::describe::describe_key(&prev),
            crate::describe::describe_key(key)
        );
        let is_home = |k: &[u8]| keys::home_ino(&k[1..]).is_some();
        let stale_path = if is_home(key) {
            Some(prev.clone())
        } else if is_home(&prev) {
            self.seen_inos.insert(ino, prev.clone());
            Some(key.to_vec())
        } else {
            None
        };
        let found = match stale_path {
            Some(path_key) => {
                let fk = path_key[1..].to_vec();
                self.paths.remove(&fk);
                self.redirects.entry(ino).or_default().push(fk);
                Found {
                    key: path_key,
                    meta: Some(Meta::Redirect(ino)),
                }
            }
            None => self.stale_of_two_paths(ino, prev, key, meta),
        };
        self.bad_meta.push((Class::DuplicateInode, detail, found));
    }

    /// Of two path names claiming inode `ino`, the one that gets a new number: `key` (seen
    /// second, holding `meta`) unless its inode changed after the one at `prev` (then `prev`, and
    /// `key` keeps the number). On a tie, or when `prev` cannot be read again, `key`.
    pub(crate) fn stale_of_two_paths(
        &mut self,
        ino: u64,
        prev: Vec<u8>,
        key: &[u8],
        meta: &Meta,
    ) -> Found {
        let second = Found {
            key: key.to_vec(),
            meta: Some(meta.clone()),
        };
        let Meta::Inode(new) = meta else {
            return second;
        };
        let prev_ctime = self.paths.get(&prev[1..]).map(|i| i.ctime);
        if prev_ctime.is_none_or(|t| t >= new.ctime) {
            self.seen_inos.insert(ino, prev);
            return second;
        }
        let old = self.engine.get(&prev).ok().flatten();
        match old.map(|v| Meta::decode(&v)) {
            Some(Ok(old @ Meta::Inode(_))) => Found {
                key: prev,
                meta: Some(old),
            },
            _ => {
                self.seen_inos.insert(ino, prev);
                second
            }
        }
    }

    pub(crate) fn meta_entry(&mut self, k: &[u8], v: &[u8]) {
        let fk = &k[1..];
        let found = |m: Option<Meta>| Found {
            key: k.to_vec(),
            meta: m,
        };
        let what = crate::describe::describe_key(k);
        let meta = match Meta::decode(v) {
            Ok(m) => m,
            Err(_) => {
                let d = format!("undecodable value: {what}");
                self.bad_meta.push((Class::BadMetadata, d, found(None)));
                return;
            }
        };
        if let Some(ino) = keys::home_ino(fk) {
            match &meta {
                Meta::Inode(i) if i.ino == ino && i.homed => {
                    if let Some(p) = crate::fs::parked_path(i) {
                        self.parked_at.insert(p.to_vec(), ino);
                    }
                    let info = Info::new(i);
                    self.homes.insert(ino, info);
                    self.note_ino(ino, k, &meta);
                }
                _ => {
                    let d = format!("home of inode {ino} holds something else");
                    self.bad_meta.push((Class::BadMetadata, d, found(None)));
                }
            }
            return;
        }
        if !valid_path_key(fk) {
            let d = format!("malformed key {fk:02x?}");
            self.bad_meta.push((Class::BadKey, d, found(None)));
            return;
        }
        match meta {
            Meta::Redirect(ino) => self.redirects.entry(ino).or_default().push(fk.to_vec()),
            Meta::Inode(ref i) => {
                if i.homed {
                    let d = format!("inode {} marked homed at a path ({what})", i.ino);
                    self.bad_meta
                        .push((Class::BadMetadata, d, found(Some(meta.clone()))));
                }
                if i.kind == Kind::Symlink && i.size != i.target.len() as u64 {
                    let d = format!("symlink {} size differs from its target ({what})", i.ino);
                    self.bad_meta
                        .push((Class::BadMetadata, d, found(Some(meta.clone()))));
                }
                let info = Info::new(i);
                self.paths.insert(fk.to_vec(), info);
                self.note_ino(i.ino, k, &meta);
            }
        }
    }

    pub(crate) fn meta_pass(&mut self) -> bool {
        let mut entries: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let engine = self.engine;
        let scan = scan_tag(engine, keys::META, |k, v| {
            entries.push((k.to_vec(), v.to_vec()))
        });
        if let Err(e) = scan {
            self.problem(Class::EngineCorruption, e.to_string());
            return false;
        }
        for (k, v) in entries {
            self.meta_entry(&k, &v);
        }
        self.r.inodes = (self.paths.len() + self.homes.len()) as u64;
        self.r.directories = self.paths.values().filter(|i| i.kind == Kind::Dir).count() as u64;
        self.parked_names();
        true
    }

    /// A parked path is never a name (eviction moves the data first): if one is, the data there
    /// is the name's, and the parked file's back pointer is what is wrong.
    pub(crate) fn parked_names(&mut self) {
        let mut clash: Vec<(Vec<u8>, u64)> = self
            .parked_at
            .iter()
            .filter(|(p, _)| {
                self.paths.contains_key(*p) || self.redirects.values().flatten().any(|k| k == *p)
            })
            .map(|(p, ino)| (p.clone(), *ino))
            .collect();
        clash.sort();
        for (p, ino) in clash {
            self.parked_at.remove(&p);
            let d = format!(
                "inode {ino} is parked at {}, which is a name",
                crate::describe::describe_key(&keys::meta_key(&p))
            );
            let i = self.problem(Class::BadMetadata, d);
            let ops = self.rewrite_inode(&keys::home_key(ino), |inode| inode.target.clear());
            self.fix(i, ops);
        }
    }

    pub(crate) fn owner(&mut self, fk: &[u8]) -> Option<&mut Info> {
        match keys::home_ino(fk) {
            Some(ino) => self.homes.get_mut(&ino),
            None => match self.parked_at.get(fk) {
                Some(ino) => self.homes.get_mut(ino),
                None => self.paths.get_mut(fk),
            },
        }
    }

    pub(crate) fn data_pass(&mut self) {
        let mut entries: Vec<(Vec<u8>, usize)> = Vec::new();
        // Values as stored: an out-of-line block's length without reading it.
        let scan = self.engine.scan_stored(
            Bound::Included(&[keys::DATA][..]),
            Bound::Excluded(&[keys::DATA + 1][..]),
            |k, v| {
                let len = match v {
                    StoredValue::Bytes(b) => b.len(),
                    StoredValue::Block(r) => r.len(),
                };
                entries.push((k.to_vec(), len));
                true
            },
        );
        if let Err(e) = scan {
            self.problem(Class::EngineCorruption, e.to_string());
        }
        for (k, len) in entries {
            let parsed = split_file_key(&k[1..]).and_then(|(fk, tail)| {
                Some((fk.to_vec(), u64::from_be_bytes(tail.try_into().ok()?)))
            });
            let Some((fk, blk)) = parsed.filter(|_| len as u64 <= BLOCK) else {
                self.bad_data.push(k);
                continue;
            };
            self.r.data_blocks += 1;
            self.r.data_bytes += len as u64;
            match self.owner(&fk) {
                Some(i) if i.kind == Kind::File => {
                    i.data_end = i.data_end.max(blk * BLOCK + len as u64);
                    i.found_blocks += 1;
                    if let Some(r) = i.reserved.iter().position(|r| r.covers(blk, blk + 1)) {
                        i.found_in_reserved[r] += 1;
                    }
                }
                _ => self.orphan_data.push(k),
            }
        }
    }

    pub(crate) fn xattr_pass(&mut self) {
        let mut ks: Vec<Vec<u8>> = Vec::new();
        let scan = scan_tag(self.engine, keys::XATTR, |k, _| ks.push(k.to_vec()));
        if let Err(e) = scan {
            self.problem(Class::EngineCorruption, e.to_string());
        }
        for k in ks {
            self.r.xattrs += 1;
            let ok = match split_file_key(&k[1..]) {
                Some((fk, name)) if !name.is_empty() => self.owner(fk).is_some(),
                _ => false,
            };
            if !ok {
                self.orphan_xattrs.push(k);
            }
        }
    }
}
