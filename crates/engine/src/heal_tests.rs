//! Healing reads a node whole only to change it (docs/SURGERY.md §3.2, step 7): a heal walk
//! passes through the internal nodes on its path as their skeletons, and leaves a few buffered
//! messages where they are instead of reading a cold leaf whole to deliver them. In the dirrename
//! benchmark the heal of the first renames' fringes read 20 of 39 MB that way, while the next
//! rename waited for it.

use std::sync::Arc;

use amaranth_device::MemDevice;

use crate::lift_tests::options;
use crate::node::ROOT_ID;
use crate::{Engine, Format};

/// Keys the tests heal around.
const KEYS: [&str; 3] = ["k/000100", "k/003001", "k/005900"];

/// An engine of three levels or more below the root, every message flushed down, healed once
/// around [`KEYS`] (so that nothing there fits with a sibling any more), written and opened
/// again: nothing is in memory but what the open reads.
fn cold_engine() -> Engine {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let e = Engine::create(dev.clone(), Format::small_for_tests(), options()).unwrap();
    for i in 0..6000u32 {
        e.put(format!("k/{i:06}").as_bytes(), &[(i % 251) as u8; 150])
            .unwrap();
    }
    while e.tree().flush_step(0).unwrap() {}
    for k in KEYS {
        e.tree().queue_heal(k.as_bytes());
    }
    while e.heal_fringes(16).unwrap() > 0 {}
    e.checkpoint().unwrap();
    e.close().unwrap();
    let e = Engine::open(dev, options()).unwrap();
    assert!(
        e.stats().height >= 3,
        "a tree of {} levels",
        e.stats().height
    );
    e
}

/// The nodes other than the root that are wholly in memory.
fn whole_nodes(e: &Engine) -> Vec<u64> {
    let mut ids: Vec<u64> = e
        .tree()
        .cache
        .all()
        .iter()
        .filter(|cn| cn.id != ROOT_ID && cn.read().fully_resident())
        .map(|cn| cn.id)
        .collect();
    ids.sort_unstable();
    ids
}

/// Heals the fringe around `k` and checks that it read no node whole (it had nothing to change:
/// no merge, no split).
fn heal_reads_nothing_whole(e: &Engine, k: &[u8]) {
    let before = e.stats();
    e.tree().queue_heal(k);
    while e.heal_fringes(16).unwrap() > 0 {}
    let after = e.stats();
    assert_eq!(
        (after.merges, after.leaf_splits, after.internal_splits),
        (before.merges, before.leaf_splits, before.internal_splits),
        "the test's tree has nothing to merge or split around {k:?}"
    );
    assert_eq!(
        whole_nodes(e),
        Vec::<u64>::new(),
        "the heal around {k:?} read nodes whole that it did not change ({} bytes read)",
        after.node_bytes_read - before.node_bytes_read
    );
}

#[test]
fn a_heal_passes_through_internal_nodes_as_skeletons() {
    let e = cold_engine();
    assert_eq!(whole_nodes(&e), Vec::<u64>::new(), "a cold open");
    for k in KEYS {
        heal_reads_nothing_whole(&e, k.as_bytes());
    }
    // (`verify` reads every node whole: last.)
    e.verify().unwrap();
    e.close().unwrap();
}

#[test]
fn a_heal_leaves_a_few_buffered_messages_to_the_usual_flushes() {
    let e = cold_engine();
    // A few messages for the leaf around the key, buffered above it (the root keeps them: it
    // flushes only when its buffers hold a node's worth).
    for i in 3000..3004u32 {
        e.put(format!("k/{i:06}").as_bytes(), b"new").unwrap();
    }
    assert_eq!(whole_nodes(&e), Vec::<u64>::new(), "messages only buffered");
    heal_reads_nothing_whole(&e, b"k/003001");
    for i in 3000..3004u32 {
        assert_eq!(
            e.get(format!("k/{i:06}").as_bytes()).unwrap().as_deref(),
            Some(&b"new"[..])
        );
    }
    e.verify().unwrap();
    e.close().unwrap();
}

/// The heavy slots of moved runs wait for writes to pause: a heal step without `drains` (the
/// cleaner while writes go on) takes only fringes, so a rename does not wait for the flush of a
/// slot the previous rename moved (28 ms in the dirrename benchmark); with `drains` (the
/// cleaner once idle, and `Engine::heal_fringes`) it takes them after the fringes.
#[test]
fn heavy_slots_wait_for_writes_to_pause() {
    let e = cold_engine();
    let t = e.tree();
    t.queue_drain(KEYS[0].as_bytes());
    t.queue_heal(KEYS[1].as_bytes());
    let taken = {
        let _w = t.writers.read();
        t.heal_step(16, false).unwrap()
    };
    assert_eq!(taken, 1, "only the fringe is healed while writes go on");
    assert!(!t.heal_pending() && t.drains_pending());
    let taken = {
        let _w = t.writers.read();
        t.heal_step(16, true).unwrap()
    };
    assert_eq!(taken, 1, "the heavy slot's walk once writes pause");
    assert!(!t.drains_pending());
    e.close().unwrap();
}
