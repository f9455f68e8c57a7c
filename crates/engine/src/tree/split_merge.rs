//! Splits and merges: keeping the root's shape (split a big root leaf or an over-wide root,
//! collapse a root with one child) and each child's after a flush (split, merge with a sibling).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::{Bounds, Need, Tree};
use crate::cache::{CachedNode, WriteGuard};
use crate::error::Result;
use crate::node::{Body, BufSlot, Internal, Leaf, Node, NodeId};

impl Tree {
    /// Loads and pins a sibling of child `c` (the one a merge of `c` would use), fully resident.
    pub(super) fn pin_sibling(&self, pg: &WriteGuard, c: usize) -> Result<Option<Arc<CachedNode>>> {
        let Body::Internal(pn) = &pg.body else {
            return Ok(None);
        };
        match default_sibling(pn, c) {
            Some(s) => self.pin_child_whole(pn, s).map(Some),
            None => Ok(None),
        }
    }

    /// Loads and pins child `s` of `pn`, fully resident.
    pub(super) fn pin_child_whole(&self, pn: &Internal, s: usize) -> Result<Arc<CachedNode>> {
        let id = pn.children[s];
        let scn = match self.cache.get(id) {
            Some(x) => x,
            None => self.load_with(id, true)?,
        };
        if !scn.read().fully_resident() {
            self.load_partitions(&scn, None)?;
        }
        Ok(scn)
    }

    /// Keeps the root's shape within bounds: splits an oversized root leaf or an over-wide root
    /// (the root keeps its id; its contents move into new children) and collapses a root with a
    /// single child. `Err(need)` asks the caller to load something and retry.
    pub(super) fn fix_root(
        &self,
        root: &Arc<CachedNode>,
        rg: &mut WriteGuard,
    ) -> Result<std::result::Result<bool, Need>> {
        let f = &self.format;
        let height = rg.height;
        let max_msn = rg.max_msn;
        enum Fix {
            SplitLeaf,
            SplitInternal,
            Collapse(NodeId),
            None,
        }
        let fix = match &rg.body {
            Body::Leaf(l) if l.bytes() > f.node_size => Fix::SplitLeaf,
            Body::Internal(n) if n.children.len() > f.max_fanout => Fix::SplitInternal,
            Body::Internal(n) if n.children.len() == 1 && n.buffers[0].is_empty() => {
                Fix::Collapse(n.children[0])
            }
            _ => Fix::None,
        };
        match fix {
            Fix::None => Ok(Ok(false)),
            Fix::SplitLeaf => {
                self.begin_modify(root, rg);
                let Body::Leaf(l) = &mut rg.body else {
                    unreachable!()
                };
                let pieces = l.split_preferring(f, &self.split_boundaries.read());
                let first = std::mem::replace(l, Leaf::empty());
                // The root's prefix is empty: so are the pieces', until re-lifted.
                let leaf = |body| Node {
                    height: 0,
                    max_msn,
                    body,
                    prefix: Vec::new(),
                };
                let mut first = leaf(Body::Leaf(first));
                let mut rest: Vec<(Vec<u8>, Node)> = pieces
                    .into_iter()
                    .map(|(low, l)| (low, leaf(Body::Leaf(l))))
                    .collect();
                self.counters
                    .leaf_splits
                    .fetch_add(rest.len() as u64, Ordering::Relaxed);
                // The pieces moved out of the root: count it empty before counting them, or the
                // accounted peak holds the root's contents twice (docs/DESIGN.md, Cache).
                self.cache.remeasure(root, rg);
                rg.body = Body::Internal(self.new_root_body(&mut first, &mut rest));
                rg.height = 1;
                self.end_modify(root, rg);
                Ok(Ok(true))
            }
            Fix::SplitInternal => {
                self.begin_modify(root, rg);
                let Body::Internal(n) = &mut rg.body else {
                    unreachable!()
                };
                let all = std::mem::replace(
                    n,
                    Internal {
                        pivots: vec![],
                        children: vec![],
                        buffers: vec![],
                    },
                );
                let (first, rest) = split_internal(all, f.max_fanout, true);
                let int = |body| Node {
                    height,
                    max_msn,
                    body,
                    prefix: Vec::new(),
                };
                let mut first = int(Body::Internal(first));
                let mut rest: Vec<(Vec<u8>, Node)> = rest
                    .into_iter()
                    .map(|(low, n)| (low, int(Body::Internal(n))))
                    .collect();
                self.counters
                    .internal_splits
                    .fetch_add(rest.len() as u64, Ordering::Relaxed);
                self.cache.remeasure(root, rg);
                rg.body = Body::Internal(self.new_root_body(&mut first, &mut rest));
                rg.height = height + 1;
                self.end_modify(root, rg);
                Ok(Ok(true))
            }
            Fix::Collapse(cid) => {
                // The root takes the child's contents: a shared child is copied first.
                let cid = if self.is_shared(cid) {
                    self.own_child(root, rg, 0)?
                } else {
                    cid
                };
                let Some(ccn) = self.cache.get(cid) else {
                    return Ok(Err(Need::Node(cid)));
                };
                let mut cg = ccn.write();
                if !cg.fully_resident() {
                    drop(cg);
                    return Ok(Err(Need::Partitions(ccn)));
                }
                self.begin_modify(root, rg);
                self.begin_modify(&ccn, &cg);
                let body = std::mem::replace(&mut cg.body, Body::Leaf(Leaf::empty()));
                rg.height = cg.height;
                rg.max_msn = rg.max_msn.max(cg.max_msn);
                rg.body = body;
                assert!(rg.prefix.is_empty(), "the root's prefix is empty");
                self.delete_node(&ccn, &mut cg)?;
                self.end_modify(root, rg);
                self.counters.merges.fetch_add(1, Ordering::Relaxed);
                Ok(Ok(true))
            }
        }
    }

    /// The root's new body after a root split: the pieces (the root's former contents, in the
    /// root's form, whose prefix is empty) become its children, each re-lifted to its prefix.
    fn new_root_body(&self, first: &mut Node, rest: &mut Vec<(Vec<u8>, Node)>) -> Internal {
        let root = Bounds::root();
        let pivots = relift_pieces(&root, first, rest, &self.counters.leaf_bytes_relifted);
        let first = std::mem::replace(first, Node::empty_leaf());
        let slot = |n: &Node| BufSlot::empty().with_longest(slot_bound(&root, n));
        let mut buffers = vec![slot(&first)];
        let mut children = vec![self.new_node(first)];
        for (_, node) in rest.drain(..) {
            buffers.push(slot(&node));
            children.push(self.new_node(node));
        }
        Internal {
            pivots,
            children,
            buffers,
        }
    }

    /// Splits an oversized child, or merges an undersized one with a sibling when that is cheap
    /// (sibling resident). Both latches are held. Returns whether the child still exists.
    pub(super) fn restructure_child(
        &self,
        pg: &mut WriteGuard,
        pb: &Bounds,
        c: usize,
        ccn: &Arc<CachedNode>,
        cg: &mut WriteGuard,
    ) -> Result<bool> {
        if self.split_child(pg, pb, c, ccn, cg) {
            return Ok(true);
        }
        let f = &self.format;
        let under = match &cg.body {
            Body::Leaf(l) => l.bytes() < f.node_size / 4,
            Body::Internal(n) => n.children.len() < f.min_fanout(),
        };
        if !under {
            return Ok(true);
        }
        self.merge_child(pg, pb, c, ccn, cg)
    }

    /// Merges child `c` (its buffer in the parent empty) with a sibling when the sibling is
    /// resident and the two fit in one node comfortably. Both latches are held. Returns whether
    /// the child still exists.
    pub(super) fn merge_child(
        &self,
        pg: &mut WriteGuard,
        pb: &Bounds,
        c: usize,
        ccn: &Arc<CachedNode>,
        cg: &mut WriteGuard,
    ) -> Result<bool> {
        let Body::Internal(pn) = &pg.body else {
            unreachable!()
        };
        match default_sibling(pn, c) {
            Some(s) => self.merge_child_with(pg, pb, c, s, ccn, cg),
            None => Ok(true),
        }
    }

    /// [`Tree::merge_child`] with the sibling `s` (`c - 1` or `c + 1`) chosen by the caller.
    pub(super) fn merge_child_with(
        &self,
        pg: &mut WriteGuard,
        pb: &Bounds,
        c: usize,
        s: usize,
        ccn: &Arc<CachedNode>,
        cg: &mut WriteGuard,
    ) -> Result<bool> {
        let Body::Internal(pn) = &pg.body else {
            unreachable!()
        };
        assert!(
            pn.buffers[c].is_empty(),
            "a child is merged only with nothing buffered for it"
        );
        assert!(
            s + 1 == c || s == c + 1,
            "child {c} merged with {s}, not a sibling"
        );
        assert!(
            s < pn.children.len(),
            "sibling {s} of {}",
            pn.children.len()
        );
        // A shared sibling is left as it is (merging is never needed).
        if self.is_shared(pn.children[s]) {
            return Ok(true);
        }
        let Some(scn) = self.cache.get(pn.children[s]) else {
            return Ok(true);
        };
        let mut sg = scn.write();
        if !sg.fully_resident() || sg.height != cg.height {
            return Ok(true);
        }
        if !self.merge_fits(cg, &sg, pn.buffers[s].bytes()) {
            return Ok(true);
        }
        self.begin_modify(&scn, &sg);
        // The sibling must receive its pending messages first: after the merge both halves share one
        // buffer slot, which must hold only messages newer than everything below it.
        let Body::Internal(pn) = &mut pg.body else {
            unreachable!()
        };
        let sbuf = pn.buffers[s].take();
        pn.buffers[s].raise_longest(sbuf.longest);
        if !sbuf.is_empty() {
            self.counters.flushes.fetch_add(1, Ordering::Relaxed);
            self.counters
                .bytes_flushed
                .fetch_add(sbuf.bytes as u64, Ordering::Relaxed);
            let (sb, extra) = (pb.child(pn, s), pb.extra(pn, s));
            self.deliver(sbuf, &mut sg, &sb, extra)?;
        }
        let (left_is_child, li) = if s > c { (true, c) } else { (false, s) };
        let halves = (pb.child(pn, li), pb.child(pn, li + 1));
        let mut pivot = pn.pivots.remove(li);
        pn.children.remove(li + 1);
        let gone = pn.buffers.remove(li + 1);
        // The merged child holds the keys of both.
        pn.buffers[li].longest = pn.buffers[li].longest.max(gone.longest);
        // The merged node's prefix is the common part of the halves' (never longer): both are
        // un-lifted to it, and the pivot between them goes down in its form.
        let merged = pb.child(pn, li);
        let head = pb.tail_of(&merged);
        assert!(pivot.starts_with(head), "a pivot outside its node's prefix");
        pivot.drain(..head.len());
        let (lcn, lg, rcn, rg): (
            &Arc<CachedNode>,
            &mut WriteGuard,
            &Arc<CachedNode>,
            &mut WriteGuard,
        ) = if left_is_child {
            (ccn, cg, &scn, &mut sg)
        } else {
            (&scn, &mut sg, ccn, cg)
        };
        lg.adopt_prefix(halves.0.prefix());
        rg.adopt_prefix(halves.1.prefix());
        let mut right_body = std::mem::replace(&mut rg.body, Body::Leaf(Leaf::empty()));
        let (lt, rt) = (merged.tail_of(&halves.0), merged.tail_of(&halves.1));
        self.counters.leaf_bytes_relifted.fetch_add(
            leaf_relift_bytes(&lg.body, lt) + leaf_relift_bytes(&right_body, rt),
            Ordering::Relaxed,
        );
        lg.relift(&[], lt);
        right_body.relift(&[], rt);
        lg.max_msn = lg.max_msn.max(rg.max_msn);
        match (&mut lg.body, right_body) {
            (Body::Leaf(a), Body::Leaf(b)) => a.absorb(pivot, b),
            (Body::Internal(a), Body::Internal(b)) => a.absorb(pivot, b),
            _ => unreachable!("siblings of different kinds"),
        }
        self.delete_node(rcn, rg)?;
        self.end_modify(lcn, lg);
        self.counters.merges.fetch_add(1, Ordering::Relaxed);
        Ok(left_is_child)
    }

    /// Whether two sibling nodes merged fit comfortably in one (no merge-then-split churn);
    /// `pending` is what the parent buffers for the one that is not flushed first.
    pub(super) fn merge_fits(&self, a: &Node, b: &Node, pending: usize) -> bool {
        let f = &self.format;
        match (&a.body, &b.body) {
            (Body::Leaf(a), Body::Leaf(b)) => a.bytes() + b.bytes() <= f.node_size * 3 / 4,
            (Body::Internal(a), Body::Internal(b)) => {
                a.children.len() + b.children.len() <= f.max_fanout
                    && a.buffered_bytes() + b.buffered_bytes() + pending <= f.node_size
            }
            _ => false,
        }
    }

    /// Splits child `c` if it is over its size or fanout bound; returns whether it did.
    pub(super) fn split_child(
        &self,
        pg: &mut WriteGuard,
        pb: &Bounds,
        c: usize,
        ccn: &Arc<CachedNode>,
        cg: &mut WriteGuard,
    ) -> bool {
        let f = &self.format;
        let height = cg.height;
        let max_msn = cg.max_msn;
        let whole = match &pg.body {
            Body::Internal(pn) => pb.child(pn, c),
            Body::Leaf(_) => unreachable!("a leaf has no children"),
        };
        cg.adopt_prefix(whole.prefix());
        let mut pieces: Vec<(Vec<u8>, Node)> = match &mut cg.body {
            Body::Leaf(l) if l.bytes() > f.node_size => {
                let p: Vec<_> = l
                    .split_preferring(f, &self.split_boundaries.read())
                    .into_iter()
                    .map(|(k, leaf)| {
                        (
                            k,
                            Node {
                                height,
                                max_msn,
                                body: Body::Leaf(leaf),
                                prefix: whole.prefix().to_vec(),
                            },
                        )
                    })
                    .collect();
                self.counters
                    .leaf_splits
                    .fetch_add(p.len() as u64, Ordering::Relaxed);
                p
            }
            Body::Internal(n) if n.children.len() > f.max_fanout => {
                let all = std::mem::replace(
                    n,
                    Internal {
                        pivots: vec![],
                        children: vec![],
                        buffers: vec![],
                    },
                );
                let (first, rest) = split_internal(all, f.max_fanout, false);
                *n = first;
                let p: Vec<_> = rest
                    .into_iter()
                    .map(|(k, int)| {
                        (
                            k,
                            Node {
                                height,
                                max_msn,
                                body: Body::Internal(int),
                                prefix: whole.prefix().to_vec(),
                            },
                        )
                    })
                    .collect();
                self.counters
                    .internal_splits
                    .fetch_add(p.len() as u64, Ordering::Relaxed);
                p
            }
            _ => return false,
        };
        let lows = relift_pieces(&whole, cg, &mut pieces, &self.counters.leaf_bytes_relifted);
        // The pieces moved out of the child: count it smaller before counting them, or the
        // accounted usage passes the bound by the pieces (measured: 72 MiB with a 64 MiB bound).
        self.cache.remeasure(ccn, cg);
        let Body::Internal(pn) = &mut pg.body else {
            unreachable!()
        };
        let head = pb.tail_of(&whole);
        // Each piece holds a part of the child's keys: the child's bound holds for it (a bound
        // from the pieces' keys would cost a pass over every key of a 4 MiB leaf: measured 15% of
        // the daemon's CPU in directory renames).
        let longest = pn.buffers[c].longest;
        for (k, (low, node)) in pieces.into_iter().enumerate() {
            let id = self.new_node(node);
            pn.pivots.insert(c + k, [head, low.as_slice()].concat());
            pn.children.insert(c + 1 + k, id);
            let mut slot = BufSlot::empty();
            slot.longest = longest;
            pn.buffers.insert(c + 1 + k, slot);
        }
        for k in 0..=lows.len() {
            assert_eq!(
                pb.child(pn, c + k),
                whole.child_of(&lows, k),
                "a split piece's bounds differ under its parent"
            );
        }
        self.end_modify(ccn, cg);
        true
    }
}

/// The key-length bound of a child slot for `child`, a fully resident node under a parent with
/// bounds `parent`, from its keys: their length in the parent's form (with the bytes the child's
/// prefix strips beyond the parent's).
pub(super) fn slot_bound(parent: &Bounds, child: &Node) -> usize {
    assert!(
        child.prefix.starts_with(parent.prefix()),
        "a child whose prefix is not inside its parent's"
    );
    child.prefix.len() - parent.prefix().len() + child.longest_stored()
}

/// Re-lifts the pieces of a split node with bounds `whole` (the first piece in `first`, the
/// others with their low keys in the whole's form) to their own, longer, prefixes. Returns the
/// low keys.
pub(super) fn relift_pieces(
    whole: &Bounds,
    first: &mut Node,
    rest: &mut [(Vec<u8>, Node)],
    relifted: &AtomicU64,
) -> Vec<Vec<u8>> {
    let lows: Vec<Vec<u8>> = rest.iter().map(|(l, _)| l.clone()).collect();
    let b = whole.child_of(&lows, 0);
    let tail = whole.tail_of(&b);
    let mut bytes = leaf_relift_bytes(&first.body, tail);
    first.relift(tail, &[]);
    for (k, (_, node)) in rest.iter_mut().enumerate() {
        let b = whole.child_of(&lows, k + 1);
        let tail = whole.tail_of(&b);
        bytes += leaf_relift_bytes(&node.body, tail);
        node.relift(tail, &[]);
    }
    relifted.fetch_add(bytes, Ordering::Relaxed);
    lows
}

/// The entry bytes a re-lift of `body` by `tail` rewrites if it is a leaf's (an internal node's
/// buffered messages are rewritten when next needed, `node/slot.rs`): what
/// [`Stats::leaf_bytes_relifted`](crate::Stats::leaf_bytes_relifted) counts.
fn leaf_relift_bytes(body: &Body, tail: &[u8]) -> u64 {
    match body {
        Body::Leaf(l) if !tail.is_empty() => l.bytes() as u64,
        _ => 0,
    }
}

/// Cuts an internal node into pieces of at most `max` children (at least two pieces if `force`).
pub(super) fn split_internal(
    mut n: Internal,
    max: usize,
    force: bool,
) -> (Internal, Vec<(Vec<u8>, Internal)>) {
    let len = n.children.len();
    let mut k = len.div_ceil(max);
    if force {
        k = k.max(2);
    }
    let per = len.div_ceil(k);
    let mut cuts: Vec<usize> = (1..k).map(|i| i * per).filter(|&c| c < len).collect();
    cuts.reverse();
    let mut rest = Vec::new();
    for cut in cuts {
        let children = n.children.split_off(cut);
        let buffers = n.buffers.split_off(cut);
        let mut pivots = n.pivots.split_off(cut - 1);
        let low = pivots.remove(0);
        rest.push((
            low,
            Internal {
                pivots,
                children,
                buffers,
            },
        ));
    }
    rest.reverse();
    (n, rest)
}

/// The sibling a merge of child `c` uses unless the caller chooses: the next one, or the
/// previous one for the last child. `None` for an only child.
pub(super) fn default_sibling(pn: &Internal, c: usize) -> Option<usize> {
    if pn.children.len() < 2 {
        None
    } else if c + 1 < pn.children.len() {
        Some(c + 1)
    } else {
        Some(c - 1)
    }
}

/// The stored bytes a merge of children `c` and `s` of `pn` (bounds `pb`) re-lifts: the merged
/// node's prefix is the common part of the halves', and each half whose prefix is longer has
/// every stored key rewritten (entries and partition pivots of a leaf; pivots and buffered
/// messages of an internal node, with what the parent buffers for it). `c_bytes` and `s_bytes`
/// are the halves' sizes ([`relift_size`]), `s_pending` what the parent buffers for `s`.
pub(super) fn merge_relift_bytes(
    pn: &Internal,
    pb: &Bounds,
    c: usize,
    s: usize,
    c_bytes: usize,
    s_bytes: usize,
    s_pending: usize,
) -> usize {
    let li = c.min(s);
    let lo: &[u8] = if li == 0 { pb.lo() } else { &pn.pivots[li - 1] };
    let hi = match pn.pivots.get(li + 1) {
        Some(p) => Some(p.as_slice()),
        None => pb.hi(),
    };
    let merged = super::bounds::lift_len(lo, hi);
    let mut bytes = 0;
    if pb.extra(pn, c) > merged {
        bytes += c_bytes;
    }
    if pb.extra(pn, s) > merged {
        bytes += s_bytes + s_pending;
    }
    bytes
}

/// What a re-lift of `n` rewrites, known from its skeleton: a leaf's entry bytes, an internal
/// node's buffered bytes and pivots.
pub(super) fn relift_size(n: &Node) -> usize {
    match &n.body {
        Body::Leaf(l) => l.bytes(),
        Body::Internal(i) => i.buffered_bytes() + i.pivots.iter().map(Vec::len).sum::<usize>(),
    }
}
