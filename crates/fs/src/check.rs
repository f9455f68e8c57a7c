//! The offline checker behind `amaranth fsck`: engine invariants and checksums, then the schema:
//! every name's parent is a directory, every redirect has a home, link counts, every data block and
//! extended attribute has its file, sizes cover the data, the inode counters, and the inode index
//! agrees with the names (schema 3, see `check_index.rs`).
//!
//! Every problem has a named class and a severity: *benign* problems are leaks or counters that
//! lose no data, *corruption* means data or structure is damaged. With `repair`, every class is
//! fixed (e2fsck's way): names whose directory is gone move to `/lost+found` (named `#inode`), an
//! inode whose names are all gone gets one there, undecodable records go, counts and sizes are made
//! to agree with what is there. Structural repairs come first; counts are then fixed by the next
//! round ([`repair`] runs rounds until one finds nothing).

use std::collections::HashMap;
use std::ops::Bound;

use amaranth_engine::{Batch, Engine, Op};

use crate::check_fix::{Fixer, Found};
use crate::inode::{Inode, Kind, Meta, Reserved, Time};
use crate::keys::{self, BLOCK};
use crate::table::ROOT_INO;

/// How bad a problem is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// Nothing is lost (a leak, a counter off); repairable.
    Benign,
    /// Structure or data is damaged.
    Corruption,
}

/// The kinds of problems the checker finds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Class {
    /// The engine's own check failed (checksums, node structure).
    EngineCorruption,
    /// Engine nodes no tree references (space leak).
    LeakedNodes,
    /// A file-system record (`s/format`, `s/next_ino`) is missing or wrong.
    BadSchema,
    /// The root directory is missing or not a directory.
    RootMissing,
    /// A metadata value does not decode, or contradicts its key.
    BadMetadata,
    /// A metadata key is not a valid path or home key.
    BadKey,
    /// A name whose parent does not exist or is not a directory.
    MissingParent,
    /// A name redirects to a home that does not exist.
    DanglingRedirect,
    /// Two inodes with one number.
    DuplicateInode,
    /// A hard-linked inode whose every name is gone.
    NamesLost,
    /// A file unlinked while open, left by a crash (removed at the next mount).
    OrphanInode,
    /// A link count that differs from the names (or subdirectories) found.
    LinkCount,
    /// Data blocks of no file.
    DataWithoutInode,
    /// Data blocks past the end of their file.
    DataBeyondEof,
    /// A data block longer than a block, or a malformed data key.
    BadDataBlock,
    /// Extended attributes of no file.
    XattrWithoutInode,
    /// The used-inode counter differs from the inodes found.
    InodeCount,
    /// The inode-number counter is not above every inode number in use.
    InodeNumberCounter,
    /// The inode index (schema 3) misses an inode, says the wrong place, or names no inode.
    InodeIndex,
    /// A file's count of data blocks or of reserved holes differs from its data blocks.
    BlockCount,
    /// The counter of reserved holes differs from the files' reservations.
    ReservedCount,
}

impl Class {
    /// The severity of this class.
    pub fn severity(self) -> Severity {
        match self {
            Class::LeakedNodes
            | Class::OrphanInode
            | Class::LinkCount
            | Class::DataWithoutInode
            | Class::DataBeyondEof
            | Class::XattrWithoutInode
            | Class::InodeCount
            | Class::InodeIndex
            | Class::BlockCount
            | Class::ReservedCount => Severity::Benign,
            _ => Severity::Corruption,
        }
    }

    /// Whether the repair of this class changes the tree's structure (names, inodes): counts are
    /// fixed only in a round without such repairs, once the structure holds still.
    fn structural(self) -> bool {
        matches!(
            self,
            Class::BadSchema
                | Class::RootMissing
                | Class::BadMetadata
                | Class::BadKey
                | Class::MissingParent
                | Class::DanglingRedirect
                | Class::DuplicateInode
                | Class::NamesLost
                | Class::BadDataBlock
        )
    }
}

/// One problem found.
#[derive(Clone, Debug)]
pub struct Problem {
    /// Its class.
    pub class: Class,
    /// What exactly.
    pub detail: String,
    /// Whether `--repair` fixed it.
    pub repaired: bool,
}

/// What a check found.
#[derive(Clone, Debug, Default)]
pub struct CheckReport {
    /// Problems.
    pub problems: Vec<Problem>,
    /// Inodes found.
    pub inodes: u64,
    /// Directories found.
    pub directories: u64,
    /// Data blocks found.
    pub data_blocks: u64,
    /// Bytes of data found.
    pub data_bytes: u64,
    /// Extended attributes found.
    pub xattrs: u64,
    /// Engine tree height and nodes.
    pub tree: Option<amaranth_engine::Report>,
}

impl CheckReport {
    /// Problems still present of at least this severity.
    pub fn unrepaired(&self, at_least: Severity) -> usize {
        self.problems
            .iter()
            .filter(|p| !p.repaired && p.class.severity() >= at_least)
            .count()
    }

    /// An `e2fsck`-style exit code: 0 clean, 1 errors corrected, 4 errors left.
    pub fn exit_code(&self) -> i32 {
        if self.unrepaired(Severity::Benign) > 0 {
            4
        } else if self.problems.is_empty() {
            0
        } else {
            1
        }
    }
}

/// What the checker knows about one inode.
#[derive(Clone, Debug)]
pub(crate) struct Info {
    pub ino: u64,
    pub kind: Kind,
    pub nlink: u32,
    pub size: u64,
    /// End of the last data block (bytes), 0 without data.
    pub data_end: u64,
    /// Data blocks the inode counts, and its reserved ranges.
    pub blocks: u64,
    pub reserved: Vec<Reserved>,
    /// Data blocks found, and those inside each reserved range.
    pub found_blocks: u64,
    pub found_in_reserved: Vec<u64>,
    /// Last status change: of two names claiming one number, the older is the stale one.
    pub ctime: Time,
}

impl Info {
    /// What the checker starts with for inode `i`.
    pub(crate) fn new(i: &Inode) -> Info {
        Info {
            ino: i.ino,
            kind: i.kind,
            nlink: i.nlink,
            size: i.size,
            data_end: 0,
            blocks: i.blocks,
            reserved: i.reserved.clone(),
            found_blocks: 0,
            found_in_reserved: vec![0; i.reserved.len()],
            ctime: i.ctime,
        }
    }
}

/// The checker's state: what the scans found, the problems, and the repairs queued.
pub(crate) struct Checker<'e> {
    pub engine: &'e Engine,
    pub repair: bool,
    pub r: CheckReport,
    /// Path-keyed inodes by file key.
    pub paths: HashMap<Vec<u8>, Info>,
    /// Homed inodes by number.
    pub homes: HashMap<u64, Info>,
    /// Names (path keys) redirecting to each home.
    pub redirects: HashMap<u64, Vec<Vec<u8>>>,
    /// Meta key of every inode number seen.
    pub seen_inos: HashMap<u64, Vec<u8>>,
    /// Meta keys to delete (undecodable or malformed) and fixes of values, found by the scan.
    pub bad_meta: Vec<(Class, String, Found)>,
    /// Data keys that are malformed or oversized.
    pub bad_data: Vec<Vec<u8>>,
    /// Data and xattr keys with no file.
    pub orphan_data: Vec<Vec<u8>>,
    pub orphan_xattrs: Vec<Vec<u8>>,
    /// Repairs queued, structural first.
    pub ops: Vec<Op>,
    /// Whether a structural repair is queued this round.
    pub structural: bool,
    /// The file-system schema found (`None`: missing or unknown).
    pub schema: Option<u32>,
    /// Path keys where files unlinked while in use keep their data, by inode (`fs/orphans.rs`).
    pub parked_at: HashMap<Vec<u8>, u64>,
}

/// Calls `f` for every entry with the given key tag, in order.
pub(crate) fn scan_tag(
    engine: &Engine,
    tag: u8,
    mut f: impl FnMut(&[u8], &[u8]),
) -> amaranth_engine::Result<()> {
    engine.scan(
        Bound::Included(&[tag][..]),
        Bound::Excluded(&[tag + 1][..]),
        |k, v| {
            f(k, v);
            true
        },
    )
}

/// Splits the part after the tag of a data or xattr key into (file key, rest after the terminator).
pub(crate) fn split_file_key(rest: &[u8]) -> Option<(&[u8], &[u8])> {
    let end = if rest.first() == Some(&keys::HOME) {
        // A home key has a fixed length; its inode number may hold zero bytes.
        9
    } else {
        rest.iter().position(|&b| b == keys::END)?
    };
    if rest.get(end) != Some(&keys::END) {
        return None;
    }
    Some((&rest[..end], &rest[end + 1..]))
}

/// The parent path key of a non-root path key, if well formed.
pub(crate) fn parent_of(path: &[u8]) -> Option<Vec<u8>> {
    // path = P SEP SEP esc(last) where P = (SEP esc(c))*; the parent's key is the last component of
    // P re-marked as the final one.
    let last = path.iter().rposition(|&b| b == keys::SEP)?;
    if last == 0 || path[last - 1] != keys::SEP {
        return None;
    }
    let prefix = &path[..last - 1];
    if prefix.is_empty() {
        return Some(Vec::new());
    }
    let sep = prefix.iter().rposition(|&b| b == keys::SEP)?;
    let mut p = prefix[..sep].to_vec();
    p.push(keys::SEP);
    p.extend_from_slice(&prefix[sep..]);
    Some(p)
}

fn valid_path_key(path: &[u8]) -> bool {
    if path.is_empty() {
        return true;
    }
    if path[0] != keys::SEP || path.len() < 3 {
        return false;
    }
    // Components between separators must decode (hash matching the name); exactly one doubled
    // separator, before the last.
    let Some(last) = path.iter().rposition(|&b| b == keys::SEP) else {
        return false;
    };
    if last == 0 || path[last - 1] != keys::SEP {
        return false;
    }
    let head = &path[..last - 1];
    let comps_ok = head
        .split(|&b| b == keys::SEP)
        .skip(1)
        .all(|c| keys::decode_component(c).is_some());
    comps_ok && keys::decode_component(&path[last + 1..]).is_some()
}

impl<'e> Checker<'e> {
    fn new(engine: &'e Engine, repair: bool) -> Checker<'e> {
        Checker {
            engine,
            repair,
            r: CheckReport::default(),
            paths: HashMap::new(),
            homes: HashMap::new(),
            redirects: HashMap::new(),
            seen_inos: HashMap::new(),
            bad_meta: Vec::new(),
            bad_data: Vec::new(),
            orphan_data: Vec::new(),
            orphan_xattrs: Vec::new(),
            ops: Vec::new(),
            structural: false,
            schema: None,
            parked_at: HashMap::new(),
        }
    }

    /// Records a problem; returns its index.
    pub fn problem(&mut self, class: Class, detail: String) -> usize {
        self.r.problems.push(Problem {
            class,
            detail,
            repaired: false,
        });
        self.r.problems.len() - 1
    }

    /// Queues the repair `ops` of problem `i` (when repairing, and, for counts, only in a round
    /// without structural repairs).
    pub fn fix(&mut self, i: usize, ops: Vec<Op>) {
        let class = self.r.problems[i].class;
        if !self.repair || (!class.structural() && self.structural) {
            return;
        }
        self.structural |= class.structural();
        self.ops.extend(ops);
        self.r.problems[i].repaired = true;
    }

    pub fn get_u64(&self, k: &str) -> Option<u64> {
        self.engine
            .get(&keys::system_key(k))
            .ok()
            .flatten()
            .and_then(|v| v.try_into().ok())
            .map(u64::from_le_bytes)
    }

    fn engine_pass(&mut self) -> bool {
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

    fn schema(&mut self) {
        let want = crate::fs::SCHEMA_VERSION.to_le_bytes();
        match self.engine.get(&keys::system_key("format")) {
            Ok(Some(v)) if v == want => self.schema = Some(crate::fs::SCHEMA_VERSION),
            // Schema 2 (before the inode index): a writable mount builds the index. Schemas 2
            // and 3 have no block counts (a writable mount upgrades them).
            Ok(Some(v)) if v == 2u32.to_le_bytes() => self.schema = Some(2),
            Ok(Some(v)) if v == 3u32.to_le_bytes() => self.schema = Some(3),
            // Schema 4 has no parked files (a writable mount records 5).
            Ok(Some(v)) if v == 4u32.to_le_bytes() => self.schema = Some(4),
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
    fn note_ino(&mut self, ino: u64, key: &[u8], meta: &Meta) {
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
    fn stale_of_two_paths(&mut self, ino: u64, prev: Vec<u8>, key: &[u8], meta: &Meta) -> Found {
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

    fn meta_entry(&mut self, k: &[u8], v: &[u8]) {
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

    fn meta_pass(&mut self) -> bool {
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
    fn parked_names(&mut self) {
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

    fn owner(&mut self, fk: &[u8]) -> Option<&mut Info> {
        match keys::home_ino(fk) {
            Some(ino) => self.homes.get_mut(&ino),
            None => match self.parked_at.get(fk) {
                Some(ino) => self.homes.get_mut(ino),
                None => self.paths.get_mut(fk),
            },
        }
    }

    fn data_pass(&mut self) {
        let mut entries: Vec<(Vec<u8>, usize)> = Vec::new();
        let scan = scan_tag(self.engine, keys::DATA, |k, v| {
            entries.push((k.to_vec(), v.len()))
        });
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

    fn xattr_pass(&mut self) {
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

    /// Link counts, sizes, data and xattrs without a file, counters.
    fn counts(&mut self) {
        let mut subdirs: HashMap<Vec<u8>, u32> = HashMap::new();
        let names: Vec<(Vec<u8>, bool)> = self
            .paths
            .iter()
            .filter(|(k, _)| !k.is_empty())
            .map(|(k, i)| (k.clone(), i.kind == Kind::Dir))
            .chain(self.redirects.iter().flat_map(|(ino, ks)| {
                let dir = self.homes.get(ino).is_some_and(|h| h.kind == Kind::Dir);
                ks.iter().map(move |k| (k.clone(), dir))
            }))
            .collect();
        for (k, is_dir) in names {
            if let Some(p) = parent_of(&k).filter(|p| self.paths.contains_key(p)) {
                if is_dir {
                    *subdirs.entry(p).or_default() += 1;
                }
            }
        }
        let mut wrong: Vec<(Vec<u8>, u32, u32, u64)> = Vec::new();
        for (k, info) in &self.paths {
            let expect = if info.kind == Kind::Dir {
                2 + subdirs.get(k).copied().unwrap_or(0)
            } else {
                1
            };
            if info.nlink != expect {
                wrong.push((k.clone(), info.nlink, expect, info.ino));
            }
        }
        for (ino, info) in &self.homes {
            let names = self.redirects.get(ino).map_or(0, |v| v.len()) as u32;
            if names > 0 && info.nlink != names {
                wrong.push((keys::home_key(*ino), info.nlink, names, *ino));
            }
        }
        wrong.sort();
        for (fk, has, want, ino) in wrong {
            let i = self.problem(
                Class::LinkCount,
                format!("inode {ino} has link count {has} but {want} links"),
            );
            let ops = self.rewrite_inode(&fk, |inode| inode.nlink = want);
            self.fix(i, ops);
        }
        self.sizes();
        self.block_counts();
        self.orphans();
        self.counters();
    }

    /// Each file's counts of blocks and reserved holes against its data blocks, and the counter
    /// of reserved holes against their sum.
    fn block_counts(&mut self) {
        let mut wrong: Vec<(Vec<u8>, u64, u64, Vec<u64>)> = Vec::new();
        let mut reserved_sum = 0u64;
        let files = self
            .paths
            .iter()
            .map(|(k, i)| (k.clone(), i))
            .chain(self.homes.iter().map(|(ino, i)| (keys::home_key(*ino), i)))
            .filter(|(_, i)| i.kind == Kind::File);
        for (fk, i) in files {
            let holes: Vec<u64> = i
                .reserved
                .iter()
                .zip(&i.found_in_reserved)
                .map(|(r, n)| (r.hi - r.lo).saturating_sub(*n))
                .collect();
            reserved_sum += holes.iter().sum::<u64>();
            let counted: Vec<u64> = i.reserved.iter().map(|r| r.holes).collect();
            if i.found_blocks != i.blocks || holes != counted {
                wrong.push((fk, i.ino, i.found_blocks, holes));
            }
        }
        wrong.sort();
        for (fk, ino, blocks, holes) in wrong {
            let i = self.problem(
                Class::BlockCount,
                format!("inode {ino}: counts differ from its {blocks} blocks and {holes:?} holes"),
            );
            let set = |inode: &mut crate::inode::Inode| {
                inode.blocks = blocks;
                for (r, h) in inode.reserved.iter_mut().zip(&holes) {
                    r.holes = *h;
                }
            };
            // Another repair of this round may rewrite the inode already: change that value.
            let key = keys::meta_key(&fk);
            let queued = self.ops.iter_mut().rev().find_map(|o| match o {
                Op::Put { key: k, value } if *k == key => Some(value),
                _ => None,
            });
            if let Some(value) = queued.filter(|_| self.repair) {
                if let Ok(Meta::Inode(mut inode)) = Meta::decode(value) {
                    set(&mut inode);
                    *value = inode.encode();
                    self.r.problems[i].repaired = true;
                }
                continue;
            }
            let ops = self.rewrite_inode(&fk, set);
            self.fix(i, ops);
        }
        let counted = self.get_u64("reserved").unwrap_or(0);
        if counted != reserved_sum {
            let i = self.problem(
                Class::ReservedCount,
                format!("reserved-hole counter {counted}, {reserved_sum} reserved holes found"),
            );
            let ops = vec![Op::Put {
                key: keys::system_key("reserved"),
                value: reserved_sum.to_le_bytes().to_vec(),
            }];
            self.fix(i, ops);
        }
    }

    /// Puts the inode at file key `fk` changed by `f` (no ops if it cannot be read).
    pub fn rewrite_inode(&self, fk: &[u8], f: impl FnOnce(&mut crate::inode::Inode)) -> Vec<Op> {
        let key = keys::meta_key(fk);
        match self
            .engine
            .get(&key)
            .ok()
            .flatten()
            .map(|v| Meta::decode(&v))
        {
            Some(Ok(Meta::Inode(mut i))) => {
                f(&mut i);
                vec![Op::Put {
                    key,
                    value: i.encode(),
                }]
            }
            _ => Vec::new(),
        }
    }

    /// Files with data past their size get the size that covers it (as e2fsck does).
    fn sizes(&mut self) {
        let mut short: Vec<(Vec<u8>, u64, u64, u64)> = self
            .paths
            .iter()
            .map(|(k, i)| (k.clone(), i))
            .chain(self.homes.iter().map(|(ino, i)| (keys::home_key(*ino), i)))
            .filter(|(_, i)| i.kind == Kind::File && i.data_end > i.size.max(1))
            .map(|(k, i)| (k, i.ino, i.size, i.data_end))
            .filter(|(_, _, size, end)| (end - 1) / BLOCK * BLOCK >= *size)
            .collect();
        short.sort();
        for (fk, ino, size, end) in short {
            let i = self.problem(
                Class::DataBeyondEof,
                format!("inode {ino} has size {size} but data up to byte {end}"),
            );
            let ops = self.rewrite_inode(&fk, |inode| inode.size = end);
            self.fix(i, ops);
        }
    }

    fn orphans(&mut self) {
        let max_key = self.engine.format().max_key_len;
        let mut unlinked: Vec<u64> = self
            .homes
            .iter()
            .filter(|(ino, h)| h.nlink == 0 && !self.redirects.contains_key(*ino))
            .map(|(ino, _)| *ino)
            .collect();
        unlinked.sort_unstable();
        for ino in unlinked {
            let i = self.problem(
                Class::OrphanInode,
                format!("inode {ino} was unlinked while in use"),
            );
            let hk = keys::home_key(ino);
            let mut ops = vec![
                Op::Delete {
                    key: keys::meta_key(&hk),
                },
                Op::Delete {
                    key: keys::ino_key(ino),
                },
            ];
            let parked = self
                .parked_at
                .iter()
                .filter(|(_, i)| **i == ino)
                .map(|(p, _)| p.clone());
            for fk in std::iter::once(hk.clone()).chain(parked) {
                for p in [keys::data_prefix(&fk), keys::xattr_prefix(&fk)] {
                    let hi = amaranth_engine::prefix_end(&p, max_key);
                    ops.push(Op::RangeDelete { lo: p, hi });
                }
            }
            self.fix(i, ops);
        }
        for (list, class) in [
            (
                std::mem::take(&mut self.orphan_data),
                Class::DataWithoutInode,
            ),
            (
                std::mem::take(&mut self.orphan_xattrs),
                Class::XattrWithoutInode,
            ),
        ] {
            if list.is_empty() {
                continue;
            }
            let what = if class == Class::DataWithoutInode {
                "data blocks"
            } else {
                "extended attributes"
            };
            let i = self.problem(
                class,
                format!(
                    "{} {what}, first {}",
                    list.len(),
                    crate::describe::describe_key(&list[0])
                ),
            );
            let ops = list.into_iter().map(|key| Op::Delete { key }).collect();
            self.fix(i, ops);
        }
    }

    fn counters(&mut self) {
        let max_ino = self.seen_inos.keys().copied().max().unwrap_or(ROOT_INO);
        let next = self.get_u64("next_ino");
        if next.is_none_or(|n| n <= max_ino) {
            let i = self.problem(
                Class::InodeNumberCounter,
                format!("next inode number {next:?}, highest in use {max_ino}"),
            );
            let ops = vec![Op::Put {
                key: keys::system_key("next_ino"),
                value: (max_ino + 1024).to_le_bytes().to_vec(),
            }];
            self.fix(i, ops);
        }
        // A file unlinked while in use still counts until it is deleted (its FORGET, or the next
        // mount, subtracts it); the orphans this repair deletes come off the counter with them.
        let found = self.r.inodes;
        let deleted = self
            .r
            .problems
            .iter()
            .filter(|p| p.class == Class::OrphanInode && p.repaired)
            .count() as u64;
        let after = found - deleted;
        let counter = |v: u64| Op::Put {
            key: keys::system_key("inodes"),
            value: v.to_le_bytes().to_vec(),
        };
        let counted = self.get_u64("inodes");
        if counted != Some(found) {
            let i = self.problem(
                Class::InodeCount,
                format!("inode counter {counted:?}, {found} inodes found"),
            );
            self.fix(i, vec![counter(after)]);
        } else if deleted > 0 {
            self.ops.push(counter(after));
        }
    }

    /// Writes the queued repairs in batches that fit a log record, in order.
    fn write(&mut self) {
        if self.ops.is_empty() {
            return;
        }
        let budget = (self.engine.stats().log.capacity as usize / 16).max(64 << 10);
        let mut batch = Batch::new();
        let mut bytes = 0usize;
        let mut result = Ok(());
        for op in std::mem::take(&mut self.ops) {
            let size = op.user_bytes() + 16;
            if !batch.is_empty() && bytes + size > budget {
                result = result.and_then(|_| self.engine.write(&batch).map(|_| ()));
                batch = Batch::new();
                bytes = 0;
            }
            bytes += size;
            batch.push(op);
        }
        if !batch.is_empty() {
            result = result.and_then(|_| self.engine.write(&batch).map(|_| ()));
        }
        if let Err(e) = result.and_then(|_| self.engine.sync()) {
            for p in &mut self.r.problems {
                p.repaired = false;
            }
            self.problem(
                Class::EngineCorruption,
                format!("repairs could not be written: {e}"),
            );
        }
    }
}

/// Checks the file system in `engine` (which should be opened read-only unless `repair`).
pub fn check(engine: &Engine, repair: bool, mut progress: impl FnMut(&str)) -> CheckReport {
    let mut c = Checker::new(engine, repair);
    progress("checking the engine (every node read and checksummed)");
    if !c.engine_pass() {
        return c.r;
    }
    c.schema();
    progress("checking metadata");
    if !c.meta_pass() {
        return c.r;
    }
    progress("checking data blocks");
    c.data_pass();
    progress("checking extended attributes");
    c.xattr_pass();
    progress("checking names and links");
    Fixer::new(&mut c).run();
    c.counts();
    progress("checking the inode index");
    c.index();
    if repair {
        progress("writing repairs");
        c.write();
    }
    c.r
}

/// Checks and repairs in rounds until a round finds nothing to repair (at most 4): structural
/// repairs first, then the counts that follow from them. Returns every round's report; the last
/// one is what is left.
pub fn repair(engine: &Engine, mut progress: impl FnMut(&str)) -> Vec<CheckReport> {
    let mut rounds: Vec<CheckReport> = Vec::new();
    for round in 1..=4 {
        progress(&format!("repair round {round}"));
        let r = check(engine, true, &mut progress);
        let done = !r.problems.iter().any(|p| p.repaired);
        rounds.push(r);
        if done {
            break;
        }
    }
    rounds
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_of_path_keys() {
        let a = keys::path_key(&[b"a"]);
        let ab = keys::path_key(&[b"a", b"b"]);
        let abc = keys::path_key(&[b"a", b"b", b"c"]);
        assert_eq!(parent_of(&a), Some(Vec::new()));
        assert_eq!(parent_of(&ab), Some(a.clone()));
        assert_eq!(parent_of(&abc), Some(ab.clone()));
        assert!(valid_path_key(&abc) && valid_path_key(&[]) && !valid_path_key(b"\x01x"));
        // A name without its hash (the version-1 layout) is not a valid path key.
        assert!(!valid_path_key(b"\x01\x01x"));
    }
}
