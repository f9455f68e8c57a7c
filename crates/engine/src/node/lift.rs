//! Re-lifting a node whose bounds changed (docs/SURGERY.md §2.1): the pieces of a split get a
//! longer prefix (their stored keys lose its extra bytes), the halves of a merge a shorter one
//! (their stored keys get the lost bytes back). Every stored key of the node changes the same
//! way: entries, partition pivots, child pivots and buffered messages.

use super::{Body, BufSlot, Internal, Leaf, Node, PartSlot, RekeyPlan, LONGEST_UNKNOWN};
use crate::partition::PartitionBuilder;

/// `key` without its first `drop.len()` bytes (which must be `drop`) and with `add` in front.
fn rekey(key: &[u8], drop: &[u8], add: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(add.len() + key.len() - drop.len().min(key.len()));
    rekey_into(&mut k, key, drop, add);
    k
}

/// [`rekey`] into `out` (cleared first).
fn rekey_into(out: &mut Vec<u8>, key: &[u8], drop: &[u8], add: &[u8]) {
    assert!(
        key.starts_with(drop),
        "a stored key outside the prefix its node is re-lifted to"
    );
    out.clear();
    out.extend_from_slice(add);
    out.extend_from_slice(&key[drop.len()..]);
}

impl Node {
    /// Changes every stored key from `drop + s` to `add + s`. The node must be fully resident
    /// (it is being modified). A no-op when both are empty. The node's [`Node::prefix`] follows:
    /// it gains `drop`, or loses `add` from its end.
    pub(crate) fn relift(&mut self, drop: &[u8], add: &[u8]) {
        self.body.relift(drop, add);
        if !drop.is_empty() {
            self.prefix.extend_from_slice(drop);
        } else if !add.is_empty() {
            assert!(
                self.prefix.ends_with(add),
                "a node un-lifted by bytes its prefix does not end with"
            );
            self.prefix.truncate(self.prefix.len() - add.len());
        }
    }
}

impl Node {
    /// Takes `prefix` (the prefix of the bounds the node is reached under) as its own: a node
    /// in a subtree moved under other pivots keeps its old prefix hint until it is next changed.
    /// Stored keys do not change (they are relative to the prefix, whatever it is).
    pub(crate) fn adopt_prefix(&mut self, prefix: &[u8]) {
        if self.prefix != prefix {
            self.prefix = prefix.to_vec();
        }
    }
}

impl Body {
    /// [`Node::relift`] for a node's body.
    pub(crate) fn relift(&mut self, drop: &[u8], add: &[u8]) {
        if drop.is_empty() && add.is_empty() {
            return;
        }
        assert!(
            drop.is_empty() || add.is_empty(),
            "a re-lift either lengthens or shortens the prefix"
        );
        match self {
            Body::Leaf(l) => l.relift(drop, add),
            Body::Internal(n) => n.relift(drop, add),
        }
    }
}

impl Leaf {
    fn relift(&mut self, drop: &[u8], add: &[u8]) {
        for p in &mut self.pivots {
            *p = rekey(p, drop, add);
        }
        for slot in &mut self.parts {
            let old = slot.data().expect("a re-lifted leaf is fully resident");
            let grow = add.len() * old.len();
            let mut b = PartitionBuilder::with_capacity(old.bytes() + grow);
            // One key buffer for all the entries (an allocation per key was a fifth of a
            // re-lift's time).
            let mut k = Vec::new();
            for i in 0..old.len() {
                rekey_into(&mut k, old.key(i), drop, add);
                b.push(&k, old.value(i));
            }
            *slot = PartSlot::resident(b.finish());
        }
    }
}

impl Internal {
    fn relift(&mut self, drop: &[u8], add: &[u8]) {
        for p in &mut self.pivots {
            *p = rekey(p, drop, add);
        }
        // The buffers' keys are rewritten when next needed (`node/slot.rs`): a node cut and
        // healed again and again around a directory renamed back and forth re-lifted megabytes
        // of messages each time.
        let plan = RekeyPlan::new(drop.to_vec(), add.to_vec());
        for slot in &mut self.buffers {
            assert!(slot.is_resident(), "a re-lifted node is fully resident");
            // The child's keys lose or regain the same bytes in this node's form (an unknown
            // bound stays unknown).
            let longest = match slot.longest {
                LONGEST_UNKNOWN => LONGEST_UNKNOWN as usize,
                l => (l as usize).saturating_sub(drop.len()) + add.len(),
            };
            *slot = std::mem::replace(slot, BufSlot::empty())
                .rekeyed(&plan)
                .with_longest(longest);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer::Buffer;
    use crate::msg::PointOp;
    use crate::partition::Partition;

    fn leaf(keys: &[&[u8]]) -> Node {
        let mut b = PartitionBuilder::with_capacity(64);
        for k in keys {
            b.push(k, crate::dataref::Stored::Bytes(b"v"));
        }
        let p: Partition = b.finish();
        Node {
            height: 0,
            max_msn: 0,
            body: Body::Leaf(Leaf {
                pivots: Vec::new(),
                parts: vec![PartSlot::resident(p)],
            }),
            prefix: Vec::new(),
        }
    }

    fn keys(n: &Node) -> Vec<Vec<u8>> {
        let Body::Leaf(l) = &n.body else {
            unreachable!()
        };
        let p = l.parts[0].data().unwrap();
        (0..p.len()).map(|i| p.key(i).to_vec()).collect()
    }

    #[test]
    fn leaf_keys_lose_and_regain_the_prefix() {
        let mut n = leaf(&[b"ab1", b"ab2"]);
        n.relift(b"ab", b"");
        assert_eq!(keys(&n), vec![b"1".to_vec(), b"2".to_vec()]);
        assert_eq!(n.prefix, b"ab".to_vec());
        n.relift(b"", b"ab");
        assert_eq!(keys(&n), vec![b"ab1".to_vec(), b"ab2".to_vec()]);
        assert!(n.prefix.is_empty());
    }

    #[test]
    #[should_panic(expected = "outside the prefix")]
    fn a_key_outside_the_prefix_is_refused() {
        let mut n = leaf(&[b"ab1", b"ac2"]);
        n.relift(b"ab", b"");
    }

    #[test]
    fn internal_pivots_and_messages_move_together() {
        let mut buf = Buffer::new();
        let _ = buf.add_point(b"xa".to_vec(), 1, PointOp::Delete);
        let _ = buf.add_range(2, b"xb", b"xc");
        let mut n = Node {
            height: 1,
            max_msn: 2,
            body: Body::Internal(Internal {
                pivots: vec![b"xb".to_vec()],
                children: vec![1, 2],
                buffers: vec![BufSlot::resident(buf), BufSlot::empty()],
            }),
            prefix: b"p/".to_vec(),
        };
        n.relift(b"x", b"");
        assert_eq!(n.prefix, b"p/x".to_vec(), "the prefix follows the re-lift");
        let Body::Internal(i) = &n.body else {
            unreachable!()
        };
        assert_eq!(i.pivots, vec![b"b".to_vec()]);
        let b = i.buffers[0].data().unwrap();
        assert!(b.point(b"a").is_some());
        assert_eq!(b.ranges_in(b"", None)[0].lo, b"b".to_vec());
        assert_eq!(b.max_msn(), 2);
        assert_eq!(b.bytes(), i.buffers[0].bytes());
    }
}
