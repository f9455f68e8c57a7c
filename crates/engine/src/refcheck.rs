//! Checking the data table against the references the tree holds, and repairing it
//! (`amaranth fsck`): a block the table counts more often than the tree references it is a leak
//! (its space comes back once the count is lowered); one the tree references more often than
//! the table counts would be freed while still referenced when a count reaches zero, and one the
//! allocator has free could be handed out — both are raised, the block claimed. A referenced
//! block inside a node image or a table holds no data of its own: reported, not repairable here.

use crate::datatable::RunMap;
use crate::superblock::Extent;
use crate::tree::Tree;

/// Examples kept in a [`RefCheck`].
const EXAMPLES: usize = 8;

/// What a check of the data table against the tree's references found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RefCheck {
    /// Blocks the table counts more often than the tree references them (leaked space).
    pub leaked: u64,
    /// Blocks the tree references more often than the table counts (one reference would free
    /// a block another still uses).
    pub undercounted: u64,
    /// Referenced blocks the allocator has free (a write could overwrite them).
    pub unallocated: u64,
    /// Referenced blocks inside a node image or a table.
    pub overlapping: u64,
    /// The first few, described.
    pub examples: Vec<String>,
}

impl RefCheck {
    /// Whether the table and the references agree.
    pub fn is_clean(&self) -> bool {
        self.leaked + self.undercounted + self.unallocated + self.overlapping == 0
    }

    /// Whether a reference may lose its block (anything but a leak).
    pub fn is_dangerous(&self) -> bool {
        self.undercounted + self.unallocated + self.overlapping > 0
    }

    /// One line for messages.
    pub fn describe(&self) -> String {
        format!(
            "data table: {} blocks leaked, {} referenced more often than counted, {} referenced \
             but free, {} inside node images or tables ({})",
            self.leaked,
            self.undercounted,
            self.unallocated,
            self.overlapping,
            self.examples.join("; ")
        )
    }

    fn note(&mut self, what: String) {
        if self.examples.len() < EXAMPLES {
            self.examples.push(what);
        }
    }
}

/// Compares the data table of `tree` with `recount`, the references its tree holds; with
/// `repair`, brings the table to the recount (see the module documentation). The caller holds
/// `writers` exclusive.
pub(crate) fn check_refs(tree: &Tree, recount: &RunMap, repair: bool) -> RefCheck {
    let mut data = tree.store.data.lock();
    let mut btt = tree.store.btt.lock();
    let mut out = RefCheck::default();
    let mut images: Vec<(u64, u64)> = btt
        .current
        .values()
        .chain(btt.checkpointed.values())
        .chain(btt.in_progress.iter().flat_map(|m| m.values()))
        .chain(btt.checkpointed_table.iter())
        .chain(data.checkpointed_table.iter())
        .map(|e| (e.block, e.block + e.blocks))
        .collect();
    images.sort_unstable();
    let in_image = |b: u64| {
        let i = images.partition_point(|&(_, end)| end <= b);
        images.get(i).is_some_and(|&(s, _)| s <= b)
    };
    let mut blocks: Vec<u64> = Vec::new();
    if data.refs != *recount {
        for (s, n, _) in data.refs.iter().chain(recount.iter()) {
            blocks.extend(s..s + n);
        }
        blocks.sort_unstable();
        blocks.dedup();
    }
    for b in blocks {
        let (t, n) = (data.refs.refs(b), recount.refs(b));
        if t > n {
            out.leaked += 1;
            out.note(format!("block {b} counted {t}, referenced {n}"));
            if repair {
                data.release(&vec![b; (t - n) as usize]);
            }
        } else if t < n {
            out.undercounted += 1;
            out.note(format!("block {b} referenced {n} times, counted {t}"));
            if repair && !in_image(b) {
                if t == 0 && !btt.alloc.is_allocated(b, 1) {
                    let claimed = btt.alloc.claim(Extent {
                        block: b,
                        blocks: 1,
                    });
                    assert!(claimed, "a free block could not be claimed");
                }
                for _ in t..n {
                    data.refs.add(b, 1);
                }
            }
        }
    }
    for (start, len, _) in recount.iter() {
        let i = images.partition_point(|&(_, end)| end <= start);
        let overlaps = images.get(i).is_some_and(|&(s, _)| s < start + len);
        if !overlaps && btt.alloc.is_allocated(start, len) {
            continue;
        }
        for b in start..start + len {
            if in_image(b) {
                out.overlapping += 1;
                out.note(format!(
                    "referenced block {b} inside a node image or a table"
                ));
            } else if !btt.alloc.is_allocated(b, 1) {
                out.unallocated += 1;
                out.note(format!("referenced block {b} is free"));
                if repair {
                    let claimed = btt.alloc.claim(Extent {
                        block: b,
                        blocks: 1,
                    });
                    assert!(claimed, "a free block could not be claimed");
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use amaranth_device::MemDevice;

    use crate::{Batch, Engine, Format, Options};

    /// A leaked count, a block referenced twice but counted once, and a referenced block the
    /// table does not count at all: found, repaired, and the data still reads back.
    #[test]
    fn leaks_and_undercounts_are_found_and_repaired() {
        let format = Format {
            node_size: 32 << 10,
            partition_size: 8 << 10,
            max_value_len: 4096,
            ..Format::small_for_tests()
        };
        let options = Options {
            cache_size: 512 << 10,
            background_threads: false,
            ..Options::default()
        };
        let e = Engine::create(Arc::new(MemDevice::new(16 << 20)), format, options).unwrap();
        let mut b = Batch::new();
        let keys = (0..4u8).map(|i| vec![b'a', b'/', i]).collect();
        b.put_blocks(keys, &[7u8; 4 * 4096]);
        b.copy_prefix(b"a/".to_vec(), b"c/".to_vec());
        e.write(&b).unwrap();
        let a = e.blocks_under_for_tests(b"a/");
        assert_eq!(a, e.blocks_under_for_tests(b"c/"));
        assert!(e.check_references().unwrap().is_clean());
        e.adjust_data_refs_for_tests(a[0], 1); // a leak: counted 3, referenced 2
        e.adjust_data_refs_for_tests(a[1], -1); // referenced twice, counted once
        let r = e.check_references().unwrap();
        assert_eq!(
            (r.leaked, r.undercounted, r.unallocated),
            (1, 1, 0),
            "{r:?}"
        );
        assert!(e.verify().is_err(), "a reference that may lose its block");
        let fixed = e.repair_references().unwrap();
        assert_eq!(fixed, r);
        assert!(e.check_references().unwrap().is_clean());
        assert_eq!(e.verify().unwrap().references, Default::default());
        // A leak alone is reported by verify, which passes.
        e.adjust_data_refs_for_tests(a[2], 1);
        assert_eq!(e.verify().unwrap().references.leaked, 1);
        e.repair_references().unwrap();
        // Referenced but uncounted and free (as after a wrongly freed block): claimed again.
        e.adjust_data_refs_for_tests(a[3], -2);
        e.tree()
            .store
            .btt
            .lock()
            .alloc
            .free(crate::superblock::Extent {
                block: a[3],
                blocks: 1,
            });
        let r = e.check_references().unwrap();
        assert_eq!((r.undercounted, r.unallocated), (1, 1), "{r:?}");
        e.repair_references().unwrap();
        let again = e.check_references().unwrap();
        assert!(again.is_clean(), "{again:?}");
        e.checkpoint().unwrap();
        for k in [&b"a/\x03"[..], b"c/\x03"] {
            assert_eq!(e.get(k).unwrap(), Some(vec![7u8; 4096]));
        }
        e.close().unwrap();
    }
}
