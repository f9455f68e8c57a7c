//! A scan one partition at a time (`scan_tree_stepwise`, for scans that usually stop after a few
//! keys: a rename's copy-or-surgery check, a destination's emptiness) sees exactly what a scan of
//! whole leaves sees, with messages of every kind still buffered above the leaves, whether it
//! runs to its end or stops early. Random ranges; the seed is printed.

use std::sync::Arc;

use amaranth_device::MemDevice;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::apply::{scan_tree, scan_tree_stepwise};
use crate::dataref::Stored;
use crate::node::{Body, ROOT_ID};
use crate::{Batch, Engine, Format, Options, Patch};

fn key(i: u32) -> Vec<u8> {
    format!("k/{i:06}").into_bytes()
}

type Seen = Vec<(Vec<u8>, Vec<u8>)>;

/// The keys and values a scan hands over, stopping after `stop` of them.
fn run(
    scan: impl FnOnce(&mut dyn FnMut(&[u8], Stored<'_>) -> bool) -> crate::error::Result<()>,
    stop: usize,
) -> Seen {
    let mut out = Vec::new();
    scan(&mut |k, v| {
        let bytes = match v {
            Stored::Bytes(b) | Stored::Ref(b) => b.to_vec(),
        };
        out.push((k.to_vec(), bytes));
        out.len() < stop
    })
    .unwrap();
    out
}

#[test]
fn a_scan_one_partition_at_a_time_sees_what_a_whole_leaf_scan_sees() {
    let seed: u64 = std::env::var("SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("SEED={seed}");
    let mut rng = SmallRng::seed_from_u64(seed);
    let dev = Arc::new(MemDevice::new(64 << 20));
    let format = Format {
        node_size: 64 << 10,
        partition_size: 4 << 10,
        max_fanout: 16,
        ..Format::small_for_tests()
    };
    let options = Options {
        cache_size: 16 << 20,
        background_threads: false,
        ..Options::default()
    };
    let e = Engine::create(dev, format, options).unwrap();
    const N: u32 = 4000;
    for i in 0..N {
        let len = rng.gen_range(20..200);
        e.put(&key(i), &vec![(i % 251) as u8; len]).unwrap();
    }
    // Messages that stay buffered above the leaves: puts, deletes, upserts, range deletes.
    for _ in 0..300 {
        let i = rng.gen_range(0..N + 100);
        let mut b = Batch::new();
        match rng.gen_range(0..4) {
            0 => {
                b.put(key(i), vec![7; rng.gen_range(1..100)]);
            }
            1 => {
                b.delete(key(i));
            }
            2 => {
                let patch = Patch::Write {
                    offset: rng.gen_range(0..50),
                    data: vec![9; 4],
                };
                b.upsert(key(i), patch);
            }
            _ => {
                b.range_delete(key(i), key(i + rng.gen_range(1..40)));
            }
        }
        e.write(&b).unwrap();
    }
    let tree = e.tree();
    // The premise: leaves of many partitions under buffers holding messages.
    {
        let root = tree.cache.get(ROOT_ID).unwrap();
        let g = root.read();
        let Body::Internal(n) = &g.body else {
            panic!("the tree is a single leaf")
        };
        let buffered: usize = n
            .buffers
            .iter()
            .filter_map(|b| b.data())
            .map(|b| b.counts().0 + b.counts().1)
            .sum();
        assert!(buffered > 0, "no message is buffered in the root");
    }
    for round in 0..300 {
        let a = rng.gen_range(0..N + 50);
        let b = a + rng.gen_range(1..(N / 2));
        let (lo, hi) = (key(a), key(b));
        let stop = if rng.gen_bool(0.5) {
            usize::MAX
        } else {
            rng.gen_range(1..50)
        };
        let whole = run(|f| scan_tree(tree, &lo, Some(&hi), f), stop);
        let parts = rng.gen_range(1..4);
        let step = run(|f| scan_tree_stepwise(tree, &lo, Some(&hi), parts, f), stop);
        assert!(
            whole == step,
            "seed {seed}, round {round}: [{a}, {b}) stop {stop}, {parts} partitions at a time: {} \
             entries whole, {} stepwise",
            whole.len(),
            step.len()
        );
    }
    e.close().unwrap();
}
