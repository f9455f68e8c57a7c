//! Re-lifting a node whose bounds changed (docs/SURGERY.md §2.1): the pieces of a split get a
//! longer prefix (their stored keys lose its extra bytes), the halves of a merge a shorter one
//! (their stored keys get the lost bytes back). Every stored key of the node changes the same
//! way: entries, partition pivots, child pivots and buffered messages.

use std::sync::Arc;

use amaranth_device::AlignedBuf;

use super::{Body, BufSlot, Internal, Leaf, Node, PartSlot, RekeyPlan, LONGEST_UNKNOWN};
use crate::partition::{Partition, PartitionBuilder};
use crate::subbytes::{ImageBuf, SharedImage};

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

/// A re-lifted leaf of at least this many bytes is built into one buffer (a huge page or more,
/// `AlignedBuf`) that its partitions share (`subbytes.rs`), instead of a buffer per partition.
const ONE_BUFFER_MIN: usize = 2 << 20;

impl Leaf {
    fn relift(&mut self, drop: &[u8], add: &[u8]) {
        for p in &mut self.pivots {
            *p = rekey(p, drop, add);
        }
        let olds: Vec<Arc<Partition>> = self
            .parts
            .iter()
            .map(|s| s.data().expect("a re-lifted leaf is fully resident"))
            .collect();
        // Every key gains `add` or loses `drop` (which every stored key starts with).
        let size = |p: &Partition| {
            (p.bytes() + p.len() * add.len())
                .checked_sub(p.len() * drop.len())
                .expect("a partition's keys shorter than the prefix they lose")
        };
        let total: usize = olds.iter().map(|p| size(p)).sum();
        if total >= ONE_BUFFER_MIN {
            // The pieces a cut re-lifts are new memory: one mapping of huge pages faults a few
            // times where partitions of their own fault once per 4 KiB (two fifths of the page
            // faults of a cold directory rename, BENCHMARKS.md "Range rename: sub-blocks read
            // in place").
            let mut arena = AlignedBuf::zeroed(total);
            let largest = olds.iter().map(|p| size(p)).max().unwrap_or(0);
            let mut b = PartitionBuilder::with_capacity(largest);
            let mut k = Vec::new();
            let mut placed = Vec::with_capacity(olds.len());
            let mut at = 0;
            for old in &olds {
                for i in 0..old.len() {
                    rekey_into(&mut k, old.key(i), drop, add);
                    b.push(&k, old.value(i));
                }
                let p = b.place(&mut arena, at);
                assert_eq!(p.len(), size(old), "a re-lifted partition's size");
                at += p.len();
                placed.push(p);
            }
            assert_eq!(at, total, "re-lifted bytes");
            let image: SharedImage = Arc::new(ImageBuf::new(arena));
            self.parts = placed
                .into_iter()
                .map(|p| PartSlot::resident(p.into_partition(&image)))
                .collect();
            return;
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
    fn a_large_leaf_is_re_lifted_into_one_shared_buffer() {
        // 40 partitions of ~64 KiB: past `ONE_BUFFER_MIN`.
        let mut parts = Vec::new();
        let mut want = Vec::new();
        for p in 0..40u32 {
            let mut b = PartitionBuilder::with_capacity(70 << 10);
            for i in 0..600u32 {
                let key = format!("dir/sub/{p:03}/{i:05}").into_bytes();
                let value = vec![(p + i) as u8; 90];
                b.push(&key, crate::dataref::Stored::Bytes(&value));
                want.push((key, value));
            }
            parts.push(PartSlot::resident(b.finish()));
        }
        let pivots: Vec<Vec<u8>> = (1..40u32)
            .map(|p| format!("dir/sub/{p:03}/").into_bytes())
            .collect();
        let mut n = Node {
            height: 0,
            max_msn: 0,
            body: Body::Leaf(Leaf { pivots, parts }),
            prefix: Vec::new(),
        };
        let bytes = n.bytes();
        assert!(bytes >= ONE_BUFFER_MIN, "{bytes} bytes");
        let entries = |n: &Node| -> Vec<(Vec<u8>, Vec<u8>)> {
            let Body::Leaf(l) = &n.body else {
                unreachable!()
            };
            l.resident_parts()
                .iter()
                .flat_map(|p| {
                    (0..p.len())
                        .map(|i| (p.key(i).to_vec(), p.value(i).raw().to_vec()))
                        .collect::<Vec<_>>()
                })
                .collect()
        };
        let shared_once = |n: &Node| {
            let Body::Leaf(l) = &n.body else {
                unreachable!()
            };
            let parts = l.resident_parts();
            let image = parts[0]
                .part_bytes()
                .image()
                .expect("in one buffer")
                .clone();
            assert!(parts
                .iter()
                .all(|p| Arc::ptr_eq(p.part_bytes().image().unwrap(), &image)));
            assert!(
                !n.unshare_sparse_images(),
                "the buffer is sized to the leaf"
            );
            image.len()
        };
        n.relift(b"dir/", b"");
        let lifted: Vec<_> = want
            .iter()
            .map(|(k, v)| (k[4..].to_vec(), v.clone()))
            .collect();
        assert_eq!(entries(&n), lifted);
        assert!(shared_once(&n) < bytes, "sized to the shorter keys");
        let Body::Leaf(l) = &n.body else {
            unreachable!()
        };
        assert_eq!(l.pivots[0], b"sub/001/".to_vec());
        n.relift(b"", b"dir/");
        assert_eq!(entries(&n), want);
        shared_once(&n);
        assert_eq!(n.bytes(), bytes);
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
