//! Slicing (docs/SURGERY.md §3.2): a key range cut into whole child slots of one node changes no
//! key, the tree verifies after every slice, and healing brings the node count back.

mod common;

use std::sync::Arc;

use amaranth_device::MemDevice;
use amaranth_engine::{Engine, Options};
use common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn nodes(e: &Engine) -> u64 {
    let r = e.verify().expect("verify");
    assert!(r.leaked_nodes.is_empty(), "leaked {:?}", r.leaked_nodes);
    eprintln!(
        "{} internal, {} leaves, {} small",
        r.internal_nodes, r.leaves, r.small_leaves
    );
    r.internal_nodes + r.leaves
}

/// A tree of height 3 or more with the small format: 30,000 keys in 300 families.
fn filled() -> (Engine, Model) {
    let dev = Arc::new(MemDevice::new(96 << 20));
    let options = Options {
        cache_size: 4 << 20,
        ..small_options()
    };
    let e = Engine::create(dev, small_format(), options).unwrap();
    let mut m = Model::new();
    for i in 0..30_000u32 {
        let k = format!("k{:04}/{:05}", (i * 7919) % 300, i).into_bytes();
        let v = vec![(i % 251) as u8; 20 + (i % 40) as usize];
        e.put(&k, &v).unwrap();
        m.insert(k, v);
    }
    e.flush_buffers(0, usize::MAX).unwrap();
    assert!(e.stats().height >= 3, "{:?}", e.stats());
    (e, m)
}

#[test]
fn slices_change_no_key_and_healing_brings_the_node_count_back() {
    let seed = 0x51ce;
    eprintln!("slice seed {seed}");
    let (e, m) = filled();
    let before = nodes(&e);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut heights = std::collections::BTreeSet::new();
    for i in 0..60 {
        // Key families, spans of several families, and a range inside one leaf.
        let a = rng.gen_range(0..300u32);
        let (lo, hi) = match i % 3 {
            0 => (format!("k{a:04}/"), format!("k{a:04}0")),
            1 => (
                format!("k{a:04}/"),
                format!("k{:04}/", (a + rng.gen_range(1..40)).min(299)),
            ),
            _ => (format!("k{a:04}/00100"), format!("k{a:04}/00100~")),
        };
        if lo >= hi {
            continue;
        }
        let (height, slots) = e.slice_for_tests(lo.as_bytes(), hi.as_bytes()).unwrap();
        assert!(slots >= 1);
        heights.insert(height);
        assert!(dump(&e) == m, "slice {i} [{lo}, {hi}) changed the contents");
    }
    assert!(
        heights.len() >= 2,
        "slices should stop at several heights: {heights:?}"
    );
    let sliced = nodes(&e);
    assert!(
        sliced > before,
        "{before} nodes before, {sliced} after slicing"
    );
    while e.heal_fringes(16).unwrap() > 0 {}
    let healed = nodes(&e);
    eprintln!("nodes: {before} before, {sliced} sliced, {healed} healed");
    // Pieces merge back where they fit in one node: with a fanout of 4, two internal pieces of
    // 2 and 3 children do not, so not all of the growth goes.
    assert!(
        healed - before <= (sliced - before) / 3,
        "{before} nodes before, {sliced} after slicing, {healed} after healing"
    );
    assert!(dump(&e) == m, "healing changed the contents");
    e.close().unwrap();
}

#[test]
fn a_root_leaf_is_sliced_under_a_new_root() {
    let dev = Arc::new(MemDevice::new(16 << 20));
    let e = Engine::create(dev, small_format(), small_options()).unwrap();
    for k in ["a/1", "b/1", "b/2", "c/1"] {
        e.put(k.as_bytes(), b"v").unwrap();
    }
    assert_eq!(e.stats().height, 0);
    assert_eq!(e.slice_for_tests(b"b/", b"b0").unwrap(), (1, 1));
    assert_eq!(e.stats().height, 1);
    assert_eq!(e.get(b"b/2").unwrap().as_deref(), Some(&b"v"[..]));
    assert_eq!(nodes(&e), 4, "the root above three leaves");
    while e.heal_fringes(16).unwrap() > 0 {}
    assert_eq!(e.get(b"c/1").unwrap().as_deref(), Some(&b"v"[..]));
    assert!(nodes(&e) <= 2, "healed back to one leaf under the root");
    e.close().unwrap();
}
