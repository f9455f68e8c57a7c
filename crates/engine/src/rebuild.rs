//! Building a new tree over salvaged leaves (see [`crate::salvage`]).
//!
//! Leaves arrive in key order, each with its lowest key and the messages its old ancestors held
//! for it. Kept leaves stay where they are on disk (no copy); rebuilt leaves are new nodes. New
//! internal nodes are built bottom-up, like a B-tree bulk load: the lowest level holds each leaf's
//! messages in that leaf's buffer (they keep their sequence numbers, so the log replays on top
//! unchanged), the levels above start empty. The top node becomes the root (id 1). Everything new
//! is dirty in the cache; the next checkpoint writes it to free space, never over the checkpoint
//! being repaired.
//!
//! The builder works with full keys: every node it makes has an empty prefix. When the tree is
//! whole, [`Builder::finish`] re-lifts it from the root down to the prefixes its pivots give
//! (docs/SURGERY.md §2.1); a kept leaf whose new bounds give another prefix than the one it was
//! stored under (its hint) is rewritten with it (§2.7).

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use crate::buffer::Buffer;
use crate::dataref::Val;
use crate::error::Result;
use crate::msg::{KeyMsgs, Msn};
use crate::node::{Body, BufSlot, Internal, Leaf, Node, NodeId, ROOT_ID};
use crate::tree::{Bounds, Tree};

/// The children gathered for the node being filled at one level, and the last node sealed there.
#[derive(Default)]
struct LevelAcc {
    lows: Vec<Vec<u8>>,
    ids: Vec<NodeId>,
    bufs: Vec<Buffer>,
    max_msn: Msn,
    bytes: usize,
    /// Sealed but not handed up yet: if it stays the only node of its level, it is the root.
    held: Option<(Vec<u8>, Node)>,
}

/// Bulk-loads a tree from leaves given in key order.
pub(crate) struct Builder<'t> {
    tree: &'t Tree,
    levels: Vec<LevelAcc>,
    /// Leaves kept where they were (every other node of the old tree goes), each with the prefix
    /// its stored keys were read under.
    pub reused: HashMap<NodeId, Vec<u8>>,
    fanout: usize,
}

impl<'t> Builder<'t> {
    pub(crate) fn new(tree: &'t Tree) -> Builder<'t> {
        Builder {
            tree,
            levels: Vec::new(),
            reused: HashMap::new(),
            fanout: (tree.format.max_fanout * 3 / 4).max(2),
        }
    }

    fn new_id(&self) -> NodeId {
        self.tree.next_node_id.fetch_add(1, Ordering::Relaxed)
    }

    fn insert(&self, id: NodeId, node: Node) -> Result<()> {
        node.check_invariants(id);
        self.tree.cache.insert(id, node, true, 0);
        self.tree.make_room()
    }

    /// A leaf kept as it is, whose range starts at `lo`, its keys stored without `prefix`.
    pub(crate) fn reuse(
        &mut self,
        id: NodeId,
        lo: Vec<u8>,
        max_msn: Msn,
        pending: Buffer,
        prefix: Vec<u8>,
    ) -> Result<()> {
        let first = self.reused.insert(id, prefix).is_none();
        assert!(first, "leaf {id} kept twice");
        self.add_child(0, lo, id, max_msn, pending)
    }

    /// A new leaf (or several, if they do not fit one) for `[lo, hi)` holding `entries` (sorted,
    /// inside the range), with the messages pending for the range.
    pub(crate) fn fresh(
        &mut self,
        lo: Vec<u8>,
        hi: Option<Vec<u8>>,
        entries: Vec<(Vec<u8>, Val)>,
        pending: Buffer,
    ) -> Result<()> {
        let format = self.tree.format.clone();
        let mut first = Leaf::empty();
        if !entries.is_empty() {
            let points: Vec<(Vec<u8>, KeyMsgs)> = entries
                .into_iter()
                .map(|(k, v)| {
                    let km = match v {
                        Val::Bytes(value) => KeyMsgs::Put { msn: 1, value },
                        Val::Ref(r) => KeyMsgs::PutRef { msn: 1, r },
                    };
                    (k, km)
                })
                .collect();
            let released = first.apply(&[], &points, &format);
            assert!(released.is_empty(), "a new leaf dropped references");
        }
        let mut pieces = vec![(lo, Leaf::empty())];
        let rest = first.split(&format);
        pieces[0].1 = first;
        pieces.extend(rest);
        let lows: Vec<Vec<u8>> = pieces.iter().map(|(l, _)| l.clone()).collect();
        for (i, (low, leaf)) in pieces.into_iter().enumerate() {
            let next = lows.get(i + 1).cloned().or_else(|| hi.clone());
            let mut mine = Buffer::new();
            restrict(&pending, &low, next.as_deref(), &mut mine);
            let id = self.new_id();
            // Every pending message is newer than these entries; 0 says nothing was applied.
            let node = Node {
                height: 0,
                max_msn: 0,
                body: Body::Leaf(leaf),
                prefix: Vec::new(),
            };
            self.insert(id, node)?;
            self.add_child(0, low, id, 0, mine)?;
        }
        Ok(())
    }

    fn add_child(
        &mut self,
        level: usize,
        lo: Vec<u8>,
        id: NodeId,
        max_msn: Msn,
        pending: Buffer,
    ) -> Result<()> {
        if self.levels.len() <= level {
            self.levels.push(LevelAcc::default());
        }
        let node_size = self.tree.format.node_size;
        let full = {
            let a = &self.levels[level];
            a.ids.len() >= self.fanout
                || (a.ids.len() >= 2 && a.bytes + pending.bytes() > node_size)
        };
        if full {
            self.seal(level)?;
        }
        let a = &mut self.levels[level];
        a.max_msn = a.max_msn.max(max_msn).max(pending.max_msn());
        a.bytes += pending.bytes();
        a.lows.push(lo);
        a.ids.push(id);
        a.bufs.push(pending);
        Ok(())
    }

    /// Seals the node being filled at `level`; hands the one sealed before it up a level.
    fn seal(&mut self, level: usize) -> Result<()> {
        let a = &mut self.levels[level];
        let mut lows = std::mem::take(&mut a.lows);
        let node = Node {
            height: level as u32 + 1,
            max_msn: std::mem::take(&mut a.max_msn),
            body: Body::Internal(Internal {
                pivots: lows.split_off(1),
                children: std::mem::take(&mut a.ids),
                buffers: std::mem::take(&mut a.bufs)
                    .into_iter()
                    .map(BufSlot::resident)
                    .collect(),
            }),
            prefix: Vec::new(),
        };
        a.bytes = 0;
        let lo = lows.pop().expect("a sealed node has a first child");
        if let Some((hlo, held)) = a.held.replace((lo, node)) {
            self.emit(level, hlo, held)?;
        }
        Ok(())
    }

    fn emit(&mut self, level: usize, lo: Vec<u8>, node: Node) -> Result<()> {
        let id = self.new_id();
        let max = node.max_msn;
        self.insert(id, node)?;
        self.add_child(level + 1, lo, id, max, Buffer::new())
    }

    /// Finishes the tree: the last node left alone at its level becomes the root. Then re-lifts
    /// it; returns how many kept leaves that rewrote.
    pub(crate) fn finish(self) -> Result<u64> {
        let tree = self.tree;
        let kept = self.assemble()?;
        lift_built(tree, &kept)
    }

    fn assemble(mut self) -> Result<HashMap<NodeId, Vec<u8>>> {
        if self.levels.is_empty() {
            self.insert(ROOT_ID, Node::empty_leaf())?;
            return Ok(self.reused);
        }
        let mut level = 0;
        loop {
            if !self.levels[level].ids.is_empty() {
                self.seal(level)?;
            }
            let (lo, node) = self.levels[level]
                .held
                .take()
                .expect("every level holds a node at the end");
            let above_empty = self
                .levels
                .get(level + 1)
                .is_none_or(|a| a.ids.is_empty() && a.held.is_none());
            if above_empty {
                self.insert(ROOT_ID, node)?;
                return Ok(self.reused);
            }
            self.emit(level, lo, node)?;
            level += 1;
        }
    }
}

/// Gives every node of the built tree the prefix its bounds give, from the root down. Built nodes
/// hold full keys (prefix empty); kept leaves hold their keys under their hint, which differs from
/// the new prefix only for adopted orphans. Returns how many kept leaves were rewritten.
fn lift_built(tree: &Tree, kept: &HashMap<NodeId, Vec<u8>>) -> Result<u64> {
    let mut relifted = 0;
    let mut stack = vec![(ROOT_ID, Bounds::root())];
    while let Some((id, bounds)) = stack.pop() {
        let cn = tree.pin(id)?;
        let read_under = kept.get(&id);
        let same =
            read_under.map_or(cn.read().prefix.as_slice(), |p| p.as_slice()) == bounds.prefix();
        if !same {
            if !cn.read().fully_resident() {
                tree.load_partitions(&cn, None)?;
            }
            let mut g = cn.write();
            tree.begin_modify(&cn, &g);
            if let Some(p) = read_under {
                // A stale hint (the image's) gives way to the prefix the walk read the keys under.
                g.prefix = p.clone();
            }
            let old = g.prefix.clone();
            let new = bounds.prefix();
            if let Some(more) = new.strip_prefix(old.as_slice()) {
                g.relift(more, &[]);
            } else {
                g.relift(&[], &old);
                g.relift(new, &[]);
            }
            assert_eq!(
                g.prefix.as_slice(),
                new,
                "node {id}: re-lifted to its bounds"
            );
            tree.end_modify(&cn, &g);
            relifted += u64::from(read_under.is_some());
        }
        let g = cn.read();
        if let Body::Internal(n) = &g.body {
            for c in 0..n.children.len() {
                stack.push((n.children[c], bounds.child(n, c)));
            }
        }
    }
    Ok(relifted)
}

/// Adds the messages of `b` in `[lo, hi)` to `out` (which holds only older messages, or messages
/// of disjoint keys): range deletes in sequence order, then point messages. Returns how many were
/// left out because they would break a buffer's order.
pub(crate) fn restrict(b: &Buffer, lo: &[u8], hi: Option<&[u8]>, out: &mut Buffer) -> u64 {
    let mut dropped = 0;
    let mut ranges = b.ranges_in(lo, hi);
    ranges.sort_by_key(|r| r.msn);
    for r in ranges {
        if r.msn < out.max_msn() || r.lo >= r.hi {
            dropped += 1;
            continue;
        }
        // References dropped here: a rebuild recounts the data table afterwards.
        let _ = out.add_range(r.msn, &r.lo, &r.hi);
    }
    for (k, km) in b.points_in(lo, hi) {
        let ok = km.min_msn() > 0 && out.point(k).is_none_or(|old| km.min_msn() > old.max_msn());
        if ok {
            let _ = out.add_key_msgs(k.clone(), km.clone());
        } else {
            dropped += 1;
        }
    }
    dropped
}
