//! Reference counts of tree nodes (docs/SURGERY.md §4.2): how many child slots, roots and
//! holders name each node. A node named more than once is *shared* and never changed in place
//! (`Tree::own_child` copies it for the owner about to change it); a node named by nothing is
//! *dead*: it stays in the block translation table with count 0 until the collector
//! (`Tree::collect`) releases its children and its out-of-line data references and frees it.
//!
//! Kept beside the block translation table (`Btt::refs`, under the same lock) and written with
//! it (BTT version 2 when a count is not 1). Only counts other than 1 are stored, so a tree that
//! shares nothing costs nothing.

use std::collections::{BTreeSet, HashMap};

use crate::node::NodeId;

/// Counts other than 1, by node, and the dead nodes (count 0) in id order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeRefs {
    counts: HashMap<NodeId, u32>,
    dead: BTreeSet<NodeId>,
    /// Nodes with a count above 1.
    shared: usize,
}

impl NodeRefs {
    /// The counts read from a table: `(node, count)` for every count other than 1.
    pub fn from_counts(counts: impl IntoIterator<Item = (NodeId, u32)>) -> NodeRefs {
        let mut r = NodeRefs::default();
        for (id, c) in counts {
            r.set(id, c);
        }
        r
    }

    /// Node `id`'s count (1 unless recorded otherwise).
    pub fn count(&self, id: NodeId) -> u32 {
        self.counts.get(&id).copied().unwrap_or(1)
    }

    /// Whether more than one slot, root or holder names node `id`.
    pub fn is_shared(&self, id: NodeId) -> bool {
        self.shared > 0 && self.count(id) > 1
    }

    /// One more reference to node `id`, a live node.
    pub fn add(&mut self, id: NodeId) {
        let c = self.count(id);
        assert!(c > 0, "a reference added to dead node {id}");
        self.set(id, c + 1);
    }

    /// One reference fewer to node `id`; returns whether the node died (count 0).
    pub fn drop_ref(&mut self, id: NodeId) -> bool {
        let c = self.count(id);
        assert!(
            c > 0,
            "node {id} released more often than it was referenced"
        );
        self.set(id, c - 1);
        c == 1
    }

    /// Forgets node `id`, which is being freed: it must be dead or named once (a node merged
    /// away, its one slot gone with it).
    pub fn forget(&mut self, id: NodeId) {
        let c = self.count(id);
        assert!(c <= 1, "freeing node {id}, which {c} slots still name");
        self.set(id, 1);
    }

    /// Whether node `id` is dead.
    pub fn is_dead(&self, id: NodeId) -> bool {
        self.dead.contains(&id)
    }

    /// Up to `max` dead nodes, lowest ids first.
    pub fn dead(&self, max: usize) -> Vec<NodeId> {
        self.dead.iter().take(max).copied().collect()
    }

    /// Dead nodes.
    pub fn dead_len(&self) -> usize {
        self.dead.len()
    }

    /// Every count other than 1, by node.
    pub fn counts(&self) -> &HashMap<NodeId, u32> {
        &self.counts
    }

    fn set(&mut self, id: NodeId, c: u32) {
        let was = self.count(id);
        if was > 1 {
            self.shared -= 1;
        }
        if c > 1 {
            self.shared += 1;
        }
        if c == 1 {
            self.counts.remove(&id);
        } else {
            self.counts.insert(id, c);
        }
        if c == 0 {
            self.dead.insert(id);
        } else {
            self.dead.remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_other_than_one_are_kept_and_dead_nodes_listed() {
        let mut r = NodeRefs::default();
        assert_eq!(r.count(7), 1);
        assert_eq!(r.shared, 0);
        r.add(7);
        assert!(r.is_shared(7));
        assert!(!r.drop_ref(7));
        assert_eq!(r.shared, 0);
        assert!(r.counts().is_empty());
        assert!(r.drop_ref(7));
        assert!(r.is_dead(7));
        assert_eq!(r.dead(10), vec![7]);
        r.forget(7);
        assert_eq!(r.dead_len(), 0);
        assert_eq!(r, NodeRefs::default());
        let r = NodeRefs::from_counts([(3, 0), (4, 2)]);
        assert_eq!((r.count(3), r.count(4), r.dead(5)), (0, 2, vec![3]));
    }

    #[test]
    #[should_panic(expected = "released more often")]
    fn an_over_free_panics() {
        let mut r = NodeRefs::default();
        r.drop_ref(5);
        r.drop_ref(5);
    }
}
