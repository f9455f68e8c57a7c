//! Healing (docs/SURGERY.md §3.2, step 7): slicing leaves under-full nodes on both sides of each
//! key it cut at, and the path flushes of a range operation can leave a node over its size. The
//! keys are queued (in memory only: healing changes no content, and after a crash the fringes
//! merge the usual way, when flushes reach them); a heal step walks down to each queued key and
//! to the keys just below it, restructuring the child on its path (split when over its size,
//! merge with a sibling when the two fit in one node, the slot's messages delivered first),
//! flushing a heavy slot on its path into its child, and draining a node on the way whose buffers
//! hold more than a node's worth. It reads a node whole only to change it (`heal_path`).

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::split_merge::{merge_relift_bytes, relift_size};
use super::surgery::RUN_DRAIN_DIVISOR;
use super::{Bounds, Tree};
use crate::cache::CachedNode;
use crate::error::Result;
use crate::node::{child_index, Body, Node, NodeId, ROOT_ID};

/// Keys the heal queue holds at most (further fringes are left to the usual merges).
const HEAL_QUEUE_MAX: usize = 4096;

/// Flushes of one over-full node's heaviest buffers per heal step at most.
const DRAIN_MAX: usize = 16;

/// A heal merges two nodes only when the merge re-lifts at most a node's size over
/// `HEAL_RELIFT_DIVISOR` plus `HEAL_RELIFT_PER_BYTE` times the smaller one's bytes (see
/// `heal_path`).
const HEAL_RELIFT_DIVISOR: usize = 8;
const HEAL_RELIFT_PER_BYTE: usize = 4;

/// Across the edge of a range moved lately, a heal merges two nodes only when the merge re-lifts
/// at most a node's size over `EDGE_RELIFT_DIVISOR` plus one `EDGE_KEPT_PER_RELIFT`th of the
/// bytes it keeps as they are (see `heal_path`).
const EDGE_RELIFT_DIVISOR: usize = 256;
const EDGE_KEPT_PER_RELIFT: usize = 16;

/// Edges of moved ranges remembered at most (the oldest are forgotten first).
const MOVED_EDGES_MAX: usize = 1024;

/// The bounds (full keys) of the ranges moved or cloned lately, oldest first: where the moved
/// run's end nodes meet the nodes that were beside the destination.
#[derive(Default)]
pub(crate) struct MovedEdges {
    order: VecDeque<Vec<u8>>,
    set: HashSet<Vec<u8>>,
}

impl MovedEdges {
    fn insert(&mut self, k: &[u8]) {
        if self.set.contains(k) {
            return;
        }
        if self.order.len() == MOVED_EDGES_MAX {
            let old = self.order.pop_front().expect("a full list");
            self.set.remove(&old);
        }
        self.order.push_back(k.to_vec());
        self.set.insert(k.to_vec());
    }
}

/// Holes kept at most: ranges a move emptied, left as a slot of their own (a filler) so that a
/// range moved into one of them later finds its bounds cut already (the oldest is healed first).
const KEPT_HOLES_MAX: usize = 16;

/// The ranges moves emptied lately, oldest first, each still a slot of its own (a chain of
/// empty nodes): a heal does not merge across their bounds, so a range moved back (a
/// directory renamed back and forth, an exchange through its parking place) lands in the
/// slot as it is, with no node cut and nothing to heal afterwards.
#[derive(Default)]
pub(crate) struct KeptHoles {
    order: VecDeque<(Vec<u8>, Vec<u8>)>,
}

impl KeptHoles {
    fn is_edge(&self, k: &[u8]) -> bool {
        self.order
            .iter()
            .any(|(lo, hi)| lo.as_slice() == k || hi.as_slice() == k)
    }
}

/// Walks per queued key at most (a tree is never this high).
const MAX_HEIGHT: usize = 64;

impl Tree {
    /// Queues the fringe around `k` (a key some node was cut at) for healing.
    pub(crate) fn queue_heal(&self, k: &[u8]) {
        let mut q = self.heal.lock();
        if q.len() < HEAL_QUEUE_MAX {
            q.insert(k.to_vec());
        }
    }

    /// Remembers `[lo, hi)` as a range just moved or cloned: a heal merges across its bounds
    /// only cheaply (`heal_path`).
    pub(crate) fn note_moved_edges(&self, lo: &[u8], hi: &[u8]) {
        let mut e = self.moved_edges.lock();
        e.insert(lo);
        e.insert(hi);
    }

    /// Keeps the hole `[lo, hi)` a move just emptied out of the heal (see [`KeptHoles`]); the
    /// oldest hole past [`KEPT_HOLES_MAX`] is queued for healing.
    pub(crate) fn keep_hole(&self, lo: &[u8], hi: &[u8]) {
        let evicted = {
            let mut h = self.kept_holes.lock();
            h.order.retain(|(l, _)| l.as_slice() != lo);
            h.order.push_back((lo.to_vec(), hi.to_vec()));
            if h.order.len() > KEPT_HOLES_MAX {
                h.order.pop_front()
            } else {
                None
            }
        };
        if let Some((l, h)) = evicted {
            self.queue_heal(&l);
            self.queue_heal(&h);
        }
    }

    /// Forgets `[lo, hi)` as a kept hole: a range is about to be moved or cloned into it.
    pub(crate) fn fill_hole(&self, lo: &[u8], hi: &[u8]) {
        self.kept_holes
            .lock()
            .order
            .retain(|(l, u)| !(l.as_slice() == lo && u.as_slice() == hi));
    }

    /// Queues a walk to `k` that flushes the heavy slot of a moved run starting there, for when
    /// writes pause (`heal_step` with `drains`).
    pub(crate) fn queue_drain(&self, k: &[u8]) {
        let mut q = self.drains.lock();
        if q.len() < HEAL_QUEUE_MAX {
            q.insert(k.to_vec());
        }
    }

    /// Whether fringes wait to be healed.
    pub fn heal_pending(&self) -> bool {
        !self.heal.lock().is_empty()
    }

    /// Whether moved runs' heavy slots wait to be flushed.
    pub fn drains_pending(&self) -> bool {
        !self.drains.lock().is_empty()
    }

    /// Heals the fringes around up to `max` queued keys, and with `drains`, once no fringe is
    /// left, flushes the queued heavy slots of moved runs. Returns how many keys it took from
    /// the queues. The caller holds `writers` shared and no latch.
    pub fn heal_step(&self, max: usize, drains: bool) -> Result<usize> {
        let mut done = 0;
        while done < max {
            let next = self.heal.lock().pop_first();
            let next = match next {
                Some(k) => Some(k),
                None if drains => self.drains.lock().pop_first(),
                None => None,
            };
            let Some(k) = next else {
                break;
            };
            // A merge low on the path can make room for one above it: walk again while the
            // walks merge something (at most once per level).
            for _ in 0..=MAX_HEIGHT {
                let merges = self.counters.merges.load(Ordering::Relaxed);
                self.heal_path(&k, false)?;
                self.heal_path(&k, true)?;
                self.make_room()?;
                if self.counters.merges.load(Ordering::Relaxed) == merges {
                    break;
                }
            }
            done += 1;
        }
        Ok(done)
    }

    /// Walks down to `k` (or, with `below`, to the keys just below it); at each level, splits
    /// the child on the path if over its size, or merges it with a sibling if the two fit in one
    /// node (whatever their fill: the pieces slicing cut are put back together), and flushes the
    /// child's slot into it when the slot is heavy or the child is restructured.
    ///
    /// A node on the path is read whole only when the walk changes it: an internal node passed
    /// through is walked as its skeleton. When the walk finds it must change a node it holds as a
    /// skeleton (its latch is held, so its sub-blocks cannot be loaded under it), it walks again
    /// from the root with that node read whole from its parent (in the dirrename benchmark, the
    /// heal read internal nodes of 4 MiB whole only to pass through them: 13 of the 39 MB the
    /// first two cold renames read, while the renames waited for `writers`).
    pub(super) fn heal_path(&self, k: &[u8], below: bool) -> Result<()> {
        let mut whole = HashSet::new();
        for _ in 0..=MAX_HEIGHT {
            match self.heal_walk(k, below, &whole)? {
                // A node asked for again was shed meanwhile: left to a later heal or flush.
                Some(id) if !whole.insert(id) => return Ok(()),
                Some(_) => {}
                None => return Ok(()),
            }
        }
        Ok(())
    }

    /// One walk of [`Tree::heal_path`]; the nodes in `whole` are read whole when entered.
    /// Returns `Some(id)` when the walk stopped before changing node `id`, which it held as a
    /// skeleton (nothing is changed in it; what the walk changed above it stays changed).
    fn heal_walk(&self, k: &[u8], below: bool, whole: &HashSet<NodeId>) -> Result<Option<NodeId>> {
        let f = &self.format;
        let root = self.pin_whole(ROOT_ID)?;
        let mut g = root.write();
        if !g.fully_resident() {
            return Ok(None);
        }
        // The root's own shape first (a root left with one child collapses).
        for _ in 0..4 {
            match self.fix_root(&root, &mut g)? {
                Ok(true) => {}
                Ok(false) => break,
                Err(_) => return Ok(None),
            }
        }
        let (mut cn, mut b) = (root, Bounds::root());
        let mut pins: Vec<Arc<CachedNode>> = Vec::new();
        loop {
            // A node whose buffers hold more than a node's worth (it received a path flush):
            // drain its heaviest buffers. Children are loaded under the parent's latch:
            // maintenance, readers passing through wait (as in `drain_from`).
            for _ in 0..DRAIN_MAX {
                let c = match &g.body {
                    Body::Internal(n) if n.buffered_bytes() > f.node_size => n.heaviest_child(),
                    _ => break,
                };
                if !g.fully_resident() {
                    return Ok(Some(cn.id));
                }
                let cid = self.own_child(&cn, &mut g, c)?;
                let ccn = self.pin_whole(cid)?;
                let mut cg = ccn.write();
                if !cg.fully_resident() {
                    return Ok(None);
                }
                self.flush_into_child(&cn, &mut g, &b, c, &ccn, &mut cg)?;
            }
            let path = |g: &Node| -> Option<(usize, u64)> {
                let Body::Internal(n) = &g.body else {
                    return None;
                };
                let s = b.lift_clipped(k);
                let c = if below {
                    n.pivots.partition_point(|p| p.as_slice() < s.as_slice())
                } else {
                    child_index(&n.pivots, &s)
                };
                Some((c, n.children[c]))
            };
            let Some((c, cid)) = path(&g) else {
                return Ok(None);
            };
            if self.is_shared(cid) && !g.fully_resident() {
                return Ok(Some(cn.id));
            }
            let cid = self.own_child(&cn, &mut g, c)?;
            // A child is read whole only when it is changed (here, or below when the walk asks
            // for it): a 4 MiB leaf read for nothing cost a rename waiting on the heal a cold
            // read, and so did an internal node passed through.
            let ccn = if whole.contains(&cid) {
                self.pin_whole(cid)?
            } else {
                self.pin(cid)?
            };
            let Body::Internal(n) = &g.body else {
                unreachable!()
            };
            // The slot's messages go down with a restructuring of the child, or when the slot
            // is heavy (the run slots a move re-keyed, `RUN_DRAIN_DIVISOR`). A few messages
            // are left to the usual flushes: delivering them read a cold 4 MiB leaf whole, and
            // most of the bytes the heal read in the dirrename benchmark were for that.
            let pending = n.buffers[c].bytes() > f.node_size / RUN_DRAIN_DIVISOR;
            let over = {
                let cg = ccn.read();
                match &cg.body {
                    Body::Leaf(l) => l.bytes() > f.node_size,
                    Body::Internal(i) => i.children.len() > f.max_fanout,
                }
            };
            // The sibling to merge with, judged on skeletons (sizes are known without contents;
            // a sibling is read whole only to merge: reading every sibling whole was 18% of the
            // daemon's time in directory renames): one the child fits with, unless the merge
            // re-lifts much more than it saves. A small piece merged into a large node with a
            // longer prefix rewrites the whole large node into the shorter one, and the next
            // slice at the same key (a directory renamed again) cuts and re-lifts it again: two
            // 4 MiB re-lifts per rename for a piece of a few root entries. The same held for a
            // 64 MiB file renamed back and forth: its leaf (400 KB of block references, lifted to
            // the file's name) was merged with the 300 KB of neighbours the cut left beside it,
            // and cut out again at the next rename, so a rename's cost grew with the file's size.
            // So across the edge of a range moved lately, a merge re-lifts at most a 256th of a
            // node plus a sixteenth of the bytes it keeps as they are: a small piece merges into
            // a large node whose prefix stays, pieces of a few kilobytes merge with each other,
            // a moved node with a longer prefix and more in it stays as it is. Elsewhere (the
            // pieces a cut left where the range was, or a slice that moved nothing) pieces of
            // similar sizes merge back.
            let mut sibling = None;
            for s in [c + 1, c.wrapping_sub(1)] {
                // A shared sibling is never merged (`merge_child_with` leaves it as it is).
                if s >= n.children.len() || self.is_shared(n.children[s]) {
                    continue;
                }
                // A kept hole stays a slot of its own (`KeptHoles`).
                let pivot = [b.prefix(), &n.pivots[c.min(s)]].concat();
                if self.kept_holes.lock().is_edge(&pivot) {
                    continue;
                }
                let scn = self.pin(n.children[s])?;
                let (cg, sg) = (ccn.read(), scn.read());
                let pending = n.buffers[s].bytes();
                if !self.merge_fits(&cg, &sg, pending) {
                    continue;
                }
                let (cb, sb) = (relift_size(&cg), relift_size(&sg) + pending);
                let relift = merge_relift_bytes(n, &b, c, s, cb, sb - pending, pending);
                assert!(
                    relift <= cb + sb,
                    "a merge re-lifts more than both halves hold"
                );
                let edge = self.moved_edges.lock().set.contains(&pivot);
                let pays = if edge {
                    relift
                        <= f.node_size / EDGE_RELIFT_DIVISOR
                            + (cb + sb - relift) / EDGE_KEPT_PER_RELIFT
                } else {
                    relift <= f.node_size / HEAL_RELIFT_DIVISOR + HEAL_RELIFT_PER_BYTE * cb.min(sb)
                };
                if pays {
                    sibling = Some(s);
                    break;
                }
            }
            let fits = sibling.is_some();
            if (pending || over || fits) && !g.fully_resident() {
                return Ok(Some(cn.id));
            }
            if let Some(s) = sibling {
                pins.push(self.pin_child_whole(n, s)?);
            }
            if pending || over || fits {
                let ccn = self.pin_whole(cid)?;
                let mut cg = ccn.write();
                if !cg.fully_resident() {
                    return Ok(None);
                }
                self.deliver_into_child(&cn, &mut g, &b, c, &ccn, &mut cg)?;
                if !self.split_child(&mut g, &b, c, &ccn, &mut cg) {
                    if let Some(s) = sibling {
                        self.merge_child_with(&mut g, &b, c, s, &ccn, &mut cg)?;
                    }
                }
                self.end_modify(&cn, &g);
            }
            // Down to the child on the path as it is now (the step may have split or merged it).
            let Some((c, cid)) = path(&g) else {
                return Ok(None);
            };
            if self.is_shared(cid) && !g.fully_resident() {
                return Ok(Some(cn.id));
            }
            let cid = self.own_child(&cn, &mut g, c)?;
            let Some(ccn) = self.cache.get(cid) else {
                return Ok(None);
            };
            let cg = ccn.write();
            if cg.height == 0 {
                return Ok(None);
            }
            if let Body::Internal(n) = &g.body {
                b.descend(n, c);
            }
            g = cg;
            cn = ccn;
        }
    }
}
