//! A node's key bounds during a descent, and the *lift* of its keys (docs/SURGERY.md §2).
//!
//! A node reached through pivots that bound it to the full keys `[lo, hi)` may store its keys
//! without `lcp(lo, hi)`, their longest common prefix (its *prefix*): every full key inside the
//! bounds starts with it, and stripping it keeps key order. Nodes do not know their own bounds;
//! every walk that descends the tree carries a [`Bounds`] from the root down and derives each
//! child's with [`Bounds::descend`] (or [`Bounds::child`]), the only place that computes a lift.
//!
//! [`LIFT_KEYS`] turns lifting on (node layout version 2, flag "keys lifted"); off, every prefix
//! is empty and nodes store full keys.

use crate::node::Internal;

/// Whether nodes store their keys lifted. Off: every node's prefix is empty, stored keys are full
/// keys (the switch SURGERY.md increment 1a kept off).
pub(crate) const LIFT_KEYS: bool = true;

/// Length of the longest common prefix of `a` and `b`.
pub(crate) fn lcp(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The lift of a node whose bounds, in its parent's stored form, are `[lo, hi)` (`hi` `None`:
/// unbounded): the bytes it strips beyond its parent's prefix. An unbounded side gives 0.
pub(crate) fn lift_len(lo: &[u8], hi: Option<&[u8]>) -> usize {
    if !LIFT_KEYS {
        return 0;
    }
    hi.map_or(0, |h| lcp(lo, h))
}

/// Where a node lies in the key space: its prefix (full bytes) and its bounds in stored form
/// (without the prefix). The root's are empty and unbounded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Bounds {
    /// The full-key prefix the node's stored keys omit.
    prefix: Vec<u8>,
    /// Inclusive low bound, stored form (empty: unbounded, or equal to the prefix).
    lo: Vec<u8>,
    /// Exclusive high bound, stored form (`None`: unbounded).
    hi: Option<Vec<u8>>,
}

impl Bounds {
    /// The root's bounds: everything, prefix empty.
    pub(crate) fn root() -> Bounds {
        Bounds::default()
    }

    /// Back to the root's bounds, keeping the buffers (a query restarting from the root).
    pub(crate) fn reset_root(&mut self) {
        self.prefix.clear();
        self.lo.clear();
        self.hi = None;
    }

    /// The prefix the node's stored keys omit.
    pub(crate) fn prefix(&self) -> &[u8] {
        &self.prefix
    }

    /// Inclusive low bound, stored form.
    pub(crate) fn lo(&self) -> &[u8] {
        &self.lo
    }

    /// Exclusive high bound, stored form.
    pub(crate) fn hi(&self) -> Option<&[u8]> {
        self.hi.as_deref()
    }

    /// Inclusive low bound, full key.
    pub(crate) fn full_lo(&self) -> Vec<u8> {
        self.full(&self.lo)
    }

    /// Exclusive high bound, full key.
    pub(crate) fn full_hi(&self) -> Option<Vec<u8>> {
        self.hi.as_ref().map(|h| self.full(h))
    }

    /// A stored key with the prefix put back.
    pub(crate) fn full(&self, stored: &[u8]) -> Vec<u8> {
        let mut k = Vec::with_capacity(self.prefix.len() + stored.len());
        k.extend_from_slice(&self.prefix);
        k.extend_from_slice(stored);
        k
    }

    /// A full key inside the bounds, as the node stores it.
    pub(crate) fn lift<'k>(&self, full: &'k [u8]) -> &'k [u8] {
        assert!(
            full.starts_with(&self.prefix),
            "a key outside its node's prefix"
        );
        &full[self.prefix.len()..]
    }

    /// A full key clipped into the bounds (raised to `lo` or lowered to `hi`), as the node stores
    /// it: for range ends that may lie outside the node.
    pub(crate) fn lift_clipped(&self, full: &[u8]) -> Vec<u8> {
        let p = self.prefix.as_slice();
        let head = &full[..p.len().min(full.len())];
        match head.cmp(p) {
            std::cmp::Ordering::Less => self.lo.clone(),
            std::cmp::Ordering::Greater => self.hi.clone().unwrap_or_default(),
            std::cmp::Ordering::Equal => {
                let s = &full[p.len()..];
                if s < self.lo.as_slice() {
                    self.lo.clone()
                } else {
                    match &self.hi {
                        Some(h) if s > h.as_slice() => h.clone(),
                        _ => s.to_vec(),
                    }
                }
            }
        }
    }

    /// Whether a stored key lies in `[lo, hi)`.
    pub(crate) fn contains(&self, stored: &[u8]) -> bool {
        stored >= self.lo.as_slice() && self.hi.as_deref().is_none_or(|h| stored < h)
    }

    /// The bytes child `c` of `n` (a node with these bounds) strips beyond this node's prefix.
    pub(crate) fn extra(&self, n: &Internal, c: usize) -> usize {
        self.extra_of(&n.pivots, c)
    }

    /// [`Bounds::extra`] for a node given by its pivots only.
    pub(crate) fn extra_of(&self, pivots: &[Vec<u8>], c: usize) -> usize {
        let l: &[u8] = if c == 0 { &self.lo } else { &pivots[c - 1] };
        let h = match pivots.get(c) {
            Some(p) => Some(p.as_slice()),
            None => self.hi.as_deref(),
        };
        lift_len(l, h)
    }

    /// Child `c`'s bounds, for a node `n` with these bounds.
    pub(crate) fn child(&self, n: &Internal, c: usize) -> Bounds {
        self.child_of(&n.pivots, c)
    }

    /// [`Bounds::child`] for a node given by its pivots only (the pieces of a split).
    pub(crate) fn child_of(&self, pivots: &[Vec<u8>], c: usize) -> Bounds {
        let mut b = self.clone();
        b.descend_pivots(pivots, c);
        b
    }

    /// Moves these bounds from node `n` down to its child `c`, reusing their buffers (the point
    /// query's descent does not allocate once they have grown).
    pub(crate) fn descend(&mut self, n: &Internal, c: usize) {
        assert!(c < n.children.len(), "child {c} of {}", n.children.len());
        self.descend_pivots(&n.pivots, c);
    }

    /// [`Bounds::descend`] for a node given by its pivots only: the one place a lift is computed.
    fn descend_pivots(&mut self, pivots: &[Vec<u8>], c: usize) {
        assert!(c <= pivots.len(), "child {c} of {}", pivots.len() + 1);
        let e = self.extra_of(pivots, c);
        let add_lo = if c == 0 {
            &self.lo[..e]
        } else {
            &pivots[c - 1][..e]
        };
        self.prefix.extend_from_slice(add_lo);
        if c == 0 {
            self.lo.drain(..e);
        } else {
            self.lo.clear();
            self.lo.extend_from_slice(&pivots[c - 1][e..]);
        }
        if c < pivots.len() {
            let hi = self.hi.get_or_insert_with(Vec::new);
            hi.clear();
            hi.extend_from_slice(&pivots[c][e..]);
        } else if let Some(h) = &mut self.hi {
            h.drain(..e);
        }
        assert!(
            self.hi.as_deref().is_none_or(|h| self.lo.as_slice() < h),
            "a child with an empty range"
        );
        assert!(
            !LIFT_KEYS || self.hi.as_deref().is_none_or(|h| lcp(&self.lo, h) == 0),
            "a lift that is not maximal"
        );
    }

    /// The bytes a node with bounds `inner` (inside these) strips beyond this node's prefix:
    /// what its stored keys lack in this node's stored form.
    pub(crate) fn tail_of<'a>(&self, inner: &'a Bounds) -> &'a [u8] {
        assert!(
            inner.prefix.starts_with(&self.prefix),
            "bounds that are not inside these"
        );
        &inner.prefix[self.prefix.len()..]
    }

    /// Strips from a message key moving from a node into its child (which strips `extra` bytes
    /// more) those bytes, checking they are the child's prefix tail.
    pub(crate) fn strip(child: &Bounds, extra: usize, key: &mut Vec<u8>) {
        if extra == 0 {
            return;
        }
        let tail = &child.prefix[child.prefix.len() - extra..];
        assert_eq!(
            &key[..extra],
            tail,
            "a message moved into a child outside its prefix"
        );
        key.drain(..extra);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::BufSlot;

    fn internal(pivots: &[&[u8]]) -> Internal {
        Internal {
            pivots: pivots.iter().map(|p| p.to_vec()).collect(),
            children: (0..=pivots.len() as u64).collect(),
            buffers: (0..=pivots.len()).map(|_| BufSlot::empty()).collect(),
        }
    }

    #[test]
    fn lcp_counts_shared_bytes() {
        assert_eq!(lcp(b"abc", b"abd"), 2);
        assert_eq!(lcp(b"", b"abd"), 0);
        assert_eq!(lcp(b"ab", b"abd"), 2);
        assert_eq!(lcp(b"x", b"y"), 0);
    }

    #[test]
    fn root_is_unbounded_and_empty() {
        let r = Bounds::root();
        assert!(r.prefix().is_empty() && r.lo().is_empty() && r.hi().is_none());
        assert!(r.contains(b"") && r.contains(b"\xff\xff"));
        assert_eq!(r.lift(b"key"), b"key");
        assert_eq!(r.full(b"key"), b"key".to_vec());
    }

    #[test]
    fn descent_follows_the_pivots() {
        let n = internal(&[b"d/a/1", b"d/a/5", b"e"]);
        let root = Bounds::root();
        let c0 = root.child(&n, 0);
        assert_eq!(c0.full_lo(), b"".to_vec());
        assert_eq!(c0.full_hi(), Some(b"d/a/1".to_vec()));
        let c1 = root.child(&n, 1);
        assert_eq!(c1.full_lo(), b"d/a/1".to_vec());
        assert_eq!(c1.full_hi(), Some(b"d/a/5".to_vec()));
        assert!(c1.contains(c1.lift(b"d/a/3")));
        let c3 = root.child(&n, 3);
        assert_eq!(c3.full_lo(), b"e".to_vec());
        assert_eq!(c3.full_hi(), None);
        // In-place descent gives the same as `child`.
        let mut d = root.clone();
        d.descend(&n, 1);
        assert_eq!(d, c1);
        // The prefix is lcp(lo, hi) when lifting is on, empty when it is off.
        let want: &[u8] = if LIFT_KEYS { b"d/a/" } else { b"" };
        assert_eq!(c1.prefix(), want);
        assert_eq!(c3.prefix(), b"");
    }

    #[test]
    fn nested_descent_keeps_full_bounds() {
        let top = internal(&[b"d/a/", b"d/b/"]);
        let mid = Bounds::root().child(&top, 1);
        // Pivots of the child are stored relative to its prefix.
        let below = internal(&[mid.lift(b"d/a/m")]);
        let leaf = mid.child(&below, 1);
        assert_eq!(leaf.full_lo(), b"d/a/m".to_vec());
        assert_eq!(leaf.full_hi(), Some(b"d/b/".to_vec()));
        let first = mid.child(&below, 0);
        assert_eq!(first.full_lo(), b"d/a/".to_vec());
        assert_eq!(first.full_hi(), Some(b"d/a/m".to_vec()));
        let ex = mid.extra(&below, 0);
        assert_eq!(first.prefix().len(), mid.prefix().len() + ex);
    }

    #[test]
    fn clipping_lifts_range_ends() {
        let n = internal(&[b"d/a/1", b"d/a/5"]);
        let b = Bounds::root().child(&n, 1);
        assert_eq!(b.full(&b.lift_clipped(b"a")), b"d/a/1".to_vec());
        assert_eq!(b.full(&b.lift_clipped(b"d/a/3")), b"d/a/3".to_vec());
        assert_eq!(b.full(&b.lift_clipped(b"z")), b"d/a/5".to_vec());
        assert_eq!(b.full(&b.lift_clipped(b"d")), b"d/a/1".to_vec());
    }

    #[test]
    fn strip_removes_the_child_prefix_tail() {
        let n = internal(&[b"d/a/1", b"d/a/5"]);
        let root = Bounds::root();
        let c = root.child(&n, 1);
        let e = root.extra(&n, 1);
        let mut k = b"d/a/3".to_vec();
        Bounds::strip(&c, e, &mut k);
        assert_eq!(c.full(&k), b"d/a/3".to_vec());
    }
}
