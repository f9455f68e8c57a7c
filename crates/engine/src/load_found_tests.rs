//! A lookup or scan that misses a child lets go of the parent's latch before it reads the child;
//! a merge can remove the child in between. `Tree::load_found` tells that benign race (start over)
//! from a load that fails for other reasons. Found as a rare `Corrupt("node N is referenced but
//! has no location")` in `tests/concurrency.rs` under load.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use amaranth_device::MemDevice;

use crate::error::Error;
use crate::{Engine, Format, Options};

/// An engine whose tree merged nodes away: many small nodes written, then most keys deleted and
/// the deletes flushed down until leaves fall under their merge threshold.
fn engine_with_merged_nodes() -> Engine {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let options = Options {
        cache_size: 512 << 10,
        background_threads: false,
        ..Options::default()
    };
    let e = Engine::create(dev, Format::small_for_tests(), options).unwrap();
    let value = vec![9u8; 500];
    for i in 0..4000u32 {
        e.put(format!("k/{i:06}").as_bytes(), &value).unwrap();
    }
    e.checkpoint().unwrap();
    for i in 0..4000u32 {
        if i % 50 != 0 {
            e.delete(format!("k/{i:06}").as_bytes()).unwrap();
        }
    }
    while e.tree().flush_step(0).unwrap() {}
    e.checkpoint().unwrap();
    e
}

#[test]
fn a_node_merged_away_is_gone_not_corrupt() {
    let e = engine_with_merged_nodes();
    let tree = e.tree();
    let next = tree.next_node_id.load(Ordering::Relaxed);
    let gone: Vec<u64> = (1..next)
        .filter(|&id| tree.cache.get(id).is_none() && tree.store.location(id).is_none())
        .collect();
    assert!(
        !gone.is_empty(),
        "no node was merged away: the test needs merges"
    );
    for &id in &gone {
        assert!(
            matches!(tree.load_with(id, false), Err(Error::Corrupt(_))),
            "a plain load of merged-away node {id} is an error"
        );
        assert!(
            tree.load_found(id, false).unwrap().is_none(),
            "node {id} merged away: start over"
        );
    }
    // A live node that is not cached is loaded as usual.
    let live = (1..next)
        .find(|&id| tree.store.location(id).is_some())
        .unwrap();
    assert_eq!(tree.load_found(live, true).unwrap().unwrap().id, live);
    // The survivors read back.
    for i in (0..4000u32).step_by(50) {
        assert!(e.get(format!("k/{i:06}").as_bytes()).unwrap().is_some());
    }
    assert_eq!(e.get(b"k/000001").unwrap(), None);
}
