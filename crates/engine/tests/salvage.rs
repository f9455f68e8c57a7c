//! Salvage: a survey names every damaged node, and a repair open rebuilds a tree from what is
//! intact, keeping every key that lived outside the damaged ranges.

mod common;

use std::collections::BTreeSet;
use std::ops::Bound;
use std::sync::Arc;

use amaranth_device::MemDevice;
use amaranth_engine::{Batch, Damage, DamagedPart, Engine, Error, Options, SalvageReport};
use common::*;
use rand::Rng;

/// An aged image: random operations, checkpoints on the way, a clean close. With `drain`, every
/// buffer is flushed down first (nothing pending above the leaves).
fn aged(seed: u64, ops: u32, drain: bool) -> (Arc<MemDevice>, Model) {
    let dev = Arc::new(MemDevice::new(24 << 20));
    let e = Engine::create(dev.clone(), small_format(), small_options()).unwrap();
    let mut m = Model::new();
    let mut g = Gen::new(seed, 2000, 300);
    for i in 0..ops {
        let op = g.simple_op();
        apply_model(&mut m, &op);
        e.write(&Batch::from(vec![op])).unwrap();
        if i % 1000 == 999 {
            e.checkpoint().unwrap();
        }
    }
    if drain {
        e.reclaim_space(u64::MAX).unwrap();
    }
    e.close().unwrap();
    (dev, m)
}

/// Panics with a short summary (counts and a few keys) if `got` differs from `want`.
fn same(got: &Model, want: &Model, what: &str) {
    if got == want {
        return;
    }
    let show = |k: &Vec<u8>| String::from_utf8_lossy(k).into_owned();
    let missing: Vec<String> = want
        .keys()
        .filter(|k| !got.contains_key(*k))
        .map(show)
        .collect();
    let extra: Vec<String> = got
        .keys()
        .filter(|k| !want.contains_key(*k))
        .map(show)
        .collect();
    let differ: Vec<String> = want
        .iter()
        .filter(|(k, v)| got.get(*k).is_some_and(|g| g != *v))
        .map(|(k, _)| show(k))
        .collect();
    panic!(
        "{what}: {} keys missing {:?}, {} extra {:?}, {} differ {:?}",
        missing.len(),
        &missing[..missing.len().min(5)],
        extra.len(),
        &extra[..extra.len().min(5)],
        differ.len(),
        &differ[..differ.len().min(5)]
    );
}

fn ro() -> Options {
    Options {
        read_only: true,
        ..small_options()
    }
}

fn repair() -> Options {
    Options {
        salvage: true,
        ..small_options()
    }
}

/// (node id, first block, blocks) of every node of the image's checkpoint.
fn extents(dev: &MemDevice) -> Vec<(u64, u64, u64)> {
    let copy = Arc::new(MemDevice::from_bytes(dev.to_bytes()));
    Engine::open(copy, ro()).unwrap().node_extents()
}

fn in_range(d: &Damage, k: &[u8]) -> bool {
    match &d.range {
        Some((lo, hi)) => k >= lo.as_slice() && hi.as_ref().is_none_or(|h| k < h.as_slice()),
        None => false,
    }
}

/// Repairs, checks the rebuilt tree, and compares it with the model outside the damaged ranges.
fn repair_and_check(dev: &Arc<MemDevice>, m: &Model, what: &str) -> SalvageReport {
    let e = Engine::open(dev.clone(), repair()).unwrap_or_else(|e| panic!("{what}: {e}"));
    let report = e.salvage_report().unwrap().clone();
    let v = e.verify().unwrap_or_else(|e| panic!("{what}: verify: {e}"));
    assert!(
        v.leaked_nodes.is_empty(),
        "{what}: leaked {:?}",
        v.leaked_nodes
    );
    let got = dump(&e);
    let damaged = |k: &[u8]| report.damage.iter().any(|d| in_range(d, k));
    for (k, v) in m {
        if !damaged(k) {
            assert_eq!(got.get(k), Some(v), "{what}: key {k:?} outside the damage");
        }
    }
    for k in got.keys() {
        assert!(
            m.contains_key(k) || damaged(k),
            "{what}: key {k:?} appeared"
        );
    }
    e.close().unwrap();
    // Repaired: a normal read-write open works, and a survey finds nothing.
    let e = Engine::open(dev.clone(), small_options()).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(dump(&e), got, "{what}: the repair did not persist");
    e.close().unwrap();
    let again = Engine::survey(dev.clone(), small_options()).unwrap();
    assert!(again.damage.is_empty(), "{what}: {:?}", again.damage);
    report
}

#[test]
fn a_damaged_partition_is_named_and_the_rest_kept() {
    let (dev, m) = aged(1, 4000, false);
    let (id, block, blocks) = extents(&dev)
        .into_iter()
        .find(|&(id, _, b)| id != 1 && b > 2)
        .unwrap();
    dev.with_bytes_mut(|b| b[((block + blocks - 1) * 4096) as usize..][..4096].fill(0));
    let s = Engine::survey(dev.clone(), small_options()).unwrap();
    assert_eq!(s.damage.len(), 1, "{:?}", s.damage);
    assert_eq!(s.damage[0].node, id);
    assert!(s.damage[0].range.is_some());
    // Not known yet to the superblock, but a repair finds and fixes it.
    let r = repair_and_check(&dev, &m, "partition");
    assert!(r.rebuilt && r.leaves_kept > 0, "{r:?}");
}

#[test]
fn a_damaged_root_loses_only_its_buffers() {
    // Drained: the root buffers nothing, so its children, adopted through the table, hold all.
    let (dev, m) = aged(2, 4000, true);
    let (_, block, _) = extents(&dev)
        .into_iter()
        .find(|&(id, _, _)| id == 1)
        .unwrap();
    dev.with_bytes_mut(|b| b[(block * 4096) as usize..][..4096].fill(0));
    let s = Engine::survey(dev.clone(), small_options()).unwrap();
    assert_eq!(s.damage.len(), 1, "{:?}", s.damage);
    assert!(matches!(
        s.damage[0].part,
        DamagedPart::Node { height: None }
    ));
    let e = Engine::open(dev.clone(), repair()).unwrap();
    let r = e.salvage_report().unwrap().clone();
    assert!(r.orphans_adopted >= 2, "{r:?}");
    same(&dump(&e), &m, "every leaf was intact");
    e.close().unwrap();
}

#[test]
fn a_damaged_internal_node_gives_up_its_children() {
    let (dev, m) = aged(3, 6000, true);
    let copy = Arc::new(MemDevice::from_bytes(dev.to_bytes()));
    let e = Engine::open(copy, ro()).unwrap();
    assert!(
        e.stats().height >= 2,
        "the test needs internal nodes below the root"
    );
    drop(e);
    // Zero the header block of each non-root node in turn until one turns out to be internal.
    for (id, block, _) in extents(&dev) {
        if id == 1 {
            continue;
        }
        let img = Arc::new(MemDevice::from_bytes(dev.to_bytes()));
        img.with_bytes_mut(|b| b[(block * 4096) as usize..][..4096].fill(0));
        let s = Engine::survey(img.clone(), small_options()).unwrap();
        if !matches!(s.damage[0].part, DamagedPart::Node { height: Some(h) } if h > 0) {
            continue;
        }
        let e = Engine::open(img, repair()).unwrap();
        let r = e.salvage_report().unwrap().clone();
        assert!(r.orphans_adopted >= 1 && r.orphans_left.is_empty(), "{r:?}");
        same(&dump(&e), &m, "every leaf was intact");
        e.verify().unwrap();
        return;
    }
    panic!("no internal node below the root");
}

#[test]
fn random_zeroed_blocks_are_all_named_and_the_rest_salvaged() {
    let mut totals = (0usize, 0u64, 0u64);
    for seed in 0..6u64 {
        let (dev, m) = aged(100 + seed, 5000, seed % 2 == 0);
        let nodes = extents(&dev);
        let used: Vec<(u64, u64)> = nodes
            .iter()
            .flat_map(|&(id, b, n)| (b..b + n).map(move |x| (id, x)))
            .collect();
        let mut rng = Gen::new(seed, 1, 1).rng;
        let mut truth = BTreeSet::new();
        for _ in 0..rng.gen_range(1..=4) {
            let (id, blk) = used[rng.gen_range(0..used.len())];
            let changed = dev.with_bytes_mut(|b| {
                let blk = &mut b[(blk * 4096) as usize..][..4096];
                let changed = blk.iter().any(|&x| x != 0);
                blk.fill(0);
                changed
            });
            if changed {
                truth.insert(id);
            }
        }
        let what = format!("seed {seed}");
        let s = Engine::survey(dev.clone(), small_options()).unwrap();
        let named: BTreeSet<u64> = s.damage.iter().map(|d| d.node).collect();
        assert_eq!(named, truth, "{what}: damaged nodes named");
        let r = repair_and_check(&dev, &m, &what);
        eprintln!(
            "{what}: {} damaged, {} leaves kept, {} rebuilt, {} entries, {} orphans adopted",
            truth.len(),
            r.leaves_kept,
            r.leaves_rebuilt,
            r.entries,
            r.orphans_adopted
        );
        totals.0 += truth.len();
        totals.1 += r.leaves_kept;
        totals.2 += r.entries;
    }
    eprintln!("totals: {totals:?}");
}

#[test]
fn repair_replays_the_log_up_to_its_damage() {
    let dev = Arc::new(MemDevice::new(24 << 20));
    let e = Engine::create(dev.clone(), small_format(), small_options()).unwrap();
    let mut m = Model::new();
    let mut g = Gen::new(9, 500, 200);
    for i in 0..600 {
        let op = g.simple_op();
        apply_model(&mut m, &op);
        e.write(&Batch::from(vec![op])).unwrap();
        if i % 50 == 0 {
            e.sync().unwrap();
        }
    }
    e.sync().unwrap();
    e.abandon();
    // Damage an early durable chunk of the log (block 3 is in the ring at block 2).
    let sb = amaranth_engine::Superblock::read_newest(&*dev, false).unwrap();
    let first = sb.log_start_block + sb.log_tail_voff / 4096 % sb.log_blocks;
    dev.with_bytes_mut(|b| b[((first + 1) * 4096) as usize..][..4096].fill(0xa5));
    let err = Engine::open(dev.clone(), small_options())
        .err()
        .expect("damaged log refused");
    assert!(err.to_string().contains("redo log is damaged"), "{err}");
    let e = Engine::open(dev.clone(), repair()).unwrap();
    let r = e.salvage_report().unwrap();
    assert!(
        r.log.as_deref().is_some_and(|l| l.contains("redo log")),
        "{r:?}"
    );
    // What was replayed is a prefix: every key present holds a value it had at some point.
    e.verify().unwrap();
    e.close().unwrap();
    Engine::open(dev, small_options()).unwrap();
    let _ = (Bound::<u8>::Unbounded, Error::Closed);
}

/// Nodes store their keys without their prefix (docs/SURGERY.md §2): the orphans of a damaged
/// node are read and placed by their prefix hints (§2.7). Keys share long prefixes, so the nodes
/// below the root have non-empty ones.
#[test]
fn orphans_with_lifted_keys_are_placed_by_their_hints() {
    let dev = Arc::new(MemDevice::new(24 << 20));
    let e = Engine::create(dev.clone(), small_format(), small_options()).unwrap();
    let mut m = Model::new();
    for i in 0..6000u32 {
        let k = format!("d/a/long/shared/directory/{:04}/{i:06}", i / 500).into_bytes();
        let v = vec![b'v'; 30];
        e.put(&k, &v).unwrap();
        m.insert(k, v);
    }
    e.reclaim_space(u64::MAX).unwrap();
    e.close().unwrap();
    let mut tried = 0;
    for (id, block, _) in extents(&dev) {
        if id == 1 {
            continue;
        }
        let img = Arc::new(MemDevice::from_bytes(dev.to_bytes()));
        img.with_bytes_mut(|b| b[(block * 4096) as usize..][..4096].fill(0));
        let s = Engine::survey(img.clone(), small_options()).unwrap();
        if !matches!(s.damage[0].part, DamagedPart::Node { height: Some(h) } if h > 0) {
            continue;
        }
        tried += 1;
        let e = Engine::open(img.clone(), repair()).unwrap();
        let r = e.salvage_report().unwrap().clone();
        assert!(r.orphans_adopted >= 1 && r.orphans_left.is_empty(), "{r:?}");
        same(&dump(&e), &m, "every leaf was intact");
        e.verify().unwrap();
        e.close().unwrap();
        let e = Engine::open(img, small_options()).unwrap();
        same(&dump(&e), &m, "after the repair's checkpoint");
        e.verify().unwrap();
    }
    assert!(tried >= 1, "no internal node below the root");
}

/// An image whose tree shares subtrees (range clones, docs/SURGERY.md §4), one of them a clone of
/// a clone with writes to both sides, and holds dead subtrees (a range delete dropped the family
/// `f3/` whole; its nodes wait for the collector at the checkpoint). Returns the image (its last
/// checkpoint holds everything), the model, and how many nodes the dead subtrees hold.
fn shared_image() -> (Arc<MemDevice>, Model, usize) {
    let dev = Arc::new(MemDevice::new(12 << 20));
    let e = Engine::create(dev.clone(), small_format(), roomy_options()).unwrap();
    let mut m = Model::new();
    for f in 0..4 {
        fill_family(&e, &mut m, &format!("f{f}/"), 2500, 60);
    }
    e.flush_buffers(0, usize::MAX).unwrap();
    let clone = |m: &mut Model, from: &str, to: &str| {
        let mut b = Batch::new();
        b.range_clone(from, to, 0);
        e.write(&b).unwrap();
        let copies: Vec<(Vec<u8>, Vec<u8>)> = m
            .range(from.as_bytes().to_vec()..)
            .take_while(|(k, _)| k.starts_with(from.as_bytes()))
            .map(|(k, v)| ([to.as_bytes(), &k[from.len()..]].concat(), v.clone()))
            .collect();
        m.extend(copies);
    };
    clone(&mut m, "f1/", "g1/");
    clone(&mut m, "f2/", "g2/");
    clone(&mut m, "g2/", "h2/");
    let mut b = Batch::new();
    for i in (0..2500u32).step_by(100) {
        for side in ["f1/", "g1/", "h2/"] {
            let k = format!("{side}{i:07}").into_bytes();
            m.insert(k.clone(), side.as_bytes().to_vec());
            b.put(k, side.as_bytes().to_vec());
        }
    }
    e.write(&b).unwrap();
    // Reopened, the use now is the baseline: the range delete below does not pass the bound that
    // makes a writer push range deletes down and collect what they dropped at once.
    e.close().unwrap();
    let e = Engine::open(dev.clone(), roomy_options()).unwrap();
    // The family sliced into whole subtrees first; the second slicing descent takes the range
    // delete down to the node whose children it covers whole, and they are let go (nothing
    // collects them here). No key of `f3/` is left anywhere, not even a pending range delete.
    e.slice_for_tests(b"f3/", b"f30").unwrap();
    e.range_delete(b"f3/", &amaranth_engine::prefix_end(b"f3/", 256))
        .unwrap();
    m.retain(|k, _| !k.starts_with(b"f3/"));
    e.slice_for_tests(b"f3/", b"f30").unwrap();
    let r = e.verify().unwrap();
    assert!(r.shared_nodes > 0, "nothing shared");
    assert_eq!(r.buffered_ranges, 0, "the range delete is pending");
    let dead = e.garbage_nodes();
    assert!(dead > 0, "nothing dead");
    assert!(dump(&e) == m);
    e.checkpoint().unwrap();
    e.abandon();
    // The nodes nothing live reaches: the dead ones and what only they name.
    let copy = Arc::new(MemDevice::from_bytes(dev.to_bytes()));
    let e = Engine::open(copy, small_options()).unwrap();
    assert_eq!(e.garbage_nodes(), dead);
    let unreachable = e.collect_garbage(usize::MAX).unwrap();
    e.abandon();
    (dev, m, unreachable)
}

/// Salvage walks a node that two parents share once under each (it is not "reachable twice"),
/// keeps a shared leaf where it is once and copies it for its other places, places the orphans
/// of a damaged node by their counts (a shared node reached through one intact parent can still
/// be the orphan of a damaged one), and never adopts a dead subtree (its keys were deleted).
/// Each node of the image is damaged in turn: a survey names it (a node of a dead subtree:
/// nothing), a repair (of a third of the internal nodes and some leaves) keeps every key outside the
/// damaged ranges and brings back no deleted one, the rebuilt tree verifies without leaks, and a
/// survey after the repair finds nothing.
#[test]
fn shared_and_dead_nodes_are_no_damage_and_a_repair_keeps_the_rest() {
    let (dev, m, unreachable) = shared_image();
    let s = Engine::survey(dev.clone(), small_options()).unwrap();
    assert!(s.damage.is_empty(), "an intact image: {:?}", s.damage);
    // Shared leaves are read under each of their places (the clones hold half the keys).
    assert!(s.entries as usize >= m.len(), "{s:?}");
    let nodes = extents(&dev);
    let (mut named, mut unreached, mut internal, mut stale, mut repaired) = (0, 0, 0, 0, 0);
    for (id, block, _) in nodes {
        let img = Arc::new(MemDevice::from_bytes(dev.to_bytes()));
        img.with_bytes_mut(|b| b[(block * 4096) as usize..][..4096].fill(0));
        let s = Engine::survey(img.clone(), small_options()).unwrap();
        let what = format!("node {id} damaged");
        if s.damage.is_empty() {
            // A node of a dead subtree: nothing reaches it.
            unreached += 1;
            continue;
        }
        assert!(
            s.damage.iter().any(|d| d.node == id),
            "{what}: {:?}",
            s.damage
        );
        // A shared node's prefix hint names one of its places (the one it was written at): an
        // orphan's edge child read under its hint at another place has its keys outside the
        // range it is given there, and is named too (docs/SURGERY.md §2.7). Nothing else is.
        for d in s.damage.iter().filter(|d| d.node != id) {
            let stale_hint = matches!(d.part, DamagedPart::Partition { .. })
                && d.error.contains("keys outside its range");
            assert!(stale_hint, "{what}: {d:?}");
            stale += 1;
        }
        named += 1;
        let is_internal = matches!(
            s.damage[0].part,
            DamagedPart::Node { height: Some(h) } if h > 0
        );
        internal += usize::from(is_internal);
        // Every third internal node repaired, and every twelfth leaf (time).
        if named % if is_internal { 3 } else { 12 } != 0 {
            continue;
        }
        repaired += 1;
        let r = repair_and_check(&img, &m, &what);
        let e = Engine::open(img, small_options()).unwrap();
        assert!(
            e.range(Bound::Included(&b"f3/"[..]), Bound::Excluded(&b"f30"[..]))
                .next()
                .is_none(),
            "{what}: a dead subtree came back ({r:?})"
        );
        e.close().unwrap();
    }
    eprintln!(
        "{named} damaged nodes named ({internal} internal), {repaired} repaired, {unreached} in \
         dead subtrees; \
         {stale} partitions of shared orphans' edge children read under a stale hint"
    );
    assert_eq!(
        unreached, unreachable,
        "every node but those of dead subtrees is named when damaged"
    );
    assert!(internal > 1, "{internal} internal nodes damaged");
}

/// A repair that rebuilds the tree deletes the snapshots, and says so: the rebuilt tree shares
/// no node with them, the old tree's nodes leave the table, and a catalog still naming the
/// snapshot roots would name nodes that are gone.
#[test]
fn a_rebuild_deletes_the_snapshots_and_names_them() {
    let dev = Arc::new(MemDevice::new(24 << 20));
    let e = Engine::create(dev.clone(), small_format(), small_options()).unwrap();
    let mut m = Model::new();
    fill_family(&e, &mut m, "a/", 1500, 40);
    e.snapshot_create("before").unwrap();
    fill_family(&e, &mut m, "b/", 1500, 40);
    e.snapshot_create("after").unwrap();
    e.close().unwrap();
    let (_, block, blocks) = extents(&dev)
        .into_iter()
        .find(|&(id, _, b)| id != 1 && b > 2)
        .unwrap();
    dev.with_bytes_mut(|b| b[((block + blocks - 1) * 4096) as usize..][..4096].fill(0));
    let r = repair_and_check(&dev, &m, "snapshots");
    assert!(r.rebuilt, "{r:?}");
    assert_eq!(
        r.snapshots_dropped,
        vec!["after".to_string(), "before".to_string()]
    );
    let e = Engine::open(dev.clone(), small_options()).unwrap();
    assert!(e.snapshots().is_empty(), "{:?}", e.snapshots());
    let v = e.verify().unwrap();
    assert!(v.leaked_nodes.is_empty(), "{:?}", v.leaked_nodes);
    e.close().unwrap();
}
