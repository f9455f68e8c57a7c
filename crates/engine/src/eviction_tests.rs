//! Eviction never waits for a victim's latch: a victim is a node nobody pinned when the list was
//! taken, and another thread may latch it right after while it waits for a latch the evicting
//! thread holds (a flush loads a child under its parent's write latch). These tests hold a
//! victim's latch (without pinning it) on one thread and evict on another; before the fix the
//! eviction waited for that latch forever (`Tree::make_room`).

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use amaranth_device::MemDevice;

use crate::cache::CachedNode;
use crate::{Engine, Format, Options};

/// Far longer than any eviction of this small cache takes: only a wait for the held latch (which
/// never ends while it is held) runs past it. Not a speed check.
const STUCK: Duration = Duration::from_secs(30);

/// An engine with many nodes in a small cache, most of them dirty (no checkpoint yet).
fn engine() -> Engine {
    let dev = Arc::new(MemDevice::new(32 << 20));
    let options = Options {
        cache_size: 256 << 10,
        background_threads: false,
        ..Options::default()
    };
    let e = Engine::create(dev, Format::small_for_tests(), options).unwrap();
    let value = vec![5u8; 700];
    for i in 0..3000u32 {
        e.put(format!("k/{i:06}").as_bytes(), &value).unwrap();
    }
    e
}

/// Runs `make_room` on another thread with the cache pushed over its bound while `hold` (a latch
/// guard on a victim) is held. Returns whether it finished within [`STUCK`]; the guard is dropped
/// before the thread is joined, so a stuck eviction ends and the test fails instead of hanging.
fn evicts_while_held<G>(e: &Engine, hold: G) -> bool {
    let tree = e.tree();
    let over = tree.cache.budget() as isize;
    tree.cache.add_used(over);
    let finished = std::thread::scope(|s| {
        let (tx, rx) = mpsc::channel();
        s.spawn(move || {
            let r = tree.make_room();
            let _ = tx.send(());
            r.unwrap();
        });
        let finished = rx.recv_timeout(STUCK).is_ok();
        drop(hold);
        finished
    });
    tree.cache.add_used(-over);
    finished
}

/// The least recently used victim `want` accepts, unpinned again (only the map holds it).
fn victim(
    e: &Engine,
    want: impl Fn(&CachedNode) -> bool,
) -> Arc<parking_lot::RwLock<crate::node::Node>> {
    let v = e.tree().cache.victims();
    let cn = v.iter().find(|cn| want(cn)).expect("a victim of that kind");
    cn.latch.clone()
}

#[test]
fn eviction_skips_a_victim_another_thread_write_latches() {
    let e = engine();
    let latch = victim(&e, |_| true);
    let held = latch.write_arc();
    assert!(
        evicts_while_held(&e, held),
        "make_room waited for a victim's write latch"
    );
    e.verify().unwrap();
    e.close().unwrap();
}

#[test]
fn eviction_leaves_dirty_a_victim_another_thread_read_latches() {
    let e = engine();
    let tree = e.tree();
    let dirty = tree.cache.victims().into_iter().find(|cn| cn.is_dirty());
    let dirty = dirty.expect("a dirty victim");
    let id = dirty.id;
    drop(dirty);
    let latch = victim(&e, |cn| cn.id == id);
    let held = latch.read_arc_recursive();
    // Its image is written, but installing it needs the write latch: the image is dropped.
    assert!(
        evicts_while_held(&e, held),
        "make_room waited for the write latch of a victim being read"
    );
    let cn = tree
        .cache
        .peek(id)
        .expect("a latched victim is not evicted");
    assert!(
        cn.is_dirty(),
        "node {id} marked clean without its write latch"
    );
    drop(cn);
    e.verify().unwrap();
    e.checkpoint().unwrap();
    e.verify().unwrap();
    e.close().unwrap();
}
