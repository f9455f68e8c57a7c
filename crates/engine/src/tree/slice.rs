//! Slicing (docs/SURGERY.md §3.2, steps 1–2): turning a key range into a run of whole child slots
//! of one node, the *slicing node*, without changing any key's value.
//!
//! The descent to the slicing node flushes each buffer it passes into the child it enters, so no
//! ancestor of the slicing node holds a message for its range. Below it nothing is flushed:
//! `make_boundary` cuts every node on a boundary key's path at that key, bottom-up, and the
//! buffer of the slot being cut is cut with it (its messages are *carried*). Cut pieces are
//! re-lifted to their narrower bounds; the under-full fringe they leave is healed later
//! (`tree/heal.rs`).
//!
//! Everything here runs with `writers` held exclusive (no other modifier changes the tree), so
//! the nodes are loaded and pinned first, without latches, and then changed under write latches
//! taken top-down.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::split_merge::relift_pieces;
use super::{Bounds, Tree};
use crate::cache::{CachedNode, WriteGuard};
use crate::error::Result;
use crate::node::{child_index, Body, BufSlot, Internal, Leaf, Node, ROOT_ID};

/// Where a key range lies in the tree once sliced: node `node` (with bounds `bounds`) holds it as
/// its child slots `slots.0..slots.1`.
pub(crate) struct Sliced {
    pub node: Arc<CachedNode>,
    pub bounds: Bounds,
    pub slots: (usize, usize),
    /// Whether slicing cut a node (its fringes want healing).
    pub cut: bool,
}

impl Tree {
    /// Node `id`, pinned by the returned `Arc` with every partition or buffer in memory (a pinned
    /// node is never evicted nor shed). Holds no latch while loading.
    pub(super) fn pin_whole(&self, id: u64) -> Result<Arc<CachedNode>> {
        let cn = match self.cache.get(id) {
            Some(cn) => cn,
            None => self.load_with(id, true)?,
        };
        if !cn.read().fully_resident() {
            self.load_partitions(&cn, None)?;
        }
        Ok(cn)
    }

    /// The node of the lowest height (but at least `min_height`, at least 1) whose range holds
    /// `[lo, hi)` and either spans several of its children, or has one child whose range is
    /// exactly `[lo, hi)`, or is at `min_height`. Every buffer on the way down is flushed into the
    /// child the descent enters (only buffers, never a restructuring). A root leaf first gets a
    /// level above it (the root keeps its id). Needs `writers` exclusive and `min_height` at most
    /// the root's height (1 for a root leaf). The node is pinned, not necessarily whole.
    pub(crate) fn slicing_node(
        &self,
        lo: &[u8],
        hi: &[u8],
        min_height: u32,
    ) -> Result<(Arc<CachedNode>, Bounds)> {
        assert!(lo < hi, "slicing an empty range");
        let root = self.pin_whole(ROOT_ID)?;
        if root.read().height == 0 {
            let mut g = root.write();
            self.grow_root(&root, &mut g)?;
        }
        let min_height = min_height.max(1);
        let (mut cn, mut b) = (root, Bounds::root());
        loop {
            let (c, cid, empty) = {
                let g = cn.read();
                assert!(g.height >= min_height, "slicing below the root's height");
                let Body::Internal(n) = &g.body else {
                    unreachable!("a node above height 0 is internal")
                };
                if g.height == min_height {
                    return Ok((cn.clone(), b));
                }
                let c0 = child_index(&n.pivots, &b.lift_clipped(lo));
                let shi = b.lift_clipped(hi);
                let c1 = n.pivots.partition_point(|p| p.as_slice() < shi.as_slice());
                let cb = b.child(n, c0);
                if c0 != c1 || (cb.full_lo() == lo && cb.full_hi().as_deref() == Some(hi)) {
                    return Ok((cn.clone(), b));
                }
                (c0, n.children[c0], n.buffers[c0].is_empty())
            };
            // Something below will change: a shared child is made this node's own first.
            let cid = if self.is_shared(cid) {
                cn = self.pin_whole(cn.id)?;
                let mut pg = cn.write();
                self.own_child(&cn, &mut pg, c)?
            } else {
                cid
            };
            // A node is read whole only to be changed: a child receiving the path's messages (and
            // its parent); one passed through on the way down needs only its skeleton.
            let ccn = if empty {
                self.pin(cid)?
            } else {
                cn = self.pin_whole(cn.id)?;
                self.pin_whole(cid)?
            };
            {
                let mut pg = cn.write();
                let cg = if empty {
                    None
                } else {
                    let mut cg = ccn.write();
                    self.deliver_into_child(&cn, &mut pg, &b, c, &ccn, &mut cg)?;
                    self.end_modify(&cn, &pg);
                    Some(cg)
                };
                let Body::Internal(n) = &pg.body else {
                    unreachable!()
                };
                b.descend(n, c);
                drop(pg);
                // The path's messages gather in the nodes it passes: one left with more than a
                // node's worth drains down now, as a flush would have drained it (left over, it
                // stays so until the next flush passes, and a copy of it for a clone doubles it).
                if let Some(cg) = cg {
                    if super::flush::over(&cg, self.format.node_size) {
                        self.drain_down(&ccn, cg, &b, self.format.node_size, false)?;
                    }
                }
            }
            self.make_room()?;
            cn = ccn;
        }
    }

    /// Makes a root leaf the only child of a new root level (the root keeps its id; its one slot
    /// has an empty buffer). The leaf's prefix is the root's: empty.
    fn grow_root(&self, root: &Arc<CachedNode>, rg: &mut WriteGuard) -> Result<()> {
        assert_eq!(rg.height, 0, "growing a root that is not a leaf");
        self.begin_modify(root, rg);
        let body = std::mem::replace(&mut rg.body, Body::Leaf(Leaf::empty()));
        let leaf = Node {
            height: 0,
            max_msn: rg.max_msn,
            body,
            prefix: Vec::new(),
        };
        let slot = BufSlot::empty().with_longest(leaf.longest_stored());
        let id = self.new_node(leaf);
        rg.body = Body::Internal(Internal {
            pivots: Vec::new(),
            children: vec![id],
            buffers: vec![slot],
        });
        rg.height = 1;
        self.end_modify(root, rg);
        Ok(())
    }

    /// Makes `k` a boundary between two child slots of node `cn` (bounds `b`, height at least 1):
    /// splits every node on `k`'s path below it at `k`, bottom-up. Nothing to do when `k` is a
    /// pivot already or not inside the node's range. The node must be pinned; `writers` held
    /// exclusive. Returns whether it cut a node.
    pub(crate) fn make_boundary(&self, cn: &Arc<CachedNode>, b: &Bounds, k: &[u8]) -> Result<bool> {
        let (c, cid, cb) = {
            let g = cn.read();
            let Body::Internal(n) = &g.body else {
                unreachable!("a boundary is made in an internal node")
            };
            if k <= b.full_lo().as_slice() || b.full_hi().is_some_and(|h| k >= h.as_slice()) {
                return Ok(false);
            }
            let s = b.lift(k);
            let c = child_index(&n.pivots, s);
            if c > 0 && n.pivots[c - 1].as_slice() == s {
                return Ok(false);
            }
            (c, n.children[c], b.child(n, c))
        };
        let cid = if self.is_shared(cid) {
            let cn = self.pin_whole(cn.id)?;
            let mut pg = cn.write();
            self.own_child(&cn, &mut pg, c)?
        } else {
            cid
        };
        let ccn = self.pin_whole(cid)?;
        if ccn.read().height > 0 {
            self.make_boundary(&ccn, &cb, k)?;
        }
        // The node may have been reached through its skeleton: it is changed now.
        let cn = &self.pin_whole(cn.id)?;
        let mut pg = cn.write();
        let mut cg = ccn.write();
        self.split_child_at(cn, &mut pg, b, c, &ccn, &mut cg, k)?;
        drop(cg);
        drop(pg);
        self.make_room()?;
        Ok(true)
    }

    /// Cuts child `c` of the latched parent (bounds `pb`) at the full key `k`, strictly inside
    /// the child's range (and one of its pivots if it is internal): the child keeps the keys
    /// below `k`, a new node takes the others, the slot's buffer is cut at `k` and the new node
    /// gets the upper half.
    #[allow(clippy::too_many_arguments)]
    fn split_child_at(
        &self,
        pcn: &Arc<CachedNode>,
        pg: &mut WriteGuard,
        pb: &Bounds,
        c: usize,
        ccn: &Arc<CachedNode>,
        cg: &mut WriteGuard,
        k: &[u8],
    ) -> Result<()> {
        self.begin_modify(pcn, pg);
        self.begin_modify(ccn, cg);
        let whole = match &pg.body {
            Body::Internal(n) => pb.child(n, c),
            Body::Leaf(_) => unreachable!("a leaf has no children"),
        };
        cg.adopt_prefix(whole.prefix());
        let sk = whole.lift(k).to_vec();
        let body = match &mut cg.body {
            Body::Leaf(l) => {
                self.counters.leaf_splits.fetch_add(1, Ordering::Relaxed);
                Body::Leaf(l.split_at(&sk))
            }
            Body::Internal(n) => {
                let j = n
                    .pivots
                    .iter()
                    .position(|p| *p == sk)
                    .expect("an internal node is cut at one of its pivots");
                self.counters
                    .internal_splits
                    .fetch_add(1, Ordering::Relaxed);
                Body::Internal(n.split_off_at(j))
            }
        };
        let right = Node {
            height: cg.height,
            max_msn: cg.max_msn,
            body,
            prefix: whole.prefix().to_vec(),
        };
        let mut pieces = vec![(sk, right)];
        relift_pieces(&whole, cg, &mut pieces, &self.counters.leaf_bytes_relifted);
        let (_, right) = pieces.pop().expect("the upper piece");
        self.cache.remeasure(ccn, cg);
        let Body::Internal(pn) = &mut pg.body else {
            unreachable!()
        };
        let pk = [pb.tail_of(&whole), whole.lift(k)].concat();
        // Both pieces keep the child's bound (see `split_child`).
        let slot = pn.buffers[c].split_off(&pk);
        pn.pivots.insert(c, pk);
        pn.children.insert(c + 1, self.new_node(right));
        pn.buffers.insert(c + 1, slot);
        assert_eq!(
            pb.child(pn, c + 1).full_lo(),
            k,
            "a cut piece starts where it was cut"
        );
        self.end_modify(ccn, cg);
        self.end_modify(pcn, pg);
        Ok(())
    }

    /// Slices `[lo, hi)` into whole child slots of its slicing node (at height 1 or above) and
    /// returns where they are. Changes no key's value. Needs `writers` exclusive.
    pub(crate) fn slice(&self, lo: &[u8], hi: &[u8], min_height: u32) -> Result<Sliced> {
        let (node, bounds) = self.slicing_node(lo, hi, min_height)?;
        let cut = self.make_boundary(&node, &bounds, lo)?;
        let cut = self.make_boundary(&node, &bounds, hi)? || cut;
        // Wholly in memory: the range's slot buffers are read (and moved) with it.
        let node = self.pin_whole(node.id)?;
        let slots = {
            let g = node.read();
            let Body::Internal(n) = &g.body else {
                unreachable!()
            };
            slots_of(n, &bounds, lo, hi)
        };
        Ok(Sliced {
            node,
            bounds,
            slots,
            cut,
        })
    }
}

/// The child slots `a..b` of `n` (bounds `b`) that cover exactly `[lo, hi)`, a range whose
/// boundaries are slot boundaries of `n` (or its own bounds).
pub(crate) fn slots_of(n: &Internal, b: &Bounds, lo: &[u8], hi: &[u8]) -> (usize, usize) {
    let first = child_index(&n.pivots, &b.lift_clipped(lo));
    let shi = b.lift_clipped(hi);
    let end = n.pivots.partition_point(|p| p.as_slice() < shi.as_slice()) + 1;
    assert_eq!(
        b.child(n, first).full_lo(),
        lo,
        "a sliced range starts at a slot"
    );
    assert_eq!(
        b.child(n, end - 1).full_hi().as_deref(),
        Some(hi),
        "a sliced range ends at a slot"
    );
    (first, end)
}
