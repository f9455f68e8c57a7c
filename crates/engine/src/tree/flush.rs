//! Flushes: moving a parent's buffer down into a child (the heaviest first), one step at a time
//! from the root, or node by node over a key range (`drain_from`, which pushes range deletes down).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::inject::range_pieces;
use super::{Bounds, Tree};
use crate::buffer::Taken;
use crate::cache::{CachedNode, WriteGuard};
use crate::config::Format;
use crate::error::{Error, Result};
use crate::msg::{KeyMsgs, RangeDel};
use crate::node::{child_index, Body, Leaf, Node, NodeId, ROOT_ID};

/// Whether `node` is internal with more than `threshold` bytes buffered (a flush drains it).
pub(super) fn over(node: &Node, threshold: usize) -> bool {
    matches!(&node.body, Body::Internal(n) if n.buffered_bytes() > threshold)
}

/// How many children `node` has (0 for a leaf).
fn children(node: &Node) -> usize {
    match &node.body {
        Body::Internal(n) => n.children.len(),
        Body::Leaf(_) => 0,
    }
}

/// How many times a flush loads a node again that was evicted before it could latch it.
const MAX_RESTARTS: usize = 256;

impl Tree {
    /// Flushes along the heaviest path from the root while buffers hold more than `threshold` bytes,
    /// fixing the root's shape first. Returns whether anything changed. The caller holds `writers`
    /// shared (or exclusive) and no latch.
    pub fn flush_step(&self, threshold: usize) -> Result<bool> {
        let mut pins: Vec<Arc<CachedNode>> = Vec::new();
        let mut did = false;
        'retry: for _ in 0..MAX_RESTARTS {
            let root = self.pin(ROOT_ID)?;
            let mut pg = root.write();
            if !pg.fully_resident() {
                drop(pg);
                self.load_partitions(&root, None)?;
                pins.push(root);
                continue 'retry;
            }
            match self.fix_root(&root, &mut pg)? {
                Ok(changed) => {
                    did |= changed;
                    if changed {
                        // A piece a root split leaves over `threshold` (a batch larger than a
                        // node lands in the root whole) drains now.
                        let n = children(&pg);
                        self.drain_pieces(&pg, &Bounds::root(), 0..n, threshold, threshold, true)?;
                    }
                }
                Err(need) => {
                    drop(pg);
                    pins.extend(self.satisfy(need)?);
                    continue 'retry;
                }
            }
            let pcn = root;
            loop {
                let Some((c, cid)) = self.heavy_child(&pcn, &mut pg, threshold)? else {
                    return Ok(did);
                };
                // At the root, a child not wholly in memory is loaded with no latch held (below
                // the root, `drain_down` loads it under its parent's latch): start again after.
                let ccn = match self.cache.get(cid) {
                    Some(c) => c,
                    None => {
                        drop(pg);
                        // Merged away by another flusher meanwhile: start over.
                        pins.extend(self.load_found(cid, true)?);
                        continue 'retry;
                    }
                };
                if !ccn.read().fully_resident() {
                    drop(pg);
                    self.load_partitions(&ccn, None)?;
                    pins.push(ccn);
                    continue 'retry;
                }
                let mut cg = ccn.write();
                if !cg.fully_resident() {
                    // Evicted again between the load and the latch (tiny cache): start over.
                    drop(cg);
                    drop(pg);
                    pins.push(ccn);
                    continue 'retry;
                }
                let before = children(&pg);
                let child_alive =
                    self.flush_into_child(&pcn, &mut pg, &Bounds::root(), c, &ccn, &mut cg)?;
                did = true;
                // A split child's pieces right of it: one left with more than twice the
                // threshold drains now (see `drain_down`).
                let pieces = c + 1..c + 1 + children(&pg).saturating_sub(before);
                self.drain_pieces(&pg, &Bounds::root(), pieces, 2 * threshold, threshold, true)?;
                if child_alive && over(&cg, threshold) {
                    // Go down: the child must drain before more is pushed into it.
                    let Body::Internal(n) = &pg.body else {
                        unreachable!()
                    };
                    let mut cb = Bounds::root();
                    cb.descend(n, c);
                    drop(pg);
                    self.drain_down(&ccn, cg, &cb, threshold, true)?;
                    return Ok(true);
                }
                // Otherwise stay at the root and flush its next heaviest buffer if it is still over.
            }
        }
        Err(Error::Corrupt(
            "a flush could not keep its path in memory (cache too small for the tree?)".into(),
        ))
    }

    /// The heaviest child slot of `pg` (and the child, made this node's own if it was shared)
    /// when `pg`'s buffers hold more than `threshold` bytes; `None` when they do not.
    fn heavy_child(
        &self,
        pcn: &Arc<CachedNode>,
        pg: &mut WriteGuard,
        threshold: usize,
    ) -> Result<Option<(usize, NodeId)>> {
        let c = match &pg.body {
            Body::Internal(n) if n.buffered_bytes() > threshold => n.heaviest_child(),
            _ => return Ok(None),
        };
        Ok(Some((c, self.own_child(pcn, pg, c)?)))
    }

    /// Drains children `range` of `pg` (bounds `pb`) that hold more than `limit` bytes of
    /// buffers down to `threshold`: the pieces a split just made, which took their share of the
    /// split node's buffers. A flush goes down only into the child it flushed into; left over,
    /// such a piece stays over until a flush passes through it, a clone sharing it copies it
    /// whole, and it is written and loaded again at many times a node's size (a root split's
    /// pieces, and a child's of height 1 that took a 196 KiB batch: docs/DESIGN.md, Cache and
    /// memory bound).
    fn drain_pieces(
        &self,
        pg: &WriteGuard,
        pb: &Bounds,
        range: std::ops::Range<usize>,
        limit: usize,
        threshold: usize,
        merge: bool,
    ) -> Result<()> {
        let Body::Internal(n) = &pg.body else {
            return Ok(());
        };
        for c in range {
            // The pieces were just made: in memory, and nobody's else.
            let Some(ccn) = self.cache.get(n.children[c]) else {
                continue;
            };
            if self.is_shared(ccn.id) {
                continue;
            }
            let cg = ccn.write();
            if cg.fully_resident() && over(&cg, limit) {
                // The split counted the pieces: room for what the drain loads below them.
                self.make_room()?;
                let mut cb = pb.clone();
                cb.descend(n, c);
                // Draining below a piece changes neither the piece's slot nor its parent.
                self.drain_down(&ccn, cg, &cb, threshold, merge)?;
            }
        }
        Ok(())
    }

    /// Flushes node `cn` (below the root, latched as `g`, bounds `b`) along its heaviest path while
    /// its buffers hold more than `threshold` bytes, as [`Tree::flush_step`] does below the root:
    /// a child is loaded under its parent's latch, and one left over `threshold` is drained before
    /// its parent's next buffer. Returns whether it changed anything (the latch is released).
    /// Without `merge`, a child the flush leaves small is not merged with a sibling (a slicing
    /// descent keeps the cuts it is making); one it leaves too large is split all the same.
    pub(super) fn drain_down(
        &self,
        cn: &Arc<CachedNode>,
        g: WriteGuard,
        b: &Bounds,
        threshold: usize,
        merge: bool,
    ) -> Result<bool> {
        assert_ne!(cn.id, ROOT_ID, "drain_down starts below the root");
        let (mut pcn, mut pg, mut pb) = (cn.clone(), g, b.clone());
        let mut did = false;
        loop {
            let Some((c, cid)) = self.heavy_child(&pcn, &mut pg, threshold)? else {
                return Ok(did);
            };
            let ccn = match self.cache.get(cid) {
                Some(c) => c,
                None => self.load_with(cid, true)?,
            };
            // An evictor that chose the child before it was pinned may still shed its sub-blocks
            // between the load and the latch (tiny cache): load again.
            let mut cg = None;
            for _ in 0..MAX_RESTARTS {
                if !ccn.read().fully_resident() {
                    self.load_partitions(&ccn, None)?;
                }
                let g = ccn.write();
                if g.fully_resident() {
                    cg = Some(g);
                    break;
                }
            }
            let Some(mut cg) = cg else {
                return Err(Error::Corrupt(
                    "a flush could not keep its path in memory (cache too small for the tree?)"
                        .into(),
                ));
            };
            let before = children(&pg);
            let child_alive = if merge {
                self.flush_into_child(&pcn, &mut pg, &pb, c, &ccn, &mut cg)?
            } else {
                self.deliver_into_child(&pcn, &mut pg, &pb, c, &ccn, &mut cg)?;
                self.split_child(&mut pg, &pb, c, &ccn, &mut cg);
                self.end_modify(&pcn, &pg);
                true
            };
            did = true;
            // A split child's pieces right of it: one left with more than twice the threshold
            // (a batch larger than a node) drains now; the descent below takes only the child
            // itself. Up to twice, a piece stays as a parent a flush went down from does: draining
            // every piece over the threshold flushed sequential inserts early, split internal
            // nodes at five children instead of more (range_move's 20,000 keys: 358 nodes, not
            // 341) and made range moves in that tree merge and split internal nodes each time.
            let pieces = c + 1..c + 1 + children(&pg).saturating_sub(before);
            self.drain_pieces(&pg, &pb, pieces, 2 * threshold, threshold, merge)?;
            if child_alive && over(&cg, threshold) {
                // Go down: the child must drain before more is pushed into it.
                if let Body::Internal(n) = &pg.body {
                    pb.descend(n, c);
                }
                drop(pg);
                pg = cg;
                pcn = ccn;
            }
            // Otherwise stay at this node and flush its next heaviest buffer if it is still over.
        }
    }

    /// Flushes buffers down to the leaves, depth first in key order, starting with the subtree
    /// holding `from` and stopping after about `max_flushes` flushes. Returns where to resume
    /// (`None`: the end of the tree was reached). Holds the write latches of the path it works on,
    /// so readers wait: a maintenance operation (reclaiming the space of deleted data), not for the
    /// fast path. The caller holds `writers` shared. With `deletes_only`, only buffers that hold a
    /// range delete are flushed (what frees the space of deleted data).
    pub fn drain_from(
        &self,
        from: &[u8],
        max_flushes: usize,
        deletes_only: bool,
    ) -> Result<(usize, Option<Vec<u8>>)> {
        let root = self.pin(ROOT_ID)?;
        self.load_partitions(&root, None)?;
        let mut g = root.write();
        if !g.fully_resident() {
            return Ok((0, Some(from.to_vec())));
        }
        let mut work = DrainWork {
            max_flushes,
            deletes_only,
            flushes: 0,
            reloads: 0,
        };
        let resume = self.drain_node(&root, &mut g, from, &Bounds::root(), &mut work)?;
        Ok((work.flushes, resume))
    }

    pub(super) fn drain_node(
        &self,
        cn: &Arc<CachedNode>,
        g: &mut WriteGuard,
        from: &[u8],
        bounds: &Bounds,
        work: &mut DrainWork,
    ) -> Result<Option<Vec<u8>>> {
        let mut i = match &g.body {
            Body::Internal(n) => child_index(&n.pivots, &bounds.lift_clipped(from)),
            Body::Leaf(_) => return Ok(None),
        };
        loop {
            let (pending, cb) = match &g.body {
                Body::Internal(n) if i < n.children.len() => {
                    let pending = if work.deletes_only {
                        n.buffers[i].range_count().is_some_and(|r| r > 0)
                    } else {
                        !n.buffers[i].is_empty()
                    };
                    (pending, bounds.child(n, i))
                }
                _ => return Ok(None),
            };
            let lo = cb.full_lo();
            if work.flushes >= work.max_flushes {
                return Ok(Some(lo));
            }
            if !pending && g.height == 1 {
                // A leaf with nothing to receive: no need to read it.
                i += 1;
                continue;
            }
            let cid = self.own_child(cn, g, i)?;
            let ccn = match self.cache.get(cid) {
                Some(c) => c,
                None => self.load_with(cid, true)?,
            };
            if !ccn.read().fully_resident() {
                self.load_partitions(&ccn, None)?;
            }
            // A pass pushing range deletes down empties leaves: keep a sibling in memory so that
            // the emptied child can merge into it (merges only take resident siblings).
            let _sibling = if pending && work.deletes_only {
                self.pin_sibling(g, i)?
            } else {
                None
            };
            let mut cg = ccn.write();
            if !cg.fully_resident() {
                // Shed between the load and the latch (a pinned node is not shed, but keep the
                // flush's rule: a node is changed only whole). Try again from this child.
                drop(cg);
                drop(_sibling);
                work.reloads += 1;
                if work.reloads > MAX_RELOADS {
                    // Give this round up; the next one starts here.
                    return Ok(Some(lo));
                }
                continue;
            }
            if pending {
                let alive = self.flush_into_child(cn, g, bounds, i, &ccn, &mut cg)?;
                work.flushes += 1;
                if !alive {
                    // Merged into its left sibling: look at that one again.
                    i = i.saturating_sub(1);
                    continue;
                }
            }
            if matches!(cg.body, Body::Internal(_)) {
                // The flush may have split or merged the child: its bounds as they are now.
                let cb = match &g.body {
                    Body::Internal(n) => bounds.child(n, i),
                    Body::Leaf(_) => unreachable!("a node with children became a leaf"),
                };
                let lo = cb.full_lo();
                let start = if from > lo.as_slice() {
                    from
                } else {
                    lo.as_slice()
                };
                if let Some(resume) = self.drain_node(&ccn, &mut cg, start, &cb, work)? {
                    return Ok(Some(resume));
                }
            }
            i += 1;
        }
    }

    /// Moves buffer `c` of the parent (whose bounds are `pb`) into the child, then restructures
    /// the child (split or merge). Returns whether the child still exists (a merge may fold it
    /// into its left sibling).
    pub(super) fn flush_into_child(
        &self,
        pcn: &Arc<CachedNode>,
        pg: &mut WriteGuard,
        pb: &Bounds,
        c: usize,
        ccn: &Arc<CachedNode>,
        cg: &mut WriteGuard,
    ) -> Result<bool> {
        self.deliver_into_child(pcn, pg, pb, c, ccn, cg)?;
        let alive = self.restructure_child(pg, pb, c, ccn, cg)?;
        self.end_modify(pcn, pg);
        Ok(alive)
    }

    /// Moves buffer `c` of the parent into the child and leaves both shapes as they are (the
    /// child may be over its size afterwards). The parent is left in modification: the caller
    /// ends it ([`Tree::end_modify`]) once done with it.
    pub(super) fn deliver_into_child(
        &self,
        pcn: &Arc<CachedNode>,
        pg: &mut WriteGuard,
        pb: &Bounds,
        c: usize,
        ccn: &Arc<CachedNode>,
        cg: &mut WriteGuard,
    ) -> Result<()> {
        self.begin_modify(pcn, pg);
        self.begin_modify(ccn, cg);
        let Body::Internal(pn) = &mut pg.body else {
            unreachable!("flush from a leaf")
        };
        let buf = pn.buffers[c].take();
        // The messages join the child's subtree: its key-length bound covers them.
        pn.buffers[c].raise_longest(buf.longest);
        let (cb, extra) = (pb.child(pn, c), pb.extra(pn, c));
        self.counters.flushes.fetch_add(1, Ordering::Relaxed);
        self.counters
            .bytes_flushed
            .fetch_add(buf.bytes as u64, Ordering::Relaxed);
        self.deliver(buf, cg, &cb, extra)?;
        // The buffer left the parent: count that before the child's growth, or the accounted
        // usage holds the messages twice (measured: 13 MiB above the eviction point in one step).
        self.cache.remeasure(pcn, pg);
        self.end_modify(ccn, cg);
        Ok(())
    }
}

impl Tree {
    /// Applies a parent's buffer to a child (internal: into its buffers; leaf: into its entries).
    /// The child has bounds `cb` and strips `extra` bytes more than the parent: every message key
    /// and range bound loses them on the way down (re-lifted to the child's prefix). References
    /// the messages drop are released; one a leaf must keep inline is read first
    /// ([`Tree::inline_heavy_refs`]), before anything changes.
    pub(super) fn deliver(
        &self,
        buf: Taken,
        node: &mut Node,
        cb: &Bounds,
        extra: usize,
    ) -> Result<()> {
        let ranges = !buf.ranges.is_empty();
        let released = deliver(buf, node, cb, extra, &self.format, &mut |l, r, p, rel| {
            self.inline_heavy_refs(l, r, p, rel)
        })?;
        self.release_refs(&released);
        if ranges {
            self.drop_covered(node, cb);
        }
        Ok(())
    }
}

/// What [`deliver`] calls before it applies messages to a leaf.
type BeforeLeaf<'a> =
    dyn FnMut(&Leaf, &[RangeDel], &mut [(Vec<u8>, KeyMsgs)], &mut Vec<u64>) -> Result<()> + 'a;

/// [`Tree::deliver`]'s work; returns the blocks whose references the messages dropped.
fn deliver(
    buf: Taken,
    node: &mut Node,
    cb: &Bounds,
    extra: usize,
    format: &Format,
    before_leaf: &mut BeforeLeaf<'_>,
) -> Result<Vec<u64>> {
    let max = buf.max_msn;
    // A node is rewritten with the prefix its bounds give (a subtree moved by a range move
    // still carries its old prefix hint until then).
    node.adopt_prefix(cb.prefix());
    let Taken {
        mut ranges,
        mut points,
        ..
    } = buf;
    if extra > 0 {
        for r in &mut ranges {
            Bounds::strip(cb, extra, &mut r.lo);
            Bounds::strip(cb, extra, &mut r.hi);
        }
        for (k, _) in &mut points {
            Bounds::strip(cb, extra, k);
        }
    }
    let mut released = Vec::new();
    match &mut node.body {
        Body::Internal(n) => {
            // Ranges are independent of each other; deliver them in MSN order so each buffer sees
            // increasing numbers, then the point messages (newer than the ranges they overlap).
            // Per child: its pieces of the ranges, in MSN order, then its points (what each
            // buffer would see were they routed one by one), delivered in one go.
            ranges.sort_by_key(|r| r.msn);
            let mut per_child: Vec<Delivery> =
                (0..n.children.len()).map(|_| Default::default()).collect();
            for r in ranges {
                for (c, lo, hi) in range_pieces(n, &r.lo, &r.hi) {
                    per_child[c].0.push(RangeDel { msn: r.msn, lo, hi });
                }
            }
            // Points come in key order (a taken buffer's; stripping the prefix its bounds share
            // keeps the order), so each child's points are one run: its start is found by one
            // search per pivot, not one per point, and the runs are split off from the back
            // (each point moved once, each child's vector allocated at its size).
            assert!(
                points.windows(2).all(|w| w[0].0 < w[1].0),
                "delivered points out of key order"
            );
            let starts: Vec<usize> = n
                .pivots
                .iter()
                .map(|p| points.partition_point(|(k, _)| k < p))
                .collect();
            for (c, &start) in starts.iter().enumerate().rev() {
                per_child[c + 1].1 = points.split_off(start);
            }
            per_child[0].1 = points;
            for (c, (rs, ps)) in per_child.into_iter().enumerate() {
                if !rs.is_empty() || !ps.is_empty() {
                    released.extend(n.buffers[c].deliver(rs, ps));
                }
            }
        }
        Body::Leaf(l) => {
            before_leaf(l, &ranges, &mut points, &mut released)?;
            released.extend(l.apply(&ranges, &points, format));
        }
    }
    node.max_msn = node.max_msn.max(max);
    Ok(released)
}

/// What one child's buffer receives in a delivery: range deletes in MSN order, then points in
/// key order.
type Delivery = (Vec<RangeDel>, Vec<(Vec<u8>, KeyMsgs)>);

/// The budget and filter of one [`Tree::drain_from`] round.
pub(super) struct DrainWork {
    max_flushes: usize,
    /// Flush only buffers holding a range delete.
    deletes_only: bool,
    flushes: usize,
    /// Children found partly shed under their latch and loaded again.
    reloads: usize,
}

/// How many times a drain round loads a shed child again before it stops (the next round
/// resumes at that child).
const MAX_RELOADS: usize = 256;
