//! Restoring key order on the device (docs/DESIGN.md, Placement).
//!
//! A checkpoint writes its dirty leaves in key order into one run of contiguous free space. After
//! it, two leaves that are neighbours in key order lie next to each other on the device if both
//! were in the run, or if neither was and they already did. A leaf rewritten alone therefore
//! breaks the order on both of its sides, and random updates wear it down checkpoint after
//! checkpoint. Before a checkpoint cuts its state, [`Tree::relocate_for_order`] adds clean leaves
//! to it where that joins its run to their neighbours: a clean leaf between two dirty ones, or
//! next to a dirty one when its other side is out of order anyway, continuing along the leaves
//! that are out of order. Only leaves fully in memory are taken (no reads), and at most a fixed
//! share of the dirty leaves' count, so the extra writing is bounded.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::cache::CachedNode;
use crate::node::{Body, NodeId, ROOT_ID};
use crate::superblock::Extent;
use crate::tree::Tree;

/// At most this many clean leaves relocated per dirty leaf of a checkpoint (numerator and
/// denominator).
const RELOCATE_PER_DIRTY: (usize, usize) = (1, 1);

/// A leaf as the selection sees it.
struct Slot {
    cn: Option<Arc<CachedNode>>,
    /// Dirty, or chosen for relocation: written in the checkpoint's run.
    in_run: bool,
    /// Clean and fully in memory: may be relocated.
    movable: bool,
    at: Option<Extent>,
}

impl Slot {
    /// Whether this leaf and the next one in key order lie one after the other now.
    fn adjacent(&self, next: &Slot) -> bool {
        match (self.at, next.at) {
            (Some(a), Some(b)) => a.block + a.blocks == b.block,
            _ => false,
        }
    }
}

impl Tree {
    /// Marks dirty, for the checkpoint about to begin, the clean leaves whose rewrite next to
    /// their dirty neighbours restores key order on the device (see the module documentation).
    /// Call under the `writers` lock held exclusive, before the checkpoint marks its nodes.
    /// Returns how many leaves it marked.
    pub(crate) fn relocate_for_order(&self) -> u64 {
        let runs = self.leaf_runs();
        let dirty: usize = runs.iter().flatten().filter(|s| s.in_run).count();
        let mut budget = dirty * RELOCATE_PER_DIRTY.0 / RELOCATE_PER_DIRTY.1;
        // A relocated leaf holds its old image and its new one until the next checkpoint: move
        // leaves only while the free space stays over twice what the checkpoint writes.
        let free = self.store.btt.lock().alloc.free_blocks();
        let mut room = (free / 2).saturating_sub(self.cache.dirty_space().next_blocks);
        let mut gaps: Vec<Gap> = runs
            .iter()
            .enumerate()
            .flat_map(|(r, run)| gaps(run).into_iter().map(move |g| (r, g)))
            .map(|(r, (range, fixes))| Gap {
                run: r,
                range,
                fixes,
            })
            .collect();
        // Cheapest first: fewest leaves rewritten per pair of neighbours put back in order.
        gaps.sort_by_key(|g| (g.range.len() * 1000 / g.fixes, g.run, g.range.start));
        let mut marked = 0;
        for g in gaps {
            let blocks: u64 = runs[g.run][g.range.clone()]
                .iter()
                .map(|s| s.at.map_or(0, |e| e.blocks))
                .sum();
            if g.range.len() > budget || blocks > room {
                continue;
            }
            budget -= g.range.len();
            room -= blocks;
            for slot in &runs[g.run][g.range] {
                let cn = slot.cn.as_ref().expect("a movable leaf is cached");
                if self.mark_for_relocation(cn) {
                    marked += 1;
                }
            }
        }
        self.store
            .counters
            .relocated
            .fetch_add(marked, Ordering::Relaxed);
        marked
    }

    /// The leaves in key order, as the selection sees them, found through the cached internal
    /// nodes from the root: one sequence per stretch of the key space whose internal nodes are
    /// all cached (an internal node not in memory ends one).
    fn leaf_runs(&self) -> Vec<Vec<Slot>> {
        // Looked up here rather than with `Cache::get`, which would count a use of every node.
        let cached: HashMap<NodeId, Arc<CachedNode>> =
            self.cache.all().into_iter().map(|cn| (cn.id, cn)).collect();
        let mut runs: Vec<Vec<NodeId>> = vec![Vec::new()];
        let mut stack: Vec<(NodeId, u32)> = vec![(ROOT_ID, u32::MAX)];
        while let Some((id, height)) = stack.pop() {
            if height == 0 {
                runs.last_mut().expect("a run").push(id);
                continue;
            }
            let Some(cn) = cached.get(&id) else {
                runs.push(Vec::new());
                continue;
            };
            let g = cn.read();
            match &g.body {
                Body::Internal(n) => {
                    stack.extend(n.children.iter().rev().map(|&c| (c, g.height - 1)));
                }
                Body::Leaf(_) => runs.last_mut().expect("a run").push(id),
            }
        }
        let at: HashMap<NodeId, Extent> = {
            let btt = self.store.btt.lock();
            runs.iter()
                .flatten()
                .filter_map(|id| btt.current.get(id).map(|e| (*id, *e)))
                .collect()
        };
        runs.into_iter()
            .filter(|r| !r.is_empty())
            .map(|leaves| {
                leaves
                    .into_iter()
                    .map(|id| {
                        let cn = cached.get(&id).cloned();
                        let (in_run, movable) = cn.as_ref().map_or((false, false), |cn| {
                            let m = cn.meta.lock();
                            let dirty = m.dirty && !m.deleted;
                            let clean = !m.dirty && !m.deleted && !m.pending;
                            drop(m);
                            (dirty, clean && cn.read().fully_resident())
                        });
                        Slot {
                            cn,
                            in_run,
                            movable,
                            at: at.get(&id).copied(),
                        }
                    })
                    .collect()
            })
            .collect()
    }

    /// Marks a clean leaf dirty, unchanged, so that the checkpoint rewrites it. Skips it (false)
    /// if it is latched or changed meanwhile.
    fn mark_for_relocation(&self, cn: &Arc<CachedNode>) -> bool {
        let Some(g) = cn.latch.try_write_arc() else {
            return false;
        };
        {
            let m = cn.meta.lock();
            if m.dirty || m.deleted || m.pending || g.height != 0 || !g.fully_resident() {
                return false;
            }
        }
        self.end_modify(cn, &g);
        true
    }
}

/// Clean leaves that could join a checkpoint's run, as one piece.
struct Gap {
    run: usize,
    range: Range<usize>,
    /// Pairs of key-order neighbours that would lie one after the other afterwards and would
    /// not otherwise.
    fixes: usize,
}

/// The pieces of clean, movable leaves worth rewriting with the dirty leaves of one sequence of
/// leaves in key order, with the pairs each puts in order. For every stretch of clean leaves
/// next to a dirty one: the whole stretch when dirty leaves bound it on both sides (its two ends,
/// which the dirty leaves' move breaks, and the pairs inside it already out of order), and the
/// part of it from a dirty end up to the first pair already out of order (that one end).
fn gaps(run: &[Slot]) -> Vec<(Range<usize>, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < run.len() {
        if run[i].in_run {
            i += 1;
            continue;
        }
        let start = i;
        while i < run.len() && !run[i].in_run {
            i += 1;
        }
        let stretch = start..i;
        let left = start > 0;
        let right = i < run.len();
        if !(left || right) || !run[stretch.clone()].iter().all(|s| s.movable) {
            continue;
        }
        // Positions j in the stretch where leaf j - 1 and leaf j are not next to each other.
        let breaks: Vec<usize> = (start + 1..i)
            .filter(|&j| !run[j - 1].adjacent(&run[j]))
            .collect();
        if left && right {
            out.push((stretch.clone(), 2 + breaks.len()));
        }
        if let (true, Some(&b)) = (left, breaks.first()) {
            out.push((start..b, 1));
        }
        if let (true, Some(&b)) = (right, breaks.last()) {
            out.push((b..i, 1));
        }
        if breaks.is_empty() && left != right {
            out.push((stretch, 1));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Leaves at the given blocks (each 1 block long), dirty where `d` is set.
    fn seq(at: &[u64], dirty: &[usize]) -> Vec<Slot> {
        at.iter()
            .enumerate()
            .map(|(i, &block)| Slot {
                cn: None,
                in_run: dirty.contains(&i),
                movable: !dirty.contains(&i),
                at: Some(Extent { block, blocks: 1 }),
            })
            .collect()
    }

    #[test]
    fn gaps_join_dirty_leaves_to_their_neighbours() {
        // 0 1 2 | 3 4 lie in order; leaf 5 is dirty, leaf 6 sits far away, leaf 7 dirty.
        let run = seq(&[10, 11, 12, 40, 41, 90, 70, 95], &[5, 7]);
        let g = gaps(&run);
        // Between the two dirty leaves: leaf 6 alone joins both.
        assert!(g.contains(&(6..7, 2)), "{g:?}");
        // Before leaf 5: back to the break between 2 and 3, one pair put in order.
        assert!(g.contains(&(3..5, 1)), "{g:?}");
        assert!(!g.iter().any(|(r, _)| r.contains(&0)), "{g:?}");
        // A stretch with a leaf that cannot move is left alone.
        let mut run = seq(&[10, 11, 90, 70, 95], &[2, 4]);
        run[3].movable = false;
        assert!(!gaps(&run).iter().any(|(r, _)| r.contains(&3)));
        // Nothing dirty: nothing to join.
        assert!(gaps(&seq(&[5, 9, 1], &[])).is_empty());
    }
}
