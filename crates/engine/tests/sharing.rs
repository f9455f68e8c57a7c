//! Reference counts on tree nodes (docs/SURGERY.md §4, increment 7): a shared subtree is copied
//! for its owner before any change reaches it and never changes itself; dead nodes are collected
//! with what they reference; a range delete lets go of the subtrees it covers without reading
//! them; the counts survive checkpoints and crashes.

mod common;

use std::sync::Arc;
use std::time::Instant;

use amaranth_device::MemDevice;
use amaranth_engine::{prefix_end, Batch, Engine, Options};
use common::*;

fn clean(e: &Engine, what: &str) -> amaranth_engine::Report {
    let r = e
        .verify()
        .unwrap_or_else(|err| panic!("{what}: verify: {err}"));
    assert!(
        r.leaked_nodes.is_empty(),
        "{what}: leaked {:?}",
        r.leaked_nodes
    );
    r
}

#[test]
fn shared_subtrees_are_copied_before_a_change_and_never_change() {
    let e = Engine::create(
        Arc::new(MemDevice::new(128 << 20)),
        small_format(),
        roomy_options(),
    )
    .unwrap();
    let mut m = Model::new();
    fill_family(&e, &mut m, "a/", 20_000, 100);
    e.flush_buffers(0, usize::MAX).unwrap();
    let before = clean(&e, "filled");
    assert!(before.height >= 3, "a tree {} high", before.height);
    // Every leaf, then every node one level up, held as a snapshot would hold them.
    for height in [0, 1] {
        let held = e.hold_for_tests(height, 1).unwrap();
        assert!(held > 10, "{held} subtrees held at height {height}");
        let r = clean(&e, "held");
        assert_eq!(r.shared_nodes, held as u64);
        let copies = e.stats().cow_copies;
        // Writes all over the tree, pushed down to the leaves: every changed path is copied.
        let mut b = Batch::new();
        for i in (0..20_000u32).step_by(7) {
            let k = format!("a/{i:07}").into_bytes();
            m.insert(k.clone(), b"new".to_vec());
            b.put(k, b"new".to_vec());
        }
        e.write(&b).unwrap();
        e.range_delete(b"a/0001000", b"a/0002000").unwrap();
        m.retain(|k, _| !(k.as_slice() >= &b"a/0001000"[..] && k.as_slice() < &b"a/0002000"[..]));
        e.reclaim_space(u64::MAX).unwrap();
        e.heal_fringes(64).unwrap();
        assert!(dump(&e) == m, "contents while shared");
        assert!(
            e.stats().cow_copies - copies >= held as u64 / 2,
            "{} copies for {held} shared subtrees",
            e.stats().cow_copies - copies
        );
        clean(&e, "changed while shared");
        // Not a byte of a held subtree changed; let go, the old versions are dead.
        assert_eq!(e.release_holds_for_tests().unwrap(), held);
        assert!(e.garbage_nodes() > 0, "nothing died");
        let r = clean(&e, "released");
        assert_eq!(
            (r.shared_nodes, r.dead_nodes),
            (0, e.garbage_nodes() as u64)
        );
        // Collection, a bounded step at a time.
        let mut steps = 0;
        while e.garbage_nodes() > 0 {
            assert!(e.collect_garbage(16).unwrap() > 0);
            steps += 1;
        }
        assert!(steps > 1, "collected in {steps} steps of at most 16");
        let r = clean(&e, "collected");
        assert_eq!((r.shared_nodes, r.dead_nodes), (0, 0));
        assert!(dump(&e) == m);
    }
    e.close().unwrap();
}

/// The counts go through checkpoints and crashes: a held-only subtree is written dead (holds do
/// not survive), a dead node stays in the table until collected, and after a reopen the
/// collector finds it again; the image stays consistent at every point.
#[test]
fn counts_survive_checkpoints_and_crashes() {
    let dev = Arc::new(MemDevice::new(128 << 20));
    let e = Engine::create(dev.clone(), small_format(), roomy_options()).unwrap();
    let mut m = Model::new();
    fill_family(&e, &mut m, "a/", 10_000, 100);
    e.flush_buffers(0, usize::MAX).unwrap();
    e.checkpoint().unwrap();
    let held = e.hold_for_tests(0, 2).unwrap();
    assert!(held > 5);
    let mut b = Batch::new();
    for i in (0..10_000u32).step_by(5) {
        let k = format!("a/{i:07}").into_bytes();
        m.insert(k.clone(), b"x".to_vec());
        b.put(k, b"x".to_vec());
    }
    e.write(&b).unwrap();
    e.reclaim_space(u64::MAX).unwrap();
    assert!(e.stats().cow_copies > 0);
    // A checkpoint while held: the originals only the holds name go into the table dead.
    e.checkpoint().unwrap();
    e.sync().unwrap();
    e.abandon();
    let e = Engine::open(dev.clone(), roomy_options()).unwrap();
    assert!(dump(&e) == m, "contents after the crash");
    let dead = e.garbage_nodes();
    assert!(dead > 0, "the held-only originals are dead after the crash");
    let r = clean(&e, "after the crash");
    assert_eq!(r.dead_nodes, dead as u64);
    // Collected halfway, checkpointed, crashed again: the rest is found again.
    e.collect_garbage(dead / 2).unwrap();
    e.checkpoint().unwrap();
    e.abandon();
    let e = Engine::open(dev.clone(), roomy_options()).unwrap();
    clean(&e, "after the second crash");
    assert!(e.garbage_nodes() > 0 && e.garbage_nodes() < dead);
    e.collect_garbage(usize::MAX).unwrap();
    assert_eq!(e.garbage_nodes(), 0);
    e.close().unwrap();
    let e = Engine::open(dev, roomy_options()).unwrap();
    let r = clean(&e, "after collection and a clean close");
    assert_eq!((r.dead_nodes, r.shared_nodes), (0, 0));
    assert!(dump(&e) == m);
    e.close().unwrap();
}

/// Deleting a large range (an `rm -rf`) lets go of the subtrees it covers without reading their
/// leaves, and the space comes back once they are collected and a checkpoint completes.
#[test]
fn a_range_delete_drops_covered_subtrees_without_reading_them() {
    let dev = Arc::new(MemDevice::new(256 << 20));
    let opts = Options {
        cache_size: 4 << 20,
        ..small_options()
    };
    let e = Engine::create(dev.clone(), small_format(), opts.clone()).unwrap();
    let mut m = Model::new();
    fill_family(&e, &mut m, "a/", 100, 20);
    fill_family(&e, &mut m, "d/", 60_000, 100);
    fill_family(&e, &mut m, "z/", 100, 20);
    e.flush_buffers(0, usize::MAX).unwrap();
    e.checkpoint().unwrap();
    let nodes = clean(&e, "filled");
    e.close().unwrap();
    // Cold: nothing in memory.
    let e = Engine::open(dev, opts).unwrap();
    let (free0, _) = e.space();
    let st0 = e.stats();
    let t = Instant::now();
    e.range_delete(b"d/", &prefix_end(b"d/", 256)).unwrap();
    m.retain(|k, _| !k.starts_with(b"d/"));
    e.reclaim_space(u64::MAX).unwrap();
    let collected = e.stats().nodes_collected - st0.nodes_collected;
    e.checkpoint().unwrap();
    let elapsed = t.elapsed();
    let st = e.stats();
    let (free1, _) = e.space();
    let reads = st.node_reads - st0.node_reads;
    eprintln!(
        "{} leaves and {} internal nodes; {} subtrees dropped, {collected} nodes collected, \
         {reads} node reads, {} MiB back, in {elapsed:?}",
        nodes.leaves,
        nodes.internal_nodes,
        st.subtrees_dropped - st0.subtrees_dropped,
        (free1 - free0) >> 20
    );
    assert!(collected > nodes.leaves * 9 / 10, "{collected} collected");
    assert!(
        reads < nodes.internal_nodes + 16,
        "{reads} node reads for {} internal nodes: leaves were read",
        nodes.internal_nodes
    );
    assert!(
        free1 - free0 > 5 << 20,
        "space back: {} bytes",
        free1 - free0
    );
    let r = clean(&e, "deleted");
    assert!(r.leaves < nodes.leaves / 10);
    assert!(dump(&e) == m);
    e.close().unwrap();
}
