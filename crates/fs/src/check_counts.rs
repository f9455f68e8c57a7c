//! The checker's counts, found against what the scans saw: link counts, block and reserved-hole
//! counts, sizes that must cover the data, data and extended attributes without a file, and the
//! inode counters (see `check.rs`).

use amaranth_engine::Op;

use std::collections::HashMap;

use crate::check::{parent_of, Checker, Class};
use crate::inode::{Kind, Meta};
use crate::keys::{self, BLOCK};
use crate::table::ROOT_INO;

impl Checker<'_> {
    /// Link counts, sizes, data and xattrs without a file, counters.
    pub(crate) fn counts(&mut self) {
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
    pub(crate) fn block_counts(&mut self) {
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
    pub(crate) fn rewrite_inode(
        &self,
        fk: &[u8],
        f: impl FnOnce(&mut crate::inode::Inode),
    ) -> Vec<Op> {
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
    pub(crate) fn sizes(&mut self) {
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

    pub(crate) fn orphans(&mut self) {
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

    pub(crate) fn counters(&mut self) {
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
}
