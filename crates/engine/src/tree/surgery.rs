//! Range move by tree surgery (docs/SURGERY.md §3.2): every key under one prefix reappears under
//! another, at a cost in node reads and writes proportional to the tree's height.
//!
//! The source range is sliced into a *run* of whole child slots of one node (`tree/slice.rs`),
//! the (logically empty) destination range into dead slots of the node the run will join, and
//! then, after the operation's record is logged, the run's child ids and buffers are *swung* from
//! the one node to the other. Keys are stored lifted (relative to the prefix their node's bounds
//! imply), so the moved subtrees are renamed by their new position: not a byte of them is read
//! or written. Only the run's pivots and buffered messages, held by its old parent, are rewritten
//! for the new one. The dead destination subtrees are released, and the fringes the slicing left
//! are healed later (`tree/heal.rs`).
//!
//! Message numbers stay right (§3.3): the slicing descents flush every buffer above the run's
//! node and above the destination node, so no ancestor holds a message for either range; the run
//! keeps its own slot buffers, which are newer than the subtrees below them; the destination's
//! old messages, all for a range with no live key, go with the dead slots.
//!
//! Runs with `writers` held exclusive: no other modifier changes the tree. Everything the swing
//! needs is loaded and pinned before the record is logged; from the record on, the swing works in
//! memory.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::slice::{slots_of, Sliced};
use super::{Bounds, Tree};
use crate::cache::{CachedNode, WriteGuard};
use crate::error::Result;
use crate::msg::Msn;
use crate::node::{
    child_index, longest_field, Body, BufSlot, Internal, Leaf, Node, NodeId, RekeyPlan,
    LONGEST_UNKNOWN, ROOT_ID,
};
use crate::ops::prefix_end;

/// A run slot whose buffer holds more than a node's size over this is flushed after a move (and
/// a heal walk flushes a slot on its path only when it holds that much, `tree/heal.rs`).
pub(super) const RUN_DRAIN_DIVISOR: usize = 16;

/// What the source node keeps where the run was after a swing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Keeps {
    /// The run itself (a clone).
    Run,
    /// A chain of new empty nodes with the run's range (a move), kept as a hole for a range
    /// moved back (`KeptHoles` in `tree/heal.rs`).
    Filler,
}

/// A run of child slots taken out of a node, in the node's stored form.
struct Run {
    children: Vec<NodeId>,
    buffers: Vec<BufSlot>,
    /// The pivots between the run's slots.
    pivots: Vec<Vec<u8>>,
}

/// How a key in a moved run is rewritten: from the source node's stored form to the destination
/// node's, `P s` becoming `Q s`.
struct Rekey<'a> {
    /// The source node's prefix (full bytes) and the moved prefix without its last byte.
    src: &'a [u8],
    p: &'a [u8],
    /// The destination node's prefix and the new prefix without its last byte.
    dst: &'a [u8],
    q: &'a [u8],
}

impl Rekey<'_> {
    /// The full key is `src + stored`; it must start with `p`, and `q` + what follows `p` must
    /// start with `dst`; the key becomes what follows `dst`. Everything but `stored` is the same
    /// for every key, so the checks on it are made here once.
    fn plan(&self) -> RekeyPlan {
        let (src, p, q, dst) = (self.src, self.p, self.q, self.dst);
        // `q + rest` where rest is what follows p in src + stored: `h + stored[need..]`.
        let (h, mut need) = if p.len() <= src.len() {
            assert!(src.starts_with(p), "a moved run outside the moved range");
            ([q, &src[p.len()..]].concat(), Vec::new())
        } else {
            assert!(p.starts_with(src), "a moved run outside the moved range");
            (q.to_vec(), p[src.len()..].to_vec())
        };
        let head = if dst.len() <= h.len() {
            assert!(
                h.starts_with(dst),
                "a moved run outside its new node's prefix"
            );
            h[dst.len()..].to_vec()
        } else {
            assert!(
                dst.starts_with(&h),
                "a moved run outside its new node's prefix"
            );
            need.extend_from_slice(&dst[h.len()..]);
            Vec::new()
        };
        RekeyPlan::new(need, head)
    }

    fn key(&self, stored: &[u8]) -> Vec<u8> {
        self.plan().key(stored)
    }

    /// A key-length bound of the source node's form in the destination node's.
    fn bound(&self, longest: u16) -> u16 {
        if longest == LONGEST_UNKNOWN {
            return LONGEST_UNKNOWN;
        }
        let full = longest as usize + self.src.len();
        longest_field((full + self.q.len()).saturating_sub(self.p.len() + self.dst.len()))
    }

    /// A slot with its buffer's keys (when they are needed: `node/slot.rs`) and its bound
    /// rewritten.
    fn slot(&self, slot: BufSlot) -> BufSlot {
        let longest = self.bound(slot.longest);
        let mut out = slot.rekeyed(&self.plan());
        out.longest = longest;
        out
    }
}

impl Tree {
    /// Moves every key under `from` to the same key under `to` by surgery. The destination range
    /// must hold no live key and the operation must have been validated (same last byte below
    /// 0xff, neither prefix of the other). `before(msn)` is called once the surgery can no longer
    /// fail but for a bug, with the one message number the operation takes (the engine logs its
    /// record there). Needs `writers` exclusive.
    pub(crate) fn range_move(
        &self,
        from: &[u8],
        to: &[u8],
        before: &mut dyn FnMut(Msn) -> Result<()>,
    ) -> Result<()> {
        self.graft(from, to, before, false)
    }

    /// Copies every key under `from` to the same key under `to` by surgery (docs/SURGERY.md
    /// §4.1): as [`Tree::range_move`], except that the source keeps its run and the destination
    /// receives the same subtrees, shared (each gains a reference), with copies of their slot
    /// buffers. Needs `writers` exclusive.
    pub(crate) fn range_clone(
        &self,
        from: &[u8],
        to: &[u8],
        before: &mut dyn FnMut(Msn) -> Result<()>,
    ) -> Result<()> {
        self.graft(from, to, before, true)
    }

    /// A range move, or with `clone` a range clone.
    fn graft(
        &self,
        from: &[u8],
        to: &[u8],
        before: &mut dyn FnMut(Msn) -> Result<()>,
        clone: bool,
    ) -> Result<()> {
        let max = self.format.max_key_len;
        let (slo, shi) = (from.to_vec(), prefix_end(from, max));
        let (dlo, dhi) = (to.to_vec(), prefix_end(to, max));
        let (p, q) = (&from[..from.len() - 1], &to[..to.len() - 1]);
        assert_eq!(
            from.last(),
            to.last(),
            "a move between prefix ranges of one kind"
        );
        // 1–2: the source, sliced into a run of whole subtrees of height `h`.
        let src = self.slice(&slo, &shi, 1)?;
        // The swing re-keys every message a run slot buffers: the heavy ones are flushed into
        // their subtrees after the move, in the background, so a range moved again does not
        // pay that again (a directory renamed back and forth spent most of each rename there).
        let heavy = heavy_slot_keys(&src, p, q, self.format.node_size / RUN_DRAIN_DIVISOR);
        let h = src.node.read().height - 1;
        // No moved key passes the limit (checked before the record), nor need its bound.
        let moved = run_bound(&src, p, q).min(max);
        // 3: the destination, sliced at the same height or above; the path down to it learns
        // the moved keys' lengths.
        let (xd, xb) = self.slicing_node_raising(&dlo, &dhi, h + 1, moved)?;
        let src_cut = src.cut;
        drop(src);
        // A destination that is one slot of the node at the run's parent height (a hole an
        // earlier move kept, `KeptHoles`) takes the run as it is: no cut, no fringe to heal.
        let dst_exact = {
            let g = xd.read();
            let Body::Internal(n) = &g.body else {
                unreachable!()
            };
            let c = child_index(&n.pivots, &xb.lift_clipped(&dlo));
            let cb = xb.child(n, c);
            g.height == h + 1 && cb.full_lo() == dlo && cb.full_hi().as_deref() == Some(&dhi[..])
        };
        let dst_cut = self.make_boundary(&xd, &xb, &dlo)?;
        let dst_cut = self.make_boundary(&xd, &xb, &dhi)? || dst_cut;
        assert!(!(dst_exact && dst_cut), "an exact destination slot was cut");
        self.fill_hole(&dlo, &dhi);
        let (dead_slots, dead_roots) = {
            let g = xd.read();
            let Body::Internal(n) = &g.body else {
                unreachable!()
            };
            let (a, b) = slots_of(n, &xb, &dlo, &dhi);
            ((a, b), n.children[a..b].to_vec())
        };
        // The run again: slicing the destination may have cut the node that holds it.
        let run = self.find_sliced(&slo, &shi, h + 1)?;
        // The destination node is changed by the swing: wholly in memory before the record.
        let xd = self.pin_whole(xd.id)?;
        // The out-of-line blocks the messages buffered in the dead slots reference lose those
        // references with them (the slots go in the swing).
        let mut dead_refs = Vec::new();
        {
            let g = xd.read();
            let Body::Internal(n) = &g.body else {
                unreachable!()
            };
            for slot in &n.buffers[dead_slots.0..dead_slots.1] {
                dead_refs.extend(slot.ref_blocks());
            }
        }
        // A move leaves a chain of empty nodes in the source's slot, kept as a hole for a range
        // moved back (`KeptHoles`).
        let keeps = if clone { Keeps::Run } else { Keeps::Filler };
        // 4: the record.
        self.take_msn(before)?;
        // 5: the swing; the dead subtrees lose the slots that named them.
        self.swing(&run, &xd, &xb, dead_slots, (p, q), keeps)?;
        drop(run);
        drop(xd);
        self.release_refs(&dead_refs);
        for &id in &dead_roots {
            self.drop_node_ref(id);
        }
        // They are collected now (what they alone held: their nodes, and the blocks their
        // entries and buffers reference), as far as that succeeds: the operation is logged and
        // applied, and what a failure leaves dead the cleaner collects later.
        match self.collect(usize::MAX) {
            Ok(freed) => {
                self.counters
                    .range_move_released
                    .fetch_add(freed as u64, Ordering::Relaxed);
            }
            Err(e) => log::warn!("amaranth engine: collecting after a range move: {e}"),
        }
        if clone {
            self.counters.range_clones.fetch_add(1, Ordering::Relaxed);
        } else {
            self.counters.range_moves.fetch_add(1, Ordering::Relaxed);
        }
        // 6–7: the fringes heal later (those of the cuts, and those of a destination under a
        // chain: the source's slot itself is kept); a destination node over its fanout is
        // split now.
        if !clone {
            self.keep_hole(&slo, &shi);
        }
        if src_cut || clone {
            self.queue_heal(&slo);
            self.queue_heal(&shi);
        }
        if !dst_exact {
            self.queue_heal(&dlo);
            self.queue_heal(&dhi);
        }
        self.note_moved_edges(&dlo, &dhi);
        for k in &heavy {
            self.queue_drain(k);
        }
        self.counters
            .range_move_drains
            .fetch_add(heavy.len() as u64, Ordering::Relaxed);
        self.fix_fanout(&dlo)
    }

    /// [`Tree::slicing_node`] for a range that is about to receive keys up to `moved` bytes long
    /// (full length): each slot the descent enters has its key-length bound raised to that.
    fn slicing_node_raising(
        &self,
        lo: &[u8],
        hi: &[u8],
        min_height: u32,
        moved: usize,
    ) -> Result<(Arc<CachedNode>, Bounds)> {
        let (node, bounds) = self.slicing_node(lo, hi, min_height)?;
        // The path is clear now; raise the bounds on it, top-down. Only a node whose bound is
        // raised is changed, and it is wholly in memory first (one the descent did not flush
        // into may have been shed since).
        let mut cn = self.pin(ROOT_ID)?;
        let mut b = Bounds::root();
        while !Arc::ptr_eq(&cn, &node) {
            let (c, need, has) = {
                let g = cn.read();
                let Body::Internal(n) = &g.body else {
                    unreachable!("the destination's path ends at an internal node")
                };
                let c = child_index(&n.pivots, &b.lift_clipped(lo));
                let need = if moved >= LONGEST_UNKNOWN as usize {
                    LONGEST_UNKNOWN as usize
                } else {
                    moved.saturating_sub(b.prefix().len())
                };
                (c, need, n.buffers[c].longest as usize)
            };
            if has < need {
                cn = self.pin_whole(cn.id)?;
                let mut g = cn.write();
                self.begin_modify(&cn, &g);
                let Body::Internal(n) = &mut g.body else {
                    unreachable!()
                };
                n.buffers[c].raise_longest(need);
                self.end_modify(&cn, &g);
            }
            let next = {
                let g = cn.read();
                let Body::Internal(n) = &g.body else {
                    unreachable!()
                };
                b.descend(n, c);
                n.children[c]
            };
            cn = self.pin(next)?;
        }
        Ok((node, bounds))
    }

    /// The node at `height` on `lo`'s path, holding `[lo, hi)` as whole child slots, after the
    /// descent asserted that no ancestor buffers a message for it.
    fn find_sliced(&self, lo: &[u8], hi: &[u8], height: u32) -> Result<Sliced> {
        // The ancestors' skeletons tell whether a buffer is empty; the node itself is changed.
        let mut cn = self.pin(ROOT_ID)?;
        let mut b = Bounds::root();
        loop {
            let next = {
                let g = cn.read();
                let Body::Internal(n) = &g.body else {
                    unreachable!("a sliced range lies in an internal node")
                };
                if g.height == height {
                    let slots = slots_of(n, &b, lo, hi);
                    drop(g);
                    return Ok(Sliced {
                        node: self.pin_whole(cn.id)?,
                        bounds: b,
                        slots,
                        cut: false,
                    });
                }
                let c = child_index(&n.pivots, &b.lift_clipped(lo));
                assert!(
                    n.buffers[c].is_empty(),
                    "an ancestor of a sliced range buffers messages for it"
                );
                b.descend(n, c);
                n.children[c]
            };
            cn = self.pin(next)?;
        }
    }

    /// Takes the operation's one message number, calling `before` with it under the root latch
    /// (log order is application order, as for injected messages).
    pub(super) fn take_msn(&self, before: &mut dyn FnMut(Msn) -> Result<()>) -> Result<()> {
        let root = self.pin(ROOT_ID)?;
        let _g = root.write();
        let first = self.next_msn.load(Ordering::Relaxed);
        before(first)?;
        self.next_msn.store(first + 1, Ordering::Relaxed);
        Ok(())
    }

    /// Moves the run's slots from their node to the destination node `xd` (bounds `xb`), in
    /// place of its dead slots: directly when `xd` is one level above the run's subtrees, under a
    /// chain of new single-child nodes otherwise. The source node keeps a slot for the range: a
    /// chain of new empty nodes stands in ([`Keeps::Filler`]). A clone's source keeps
    /// the run ([`Keeps::Run`]), and the destination gets the same subtrees (one more reference
    /// each) with copies of their buffers (one more reference to each block the copies name).
    /// `(p, q)` are the source and destination prefixes without their last byte.
    fn swing(
        &self,
        run: &Sliced,
        xd: &Arc<CachedNode>,
        xb: &Bounds,
        dead: (usize, usize),
        (p, q): (&[u8], &[u8]),
        keeps: Keeps,
    ) -> Result<()> {
        let clone = keeps == Keeps::Run;
        let same = Arc::ptr_eq(&run.node, xd);
        // Latches top-down: the destination node first (it is at the run node's height, where
        // no reader holds both, or higher, where it may be an ancestor of it).
        let mut dg = (!same).then(|| xd.write());
        let mut sg = run.node.write();
        let h = sg.height - 1;
        let dst_height = dg.as_ref().map_or(sg.height, |g| g.height);
        self.begin_modify(&run.node, &sg);
        if let Some(g) = &dg {
            self.begin_modify(xd, g);
        }
        let (a, b) = run.slots;
        let taken = {
            let Body::Internal(sn) = &mut sg.body else {
                unreachable!()
            };
            let buffers = if clone {
                (a..b)
                    .map(|i| {
                        assert!(
                            sn.buffers[i].is_resident(),
                            "the run's node is wholly loaded"
                        );
                        sn.buffers[i].copy()
                    })
                    .collect()
            } else {
                (a..b)
                    .map(|i| std::mem::replace(&mut sn.buffers[i], BufSlot::empty()))
                    .collect()
            };
            Run {
                children: sn.children[a..b].to_vec(),
                buffers,
                pivots: sn.pivots[a..b - 1].to_vec(),
            }
        };
        if clone {
            self.share_run(&taken);
        }
        let filler = (!clone).then(|| self.empty_chain(h, p));
        // The run in its new form: in the destination node itself when it is one level above
        // the run's subtrees, else in a new node under a chain down from the destination node.
        let direct = dst_height == h + 1;
        let dst_prefix: &[u8] = if direct { xb.prefix() } else { q };
        let rekey = Rekey {
            src: run.bounds.prefix(),
            p,
            dst: dst_prefix,
            q,
        };
        let run_msn = taken
            .buffers
            .iter()
            .map(|s| s.resident_max_msn().unwrap_or(0))
            .max()
            .unwrap_or(0);
        let moved = Run {
            children: taken.children,
            buffers: taken
                .buffers
                .into_iter()
                .map(|s| {
                    let before = s.rekey_pending();
                    let out = rekey.slot(s);
                    let after = out.rekey_pending();
                    if after {
                        self.counters
                            .rekeys_deferred
                            .fetch_add(1, Ordering::Relaxed);
                    } else if before {
                        self.counters
                            .rekeys_cancelled
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    out
                })
                .collect(),
            pivots: taken.pivots.iter().map(|k| rekey.key(k)).collect(),
        };
        let insert = if direct {
            moved
        } else {
            self.wrap(moved, h, dst_height, q, xb.prefix().len(), run_msn)
        };
        let (da, db) = dead;
        match dg.as_mut() {
            Some(g) if clone => splice(g, da, db, insert, run_msn),
            None if clone => splice(&mut sg, da, db, insert, run_msn),
            Some(g) => {
                splice(g, da, db, insert, run_msn);
                remove_run(&mut sg, a, b, filler.expect("a move leaves a filler"));
            }
            // In one node, the higher slot range first, so the other's indices stay right.
            None if da > a => {
                splice(&mut sg, da, db, insert, run_msn);
                remove_run(&mut sg, a, b, filler.expect("a move leaves a filler"));
            }
            None => {
                remove_run(&mut sg, a, b, filler.expect("a move leaves a filler"));
                splice(&mut sg, da, db, insert, run_msn);
            }
        }
        self.end_modify(&run.node, &sg);
        if let Some(g) = &dg {
            self.end_modify(xd, g);
        }
        Ok(())
    }

    /// The references a cloned run adds: one to each of its subtrees (now also named by the
    /// destination), one to each out-of-line block its buffers' copies name.
    fn share_run(&self, run: &Run) {
        {
            let mut btt = self.store.btt.lock();
            for &c in &run.children {
                btt.refs.add(c);
            }
        }
        let blocks: Vec<u64> = run.buffers.iter().flat_map(|s| s.ref_blocks()).collect();
        if !blocks.is_empty() {
            let mut d = self.store.data.lock();
            for b in blocks {
                d.refs.add(b, 1);
            }
        }
    }

    /// A chain of new empty nodes of height `h` down to an empty leaf, for a slot whose range
    /// (under the full prefix `p` plus one byte) lost its keys. Returns the top's id and slot.
    pub(super) fn empty_chain(&self, h: u32, p: &[u8]) -> (NodeId, BufSlot) {
        let mut id = self.new_node(Node {
            height: 0,
            max_msn: 0,
            body: Body::Leaf(Leaf::empty()),
            prefix: p.to_vec(),
        });
        for height in 1..=h {
            id = self.new_node(Node {
                height,
                max_msn: 0,
                body: Body::Internal(Internal {
                    pivots: Vec::new(),
                    children: vec![id],
                    buffers: vec![BufSlot::empty().with_longest(0)],
                }),
                prefix: p.to_vec(),
            });
        }
        (id, BufSlot::empty().with_longest(0))
    }

    /// The run (already in the form of a node with prefix `q`) under a new node at height
    /// `h + 1`, and that under single-child nodes up to height `top - 1`: one slot of a node at
    /// height `top` whose prefix is `top_prefix` bytes long, covering the destination's range.
    fn wrap(&self, run: Run, h: u32, top: u32, q: &[u8], top_prefix: usize, max_msn: Msn) -> Run {
        let mut node = Node {
            height: h + 1,
            max_msn,
            body: Body::Internal(Internal {
                pivots: run.pivots,
                children: run.children,
                buffers: run.buffers,
            }),
            prefix: q.to_vec(),
        };
        // Every node of the chain has the destination's bounds: one prefix, one bound.
        let longest = node.longest_stored();
        let mut id = self.new_node(node);
        for height in h + 2..top {
            node = Node {
                height,
                max_msn,
                body: Body::Internal(Internal {
                    pivots: Vec::new(),
                    children: vec![id],
                    buffers: vec![BufSlot::empty().with_longest(longest)],
                }),
                prefix: q.to_vec(),
            };
            id = self.new_node(node);
        }
        Run {
            children: vec![id],
            buffers: vec![BufSlot::empty().with_longest(longest + q.len() - top_prefix)],
            pivots: Vec::new(),
        }
    }

    /// Splits the nodes on `k`'s path that a swing left over their fanout (bottom-up over at
    /// most the tree's height of walks).
    fn fix_fanout(&self, k: &[u8]) -> Result<()> {
        for _ in 0..64 {
            let splits = self.counters.internal_splits.load(Ordering::Relaxed);
            if !self.fanout_over(k)? {
                return Ok(());
            }
            self.heal_path(k, false)?;
            if self.counters.internal_splits.load(Ordering::Relaxed) == splits {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Whether a node on `k`'s path has more children than the format allows.
    fn fanout_over(&self, k: &[u8]) -> Result<bool> {
        let mut cn = self.pin(ROOT_ID)?;
        let mut b = Bounds::root();
        loop {
            let next = {
                let g = cn.read();
                let Body::Internal(n) = &g.body else {
                    return Ok(false);
                };
                if n.children.len() > self.format.max_fanout {
                    return Ok(true);
                }
                let c = child_index(&n.pivots, &b.lift_clipped(k));
                b.descend(n, c);
                n.children[c]
            };
            cn = self.pin(next)?;
        }
    }
}

/// The length of the longest key (full) the run of `src` holds, as it will be under `q` instead
/// of `p`; [`LONGEST_UNKNOWN`] when a slot's bound is unknown.
fn run_bound(src: &Sliced, p: &[u8], q: &[u8]) -> usize {
    let g = src.node.read();
    let Body::Internal(n) = &g.body else {
        unreachable!()
    };
    let plen = src.bounds.prefix().len();
    let mut full = 0;
    for s in &n.buffers[src.slots.0..src.slots.1] {
        if s.longest == LONGEST_UNKNOWN {
            return LONGEST_UNKNOWN as usize;
        }
        let msgs = s.longest_point_key();
        full = full.max(plen + (s.longest as usize).max(msgs));
    }
    (full + q.len()).saturating_sub(p.len())
}

/// Takes slots `a..b` out of `n` (their contents already taken): `filler` takes their place,
/// with the run's bounds (the pivots between its slots go, the ones bounding it stay).
fn remove_run(g: &mut WriteGuard, a: usize, b: usize, (id, slot): (NodeId, BufSlot)) {
    let Body::Internal(n) = &mut g.body else {
        unreachable!()
    };
    n.children.splice(a..b, [id]);
    n.buffers.splice(a..b, [slot]);
    n.pivots.drain(a..b - 1);
}

/// Puts `run` in place of the dead slots `a..b` of `g` (their pivots between them go, the ones
/// bounding them stay) and raises the node's max MSN to the run's buffers'.
fn splice(g: &mut WriteGuard, a: usize, b: usize, run: Run, run_msn: Msn) {
    g.max_msn = g.max_msn.max(run_msn);
    let Body::Internal(n) = &mut g.body else {
        unreachable!()
    };
    n.children.splice(a..b, run.children);
    n.buffers.splice(a..b, run.buffers);
    n.pivots.splice(a..b - 1, run.pivots);
}

/// The first keys, after the move from `p` to `q`, of the run's slots whose buffers hold more
/// than `threshold` bytes: a heal walk to such a key flushes the slot into its subtree.
fn heavy_slot_keys(run: &Sliced, p: &[u8], q: &[u8], threshold: usize) -> Vec<Vec<u8>> {
    let g = run.node.read();
    let Body::Internal(n) = &g.body else {
        unreachable!("a sliced range lies in an internal node")
    };
    (run.slots.0..run.slots.1)
        .filter(|&c| n.buffers[c].bytes() > threshold)
        .map(|c| {
            let lo = run.bounds.child(n, c).full_lo();
            let rest = lo
                .strip_prefix(p)
                .expect("a run slot starts inside the moved range");
            [q, rest].concat()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::Rekey;

    /// The rule written out: `src + stored` must start with `p`; `q` + what follows `p` must
    /// start with `dst`; the new stored key is what follows `dst`.
    fn naive(r: &Rekey, stored: &[u8]) -> Option<Vec<u8>> {
        let full = [r.src, stored].concat();
        let rest = full.strip_prefix(r.p)?;
        let moved = [r.q, rest].concat();
        moved.strip_prefix(r.dst).map(<[u8]>::to_vec)
    }

    #[test]
    fn a_plan_rewrites_keys_as_the_rule_says() {
        // Every split of "ab" / "abx" / "xy" / "xyz" into node prefixes and stored keys.
        let keys: [&[u8]; 4] = [b"abcd", b"abc", b"abxy", b"ab"];
        for full in keys {
            for s in 0..=full.len() {
                let (src, stored) = full.split_at(s);
                for (p, q) in [(&b"ab"[..], &b"xyz"[..]), (b"a", b"x"), (b"abc", b"q")] {
                    for d in 0..=q.len() + 2 {
                        let moved_full = match full.strip_prefix(p) {
                            Some(rest) => [q, rest].concat(),
                            None => continue,
                        };
                        let dst = &moved_full[..d.min(moved_full.len())];
                        let r = Rekey { src, p, dst, q };
                        assert_eq!(
                            Some(r.plan().key(stored)),
                            naive(&r, stored),
                            "src {src:?} stored {stored:?} p {p:?} q {q:?} dst {dst:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn a_key_outside_the_moved_range_is_refused() {
        let r = Rekey {
            src: b"",
            p: b"ab",
            dst: b"",
            q: b"x",
        };
        let _ = r.plan().key(b"ac1");
    }
}
