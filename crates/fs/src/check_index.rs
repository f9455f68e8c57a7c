//! The checker's pass over the inode index (schema 3, see `fs/handles.rs`): every inode but the
//! root has exactly one entry, saying where it is (its parent directory's number and its name, or
//! "at its home" for a hard-linked or unlinked-while-open inode), and there is no other entry.
//!
//! The names index (schema 6, see `fs/links.rs`) is checked the same way: one entry per name that
//! holds a redirect (the redirect's inode, its directory's number, the name), and no other entry.
//!
//! The indexes hold nothing the names do not, so their repair rewrites them from the names found. It is
//! not structural: it runs in a round without structural repairs, once the names hold still, so
//! that names moved into `/lost+found` (or given a new number) are indexed where they end up.

use std::collections::{HashMap, HashSet};

use amaranth_engine::Op;

use crate::check::{parent_of, scan_tag, Checker, Class};
use crate::describe::path_of;
use crate::fs::{Place, INDEX_SCHEMA, NAMES_SCHEMA};
use crate::inode::Kind;
use crate::keys;
use crate::table::ROOT_INO;

impl Checker<'_> {
    /// Compares the index with the names found; queues its repair.
    pub(crate) fn index(&mut self) {
        if self.schema.is_none_or(|s| s < INDEX_SCHEMA) {
            return;
        }
        let (want, unplaced) = self.expected_places();
        let mut entries: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let scan = scan_tag(self.engine, keys::INDEX, |k, v| {
            entries.push((k.to_vec(), v.to_vec()))
        });
        if let Err(e) = scan {
            self.problem(Class::EngineCorruption, e.to_string());
            return;
        }
        let mut stray: Vec<Vec<u8>> = Vec::new();
        let mut wrong: Vec<u64> = Vec::new();
        let mut indexed: HashSet<u64> = HashSet::new();
        for (k, v) in entries {
            let Some(ino) = index_ino(&k) else {
                stray.push(k);
                continue;
            };
            indexed.insert(ino);
            match want.get(&ino) {
                // Where it will be is decided by the structural repairs (no parent directory now).
                None if unplaced.contains(&ino) => {}
                None => stray.push(k),
                Some(p) if Place::decode(&v).ok().as_ref() != Some(p) => wrong.push(ino),
                Some(_) => {}
            }
        }
        let mut missing: Vec<u64> = want
            .keys()
            .filter(|ino| !indexed.contains(ino))
            .copied()
            .collect();
        missing.sort_unstable();
        wrong.sort_unstable();
        self.index_stray(stray);
        self.index_rewrite(wrong, &want, "say the wrong place");
        self.index_rewrite(missing, &want, "are missing");
    }

    /// Compares the names index with the redirects found; queues its repair (stray entries go,
    /// missing ones are written).
    pub(crate) fn names(&mut self) {
        if self.schema.is_none_or(|s| s < NAMES_SCHEMA) {
            return;
        }
        let want = self.expected_names();
        let mut stray: Vec<Vec<u8>> = Vec::new();
        let mut found: HashSet<Vec<u8>> = HashSet::new();
        let scan = scan_tag(self.engine, keys::NAMES, |k, _| {
            found.insert(k.to_vec());
        });
        if let Err(e) = scan {
            self.problem(Class::EngineCorruption, e.to_string());
            return;
        }
        for k in &found {
            let ino = keys::name_of_name_key(k).map(|(ino, _, _)| ino);
            if !want.contains(k) && !ino.is_some_and(|i| self.unplaced_redirect(i)) {
                stray.push(k.clone());
            }
        }
        let mut missing: Vec<Vec<u8>> = want.difference(&found).cloned().collect();
        missing.sort_unstable();
        stray.sort_unstable();
        if let Some(first) = stray.first() {
            let i = self.problem(
                Class::InodeIndex,
                format!(
                    "names index: {} entries name no redirect (the first: {})",
                    stray.len(),
                    describe_name_key(first)
                ),
            );
            let ops = stray.into_iter().map(|key| Op::Delete { key }).collect();
            self.fix(i, ops);
        }
        if let Some(first) = missing.first() {
            let i = self.problem(
                Class::InodeIndex,
                format!(
                    "names index: {} redirects are missing (the first: {})",
                    missing.len(),
                    describe_name_key(first)
                ),
            );
            let ops = missing
                .into_iter()
                .map(|key| Op::Put {
                    key,
                    value: vec![1],
                })
                .collect();
            self.fix(i, ops);
        }
    }

    /// The names-index keys the redirects found call for (those whose directory is known).
    fn expected_names(&self) -> HashSet<Vec<u8>> {
        let mut want = HashSet::new();
        for (&ino, names) in &self.redirects {
            for fk in names {
                if let Some((dir, name)) = self.dir_and_name(fk) {
                    want.insert(keys::name_key(ino, dir, &name));
                }
            }
        }
        want
    }

    /// Whether a redirect to `ino` has no known directory (a structural repair moves it first).
    fn unplaced_redirect(&self, ino: u64) -> bool {
        self.redirects
            .get(&ino)
            .is_some_and(|names| names.iter().any(|fk| self.dir_and_name(fk).is_none()))
    }

    /// The directory number and name of the path key `fk`, if its directory is known.
    fn dir_and_name(&self, fk: &[u8]) -> Option<(u64, Vec<u8>)> {
        let parent = parent_of(fk)?;
        let dir = self.paths.get(&parent).filter(|i| i.kind == Kind::Dir)?;
        let name = keys::name_of_child(fk, keys::children_prefix(&parent).len())?;
        Some((dir.ino, name))
    }

    /// Where every inode should be according to the names, and the inodes whose place is not
    /// known yet (their name has no parent directory: a structural repair moves it).
    fn expected_places(&self) -> (HashMap<u64, Place>, HashSet<u64>) {
        let mut want = HashMap::new();
        let mut unplaced = HashSet::new();
        for (&ino, meta_key) in &self.seen_inos {
            let fk = &meta_key[1..];
            if ino == ROOT_INO && fk.is_empty() {
                continue;
            }
            if keys::home_ino(fk).is_some() {
                want.insert(ino, Place::Home);
                continue;
            }
            let place = self
                .dir_and_name(fk)
                .map(|(parent, name)| Place::At { parent, name });
            match place {
                Some(p) => {
                    want.insert(ino, p);
                }
                None => {
                    unplaced.insert(ino);
                }
            }
        }
        (want, unplaced)
    }

    /// Entries of no inode (or with a malformed key) go.
    fn index_stray(&mut self, stray: Vec<Vec<u8>>) {
        let Some(first) = stray.first() else {
            return;
        };
        let what = index_ino(first).map_or_else(
            || format!("a key of {} bytes", first.len()),
            |ino| format!("inode {ino}"),
        );
        let i = self.problem(
            Class::InodeIndex,
            format!(
                "inode index: {} entries name no inode (the first: {what})",
                stray.len()
            ),
        );
        let ops = stray.into_iter().map(|key| Op::Delete { key }).collect();
        self.fix(i, ops);
    }

    /// Entries of `inos` are written as the names say.
    fn index_rewrite(&mut self, inos: Vec<u64>, want: &HashMap<u64, Place>, how: &str) {
        let Some(&first) = inos.first() else {
            return;
        };
        let at = self
            .seen_inos
            .get(&first)
            .map_or_else(String::new, |k| format!(" at {}", path_of(&k[1..])));
        let i = self.problem(
            Class::InodeIndex,
            format!(
                "inode index: the entries of {} inodes {how} (the first: inode {first}{at})",
                inos.len()
            ),
        );
        let ops = inos
            .into_iter()
            .map(|ino| Op::Put {
                key: keys::ino_key(ino),
                value: want[&ino].encode(),
            })
            .collect();
        self.fix(i, ops);
    }
}

/// The inode number of an index key (`'i'` and eight bytes, big-endian).
fn index_ino(key: &[u8]) -> Option<u64> {
    let raw: [u8; 8] = key.get(1..)?.try_into().ok()?;
    Some(u64::from_be_bytes(raw))
}

/// A names-index key in words.
fn describe_name_key(key: &[u8]) -> String {
    match keys::name_of_name_key(key) {
        Some((ino, dir, name)) => format!(
            "inode {ino} as {:?} in directory {dir}",
            String::from_utf8_lossy(&name)
        ),
        None => format!("a key of {} bytes", key.len()),
    }
}
