//! Node placement (docs/DESIGN.md, Placement): a checkpoint writes its dirty leaves in key order
//! into contiguous free space, so that the leaves of a tree rewritten in random key order over
//! many checkpoints still lie on the device in key order, and a scan in key order reads the
//! device in order.

mod common;

use std::sync::Arc;

use amaranth_device::MemDevice;
use amaranth_engine::{Engine, Format, Options};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

const KEYS: u64 = 20_000;

fn key(i: u64) -> Vec<u8> {
    format!("dir{:02}/file{:06}", i % 7, i).into_bytes()
}

fn options() -> Options {
    Options {
        // Everything stays in memory: only checkpoints write nodes.
        cache_size: 64 << 20,
        background_threads: false,
        check_invariants: true,
        ..Options::default()
    }
}

fn layout(e: &Engine) -> (f64, u64) {
    let r = e.verify().unwrap();
    assert!(
        r.leaked_nodes.is_empty(),
        "leaked nodes: {:?}",
        r.leaked_nodes
    );
    (r.leaf_layout_score(), r.leaves)
}

/// Rewrites random keys (in random order) over many checkpoints, and after every tenth checks
/// the leaves' layout score: the fraction of leaves that start on the device where the previous
/// leaf in key order ends. With first-fit placement of each node where free space happened to be
/// it falls to a few percent; with key-ordered runs it stays high.
#[test]
fn leaves_stay_in_key_order_on_the_device_across_random_rewrites() {
    let seed = 13;
    println!("seed {seed}");
    let mut rng = SmallRng::seed_from_u64(seed);
    let dev = Arc::new(MemDevice::new(96 << 20));
    let format = Format {
        log_size: Some(8 << 20),
        ..Format::small_for_tests()
    };
    let e = Engine::create(dev.clone(), format, options()).unwrap();
    let mut value = vec![0u8; 150];
    let mut order: Vec<u64> = (0..KEYS).collect();
    order.shuffle(&mut rng);
    for &i in &order {
        rng.fill(&mut value[..]);
        e.put(&key(i), &value).unwrap();
    }
    e.checkpoint().unwrap();
    let (first, leaves) = layout(&e);
    println!("after the load: {leaves} leaves, layout score {first:.2}");
    assert!(
        leaves > 100,
        "too few leaves ({leaves}) to measure a layout"
    );
    let mut worst = first;
    for round in 1..=60 {
        // A few percent of the keys, scattered over the whole key space.
        for _ in 0..KEYS / 25 {
            let i = rng.gen_range(0..KEYS);
            rng.fill(&mut value[..]);
            e.put(&key(i), &value).unwrap();
        }
        e.checkpoint().unwrap();
        if round % 10 == 0 {
            let (score, leaves) = layout(&e);
            println!("round {round}: {leaves} leaves, layout score {score:.2}");
            worst = worst.min(score);
        }
    }
    let stats = e.stats();
    println!(
        "run extents {} of which contiguous {}, relocated leaves {}",
        stats.run_extents, stats.run_contiguous, stats.relocated
    );
    assert!(
        worst >= 0.5,
        "the leaves' layout score fell to {worst:.2} (after the load: {first:.2})"
    );
    e.close().unwrap();
    // What a reopen finds is the same placement.
    let e = Engine::open(dev, options()).unwrap();
    let (reopened, _) = layout(&e);
    assert!(
        reopened >= 0.5,
        "layout score {reopened:.2} after reopening"
    );
}

/// Choosing the leaves to relocate looks at every cached leaf; that is not a use of them (it would
/// make every node most recently used at each checkpoint, and count as cache hits).
#[test]
fn choosing_leaves_to_relocate_is_not_a_use_of_the_cache() {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let format = Format {
        log_size: Some(8 << 20),
        ..Format::small_for_tests()
    };
    let e = Engine::create(dev, format, options()).unwrap();
    for i in 0..4_000 {
        e.put(&key(i), &[7u8; 150]).unwrap();
    }
    e.checkpoint().unwrap();
    e.put(&key(1_234), b"changed").unwrap();
    let leaves = e.verify().unwrap().leaves;
    let before = e.stats().cache_hits;
    e.checkpoint().unwrap();
    let hits = e.stats().cache_hits - before;
    // The checkpoint's own work (settling the root) uses a node or two, not every leaf.
    assert!(
        hits < 10,
        "the checkpoint counted {hits} cache hits ({leaves} leaves)"
    );
}
