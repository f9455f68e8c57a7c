//! Collection of dead nodes (docs/SURGERY.md §4.4): a node whose reference count reached 0 stays
//! in the block translation table, still holding its children's references and its out-of-line
//! blocks', until the collector frees it. The table is the garbage list (it survives a crash
//! with the checkpoint that wrote it), and each step does a bounded amount of work: it takes
//! dead ids, releases what each one references (its children, which may die in turn; the
//! blocks its entries or buffered messages name) and frees it.
//!
//! A dead internal node is read as a skeleton (its child ids) unless the data table holds
//! references, when its buffers are read too. A dead leaf is read only when the data table holds
//! references (its entries may name blocks); otherwise the leaves below a dead node at height 1
//! are freed at once without a read.
//!
//! Range deletes feed it (§4.3): a child whose whole range a range delete in its slot covers is
//! not flushed into but let go ([`Tree::drop_covered`]), so deleting a large range (`rm -rf`, a
//! clone) frees its subtrees without reading their leaves, and never copies a shared one only to
//! empty it.

use std::sync::atomic::Ordering;

use super::{Bounds, Tree};
use crate::error::Result;
use crate::node::{Body, Node, NodeId};

impl Tree {
    /// Dead nodes waiting for the collector.
    pub fn garbage_nodes(&self) -> usize {
        self.store.btt.lock().refs.dead_len()
    }

    /// Frees up to about `max` dead nodes (a step may free the leaves of one more node). Returns
    /// how many it freed. The caller holds `writers` shared and no latch.
    ///
    /// One collection at a time: the dead ids are taken from the table without being removed
    /// (a node leaves it only once freed), so two collectors at once took the same ids, and the
    /// second read a node the first had freed ("referenced but has no location"), found it no
    /// longer dead (a panic), or took its children's references a second time.
    pub fn collect(&self, max: usize) -> Result<usize> {
        let _one = self.collecting.lock();
        let mut freed = 0;
        while freed < max {
            let ids = self.store.btt.lock().refs.dead(max - freed);
            if ids.is_empty() {
                break;
            }
            for id in ids {
                freed += self.collect_one(id)?;
            }
            self.make_room()?;
        }
        self.counters
            .collected
            .fetch_add(freed as u64, Ordering::Relaxed);
        Ok(freed)
    }

    /// Frees dead node `id`, releasing its references; returns how many nodes it freed.
    fn collect_one(&self, id: NodeId) -> Result<usize> {
        let data = !self.store.data.lock().refs.is_empty();
        let (height, children, blocks) = match self.cache.peek(id) {
            Some(_) | None if data => {
                let cn = self.pin_whole(id)?;
                let g = cn.read();
                (g.height, children_of(&g.body), g.ref_blocks())
            }
            Some(cn) => {
                let g = cn.read();
                (g.height, children_of(&g.body), Vec::new())
            }
            None => {
                let (n, _) = self.read_node(id, false)?;
                (n.height, children_of(&n.body), Vec::new())
            }
        };
        self.free_dead(id)?;
        self.release_refs(&blocks);
        let mut dying = Vec::new();
        {
            let mut btt = self.store.btt.lock();
            for &c in &children {
                if btt.refs.drop_ref(c) {
                    dying.push(c);
                }
            }
        }
        let mut freed = 1;
        if height == 1 && !data {
            // Leaves holding no out-of-line reference: nothing in them to release.
            for c in dying {
                self.free_dead(c)?;
                freed += 1;
            }
        }
        Ok(freed)
    }

    /// Drops dead node `id` from the cache and the table (a resident one as a merge drops a
    /// node: an image a running checkpoint still needs is saved first).
    fn free_dead(&self, id: NodeId) -> Result<()> {
        assert!(
            self.store.btt.lock().refs.is_dead(id),
            "freeing node {id}, which is not dead"
        );
        match self.cache.peek(id) {
            Some(cn) => {
                let mut g = cn.write();
                self.delete_node(&cn, &mut g)
            }
            None => {
                self.store.btt.lock().remove(id);
                Ok(())
            }
        }
    }
}

impl Tree {
    /// Lets go of every child of `node` (internal, wholly in memory, being changed; bounds `b`)
    /// whose whole range a range delete buffered in its slot covers: the slot gets a chain of
    /// new empty nodes of the child's height (healed later), the range delete leaves the buffer
    /// (the older messages it covered there are gone already, and nothing is left below it),
    /// and the old child loses the slot's reference (dead unless shared; the collector frees
    /// it and what it references). The messages in the buffer newer than the range delete stay.
    pub(super) fn drop_covered(&self, node: &mut Node, b: &Bounds) {
        let height = node.height;
        let Body::Internal(n) = &mut node.body else {
            return;
        };
        for i in 0..n.children.len() {
            let (cl, ch) = match n.child_bounds(i, b.lo(), b.hi()) {
                (cl, Some(ch)) => (cl.to_vec(), ch.to_vec()),
                // A range delete never reaches the end of the key space.
                (_, None) => continue,
            };
            if !n.buffers[i].deletes_all_of(&cl, &ch) {
                continue;
            }
            assert!(
                n.buffers[i].mutate(|buf| buf.remove_covering(&cl, &ch)),
                "the covering range delete is in the buffer"
            );
            let cb = b.child(n, i);
            let (id, _) = self.empty_chain(height - 1, cb.prefix());
            let old = std::mem::replace(&mut n.children[i], id);
            self.drop_node_ref(old);
            self.queue_heal(&cb.full_lo());
            self.counters
                .subtrees_dropped
                .fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn children_of(body: &Body) -> Vec<NodeId> {
    match body {
        Body::Internal(n) => n.children.clone(),
        Body::Leaf(_) => Vec::new(),
    }
}
