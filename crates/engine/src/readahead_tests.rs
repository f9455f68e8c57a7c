//! Read-ahead that falls behind its reader: a worker scheduled late (a loaded machine) must not
//! read a leaf the reader has already loaded itself, used and let the cache shed. Before, it did,
//! and nobody used that copy (the CLI's read-ahead test failed in CI with 12 leaves read ahead,
//! 9 used and 1.2x the file's bytes read).

use std::ops::Bound;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use amaranth_device::MemDevice;

use crate::node::{Body, ROOT_ID};
use crate::{Engine, Format, Options};

fn key(i: u32) -> Vec<u8> {
    format!("f/{i:06}").into_bytes()
}

/// A cold engine (nothing in memory) over about 16 leaves under the root, with background
/// threads off (no read-ahead workers: the test plays the worker) and read-ahead on.
fn cold_engine() -> Engine {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let format = Format {
        node_size: 64 << 10,
        partition_size: 8 << 10,
        max_fanout: 64,
        ..Format::small_for_tests()
    };
    let options = Options {
        cache_size: 8 << 20,
        background_threads: false,
        ..Options::default()
    };
    let e = Engine::create(dev.clone(), format, options.clone()).unwrap();
    for i in 0..1200u32 {
        e.put(&key(i), &[i as u8; 500]).unwrap();
    }
    e.close().unwrap();
    let e = Engine::open(dev, options).unwrap();
    e.tree().readahead.start(4);
    e
}

/// The root's pivots (full keys: the root's prefix is empty); the tree must be two levels.
fn root_pivots(e: &Engine) -> Vec<Vec<u8>> {
    e.get(&key(0)).unwrap();
    let cn = e.tree().cache.get(ROOT_ID).unwrap();
    let g = cn.read();
    assert_eq!(g.height, 1, "the test wants leaves right under the root");
    let Body::Internal(n) = &g.body else {
        unreachable!()
    };
    n.pivots.clone()
}

/// The root's children (the leaves, in a two-level tree), in key order.
fn root_children(e: &Engine) -> Vec<crate::node::NodeId> {
    let cn = e.tree().cache.get(ROOT_ID).unwrap();
    let g = cn.read();
    let Body::Internal(n) = &g.body else {
        unreachable!("the root of a two-level tree is internal")
    };
    n.children.clone()
}

/// Scans `[lo, hi)` as a reader does; returns the number of entries.
fn scan(e: &Engine, lo: &[u8], hi: &[u8]) -> usize {
    let mut n = 0;
    e.scan(Bound::Included(lo), Bound::Excluded(hi), |_, _| {
        n += 1;
        true
    })
    .unwrap();
    n
}

#[test]
fn a_late_worker_skips_the_leaf_a_reader_loaded_and_the_cache_shed() {
    let e = cold_engine();
    let tree = e.tree();
    // The reader reads the first leaf; read-ahead queues the next ones.
    let pivots = root_pivots(&e);
    assert!(pivots.len() >= 6, "{} leaves", pivots.len() + 1);
    assert!(scan(&e, &key(0), &pivots[0]) > 0);
    tree.read_ahead_from(&pivots[0]);
    let queued = tree.readahead.queued();
    assert_eq!(queued.len(), 4, "{queued:?}");
    // A worker takes the second leaf's job, and is then not scheduled for a while.
    let late = tree.readahead.take_job().unwrap();
    assert_eq!(late, queued[0]);
    // Meanwhile the reader loads, reads and leaves that leaf and the next; the cache sheds them.
    assert!(scan(&e, &pivots[0], &pivots[2]) > 0);
    // (The reader's scan continued its last one: it queued the leaves after its end too.)
    let now = tree.readahead.queued();
    assert!(
        !now.contains(&queued[1]),
        "the job of the leaf the reader loaded itself is still queued: {now:?}"
    );
    assert_eq!(now[..2], queued[2..], "{now:?}");
    for id in [queued[0], queued[1]] {
        let cn = tree.cache.peek(id).unwrap();
        assert!(
            tree.cache.evict_if_idle(&cn),
            "leaf {id} could not be evicted"
        );
    }
    // The late worker runs its job now: nothing is read.
    let reads = e.stats().node_reads;
    tree.read_ahead_one(late).unwrap();
    tree.readahead.finish(late);
    assert_eq!(e.stats().node_reads, reads, "the late worker read the leaf");
    assert_eq!(
        tree.cache.counters.prefetch_loads.load(Ordering::Relaxed),
        0
    );
    // A worker in time still reads ahead: the next job's leaf, then used by the reader.
    let next = tree.readahead.take_job().unwrap();
    assert_eq!(next, queued[2]);
    tree.read_ahead_one(next).unwrap();
    tree.readahead.finish(next);
    assert_eq!(e.stats().node_reads, reads + 1);
    assert!(scan(&e, &pivots[2], &pivots[3]) > 0);
    let st = e.stats();
    assert_eq!((st.prefetch_loads, st.prefetch_hits), (1, 1));
    e.close().unwrap();
}

/// Whether leaf `id` is in memory with every partition.
fn resident(e: &Engine, id: crate::node::NodeId) -> bool {
    let Some(cn) = e.tree().cache.peek(id) else {
        return false;
    };
    let g = cn.read();
    match &g.body {
        Body::Leaf(l) => l.parts.iter().all(|p| p.data().is_some()),
        Body::Internal(_) => unreachable!("leaf {id} is an internal node"),
    }
}

/// Read-ahead making room under a tight cache sheds the leaves readers have left behind, never
/// the ones a sequential reader is in or reads next: before, it shed the leaf a reader was in the
/// middle of (or one the kernel's own read-ahead was reading) for a leaf further on, and the
/// reader read it again (the CLI's read-ahead test in CI, 64 MiB cache: 1.34x the file's bytes).
#[test]
fn read_ahead_makes_room_only_from_leaves_behind_the_readers() {
    let e = cold_engine();
    let tree = e.tree();
    let pivots = root_pivots(&e);
    assert!(pivots.len() >= 10, "{} leaves", pivots.len() + 1);
    let leaves = root_children(&e);
    // A reader reads the first six leaves in order, one scan per leaf (each continues the last).
    assert!(scan(&e, &key(0), &pivots[0]) > 0);
    for i in 0..5 {
        assert!(scan(&e, &pivots[i], &pivots[i + 1]) > 0);
    }
    for (i, &id) in leaves.iter().enumerate().take(6) {
        assert!(resident(&e, id), "leaf {i} ({id}) was read");
    }
    // The recent scans' windows: from the leaf holding each scan's end onwards, so the leaves
    // read first are behind the reader, and some read are in its windows.
    let windows = tree.readahead.readers_windows();
    let (ahead, behind): (Vec<_>, Vec<_>) = leaves[..6].iter().partition(|id| windows.contains(id));
    assert!(
        !ahead.is_empty() && !behind.is_empty(),
        "windows {windows:?}"
    );
    assert!(behind.contains(&&leaves[0]), "windows {windows:?}");
    // Read-ahead asks for more room than there is: it sheds the leaves behind the reader only.
    let room = tree.make_room_for(tree.cache.eviction_point()).unwrap();
    assert!(!room, "the whole eviction point was free");
    for id in behind {
        assert!(!resident(&e, *id), "leaf {id}, behind the reader, was kept");
    }
    for id in ahead {
        assert!(
            resident(&e, *id),
            "read-ahead shed leaf {id}, in a reader's window"
        );
    }
    e.close().unwrap();
}

/// One scan over many leaves reads ahead by itself once it has walked a leaf whole and goes on
/// (it need not continue an earlier scan): the leaves after the one it enters are queued. A scan
/// over at most three leaves (a listing that stops early) queues nothing.
#[test]
fn a_long_scan_reads_ahead_by_itself_after_a_whole_leaf() {
    let e = cold_engine();
    let tree = e.tree();
    let pivots = root_pivots(&e);
    assert!(pivots.len() >= 9, "{} leaves", pivots.len() + 1);
    let children = root_children(&e);
    // Three leaves, from the middle of the first: nothing read ahead.
    assert!(scan(&e, &key(1), &pivots[2]) > 0);
    assert_eq!(tree.readahead.queued(), Vec::new());
    // Six leaves, not continuing the last scan: from its third leaf on, the leaves after the one
    // it enters are queued (this test has no workers: the reader loads the ones it reaches).
    let all = scan(&e, &key(1), &pivots[5]);
    let want = (1..1200u32).filter(|&i| key(i) < pivots[5]).count();
    assert_eq!(all, want);
    let queued = tree.readahead.queued();
    assert!(!queued.is_empty());
    assert_eq!(queued[0], children[6], "{queued:?}");
    assert!(
        queued.iter().all(|id| children[6..].contains(id)),
        "only leaves past the scan's end: {queued:?}"
    );
    e.close().unwrap();
}
