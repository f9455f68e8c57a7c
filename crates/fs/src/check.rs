//! The offline checker behind `amaranth fsck`: engine invariants and checksums, then the schema:
//! every name's parent is a directory, every redirect has a home, link counts, every data block and
//! extended attribute has its file, sizes cover the data, the inode counters, and the inode index
//! agrees with the names (schema 3, see `check_index.rs`), as does the names index (schema 6).
//!
//! Every problem has a named class and a severity: *benign* problems are leaks or counters that
//! lose no data, *corruption* means data or structure is damaged. With `repair`, every class is
//! fixed (e2fsck's way): names whose directory is gone move to `/lost+found` (named `#inode`), an
//! inode whose names are all gone gets one there, undecodable records go, counts and sizes are made
//! to agree with what is there. Structural repairs come first; counts are then fixed by the next
//! round ([`repair`] runs rounds until one finds nothing).
//!
//! This file holds the problem classes, the report, the checker's state and the order of its passes;
//! the passes are in `check_scan.rs` (the scans), `check_fix.rs` (structural repairs),
//! `check_counts.rs` (counts, sizes, counters) and `check_index.rs` (the inode index).

use std::collections::HashMap;
use std::ops::Bound;
use std::sync::Arc;

use amaranth_device::BlockDevice;
use amaranth_engine::{Batch, Engine, Op, Options};

use crate::check_fix::{Fixer, Found};
use crate::inode::{Inode, Kind, Reserved, Time};
use crate::keys;

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
    /// Out-of-line data blocks the engine's data table counts but no key references (space
    /// leak; docs/WRITEONCE.md).
    LeakedData,
    /// Out-of-line data blocks referenced more often than the data table counts, referenced but
    /// free, or inside node images: a write could overwrite data a file still names.
    DataReferences,
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
            | Class::LeakedData
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

pub(crate) fn valid_path_key(path: &[u8]) -> bool {
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
    c.names();
    if repair {
        progress("writing repairs");
        c.write();
    }
    c.r
}

/// Closes `fs` (its last owner) and its engine, opens the image on `dev` read-only with `options`
/// otherwise, and checks it: what tests run after a workload. Panics if `fs` or its engine has
/// another owner, or if closing or opening fails.
pub fn close_and_check(
    fs: Arc<crate::Fs>,
    dev: Arc<dyn BlockDevice>,
    options: Options,
) -> CheckReport {
    let engine = Arc::try_unwrap(fs)
        .ok()
        .expect("the file system has another owner")
        .engine()
        .clone();
    Arc::try_unwrap(engine)
        .ok()
        .expect("the engine has another owner")
        .close()
        .expect("closing the engine");
    let ro = Options {
        read_only: true,
        ..options
    };
    let engine = Engine::open(dev, ro).expect("opening the image read-only");
    check(&engine, false, |_| {})
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
