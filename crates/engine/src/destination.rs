//! The destination of a range move must hold no key when the move applies (docs/SURGERY.md §3.1):
//! checked before the batch is logged, against the tree as it is (writers are held off) and the
//! batch's earlier operations.
//!
//! Going back from the move through the batch: a key put under the destination makes it occupied;
//! a range delete or a move out of all of it empties it (nothing older counts); one of part of it
//! empties that part; a move or copy into it brings what its source held then (the same question,
//! asked of the source at that point). What remains is asked of the tree: is there a key under the
//! destination outside the parts emptied? A key deleted one at a time earlier in the batch still
//! counts, so the check may refuse a batch whose destination would be empty (the file system
//! empties destinations with range deletes and moves), never accept one whose destination is not.

use std::collections::HashMap;

use crate::error::{Error, Result};
use crate::ops::{prefix_end, Op};
use crate::prefix::moving;

/// Whether the tree holds a live key in `[lo, hi)`.
pub(crate) type AnyInTree<'a> = dyn FnMut(&[u8], &[u8]) -> Result<bool> + 'a;

/// Checks that the destination of every range move of `ops` holds no key when the move applies.
/// [`Error::InvalidArgument`] otherwise, before anything is logged.
pub(crate) fn check_destinations(
    ops: &[Op],
    max_key: usize,
    tree: &mut AnyInTree<'_>,
) -> Result<()> {
    let mut o = Occupancy {
        ops,
        max_key,
        tree,
        memo: HashMap::new(),
    };
    for (i, op) in ops.iter().enumerate() {
        if let Op::RangeMove { to, .. } | Op::RangeClone { to, .. } = op {
            if o.occupied(to, i)? {
                let what = if matches!(op, Op::RangeMove { .. }) {
                    "move"
                } else {
                    "clone"
                };
                return Err(Error::InvalidArgument(format!(
                    "range {what} into a non-empty range"
                )));
            }
        }
    }
    Ok(())
}

struct Occupancy<'a, 'b> {
    ops: &'a [Op],
    max_key: usize,
    tree: &'a mut AnyInTree<'b>,
    memo: HashMap<(Vec<u8>, usize), bool>,
}

/// Whether `[lo, hi)` lies inside one of `ranges`.
fn covered(ranges: &[(Vec<u8>, Vec<u8>)], lo: &[u8], hi: &[u8]) -> bool {
    ranges
        .iter()
        .any(|(a, b)| a.as_slice() <= lo && hi <= b.as_slice())
}

impl Occupancy<'_, '_> {
    /// Whether a key may lie under `p` just before `ops[t]` applies.
    fn occupied(&mut self, p: &[u8], t: usize) -> Result<bool> {
        if let Some(&known) = self.memo.get(&(p.to_vec(), t)) {
            return Ok(known);
        }
        let r = self.compute(p, t)?;
        self.memo.insert((p.to_vec(), t), r);
        Ok(r)
    }

    fn compute(&mut self, p: &[u8], t: usize) -> Result<bool> {
        let ops = self.ops;
        let end = prefix_end(p, self.max_key);
        // Parts of `p`'s range emptied by operations newer than the one looked at.
        let mut gone: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        for j in (0..t).rev() {
            match &ops[j] {
                Op::Put { key, .. } | Op::Upsert { key, .. } => {
                    let k = key.as_slice();
                    if k.starts_with(p) && !gone.iter().any(|(a, b)| a.as_slice() <= k && k < b) {
                        return Ok(true);
                    }
                }
                Op::PutBlocks { keys, .. } => {
                    let live = |k: &[u8]| {
                        k.starts_with(p) && !gone.iter().any(|(a, b)| a.as_slice() <= k && k < b)
                    };
                    if keys.iter().any(|k| live(k)) {
                        return Ok(true);
                    }
                }
                Op::Delete { .. } | Op::SnapshotCreate { .. } | Op::SnapshotDelete { .. } => {}
                Op::RangeDelete { lo, hi } => {
                    if lo.as_slice() <= p && hi.as_slice() >= end.as_slice() {
                        return Ok(false);
                    }
                    let (a, b) = (lo.as_slice().max(p), hi.as_slice().min(&end));
                    if a < b {
                        gone.push((a.to_vec(), b.to_vec()));
                    }
                }
                op => {
                    let (from, to, empties) = moving(op).expect("a moving operation");
                    // What it wrote under `p` came from its source under this prefix.
                    let into = if to.starts_with(p) {
                        Some((from.to_vec(), to.to_vec()))
                    } else if p.starts_with(to) {
                        Some(([from, &p[to.len()..]].concat(), p.to_vec()))
                    } else {
                        None
                    };
                    if let Some((source, dest)) = into {
                        let dest_end = prefix_end(&dest, self.max_key);
                        if !covered(&gone, &dest, &dest_end) && self.occupied(&source, j)? {
                            return Ok(true);
                        }
                    }
                    if empties && p.starts_with(from) {
                        return Ok(false);
                    }
                    if empties && from.starts_with(p) {
                        gone.push((from.to_vec(), prefix_end(from, self.max_key)));
                    }
                }
            }
        }
        // The tree's keys under `p`, outside the parts emptied: gap by gap.
        gone.sort();
        let mut at = p.to_vec();
        for (a, b) in gone {
            if at < a && (self.tree)(&at, &a)? {
                return Ok(true);
            }
            at = at.max(b);
        }
        Ok(at < end && (self.tree)(&at, &end)?)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn mv(from: &str, to: &str) -> Op {
        Op::RangeMove {
            from: from.into(),
            to: to.into(),
            copy_max: 0,
        }
    }

    fn check(keys: &[&str], ops: &[Op]) -> bool {
        let set: BTreeSet<Vec<u8>> = keys.iter().map(|k| k.as_bytes().to_vec()).collect();
        let mut any = |lo: &[u8], hi: &[u8]| -> Result<bool> {
            Ok(set.range(lo.to_vec()..hi.to_vec()).next().is_some())
        };
        check_destinations(ops, 64, &mut any).is_ok()
    }

    #[test]
    fn a_destination_holding_a_key_is_refused() {
        assert!(check(&["a/1"], &[mv("a/", "b/")]));
        assert!(!check(&["a/1", "b/1"], &[mv("a/", "b/")]));
        // A key put there earlier in the batch, or moved there.
        let put = Op::Put {
            key: b"b/x".to_vec(),
            value: vec![],
        };
        assert!(!check(&["a/1"], &[put, mv("a/", "b/")]));
        assert!(!check(&["a/1", "c/1"], &[mv("c/", "b/"), mv("a/", "b/")]));
        // Moving an empty range there brings nothing.
        assert!(check(&["a/1"], &[mv("c/", "b/"), mv("a/", "b/")]));
    }

    #[test]
    fn ranges_emptied_earlier_in_the_batch_do_not_count() {
        // All of it, by a range delete or a move out.
        let del = |lo: &str, hi: &str| Op::RangeDelete {
            lo: lo.into(),
            hi: hi.into(),
        };
        assert!(check(&["a/1", "b/1"], &[del("b/", "b0"), mv("a/", "b/")]));
        assert!(check(&["a/1", "b/1"], &[mv("b/", "c/"), mv("a/", "b/")]));
        // Part of it, by a move out of a nested range (a parked file going home) and a range
        // delete of the rest.
        let keys = ["a/1", "b/x/1", "b/y"];
        assert!(!check(&keys, &[mv("b/x/", "h/"), mv("a/", "b/")]));
        assert!(check(
            &keys,
            &[mv("b/x/", "h/"), del("b/y", "b/z"), mv("a/", "b/")]
        ));
        // An exchange through a third place.
        let keys = ["a/1", "b/1"];
        assert!(check(
            &keys,
            &[mv("a/", "t/"), mv("b/", "a/"), mv("t/", "b/")]
        ));
        // A key deleted alone still counts.
        let gone = Op::Delete {
            key: b"b/1".to_vec(),
        };
        assert!(!check(&keys, &[gone, mv("a/", "b/")]));
    }
}
