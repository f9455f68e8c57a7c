//! The keys a batch's prefix moves and copies would produce, checked before the batch is logged.
//!
//! A prefix operation rewrites every key under `from` into the same key under `to`. When `to` is
//! longer, every moved key grows, and one of them may pass the format's key limit. A batch that
//! would write such a key must be refused before its record reaches the log: a logged record is
//! replayed after a crash, and its replay must not fail.
//!
//! The batch is checked as a whole, in order, against the tree as it is when it will be applied
//! (writers are held off meanwhile, so the tree the check reads is the tree the expansion, and
//! replay, will read). The keys an operation reads are the tree's keys under its source, plus those
//! earlier operations of the batch put or moved there, minus those they removed wholesale (a range
//! delete or a move of an enclosing prefix). Keys removed one at a time are still counted: the
//! result is never smaller than the truth, and exact for what the file system builds. Only lengths
//! matter, so the tree is asked for the longest key under a prefix: one scan per source.
//!
//! Moves that do not lengthen keys need no scan: the keys they produce are no longer than keys
//! that are already within the limit. A range move ([`Op::RangeMove`]) produces the keys a prefix
//! move does and is checked the same way (its empty destination is checked in `destination.rs`).

use std::collections::HashMap;

use crate::error::{Error, Result};
use crate::ops::{prefix_end, Op};

/// The longest key under a prefix in the tree as it is (`None`: no key).
pub(crate) type LongestInTree<'a> = dyn FnMut(&[u8]) -> Result<Option<usize>> + 'a;

/// What the moving operations of a batch do: (source, destination, whether the source empties).
pub(crate) fn moving(op: &Op) -> Option<(&[u8], &[u8], bool)> {
    match op {
        Op::MovePrefix { from, to } | Op::RangeMove { from, to, .. } => Some((from, to, true)),
        Op::CopyPrefix { from, to } | Op::RangeClone { from, to, .. } => Some((from, to, false)),
        _ => None,
    }
}

/// Checks that every key the prefix operations of `ops`, applied in order, would produce is at most
/// `max_key` bytes long. [`Error::KeyTooLong`] (the longest such key) otherwise.
pub(crate) fn check_keys(ops: &[Op], max_key: usize, tree: &mut LongestInTree<'_>) -> Result<()> {
    let mut c = Check::new(ops, max_key, tree);
    for (i, op) in ops.iter().enumerate() {
        let Some((from, to, _)) = moving(op) else {
            continue;
        };
        if to.len() <= from.len() {
            continue;
        }
        if let Some(longest) = c.longest_under(from, i)? {
            let produced = longest - from.len() + to.len();
            if produced > max_key {
                return Err(Error::KeyTooLong {
                    len: produced,
                    max: max_key,
                });
            }
        }
    }
    Ok(())
}

/// Whether an error is one [`check_keys`] or operation validation returns: the batch was refused
/// before anything was applied.
pub(crate) fn is_refusal(e: &Error) -> bool {
    matches!(
        e,
        Error::KeyTooLong { .. }
            | Error::ValueTooLarge { .. }
            | Error::InvalidArgument(_)
            | Error::SnapshotExists(_)
            | Error::NoSuchSnapshot(_)
    )
}

struct Check<'a, 'b> {
    ops: &'a [Op],
    max_key: usize,
    tree: &'a mut LongestInTree<'b>,
    memo: HashMap<(Vec<u8>, usize), Option<usize>>,
}

impl<'a, 'b> Check<'a, 'b> {
    fn new(ops: &'a [Op], max_key: usize, tree: &'a mut LongestInTree<'b>) -> Check<'a, 'b> {
        Check {
            ops,
            max_key,
            tree,
            memo: HashMap::new(),
        }
    }

    /// The longest key under `p` just before `ops[t]` is applied (`None`: no key).
    fn longest_under(&mut self, p: &[u8], t: usize) -> Result<Option<usize>> {
        if let Some(&known) = self.memo.get(&(p.to_vec(), t)) {
            return Ok(known);
        }
        let r = self.compute(p, t)?;
        self.memo.insert((p.to_vec(), t), r);
        Ok(r)
    }

    fn compute(&mut self, p: &[u8], t: usize) -> Result<Option<usize>> {
        let ops = self.ops;
        let mut best: Option<usize> = None;
        // Newest first: an operation that removed the whole range under `p` hides everything older.
        for j in (0..t).rev() {
            match &ops[j] {
                Op::Put { key, .. } | Op::Upsert { key, .. } => {
                    if key.starts_with(p) {
                        best = best.max(Some(key.len()));
                    }
                }
                Op::PutBlocks { keys, .. } => {
                    for key in keys.iter().filter(|k| k.starts_with(p)) {
                        best = best.max(Some(key.len()));
                    }
                }
                Op::Delete { .. } | Op::SnapshotCreate { .. } | Op::SnapshotDelete { .. } => {}
                Op::RangeDelete { lo, hi } => {
                    if lo.as_slice() <= p && prefix_end(p, self.max_key) <= *hi {
                        return Ok(best);
                    }
                }
                Op::MovePrefix { .. }
                | Op::CopyPrefix { .. }
                | Op::RangeMove { .. }
                | Op::RangeClone { .. } => {
                    let (from, to, empties) = moving(&ops[j]).expect("a moving operation");
                    // The keys it wrote under `p` came from its source's keys under this prefix.
                    let source = if to.starts_with(p) {
                        Some(from.to_vec())
                    } else if p.starts_with(to) {
                        Some([from, &p[to.len()..]].concat())
                    } else {
                        None
                    };
                    if let Some(source) = source {
                        if let Some(l) = self.longest_under(&source, j)? {
                            best = best.max(Some(l - from.len() + to.len()));
                        }
                    }
                    // A move empties its source range (never overlapping its destination).
                    if empties && p.starts_with(from) {
                        return Ok(best);
                    }
                }
            }
        }
        Ok(best.max((self.tree)(p)?))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn mv(from: &str, to: &str) -> Op {
        Op::MovePrefix {
            from: from.into(),
            to: to.into(),
        }
    }

    fn cp(from: &str, to: &str) -> Op {
        Op::CopyPrefix {
            from: from.into(),
            to: to.into(),
        }
    }

    fn put(key: &str) -> Op {
        Op::Put {
            key: key.into(),
            value: Vec::new(),
        }
    }

    /// Checks `ops` against a tree holding `keys`, with a key limit of `max`; also counts scans.
    fn check(keys: &[&str], ops: &[Op], max: usize) -> (Result<()>, usize) {
        let set: BTreeSet<Vec<u8>> = keys.iter().map(|k| k.as_bytes().to_vec()).collect();
        let mut scans = 0;
        let mut longest = |p: &[u8]| -> Result<Option<usize>> {
            scans += 1;
            Ok(set.iter().filter(|k| k.starts_with(p)).map(Vec::len).max())
        };
        let r = check_keys(ops, max, &mut longest);
        (r, scans)
    }

    fn too_long(r: Result<()>) -> usize {
        match r {
            Err(Error::KeyTooLong { len, .. }) => len,
            other => panic!("expected KeyTooLong, got {other:?}"),
        }
    }

    #[test]
    fn a_growing_move_is_checked_against_the_longest_moved_key() {
        let keys = ["a/1", "a/12345", "b/x"];
        // a/12345 (7 bytes) becomes longer/12345 (12 bytes).
        assert!(check(&keys, &[mv("a/", "longer/")], 12).0.is_ok());
        assert_eq!(too_long(check(&keys, &[mv("a/", "longer/")], 11).0), 12);
        assert_eq!(too_long(check(&keys, &[cp("a/", "longer/")], 11).0), 12);
        // Nothing to move: nothing can grow.
        assert!(check(&keys, &[mv("c/", "much-longer/")], 4).0.is_ok());
    }

    #[test]
    fn moves_that_do_not_grow_keys_read_nothing() {
        let keys = ["long/1", "long/2"];
        let (r, scans) = check(&keys, &[mv("long/", "s/"), mv("s/", "t/")], 6);
        assert!(r.is_ok());
        assert_eq!(scans, 0);
    }

    #[test]
    fn an_exchange_through_a_short_temporary_sees_the_final_lengths() {
        // Swap a/ (deep keys) and bb/ through t/: the keys end as long as the names say.
        let keys = ["a/123456", "bb/1"];
        let swap = [mv("a/", "t/"), mv("bb/", "a/"), mv("t/", "bb/")];
        // a/123456 ends as bb/123456 (9 bytes).
        assert!(check(&keys, &swap, 9).0.is_ok());
        assert_eq!(too_long(check(&keys, &swap, 8).0), 9);
        // Through a longer temporary the intermediate keys grow past what the final ones need.
        let long = [
            mv("a/", "tmp-long/"),
            mv("bb/", "a/"),
            mv("tmp-long/", "bb/"),
        ];
        assert_eq!(too_long(check(&keys, &long, 9).0), 15);
    }

    #[test]
    fn keys_put_or_moved_in_earlier_count_and_removed_ranges_do_not() {
        // A put under the source earlier in the batch moves along.
        let ops = [put("a/0123456789"), mv("a/", "aaaa/")];
        assert_eq!(too_long(check(&["a/1"], &ops, 12).0), 15);
        // A range delete of the whole source before the move: nothing of the tree moves.
        let ops = [
            Op::RangeDelete {
                lo: b"a/".to_vec(),
                hi: b"a0".to_vec(),
            },
            mv("a/", "aaaa/"),
        ];
        assert!(check(&["a/0123456789"], &ops, 12).0.is_ok());
        // A move out of an enclosing prefix empties it too.
        let ops = [mv("a", "z"), mv("a/", "aaaa/")];
        assert!(check(&["a/0123456789"], &ops, 12).0.is_ok());
        // Keys moved into a range that holds the source: only those that land under it count
        // (s/x/1 becomes a/x/1 and then a/xyz/1; s/y/22 lands elsewhere).
        let ops = [mv("s/", "a/"), mv("a/x/", "a/xyz/")];
        let keys = ["s/x/1", "s/y/22", "a/y/0"];
        assert!(check(&keys, &ops, 7).0.is_ok());
        assert_eq!(too_long(check(&keys, &ops, 6).0), 7);
    }

    #[test]
    fn chains_of_moves_are_followed_to_the_tree() {
        let ops = [mv("a/", "bb/"), mv("bb/", "ccc/"), cp("ccc/", "dddd/")];
        assert!(check(&["a/12"], &ops, 7).0.is_ok());
        assert_eq!(too_long(check(&["a/12"], &ops, 6).0), 7);
    }
}
