//! Cutting a node at a key (docs/SURGERY.md §3.2, slicing): a leaf at any key, an internal node
//! at one of its pivots. Both pieces keep the stored form of their keys; the caller re-lifts them.
//! And the leaf split that prefers such a cut at a boundary of the caller's key structure
//! (§3.5, preferential splitting).

use super::{child_index, separator, Internal, Leaf, PartSlot};
use crate::config::Format;
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

impl Leaf {
    /// Splits an oversized leaf (docs/SURGERY.md §3.5): in two, at a key between a quarter and
    /// three quarters of its bytes that ends just after one of the `boundaries` bytes (the key
    /// structure's separators, given by the caller), and each piece again while it is over a
    /// node; as [`Leaf::split`] without boundaries. Returns the pieces after the first with
    /// their low keys. Every partition must be resident.
    pub fn split_preferring(&mut self, format: &Format, boundaries: &[u8]) -> Vec<(Vec<u8>, Leaf)> {
        if boundaries.is_empty() {
            return self.split(format);
        }
        let mut out = Vec::new();
        self.split_preferring_into(format, boundaries, &mut out);
        out
    }

    /// [`Leaf::split_preferring`]: this leaf keeps its first piece, `out` gets the others.
    fn split_preferring_into(
        &mut self,
        format: &Format,
        boundaries: &[u8],
        out: &mut Vec<(Vec<u8>, Leaf)>,
    ) {
        if self.bytes() <= format.node_size {
            return;
        }
        let bytes = self.bytes();
        let k = match (self.key_at(bytes / 4), self.key_at(bytes * 3 / 4)) {
            (Some(a), Some(b)) if a < b => boundary_separator(&a, &b, boundaries),
            // A few huge entries: the plain split.
            _ => {
                out.extend(self.split(format));
                return;
            }
        };
        let mut right = self.split_at(&k);
        self.split_preferring_into(format, boundaries, out);
        let mut rest = Vec::new();
        right.split_preferring_into(format, boundaries, &mut rest);
        out.push((k, right));
        out.extend(rest);
    }

    /// The key of the first entry at or after `offset` bytes into the leaf's entries.
    fn key_at(&self, offset: usize) -> Option<Vec<u8>> {
        let mut at = 0;
        for slot in &self.parts {
            let p = slot.data().expect("a leaf being split is fully resident");
            if at + p.bytes() > offset {
                let i = (0..p.len()).find(|&i| at + p.run_bytes(0, i + 1) > offset)?;
                return Some(p.key(i).to_vec());
            }
            at += p.bytes();
        }
        None
    }
}

/// A key `k` with `a < k <= b` that ends just after the first of the `boundaries` bytes `b` holds
/// past its common prefix with `a`: the start of the key-structure unit (a directory's subtree, a
/// file's data) that `b` begins, so that later range operations on it find a pivot there. The
/// shortest separator when `b` has no such byte.
pub fn boundary_separator(a: &[u8], b: &[u8], boundaries: &[u8]) -> Vec<u8> {
    assert!(a < b, "a separator between keys out of order");
    let c = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    match b[c..].iter().position(|x| boundaries.contains(x)) {
        Some(i) => b[..c + i + 1].to_vec(),
        None => separator(a, b),
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
    fn boundary_separators_start_a_unit_of_the_key_structure() {
        let sep = |a: &str, b: &str| {
            String::from_utf8(boundary_separator(a.as_bytes(), b.as_bytes(), b"/")).unwrap()
        };
        // Two files' keys: the second file's name, to its end.
        assert_eq!(sep("d/x/f1/0007", "d/x/f2/0001"), "d/x/f2/");
        // Two directories apart: the second directory.
        assert_eq!(sep("d/abc/zz/1", "d/abd/aa/1"), "d/abd/");
        // No boundary after the divergence: the shortest separator.
        assert_eq!(sep("d/x/f1", "d/x/f2"), "d/x/f2");
        assert_eq!(sep("a/1", "a/1/x"), "a/1/");
    }

    #[test]
    fn a_preferred_split_cuts_between_a_quarter_and_three_quarters_at_a_boundary() {
        // Keys "key00000".."key00599" have no boundary byte: the plain shortest separator.
        let mut l = leaf_with(300);
        let all = all_entries(&l);
        let f = crate::config::Format::small_for_tests();
        let pieces = l.split_preferring(&f, b"/");
        assert_eq!(pieces.len(), 1);
        let (k, right) = &pieces[0];
        let (left, right) = (all_entries(&l), all_entries(right));
        assert!(
            left.len() >= all.len() / 5 && right.len() >= all.len() / 5,
            "{}",
            left.len()
        );
        assert!(left.iter().all(|(key, _)| key < k) && right.iter().all(|(key, _)| key >= k));
        assert_eq!([left, right].concat(), all);
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
