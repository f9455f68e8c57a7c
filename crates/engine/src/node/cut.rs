//! Cutting a node at a key (docs/SURGERY.md §3.2, slicing): a leaf at any key, an internal node
//! at one of its pivots. Both pieces keep the stored form of their keys; the caller re-lifts them.

use super::{child_index, Internal, Leaf, PartSlot};
use crate::partition::PartitionBuilder;

impl Leaf {
    /// Cuts the leaf at `k` (stored form): keys below `k` stay, keys at or above it go to the
    /// returned leaf. The partition holding `k` is cut in two; the others move whole. Every
    /// partition must be resident.
    pub fn split_at(&mut self, k: &[u8]) -> Leaf {
        let p = child_index(&self.pivots, k);
        let mut right_parts = self.parts.split_off(p + 1);
        let mut right_pivots = self.pivots.split_off(p);
        let cut = self.parts.pop().expect("the partition holding the key");
        let data = cut.data().expect("a leaf being cut is fully resident");
        let at = data.lower_bound(k);
        let piece = |from: usize, to: usize| {
            let mut b = PartitionBuilder::with_capacity(data.run_bytes(from, to));
            for i in from..to {
                b.push(data.key(i), data.value(i));
            }
            PartSlot::resident(b.finish())
        };
        self.parts.push(piece(0, at));
        right_parts.insert(0, piece(at, data.len()));
        // The right leaf's first partition starts at `k`: its low key is not a pivot.
        let mut right = Leaf {
            pivots: std::mem::take(&mut right_pivots),
            parts: right_parts,
        };
        self.drop_empty_partitions();
        right.drop_empty_partitions();
        right
    }
}

impl Internal {
    /// Cuts the node at its pivot `j`: children `0..=j` stay, the others (with their buffers and
    /// the pivots between them) go to the returned node. The pivot itself bounds both pieces.
    pub fn split_off_at(&mut self, j: usize) -> Internal {
        assert!(j < self.pivots.len(), "pivot {j} of {}", self.pivots.len());
        let children = self.children.split_off(j + 1);
        let buffers = self.buffers.split_off(j + 1);
        let pivots = self.pivots.split_off(j + 1);
        self.pivots.pop();
        Internal {
            pivots,
            children,
            buffers,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::tests::{all_entries, leaf_with};
    use crate::node::{Body, BufSlot, Node};

    fn checked(l: Leaf) -> Leaf {
        let n = Node {
            height: 0,
            max_msn: 1,
            body: Body::Leaf(l),
            prefix: Vec::new(),
        };
        n.check_invariants(1);
        match n.body {
            Body::Leaf(l) => l,
            Body::Internal(_) => unreachable!(),
        }
    }

    #[test]
    fn a_leaf_cut_anywhere_keeps_every_entry_on_its_side() {
        let whole = leaf_with(600);
        let all = all_entries(&whole);
        assert!(whole.parts.len() > 3, "several partitions");
        let first_of_second = whole.pivots[0].clone();
        for k in [
            b"".to_vec(),
            b"key00000".to_vec(),
            b"key00123x".to_vec(),
            first_of_second,
            b"key00599".to_vec(),
            b"zzz".to_vec(),
        ] {
            let mut left = leaf_with(600);
            let right = left.split_at(&k);
            let (left, right) = (checked(left), checked(right));
            let (l, r) = (all_entries(&left), all_entries(&right));
            assert!(l.iter().all(|(key, _)| key < &k), "{k:?}");
            assert!(r.iter().all(|(key, _)| key >= &k), "{k:?}");
            assert_eq!([l, r].concat(), all, "{k:?}");
        }
    }

    #[test]
    fn an_internal_node_cut_at_a_pivot_keeps_its_slots_in_order() {
        let mut n = Internal {
            pivots: vec![b"b".to_vec(), b"c".to_vec(), b"d".to_vec()],
            children: vec![1, 2, 3, 4],
            buffers: (0..4).map(|_| BufSlot::empty()).collect(),
        };
        let right = n.split_off_at(1);
        assert_eq!((n.pivots, n.children), (vec![b"b".to_vec()], vec![1, 2]));
        assert_eq!(
            (right.pivots, right.children),
            (vec![b"d".to_vec()], vec![3, 4])
        );
        assert_eq!((n.buffers.len(), right.buffers.len()), (2, 2));
    }
}
