//! The offline checker behind `amaranth fsck`: engine invariants and checksums, then the schema:
//! every name's parent is a directory, every redirect has a home, link counts, every data block and
//! extended attribute has its file, the inode counters.
//!
//! Every problem has a named class and a severity: *benign* problems are leaks or counters that
//! lose no data (and `--repair` fixes them), *corruption* means data or structure is damaged.

use std::collections::HashMap;
use std::ops::Bound;

use amaranth_engine::{Batch, Engine};

use crate::inode::{Kind, Meta};
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
    /// A metadata value does not decode.
    BadMetadata,
    /// A metadata key is not a valid path or home key.
    BadKey,
    /// A name whose parent does not exist or is not a directory.
    MissingParent,
    /// A name redirects to a home that does not exist.
    DanglingRedirect,
    /// Two inodes with one number.
    DuplicateInode,
    /// A file unlinked while open, left by a crash (removed at the next mount).
    OrphanInode,
    /// A link count that differs from the names (or subdirectories) found.
    LinkCount,
    /// Data blocks of no file.
    DataWithoutInode,
    /// Data blocks past the end of their file.
    DataBeyondEof,
    /// A data block longer than a block.
    BadDataBlock,
    /// Extended attributes of no file.
    XattrWithoutInode,
    /// The used-inode counter differs from the inodes found.
    InodeCount,
    /// The inode-number counter is not above every inode number in use.
    InodeNumberCounter,
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
            | Class::InodeCount => Severity::Benign,
            _ => Severity::Corruption,
        }
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

struct Info {
    ino: u64,
    kind: Kind,
    nlink: u32,
    size: u64,
    homed: bool,
}

/// Calls `f` for every entry with the given key tag, in order.
fn scan_tag(
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
fn split_file_key(rest: &[u8]) -> Option<(&[u8], &[u8])> {
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
fn parent_of(path: &[u8]) -> Option<Vec<u8>> {
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

/// Checks the file system in `engine` (which should be opened read-only unless `repair`).
pub fn check(engine: &Engine, repair: bool, mut progress: impl FnMut(&str)) -> CheckReport {
    let mut r = CheckReport::default();
    let problem = |r: &mut CheckReport, class: Class, detail: String| {
        r.problems.push(Problem {
            class,
            detail,
            repaired: false,
        });
    };
    progress("checking the engine (every node read and checksummed)");
    match engine.verify() {
        Ok(rep) => {
            if !rep.leaked_nodes.is_empty() {
                problem(
                    &mut r,
                    Class::LeakedNodes,
                    format!("{} unreferenced nodes", rep.leaked_nodes.len()),
                );
            }
            r.tree = Some(rep);
        }
        Err(e) => {
            problem(&mut r, Class::EngineCorruption, e.to_string());
            return r;
        }
    }
    let get_u64 = |k: &str| {
        engine
            .get(&keys::system_key(k))
            .ok()
            .flatten()
            .and_then(|v| v.try_into().ok())
            .map(u64::from_le_bytes)
    };
    match engine.get(&keys::system_key("format")) {
        Ok(Some(v)) if v == crate::fs::SCHEMA_VERSION.to_le_bytes() => {}
        // Schema 2 (before the inode index) is upgraded at the next writable mount.
        Ok(Some(v)) if v == 2u32.to_le_bytes() => {}
        Ok(other) => problem(
            &mut r,
            Class::BadSchema,
            format!("schema record is {other:?}"),
        ),
        Err(e) => problem(&mut r, Class::EngineCorruption, e.to_string()),
    }
    progress("checking metadata");
    // Pass 1: every metadata key.
    let mut paths: HashMap<Vec<u8>, Info> = HashMap::new();
    let mut homes: HashMap<u64, Info> = HashMap::new();
    let mut redirects: HashMap<u64, u32> = HashMap::new();
    let mut redirect_keys: Vec<(Vec<u8>, u64)> = Vec::new();
    let mut seen_inos: HashMap<u64, Vec<u8>> = HashMap::new();
    let mut bad: Vec<(Class, String, Vec<u8>)> = Vec::new();
    let scan = scan_tag(engine, keys::META, |k, v| {
        let fk = &k[1..];
        let meta = match Meta::decode(v) {
            Ok(m) => m,
            Err(_) => {
                bad.push((
                    Class::BadMetadata,
                    format!("undecodable value at {fk:?}"),
                    k.to_vec(),
                ));
                return;
            }
        };
        if let Some(ino) = keys::home_ino(fk) {
            match meta {
                Meta::Inode(i) if i.ino == ino && i.homed => {
                    if let Some(prev) = seen_inos.insert(i.ino, k.to_vec()) {
                        bad.push((
                            Class::DuplicateInode,
                            format!("inode {} at {prev:?} and {k:?}", i.ino),
                            Vec::new(),
                        ));
                    }
                    homes.insert(
                        ino,
                        Info {
                            ino,
                            kind: i.kind,
                            nlink: i.nlink,
                            size: i.size,
                            homed: true,
                        },
                    );
                }
                _ => bad.push((
                    Class::BadMetadata,
                    format!("home of inode {ino} holds something else"),
                    k.to_vec(),
                )),
            }
            return;
        }
        if !valid_path_key(fk) {
            bad.push((Class::BadKey, format!("malformed key {fk:?}"), k.to_vec()));
            return;
        }
        match meta {
            Meta::Redirect(ino) => {
                *redirects.entry(ino).or_default() += 1;
                redirect_keys.push((fk.to_vec(), ino));
            }
            Meta::Inode(i) => {
                if i.homed {
                    bad.push((
                        Class::BadMetadata,
                        format!("inode {} marked homed at a path", i.ino),
                        k.to_vec(),
                    ));
                }
                if let Some(prev) = seen_inos.insert(i.ino, k.to_vec()) {
                    bad.push((
                        Class::DuplicateInode,
                        format!("inode {} at {prev:?} and {k:?}", i.ino),
                        Vec::new(),
                    ));
                }
                if i.kind == Kind::Symlink && i.size != i.target.len() as u64 {
                    bad.push((
                        Class::BadMetadata,
                        format!("symlink {} size differs from its target", i.ino),
                        Vec::new(),
                    ));
                }
                paths.insert(
                    fk.to_vec(),
                    Info {
                        ino: i.ino,
                        kind: i.kind,
                        nlink: i.nlink,
                        size: i.size,
                        homed: false,
                    },
                );
            }
        }
    });
    if let Err(e) = scan {
        problem(&mut r, Class::EngineCorruption, e.to_string());
        return r;
    }
    for (c, d, _) in &bad {
        problem(&mut r, *c, d.clone());
    }
    match paths.get(&Vec::new()) {
        Some(root) if root.kind == Kind::Dir && root.ino == ROOT_INO => {}
        _ => problem(&mut r, Class::RootMissing, "no root directory".into()),
    }
    // Parents exist and are directories; count subdirectories.
    let mut subdirs: HashMap<Vec<u8>, u32> = HashMap::new();
    let names: Vec<(Vec<u8>, bool)> = paths
        .iter()
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, i)| (k.clone(), i.kind == Kind::Dir))
        .chain(redirect_keys.iter().map(|(k, ino)| {
            (
                k.clone(),
                homes.get(ino).is_some_and(|h| h.kind == Kind::Dir),
            )
        }))
        .collect();
    for (k, is_dir) in &names {
        match parent_of(k) {
            Some(p) => match paths.get(&p) {
                Some(pi) if pi.kind == Kind::Dir => {
                    if *is_dir {
                        *subdirs.entry(p).or_default() += 1;
                    }
                }
                _ => problem(
                    &mut r,
                    Class::MissingParent,
                    format!("{:?} has no parent directory", k),
                ),
            },
            None => problem(
                &mut r,
                Class::BadKey,
                format!("cannot find the parent of {k:?}"),
            ),
        }
    }
    // Link counts.
    let mut fixes = Batch::new();
    for (k, info) in &paths {
        let expect = if info.kind == Kind::Dir {
            2 + subdirs.get(k).copied().unwrap_or(0)
        } else {
            1
        };
        if info.nlink != expect {
            problem(
                &mut r,
                Class::LinkCount,
                format!(
                    "inode {} has link count {} but {} links",
                    info.ino, info.nlink, expect
                ),
            );
            if repair {
                if let Ok(Some(v)) = engine.get(&keys::meta_key(k)) {
                    if let Ok(Meta::Inode(mut i)) = Meta::decode(&v) {
                        i.nlink = expect;
                        fixes.put(keys::meta_key(k), i.encode());
                        r.problems.last_mut().expect("just pushed").repaired = true;
                    }
                }
            }
        }
    }
    for (ino, count) in &redirects {
        if !homes.contains_key(ino) {
            problem(
                &mut r,
                Class::DanglingRedirect,
                format!("{count} names redirect to missing inode {ino}"),
            );
        }
    }
    for (ino, info) in &homes {
        let names = redirects.get(ino).copied().unwrap_or(0);
        if info.nlink == 0 && names == 0 {
            problem(
                &mut r,
                Class::OrphanInode,
                format!("inode {ino} was unlinked while open"),
            );
            if repair {
                let hk = keys::home_key(*ino);
                fixes.delete(keys::meta_key(&hk));
                let d = keys::data_prefix(&hk);
                fixes.range_delete(
                    d.clone(),
                    amaranth_engine::prefix_end(&d, engine.format().max_key_len),
                );
                let x = keys::xattr_prefix(&hk);
                fixes.range_delete(
                    x.clone(),
                    amaranth_engine::prefix_end(&x, engine.format().max_key_len),
                );
                r.problems.last_mut().expect("just pushed").repaired = true;
            }
        } else if info.nlink != names {
            problem(
                &mut r,
                Class::LinkCount,
                format!(
                    "inode {ino} has link count {} but {names} names",
                    info.nlink
                ),
            );
            if repair {
                let hk = keys::home_key(*ino);
                if let Ok(Some(v)) = engine.get(&keys::meta_key(&hk)) {
                    if let Ok(Meta::Inode(mut i)) = Meta::decode(&v) {
                        i.nlink = names;
                        fixes.put(keys::meta_key(&hk), i.encode());
                        r.problems.last_mut().expect("just pushed").repaired = true;
                    }
                }
            }
        }
    }
    r.inodes = (paths.len() + homes.len()) as u64;
    r.directories = paths.values().filter(|i| i.kind == Kind::Dir).count() as u64;
    progress("checking data blocks");
    // Pass 2: data blocks belong to a file and lie inside it.
    let owner = |fk: &[u8]| -> Option<&Info> {
        match keys::home_ino(fk) {
            Some(ino) => homes.get(&ino),
            None => paths.get(fk),
        }
    };
    let mut orphan_data: Vec<Vec<u8>> = Vec::new();
    let mut beyond: Vec<Vec<u8>> = Vec::new();
    let mut bad_blocks = 0u64;
    let scan = scan_tag(engine, keys::DATA, |k, v| {
        let Some((fk, tail)) = split_file_key(&k[1..]) else {
            bad_blocks += 1;
            return;
        };
        let Ok(raw) = <[u8; 8]>::try_from(tail) else {
            bad_blocks += 1;
            return;
        };
        let blk = u64::from_be_bytes(raw);
        r.data_blocks += 1;
        r.data_bytes += v.len() as u64;
        if v.len() as u64 > BLOCK {
            bad_blocks += 1;
        }
        match owner(fk) {
            Some(i) if i.kind == Kind::File => {
                if blk * BLOCK >= i.size.max(1) && !(i.size == 0 && v.is_empty()) {
                    beyond.push(k.to_vec());
                }
            }
            _ => orphan_data.push(k.to_vec()),
        }
    });
    if let Err(e) = scan {
        problem(&mut r, Class::EngineCorruption, e.to_string());
    }
    if bad_blocks > 0 {
        problem(
            &mut r,
            Class::BadDataBlock,
            format!("{bad_blocks} malformed data keys or oversized blocks"),
        );
    }
    for (list, class) in [
        (orphan_data, Class::DataWithoutInode),
        (beyond, Class::DataBeyondEof),
    ] {
        if list.is_empty() {
            continue;
        }
        problem(&mut r, class, format!("{} data blocks", list.len()));
        if repair {
            for k in list {
                fixes.delete(k);
            }
            r.problems.last_mut().expect("just pushed").repaired = true;
        }
    }
    progress("checking extended attributes");
    let mut orphan_x = Vec::new();
    let scan = scan_tag(engine, keys::XATTR, |k, _| {
        r.xattrs += 1;
        match split_file_key(&k[1..]) {
            Some((fk, name)) if !name.is_empty() && owner(fk).is_some() => {}
            _ => orphan_x.push(k.to_vec()),
        }
    });
    if let Err(e) = scan {
        problem(&mut r, Class::EngineCorruption, e.to_string());
    }
    if !orphan_x.is_empty() {
        problem(
            &mut r,
            Class::XattrWithoutInode,
            format!("{} extended attributes", orphan_x.len()),
        );
        if repair {
            for k in orphan_x {
                fixes.delete(k);
            }
            r.problems.last_mut().expect("just pushed").repaired = true;
        }
    }
    // The inode index (schema 3): one entry per inode but the root, saying where it is.
    if engine
        .get(&keys::system_key("format"))
        .ok()
        .flatten()
        .is_some_and(|v| v == crate::fs::SCHEMA_VERSION.to_le_bytes())
    {
        for detail in crate::fs::index_problems(engine, &seen_inos) {
            problem(&mut r, Class::BadMetadata, detail);
        }
    }
    // Counters.
    let max_ino = seen_inos.keys().copied().max().unwrap_or(ROOT_INO);
    match get_u64("next_ino") {
        Some(n) if n > max_ino => {}
        other => {
            problem(
                &mut r,
                Class::InodeNumberCounter,
                format!("next inode number {other:?}, highest in use {max_ino}"),
            );
            if repair {
                fixes.put(
                    keys::system_key("next_ino"),
                    (max_ino + 1024).to_le_bytes().to_vec(),
                );
                r.problems.last_mut().expect("just pushed").repaired = true;
            }
        }
    }
    let live = r.inodes - homes.values().filter(|h| h.nlink == 0).count() as u64;
    if get_u64("inodes") != Some(live) {
        problem(
            &mut r,
            Class::InodeCount,
            format!("inode counter {:?}, {live} inodes found", get_u64("inodes")),
        );
        if repair {
            fixes.put(keys::system_key("inodes"), live.to_le_bytes().to_vec());
            r.problems.last_mut().expect("just pushed").repaired = true;
        }
    }
    if repair && !fixes.is_empty() {
        progress("writing repairs");
        if let Err(e) = engine.write(&fixes).and_then(|_| engine.sync()) {
            for p in &mut r.problems {
                p.repaired = false;
            }
            problem(
                &mut r,
                Class::EngineCorruption,
                format!("repairs could not be written: {e}"),
            );
        }
    }
    let _ = paths.values().any(|i| i.homed);
    r
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
