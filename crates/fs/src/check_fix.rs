//! The checker's structural repairs: the root, undecodable or contradictory records, names whose
//! directory is gone (moved into `/lost+found` as `#inode`, as e2fsck does), names of missing
//! inodes, inodes whose names are all gone, duplicate inode numbers.

use std::collections::HashSet;
use std::ops::Bound;

use amaranth_engine::Op;

use crate::check::{parent_of, Checker, Class, Info};
use crate::describe::path_of;
use crate::inode::{Inode, Kind, Meta};
use crate::keys;
use crate::table::ROOT_INO;

/// A metadata record the scan found wrong: its key and, when it decodes, its value.
#[derive(Clone, Debug)]
pub(crate) struct Found {
    pub key: Vec<u8>,
    pub meta: Option<Meta>,
}

/// The name of the directory that takes in what lost its place.
const LOST_FOUND: &[u8] = b"lost+found";

pub(crate) struct Fixer<'c, 'e> {
    c: &'c mut Checker<'e>,
    /// The next free inode number (once one was needed).
    next_ino: Option<u64>,
    /// `/lost+found`'s key once known or created, with the ops creating it if not yet queued.
    lost_found: Option<(Vec<u8>, Vec<Op>)>,
    /// Names given in `/lost+found` this round.
    used: HashSet<Vec<u8>>,
}

impl<'c, 'e> Fixer<'c, 'e> {
    pub(crate) fn new(c: &'c mut Checker<'e>) -> Fixer<'c, 'e> {
        Fixer {
            c,
            next_ino: None,
            lost_found: None,
            used: HashSet::new(),
        }
    }

    pub(crate) fn run(mut self) {
        self.root();
        self.bad_meta();
        self.bad_data();
        self.parents();
        self.dangling();
        self.names_lost();
        if let (Some(next), true) = (self.next_ino, self.c.structural) {
            self.c.ops.push(Op::Put {
                key: keys::system_key("next_ino"),
                value: next.to_le_bytes().to_vec(),
            });
        }
    }

    fn alloc_ino(&mut self) -> u64 {
        let next = *self.next_ino.get_or_insert_with(|| {
            let max = self.c.seen_inos.keys().copied().max().unwrap_or(ROOT_INO);
            self.c.get_u64("next_ino").unwrap_or(0).max(max + 1)
        });
        self.next_ino = Some(next + 1);
        next
    }

    fn root(&mut self) {
        let ok = matches!(self.c.paths.get(&[][..]), Some(i) if i.kind == Kind::Dir && i.ino == ROOT_INO);
        if ok {
            return;
        }
        let i = self
            .c
            .problem(Class::RootMissing, "no root directory".into());
        let root = Inode::new(ROOT_INO, Kind::Dir, 0o755, 0, 0);
        let ops = vec![Op::Put {
            key: keys::meta_key(&[]),
            value: root.encode(),
        }];
        self.c.fix(i, ops);
        if self.c.r.problems[i].repaired {
            let info = Info::new(&root);
            self.c.paths.insert(Vec::new(), info);
        }
    }

    fn bad_meta(&mut self) {
        for (class, detail, found) in std::mem::take(&mut self.c.bad_meta) {
            let i = self.c.problem(class, detail);
            let is_home = keys::home_ino(&found.key[1..]).is_some();
            let ops = match (class, found.meta) {
                (Class::DuplicateInode, Some(Meta::Inode(mut inode))) if !is_home => {
                    inode.ino = self.alloc_ino();
                    vec![Op::Put {
                        key: found.key,
                        value: inode.encode(),
                    }]
                }
                (Class::DuplicateInode, Some(Meta::Redirect(ino))) => vec![Op::Put {
                    key: found.key,
                    value: Meta::redirect(ino),
                }],
                (Class::DuplicateInode, _) => continue,
                (Class::BadMetadata, Some(Meta::Inode(mut inode))) => {
                    inode.homed = false;
                    if inode.kind == Kind::Symlink {
                        inode.size = inode.target.len() as u64;
                    }
                    vec![Op::Put {
                        key: found.key,
                        value: inode.encode(),
                    }]
                }
                _ => vec![Op::Delete { key: found.key }],
            };
            self.c.fix(i, ops);
        }
    }

    fn bad_data(&mut self) {
        let bad = std::mem::take(&mut self.c.bad_data);
        if bad.is_empty() {
            return;
        }
        let i = self.c.problem(
            Class::BadDataBlock,
            format!("{} malformed data keys or oversized blocks", bad.len()),
        );
        self.c
            .fix(i, bad.into_iter().map(|key| Op::Delete { key }).collect());
    }

    /// `/lost+found`'s key, creating it (ops returned once, with the first move) if needed.
    fn lost_found(&mut self) -> Option<(Vec<u8>, Vec<Op>)> {
        if let Some((k, ops)) = &mut self.lost_found {
            return Some((k.clone(), std::mem::take(ops)));
        }
        for n in 0..10 {
            let name = if n == 0 {
                LOST_FOUND.to_vec()
            } else {
                [LOST_FOUND, format!(".{n}").as_bytes()].concat()
            };
            let key = keys::path_key(&[&name]);
            match self.c.paths.get(&key) {
                Some(i) if i.kind == Kind::Dir => {
                    self.lost_found = Some((key.clone(), Vec::new()));
                    return Some((key, Vec::new()));
                }
                Some(_) => continue,
                None if self.c.redirects.values().any(|v| v.contains(&key)) => continue,
                None => {
                    let ino = self.alloc_ino();
                    let dir = Inode::new(ino, Kind::Dir, 0o700, 0, 0);
                    let ops = vec![Op::Put {
                        key: keys::meta_key(&key),
                        value: dir.encode(),
                    }];
                    let info = Info::new(&dir);
                    self.c.paths.insert(key.clone(), info);
                    self.lost_found = Some((key.clone(), Vec::new()));
                    return Some((key, ops));
                }
            }
        }
        None
    }

    /// A free name `#ino` (or `#ino.N`) in `/lost+found`.
    fn free_name(&mut self, lf: &[u8], ino: u64) -> Vec<u8> {
        for n in 0.. {
            let name = if n == 0 {
                format!("#{ino}")
            } else {
                format!("#{ino}.{n}")
            };
            let key = keys::child_key(lf, name.as_bytes());
            let taken = self.c.paths.contains_key(&key)
                || self.used.contains(&key)
                || self.c.redirects.values().any(|v| v.contains(&key));
            if !taken {
                self.used.insert(key.clone());
                return key;
            }
        }
        unreachable!("some name is free")
    }

    /// The longest key of the entry at `fk` (metadata, data, xattrs, and a directory's subtree).
    fn longest_key(&self, fk: &[u8], dir: bool) -> usize {
        let mut prefixes = vec![keys::data_prefix(fk), keys::xattr_prefix(fk)];
        if dir {
            prefixes.extend(keys::subtree_prefixes(fk));
        }
        let max_key = self.c.engine.format().max_key_len;
        let mut longest = 1 + fk.len();
        for p in prefixes {
            let hi = amaranth_engine::prefix_end(&p, max_key);
            let _ = self
                .c
                .engine
                .scan_stored(Bound::Included(&p), Bound::Excluded(&hi), |k, _| {
                    longest = longest.max(k.len());
                    true
                });
        }
        longest
    }

    /// Names whose parent is missing or not a directory move into `/lost+found`, deepest first.
    fn parents(&mut self) {
        let mut lost: Vec<(Vec<u8>, Option<Info>, u64)> = Vec::new();
        let is_dir = |c: &Checker, p: &Vec<u8>| c.paths.get(p).is_some_and(|i| i.kind == Kind::Dir);
        for (k, info) in &self.c.paths {
            if !k.is_empty() && !parent_of(k).is_some_and(|p| is_dir(self.c, &p)) {
                lost.push((k.clone(), Some(info.clone()), info.ino));
            }
        }
        for (ino, names) in &self.c.redirects {
            for k in names {
                if !parent_of(k).is_some_and(|p| is_dir(self.c, &p)) {
                    lost.push((k.clone(), None, *ino));
                }
            }
        }
        lost.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
        for (fk, info, ino) in lost {
            let i = self.c.problem(
                Class::MissingParent,
                format!("{} (inode {ino}) has no parent directory", path_of(&fk)),
            );
            if !self.c.repair {
                continue;
            }
            let Some((lf, mut ops)) = self.lost_found() else {
                continue;
            };
            let to = self.free_name(&lf, ino);
            ops.extend(self.move_ops(&fk, &to, info.as_ref(), ino));
            let dir = info.as_ref().is_some_and(|i| i.kind == Kind::Dir);
            let grow = to.len().saturating_sub(fk.len());
            if self.longest_key(&fk, dir) + grow > self.c.engine.format().max_key_len {
                self.c.r.problems[i].detail += " (too deep to move into /lost+found)";
                // The directory's creation goes with the next move that happens.
                let create: Vec<Op> = ops
                    .into_iter()
                    .take_while(|op| !matches!(op, Op::Delete { .. }))
                    .collect();
                self.lost_found = Some((lf, create));
                continue;
            }
            self.c.r.problems[i].detail += &format!(" [moved to {}]", path_of(&to));
            self.c.fix(i, ops);
        }
    }

    /// Operations moving the name `from` (with its data, xattrs and subtree) to `to`.
    fn move_ops(&self, from: &[u8], to: &[u8], info: Option<&Info>, ino: u64) -> Vec<Op> {
        let mut ops = vec![Op::Delete {
            key: keys::meta_key(from),
        }];
        let Some(info) = info else {
            ops.push(Op::Put {
                key: keys::meta_key(to),
                value: Meta::redirect(ino),
            });
            return ops;
        };
        let value = self.c.engine.get(&keys::meta_key(from)).ok().flatten();
        let Some(value) = value else {
            return Vec::new();
        };
        ops.push(Op::Put {
            key: keys::meta_key(to),
            value,
        });
        let mut mv = |f: Vec<u8>, t: Vec<u8>| ops.push(Op::MovePrefix { from: f, to: t });
        mv(keys::xattr_prefix(from), keys::xattr_prefix(to));
        match info.kind {
            Kind::Dir => {
                for (f, t) in keys::subtree_prefixes(from)
                    .into_iter()
                    .zip(keys::subtree_prefixes(to))
                {
                    mv(f, t);
                }
            }
            Kind::File => mv(keys::data_prefix(from), keys::data_prefix(to)),
            _ => {}
        }
        ops
    }

    /// Names of inodes that do not exist go.
    fn dangling(&mut self) {
        let mut gone: Vec<(u64, Vec<Vec<u8>>)> = self
            .c
            .redirects
            .iter()
            .filter(|(ino, _)| !self.c.homes.contains_key(*ino))
            .map(|(ino, v)| (*ino, v.clone()))
            .collect();
        gone.sort();
        for (ino, names) in gone {
            let shown: Vec<String> = names.iter().map(|k| path_of(k)).collect();
            let i = self.c.problem(
                Class::DanglingRedirect,
                format!(
                    "{} names redirect to missing inode {ino}: {}",
                    names.len(),
                    shown.join(", ")
                ),
            );
            let ops = names
                .into_iter()
                .map(|k| Op::Delete {
                    key: keys::meta_key(&k),
                })
                .collect();
            self.c.fix(i, ops);
        }
    }

    /// A hard-linked inode with links but no name left gets one in `/lost+found`.
    fn names_lost(&mut self) {
        let mut lost: Vec<(u64, u32)> = self
            .c
            .homes
            .iter()
            .filter(|(ino, h)| h.nlink > 0 && !self.c.redirects.contains_key(*ino))
            .map(|(ino, h)| (*ino, h.nlink))
            .collect();
        lost.sort();
        for (ino, nlink) in lost {
            let i = self.c.problem(
                Class::NamesLost,
                format!("inode {ino} has {nlink} links but no name"),
            );
            if !self.c.repair {
                continue;
            }
            let Some((lf, mut ops)) = self.lost_found() else {
                continue;
            };
            let to = self.free_name(&lf, ino);
            self.c.r.problems[i].detail += &format!(" [named {}]", path_of(&to));
            ops.push(Op::Put {
                key: keys::meta_key(&to),
                value: Meta::redirect(ino),
            });
            self.c.fix(i, ops);
        }
    }
}
