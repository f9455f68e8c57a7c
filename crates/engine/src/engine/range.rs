//! Iterating over a key range one leaf at a time ([`RangeIter`]).

use std::collections::VecDeque;
use std::ops::Bound;

use super::data::Resolver;
use super::Inner;
use crate::error::Result;
use crate::node::{NodeId, ROOT_ID};
use crate::read::Target;

/// Out-of-line blocks one refill reads at most: it stops its leaf's walk there and goes on from
/// the next key at the next refill.
const REFILL_REFS: usize = 256;

/// Converts bounds to an inclusive low key and an exclusive high key (`None` low: empty range).
pub(super) fn normalize(lo: Bound<&[u8]>, hi: Bound<&[u8]>) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
    let lo = match lo {
        Bound::Included(k) => Some(k.to_vec()),
        Bound::Excluded(k) => {
            let mut v = k.to_vec();
            v.push(0);
            Some(v)
        }
        Bound::Unbounded => Some(Vec::new()),
    };
    let hi = match hi {
        Bound::Included(k) => {
            let mut v = k.to_vec();
            v.push(0);
            Some(v)
        }
        Bound::Excluded(k) => Some(k.to_vec()),
        Bound::Unbounded => None,
    };
    match (&lo, &hi) {
        (Some(l), Some(h)) if l >= h => (None, hi),
        _ => (lo, hi),
    }
}

/// An iterator over a key range, one leaf at a time.
pub struct RangeIter<'a> {
    inner: &'a Inner,
    /// The root of the tree read (the live one or a snapshot's).
    root: NodeId,
    lo: Vec<u8>,
    hi: Option<Vec<u8>>,
    forward: bool,
    /// Next position: forward, the inclusive start; reverse, the exclusive end.
    cursor: Option<Option<Vec<u8>>>,
    buf: VecDeque<(Vec<u8>, Vec<u8>)>,
    /// Leaves visited so far (forward): read-ahead starts from the second.
    leaves: usize,
}

impl<'a> RangeIter<'a> {
    pub(super) fn new(
        inner: &'a Inner,
        root: NodeId,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
        forward: bool,
    ) -> RangeIter<'a> {
        let (lo, hi) = normalize(lo, hi);
        let cursor = lo
            .as_ref()
            .map(|l| if forward { Some(l.clone()) } else { hi.clone() });
        RangeIter {
            inner,
            root,
            lo: lo.unwrap_or_default(),
            hi,
            forward,
            cursor,
            buf: VecDeque::new(),
            leaves: 0,
        }
    }

    fn refill(&mut self) -> Result<()> {
        let inner = self.inner;
        let tree = &inner.tree;
        while self.buf.is_empty() {
            let Some(cur) = self.cursor.take() else {
                return Ok(());
            };
            // Entries are held (copied) with the references among them, whose blocks are read
            // once the walk stops: at its leaf's end, or after `REFILL_REFS` references.
            let mut held = Resolver::default();
            let mut last: Option<Vec<u8>> = None;
            let mut push = |k: &[u8], v: crate::dataref::Stored<'_>| {
                held.push(k, v);
                if held.refs() >= REFILL_REFS {
                    last = Some(k.to_vec());
                    return false;
                }
                true
            };
            if self.forward {
                let start = cur.expect("forward cursor");
                let chunk = tree.chunk_at(
                    self.root,
                    Target::AtOrAfter(&start),
                    &start,
                    self.hi.as_deref(),
                )?;
                let whole = chunk.walk(&start, self.hi.as_deref(), true, &mut push);
                self.cursor = match (&chunk.hi, last) {
                    (_, Some(mut k)) if !whole => {
                        k.push(0);
                        Some(Some(k))
                    }
                    (Some(h), _) if self.hi.as_ref().is_none_or(|e| h < e) => Some(Some(h.clone())),
                    _ => None,
                };
                // A forward iteration past its first leaf is sequential: read the next leaves
                // ahead while the caller consumes this one.
                if let Some(Some(h)) = &self.cursor {
                    if self.leaves > 0 && self.root == ROOT_ID {
                        tree.read_ahead_from(h);
                    }
                }
                self.leaves += 1;
            } else {
                let chunk = tree.chunk_at(
                    self.root,
                    Target::Before(cur.as_deref()),
                    &self.lo,
                    cur.as_deref(),
                )?;
                let whole = chunk.walk(&self.lo, cur.as_deref(), false, &mut push);
                self.cursor = match last {
                    Some(k) if !whole => Some(Some(k)),
                    _ if !chunk.lo.is_empty() && chunk.lo > self.lo => Some(Some(chunk.lo.clone())),
                    _ => None,
                };
            }
            self.buf.extend(held.resolve_owned(inner)?);
            tree.make_room()?;
        }
        Ok(())
    }
}

impl Iterator for RangeIter<'_> {
    type Item = Result<(Vec<u8>, Vec<u8>)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.buf.is_empty() {
            if let Err(e) = self.refill() {
                self.inner.note_damage(&e);
                self.cursor = None;
                return Some(Err(e));
            }
        }
        self.buf.pop_front().map(Ok)
    }
}
