//! Lifted keys (docs/SURGERY.md §2): a tree whose nodes store their keys without their prefix
//! reads back the full keys, and `verify` catches a node stored with a lift other than the one
//! its bounds give.

use std::sync::Arc;

use amaranth_device::MemDevice;

use crate::node::{Body, ROOT_ID};
use crate::tree::{Bounds, LIFT_KEYS};
use crate::{Engine, Format, Options};

/// Options of the engine-internal tests: a small cache, no background threads (deterministic),
/// every node's invariants checked.
pub(crate) fn options() -> Options {
    Options {
        cache_size: 8 << 20,
        background_threads: false,
        check_invariants: true,
        ..Options::default()
    }
}

/// An engine holding keys under one long common prefix, flushed down to a two-level tree.
fn engine_with_prefixed_keys() -> Engine {
    engine_on(Arc::new(MemDevice::new(64 << 20)))
}

fn engine_on(dev: Arc<MemDevice>) -> Engine {
    let e = Engine::create(dev, Format::small_for_tests(), options()).unwrap();
    for i in 0..3000u32 {
        e.put(format!("d/some/dir/{i:06}").as_bytes(), &[7u8; 40])
            .unwrap();
    }
    while e.tree().flush_step(0).unwrap() {}
    e
}

/// The bounds and id of a leaf strictly inside the key space (so its prefix is not empty).
fn inner_leaf(e: &Engine) -> (Bounds, u64) {
    let tree = e.tree();
    let mut bounds = Bounds::root();
    let mut cn = tree.pin(ROOT_ID).unwrap();
    loop {
        let next = {
            let g = cn.read();
            let Body::Internal(n) = &g.body else {
                return (bounds, cn.id);
            };
            assert!(n.children.len() >= 3, "a node with a middle child");
            let c = n.children.len() / 2;
            bounds.descend(n, c);
            n.children[c]
        };
        cn = tree.pin(next).unwrap();
        tree.load_partitions(&cn, None).unwrap();
    }
}

#[test]
fn a_lifted_tree_reads_back_full_keys() {
    let e = engine_with_prefixed_keys();
    let (bounds, _) = inner_leaf(&e);
    if LIFT_KEYS {
        assert!(
            bounds.prefix().starts_with(b"d/some/dir/"),
            "prefix {:?}",
            String::from_utf8_lossy(bounds.prefix())
        );
    }
    let all = e.range(std::ops::Bound::Unbounded, std::ops::Bound::Unbounded);
    let keys: Vec<Vec<u8>> = all.map(|r| r.unwrap().0).collect();
    assert_eq!(keys.len(), 3000);
    assert_eq!(keys[1234], b"d/some/dir/001234".to_vec());
    assert!(e.get(b"d/some/dir/002999").unwrap().is_some());
    e.verify().unwrap();
}

#[test]
fn verify_catches_a_node_with_a_wrong_lift() {
    let e = engine_with_prefixed_keys();
    e.verify().unwrap();
    let (bounds, id) = inner_leaf(&e);
    // Store the leaf's keys without the lift its bounds give (as an unlifted image would) or, when
    // lifting is off, with one byte too many stripped.
    {
        let cn = e.tree().pin(id).unwrap();
        let mut g = cn.write();
        if LIFT_KEYS {
            g.relift(&[], bounds.prefix());
        } else {
            g.relift(b"d", &[]);
        }
    }
    let err = e.verify().unwrap_err().to_string();
    assert!(err.contains("outside the range"), "{err}");
    e.abandon();
}

/// Salvage reads an orphan (a node whose parent is damaged) under its prefix hint, places it by
/// its full keys, and rewrites it at the lift its new bounds give (docs/SURGERY.md §2.7). The
/// orphan here is a leaf written un-lifted (hint empty, full keys), so its new prefix differs.
#[test]
fn salvage_relifts_an_adopted_orphan_stored_under_another_prefix() {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let e = engine_on(dev.clone());
    let (bounds, id) = inner_leaf(&e);
    assert!(!bounds.prefix().is_empty(), "an inner leaf has a prefix");
    let parent = parent_of(&e, id);
    {
        let cn = e.tree().pin(id).unwrap();
        let mut g = cn.write();
        e.tree().begin_modify(&cn, &g);
        g.relift(&[], bounds.prefix());
        assert!(g.prefix.is_empty(), "the hint follows the re-lift");
        e.tree().end_modify(&cn, &g);
    }
    e.close().unwrap();
    let e = Engine::open(dev.clone(), options()).unwrap();
    let at = e.node_extents();
    e.abandon();
    let (_, block, _) = at.iter().find(|(n, _, _)| *n == parent).unwrap();
    dev.with_bytes_mut(|b| b[(*block * 4096) as usize..][..4096].fill(0));
    let repair = Options {
        salvage: true,
        ..options()
    };
    let e = Engine::open(dev.clone(), repair).unwrap();
    let r = e.salvage_report().unwrap().clone();
    assert!(r.orphans_adopted >= 1 && r.nodes_relifted >= 1, "{r:?}");
    e.verify().unwrap();
    e.close().unwrap();
    let e = Engine::open(dev, options()).unwrap();
    e.verify().unwrap();
    let all = e.range(std::ops::Bound::Unbounded, std::ops::Bound::Unbounded);
    let keys: Vec<Vec<u8>> = all.map(|r| r.unwrap().0).collect();
    assert_eq!(keys.len(), 3000, "every entry is back");
    assert_eq!(keys[2345], b"d/some/dir/002345".to_vec());
}

/// The id of the node whose child `id` is.
fn parent_of(e: &Engine, id: u64) -> u64 {
    let tree = e.tree();
    let mut stack = vec![ROOT_ID];
    while let Some(p) = stack.pop() {
        let cn = tree.pin(p).unwrap();
        let g = cn.read();
        if let Body::Internal(n) = &g.body {
            if n.children.contains(&id) {
                return p;
            }
            stack.extend(&n.children);
        }
    }
    panic!("node {id} has no parent")
}
