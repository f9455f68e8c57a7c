//! Shared nodes (docs/SURGERY.md §4.2–4.3): a node named by more than one slot (or a slot and a
//! holder) is never changed in place. A modifier about to change a child, or to go on down
//! through it to change something below, first takes ownership of it ([`Tree::own_child`]): a
//! shared child is copied to a new id for the parent at hand, the copy's children and
//! out-of-line blocks gain a reference each, the original loses the parent's. Since every
//! modifying descent owns each child it enters, no node below a shared one is ever changed for
//! one of its owners.
//!
//! Sharing comes from range clones and snapshots (increments 8 and 10); until then only the test
//! hook [`Tree::hold_for_tests`] makes it: it holds a reference to subtrees, as a snapshot
//! would, and checks when they are let go that not a byte of them changed meanwhile.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hasher};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{Bounds, Tree};
use crate::cache::{CachedNode, WriteGuard};
use crate::config::Compression;
use crate::error::{Error, Result};
use crate::node::{self, Body, NodeId, ROOT_ID};
use crate::noderefs::NodeRefs;

/// A subtree the test hook holds a reference to: its root, the root's bounds and height, and a
/// digest of every node image in it when the hold was taken.
#[derive(Clone, Debug)]
pub(crate) struct Hold {
    pub id: NodeId,
    pub bounds: Bounds,
    pub height: u32,
    digest: u64,
}

impl Tree {
    /// Whether node `id` is shared (more than one slot, root or holder names it).
    pub(crate) fn is_shared(&self, id: NodeId) -> bool {
        self.store.btt.lock().refs.is_shared(id)
    }

    /// Makes child `c` of the write-latched parent (wholly in memory, and owned itself) the
    /// parent's own before it, or anything below it, is changed: a shared child is replaced in
    /// the slot by a copy (a new node, dirty). Returns the child's id as it is now. Loads the
    /// child under the parent's latch when it must be copied.
    pub(super) fn own_child(
        &self,
        pcn: &Arc<CachedNode>,
        pg: &mut WriteGuard,
        c: usize,
    ) -> Result<NodeId> {
        let Body::Internal(n) = &pg.body else {
            unreachable!("a leaf has no children")
        };
        let cid = n.children[c];
        if !self.is_shared(cid) {
            return Ok(cid);
        }
        assert!(
            !self.is_shared(pcn.id),
            "node {} is changed for one of its owners",
            pcn.id
        );
        let ccn = self.pin_whole(cid)?;
        let (copy, blocks, grandchildren) = {
            let g = ccn.read();
            let grandchildren = match &g.body {
                Body::Internal(n) => n.children.clone(),
                Body::Leaf(_) => Vec::new(),
            };
            (g.copy_resident(), g.ref_blocks(), grandchildren)
        };
        // The original stays for its other owners on disk: it is clean, so it leaves memory now
        // rather than sit beside its copy until the next eviction (the bound counts both).
        self.cache.evict_if_idle(&ccn);
        drop(ccn);
        let id = self.new_node(copy);
        {
            let mut btt = self.store.btt.lock();
            for &g in &grandchildren {
                btt.refs.add(g);
            }
            assert!(
                !btt.refs.drop_ref(cid),
                "a shared node died when one owner let it go"
            );
        }
        // The copy is a second physical holder of every reference the node held.
        if !blocks.is_empty() {
            let mut d = self.store.data.lock();
            for &b in &blocks {
                d.refs.add(b, 1);
            }
        }
        self.begin_modify(pcn, pg);
        let Body::Internal(n) = &mut pg.body else {
            unreachable!()
        };
        n.children[c] = id;
        self.end_modify(pcn, pg);
        self.counters.cow_copies.fetch_add(1, Ordering::Relaxed);
        Ok(id)
    }

    /// One reference fewer to node `id` (a slot that named it is gone); a node left without one
    /// is dead and waits for the collector ([`Tree::collect`]).
    pub(super) fn drop_node_ref(&self, id: NodeId) {
        self.store.btt.lock().refs.drop_ref(id);
    }

    /// The counts a checkpoint cut now records (those other than 1): the tree's, without the
    /// test hook's holds, which do not survive a reopen (a subtree only a hold names is written
    /// dead, and collected after a crash).
    pub(crate) fn counts_to_write(&self, refs: &NodeRefs) -> HashMap<NodeId, u32> {
        let mut counts = refs.counts().clone();
        for h in self.holds.lock().iter() {
            let c = counts.get(&h.id).copied().unwrap_or(1);
            assert!(c > 0, "a held node is dead");
            if c == 2 {
                counts.remove(&h.id);
            } else {
                counts.insert(h.id, c - 1);
            }
        }
        counts
    }

    /// Test hook (docs/SURGERY.md §7, increment 7): holds one more reference to every `every`th
    /// node at `height` (below the root's), in key order, as a snapshot would hold the root's
    /// children. Every modifier must then copy them (and the paths below them) before changing
    /// them. Returns how many it holds. The caller holds `writers` exclusive.
    pub(crate) fn hold_for_tests(&self, height: u32, every: usize) -> Result<usize> {
        let every = every.max(1);
        let mut found = Vec::new();
        let mut stack = vec![(ROOT_ID, Bounds::root())];
        while let Some((id, b)) = stack.pop() {
            let cn = self.pin(id)?;
            let g = cn.read();
            if g.height <= height {
                return Ok(0);
            }
            let Body::Internal(n) = &g.body else {
                unreachable!("a node above height 0 is internal")
            };
            for c in (0..n.children.len()).rev() {
                let cb = b.child(n, c);
                if g.height == height + 1 {
                    found.push((n.children[c], cb));
                } else {
                    stack.push((n.children[c], cb));
                }
            }
        }
        let mut held = 0;
        for (k, (id, bounds)) in found.into_iter().enumerate() {
            if k % every != 0 {
                continue;
            }
            let digest = self.digest(id)?;
            self.store.btt.lock().refs.add(id);
            self.holds.lock().push(Hold {
                id,
                bounds,
                height,
                digest,
            });
            held += 1;
        }
        Ok(held)
    }

    /// Lets go of every subtree [`Tree::hold_for_tests`] holds (a subtree the tree copied away
    /// from is dead then, and collected). Fails if any of them changed while held. The caller
    /// holds `writers` exclusive.
    pub(crate) fn release_holds_for_tests(&self) -> Result<usize> {
        let holds = std::mem::take(&mut *self.holds.lock());
        let mut changed = Vec::new();
        for h in &holds {
            if self.digest(h.id)? != h.digest {
                changed.push(h.id);
            }
            self.drop_node_ref(h.id);
        }
        if !changed.is_empty() {
            return Err(Error::Corrupt(format!(
                "held subtrees changed while shared: {changed:?}"
            )));
        }
        Ok(holds.len())
    }

    /// The subtrees the test hook holds.
    pub(crate) fn holds(&self) -> Vec<Hold> {
        self.holds.lock().clone()
    }

    /// A digest of every node image in the subtree under `id`.
    fn digest(&self, id: NodeId) -> Result<u64> {
        let mut h = DefaultHasher::new();
        let mut stack = vec![id];
        while let Some(id) = stack.pop() {
            let cn = self.pin_whole(id)?;
            let g = cn.read();
            h.write(&node::serialize(id, &g, Compression::None).buf);
            if let Body::Internal(n) = &g.body {
                stack.extend(n.children.iter().copied());
            }
            drop(g);
            drop(cn);
            self.make_room()?;
        }
        Ok(h.finish())
    }
}
