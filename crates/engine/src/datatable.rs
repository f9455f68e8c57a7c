//! The data table: the device blocks that hold out-of-line file data (docs/WRITEONCE.md) and how
//! many references the tree holds to each.
//!
//! A block written by [`crate::Batch::put_blocks`] is referenced from the tree by a 12-byte
//! reference (`dataref.rs`). The table counts those references per block, as runs of consecutive
//! blocks with the same count ([`RunMap`]): a file written sequentially is one run. A count is
//! more than one only while a prefix move or copy holds a block under two keys (the copy's put
//! and the source's entry, until the source's range delete reaches it).
//!
//! A block whose last reference goes is *released*: it stays allocated until the next checkpoint
//! completes, because the last checkpoint's tree or a log record replay can reach may still name
//! it. The checkpoint's start takes what was released before it (`freeing`), writes the table of
//! the counts at that instant (the blocks its tree references), and frees those blocks when it
//! completes, exactly as it frees a node's old image.

use std::collections::BTreeMap;
use std::ops::Bound;

use amaranth_device::AlignedBuf;

use crate::codec::{crc_with_hole, Dec, Enc};
use crate::error::{Error, Result};
use crate::superblock::Extent;

const TABLE_MAGIC: [u8; 4] = *b"AMDT";
const TABLE_VERSION: u16 = 1;
/// Bytes of the table's header.
pub const TABLE_HEADER: usize = 32;
/// Bytes of one run in the table.
pub const TABLE_ENTRY: usize = 16;
const TABLE_CRC_AT: usize = 16;

/// One run of consecutive blocks with the same reference count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Run {
    len: u64,
    refs: u32,
}

/// Reference counts of blocks, kept as maximal runs of consecutive blocks with one count (two
/// touching runs never have the same count; a block with no reference is in no run).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunMap {
    runs: BTreeMap<u64, Run>,
    /// Blocks with at least one reference.
    blocks: u64,
}

impl RunMap {
    /// Blocks with at least one reference.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }

    /// Number of runs.
    pub fn runs(&self) -> usize {
        self.runs.len()
    }

    /// Whether no block is referenced.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// The references to `block`.
    pub fn refs(&self, block: u64) -> u32 {
        match self.runs.range(..=block).next_back() {
            Some((&s, r)) if block < s + r.len => r.refs,
            _ => 0,
        }
    }

    /// The runs `(first block, blocks, references)` in block order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64, u32)> + '_ {
        self.runs.iter().map(|(&s, r)| (s, r.len, r.refs))
    }

    /// Cuts the run that covers `at` (if any starts before it) so that one starts at `at`.
    fn split_at(&mut self, at: u64) {
        let Some((&s, &r)) = self.runs.range(..at).next_back() else {
            return;
        };
        if at < s + r.len {
            self.runs.insert(
                s,
                Run {
                    len: at - s,
                    refs: r.refs,
                },
            );
            self.runs.insert(
                at,
                Run {
                    len: s + r.len - at,
                    refs: r.refs,
                },
            );
        }
    }

    /// Merges touching runs with equal counts in `[lo, hi]` (and the neighbours of that span).
    fn coalesce(&mut self, lo: u64, hi: u64) {
        let from = self.runs.range(..lo).next_back().map_or(lo, |(&s, _)| s);
        let starts: Vec<u64> = self
            .runs
            .range((Bound::Included(from), Bound::Included(hi)))
            .map(|(&s, _)| s)
            .collect();
        let mut prev: Option<u64> = None;
        for s in starts {
            let r = self.runs[&s];
            if let Some(p) = prev {
                let pr = self.runs[&p];
                if p + pr.len == s && pr.refs == r.refs {
                    self.runs.remove(&s);
                    self.runs.insert(
                        p,
                        Run {
                            len: pr.len + r.len,
                            refs: r.refs,
                        },
                    );
                    continue;
                }
            }
            prev = Some(s);
        }
    }

    /// Adds one reference to each of the `len` blocks from `start`.
    pub fn add(&mut self, start: u64, len: u64) {
        assert!(len > 0, "adding references to no block");
        let end = start + len;
        self.split_at(start);
        self.split_at(end);
        let inside: Vec<(u64, Run)> = self.runs.range(start..end).map(|(&s, &r)| (s, r)).collect();
        let mut at = start;
        for (s, r) in inside {
            if s > at {
                self.runs.insert(
                    at,
                    Run {
                        len: s - at,
                        refs: 1,
                    },
                );
                self.blocks += s - at;
            }
            assert!(r.refs < u32::MAX, "reference count overflow at block {s}");
            self.runs.insert(
                s,
                Run {
                    len: r.len,
                    refs: r.refs + 1,
                },
            );
            at = s + r.len;
        }
        if at < end {
            self.runs.insert(
                at,
                Run {
                    len: end - at,
                    refs: 1,
                },
            );
            self.blocks += end - at;
        }
        self.coalesce(start, end);
    }

    /// Drops one reference to `block`; returns whether that was its last. Panics if it had none:
    /// a reference the table does not count is a broken invariant.
    pub fn release(&mut self, block: u64) -> bool {
        let refs = self.refs(block);
        assert!(refs > 0, "releasing block {block}, which has no reference");
        self.split_at(block);
        self.split_at(block + 1);
        if refs == 1 {
            self.runs.remove(&block);
            self.blocks -= 1;
        } else {
            self.runs.insert(
                block,
                Run {
                    len: 1,
                    refs: refs - 1,
                },
            );
        }
        self.coalesce(block, block + 1);
        refs == 1
    }

    /// Serializes the table: a 32-byte header, then `(first block u64, blocks u32, references
    /// u32)` per run, in block order. Asserts first what [`RunMap::decode`] checks.
    pub fn encode(&self) -> AlignedBuf {
        let mut e = Enc::with_capacity(TABLE_HEADER + self.runs.len() * TABLE_ENTRY);
        e.raw(&TABLE_MAGIC);
        e.u16(TABLE_VERSION);
        e.u16(0);
        e.u64(self.runs.len() as u64);
        e.u32(0); // crc at 16
        e.raw(&[0u8; 12]);
        let mut prev: Option<(u64, Run)> = None;
        for (&s, &r) in &self.runs {
            assert!(
                r.len > 0 && r.len <= u32::MAX as u64 && r.refs > 0,
                "data table run at {s}: {r:?}"
            );
            if let Some((ps, pr)) = prev {
                assert!(ps + pr.len <= s, "data table runs overlap at {s}");
                assert!(
                    ps + pr.len < s || pr.refs != r.refs,
                    "data table runs at {ps} and {s} are not maximal"
                );
            }
            e.u64(s);
            e.u32(r.len as u32);
            e.u32(r.refs);
            prev = Some((s, r));
        }
        let c = crc_with_hole(&e.buf, TABLE_CRC_AT);
        e.put_u32_at(TABLE_CRC_AT, c);
        AlignedBuf::from_slice(&e.buf)
    }

    /// Bytes of the encoded table with `runs` runs.
    pub fn encoded_len(runs: u64) -> usize {
        TABLE_HEADER + runs as usize * TABLE_ENTRY
    }

    /// Parses and verifies a table read from byte `offset` of the device: `runs` runs (from the
    /// superblock), each inside `[data_start, dev_blocks)`, in order, not overlapping, maximal.
    pub fn decode(
        bytes: &[u8],
        runs: u64,
        data_start: u64,
        dev_blocks: u64,
        offset: u64,
    ) -> Result<RunMap> {
        let len = usize::try_from(runs)
            .ok()
            .and_then(|r| r.checked_mul(TABLE_ENTRY))
            .and_then(|b| b.checked_add(TABLE_HEADER))
            .filter(|&l| l <= bytes.len())
            .ok_or_else(|| Error::Corrupt("data table longer than its extent".into()))?;
        let stored = u32::from_le_bytes(
            bytes[TABLE_CRC_AT..TABLE_CRC_AT + 4]
                .try_into()
                .expect("4 bytes"),
        );
        if crc_with_hole(&bytes[..len], TABLE_CRC_AT) != stored {
            return Err(Error::Checksum {
                what: "data table".into(),
                offset,
            });
        }
        let mut d = Dec::new(&bytes[..len], "data table");
        if d.raw(4)? != TABLE_MAGIC {
            return Err(Error::Corrupt("data table: bad magic".into()));
        }
        if d.u16()? != TABLE_VERSION {
            return Err(Error::Corrupt("data table: unknown version".into()));
        }
        d.u16()?;
        if d.u64()? != runs {
            return Err(Error::Corrupt(
                "data table: run count differs from the superblock".into(),
            ));
        }
        d.raw(16)?;
        let mut map = RunMap::default();
        let mut prev: Option<(u64, Run)> = None;
        for _ in 0..runs {
            let s = d.u64()?;
            let r = Run {
                len: d.u32()? as u64,
                refs: d.u32()?,
            };
            let bad = r.len == 0
                || r.refs == 0
                || s < data_start
                || s.checked_add(r.len).is_none_or(|e| e > dev_blocks)
                || prev.is_some_and(|(ps, pr)| {
                    ps + pr.len > s || (ps + pr.len == s && pr.refs == r.refs)
                });
            if bad {
                return Err(Error::Corrupt(format!(
                    "data table: bad run of {} blocks at block {s}",
                    r.len
                )));
            }
            map.runs.insert(s, r);
            map.blocks += r.len;
            prev = Some((s, r));
        }
        d.finish()?;
        Ok(map)
    }
}

/// Consecutive block runs `(first, blocks)`, merged as they are pushed in increasing order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Runs(Vec<(u64, u64)>);

impl Runs {
    /// Adds `block`, extending the last run when it follows it.
    pub fn push(&mut self, block: u64) {
        match self.0.last_mut() {
            Some((s, n)) if *s + *n == block => *n += 1,
            _ => self.0.push((block, 1)),
        }
    }

    /// Blocks in all runs.
    pub fn blocks(&self) -> u64 {
        self.0.iter().map(|&(_, n)| n).sum()
    }

    /// The runs as extents.
    pub fn extents(&self) -> impl Iterator<Item = Extent> + '_ {
        self.0
            .iter()
            .map(|&(block, blocks)| Extent { block, blocks })
    }

    /// Moves every run of `other` to the end of this list.
    pub fn append(&mut self, other: &mut Runs) {
        self.0.append(&mut other.0);
    }
}

/// The engine's data table in memory: the counts, what was released and when it is freed, and
/// where the next data extent goes.
#[derive(Debug, Default)]
pub struct DataTable {
    /// References per block, as the tree in memory holds them.
    pub refs: RunMap,
    /// Blocks whose last reference went since the last checkpoint started (still allocated).
    released: Runs,
    /// Blocks released before the running checkpoint started: freed when it completes.
    freeing: Option<Runs>,
    /// The table the last completed checkpoint wrote.
    pub checkpointed_table: Option<Extent>,
    /// Blocks allocated for data being written, not yet referenced (a write in flight).
    pub writing: u64,
    /// Where the last data extent ended: the next one goes there if it is free.
    pub cursor: Option<u64>,
    /// While an open replays the log: the extents replayed records gave references to (the
    /// open frees the other extents the log names).
    pub replayed: Option<Vec<Extent>>,
}

impl DataTable {
    /// A table holding `refs`, written at `table` by the last checkpoint.
    pub fn new(refs: RunMap, table: Option<Extent>) -> DataTable {
        DataTable {
            refs,
            checkpointed_table: table,
            ..DataTable::default()
        }
    }

    /// Drops one reference to each block of `blocks`; those that had their last one are released.
    pub fn release(&mut self, blocks: &[u64]) {
        for &b in blocks {
            if self.refs.release(b) {
                self.released.push(b);
            }
        }
    }

    /// A replayed record's extent gets its references (see `replayed`).
    pub fn add_replayed(&mut self, e: Extent) {
        self.refs.add(e.block, e.blocks);
        self.replayed.get_or_insert_with(Vec::new).push(e);
    }

    /// Brings the counts down to `recount`, the references a rebuilt tree holds (a repair drops
    /// what sat in damaged nodes, and never adds a reference): blocks that lost theirs are
    /// released. Fails if the tree holds a reference the table does not count.
    pub fn settle_recount(&mut self, recount: &RunMap) -> Result<()> {
        for (start, len, refs) in recount.iter() {
            for b in start..start + len {
                if self.refs.refs(b) < refs {
                    return Err(Error::Corrupt(format!(
                        "the tree references data block {b} more often than the data table counts"
                    )));
                }
            }
        }
        let old: Vec<(u64, u64, u32)> = self.refs.iter().collect();
        let mut drop = Vec::new();
        for (start, len, refs) in old {
            for b in start..start + len {
                for _ in recount.refs(b)..refs {
                    drop.push(b);
                }
            }
        }
        self.release(&drop);
        Ok(())
    }

    /// Blocks released and not yet free (waiting for a checkpoint to complete).
    pub fn held_blocks(&self) -> u64 {
        self.released.blocks() + self.freeing.as_ref().map_or(0, Runs::blocks)
    }

    /// A checkpoint starts (writers held off): it takes what was released so far, to free when it
    /// completes, and the table to write, of the references its tree holds.
    pub fn begin_checkpoint(&mut self) -> AlignedBuf {
        assert!(self.freeing.is_none(), "two checkpoints at once");
        self.freeing = Some(std::mem::take(&mut self.released));
        self.refs.encode()
    }

    /// The checkpoint completed with its table at `table`: returns the extents to free (the
    /// blocks released before it started, and the previous table).
    pub fn complete_checkpoint(&mut self, table: Extent) -> Vec<Extent> {
        let freeing = self.freeing.take().expect("a checkpoint in progress");
        let mut out: Vec<Extent> = freeing.extents().collect();
        out.extend(self.checkpointed_table.replace(table));
        out
    }

    /// The checkpoint failed: what it took stays released until the next one.
    pub fn abort_checkpoint(&mut self) {
        if let Some(mut f) = self.freeing.take() {
            f.append(&mut self.released);
            self.released = f;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    #[test]
    fn counts_follow_a_plain_map_and_runs_stay_maximal() {
        for seed in 0..20u64 {
            let mut rng = SmallRng::seed_from_u64(seed);
            let mut m = RunMap::default();
            let mut plain = std::collections::BTreeMap::<u64, u32>::new();
            for step in 0..2000 {
                if rng.gen_bool(0.4) || plain.is_empty() {
                    let s = rng.gen_range(100..400u64);
                    let n = rng.gen_range(1..20u64);
                    m.add(s, n);
                    for b in s..s + n {
                        *plain.entry(b).or_default() += 1;
                    }
                } else {
                    let keys: Vec<u64> = plain.keys().copied().collect();
                    let b = keys[rng.gen_range(0..keys.len())];
                    let last = m.release(b);
                    let c = plain.get_mut(&b).unwrap();
                    *c -= 1;
                    assert_eq!(last, *c == 0, "seed {seed} step {step}");
                    if *c == 0 {
                        plain.remove(&b);
                    }
                }
                for b in 90..430 {
                    assert_eq!(
                        m.refs(b),
                        plain.get(&b).copied().unwrap_or(0),
                        "seed {seed} step {step} block {b}"
                    );
                }
                assert_eq!(m.blocks(), plain.len() as u64);
                let runs: Vec<_> = m.iter().collect();
                for w in runs.windows(2) {
                    let ((s, l, r), (t, _, q)) = (w[0], w[1]);
                    assert!(s + l < t || (s + l == t && r != q), "seed {seed}: {runs:?}");
                }
            }
            let enc = m.encode();
            let back = RunMap::decode(&enc, m.runs() as u64, 0, 1000, 0).unwrap();
            assert_eq!(back, m);
        }
    }

    #[test]
    fn the_table_is_checked_when_read() {
        let mut m = RunMap::default();
        m.add(10, 5);
        m.add(12, 1);
        m.add(30, 2);
        assert_eq!(m.runs(), 4);
        let enc = m.encode();
        assert_eq!(RunMap::decode(&enc, 4, 10, 100, 0).unwrap(), m);
        // A flipped bit, a wrong count, a run outside the data area.
        let mut bad = enc.to_vec();
        bad[TABLE_HEADER + 3] ^= 1;
        assert!(matches!(
            RunMap::decode(&bad, 4, 10, 100, 0),
            Err(Error::Checksum { .. })
        ));
        assert!(RunMap::decode(&enc, 3, 10, 100, 0).is_err());
        assert!(RunMap::decode(&enc, 4, 11, 100, 0).is_err());
        assert!(RunMap::decode(&enc, 4, 10, 31, 0).is_err());
    }

    #[test]
    fn released_blocks_are_freed_by_the_checkpoint_after_their_release() {
        let mut t = DataTable::default();
        t.refs.add(100, 4);
        t.release(&[101, 102]);
        assert_eq!(t.held_blocks(), 2);
        let _ = t.begin_checkpoint();
        // Released while the checkpoint runs: its table still names it, the next one frees it.
        t.release(&[103]);
        let freed = t.complete_checkpoint(Extent {
            block: 7,
            blocks: 1,
        });
        assert_eq!(
            freed,
            vec![Extent {
                block: 101,
                blocks: 2
            }]
        );
        assert_eq!(t.held_blocks(), 1);
        let _ = t.begin_checkpoint();
        t.abort_checkpoint();
        assert_eq!(t.held_blocks(), 1);
        let _ = t.begin_checkpoint();
        let freed = t.complete_checkpoint(Extent {
            block: 8,
            blocks: 1,
        });
        assert_eq!(
            freed,
            vec![
                Extent {
                    block: 103,
                    blocks: 1
                },
                Extent {
                    block: 7,
                    blocks: 1
                }
            ]
        );
    }
}
