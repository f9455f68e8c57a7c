//! Snapshots (docs/SURGERY.md §4.7, increment 10): a snapshot is the tree as it was at its
//! record, read through a view while the live tree goes on changing; it survives checkpoints,
//! reopens and crashes; creating one copies one node; deleting it gives back what only it held.

mod common;

use std::ops::Bound;
use std::sync::Arc;

use amaranth_device::MemDevice;
use amaranth_engine::{prefix_end, Batch, Engine, Error, View};
use common::*;

fn view_dump(v: &View) -> Model {
    v.range(Bound::Unbounded, Bound::Unbounded)
        .map(|r| r.expect("snapshot scan"))
        .collect()
}

fn verified(e: &Engine) -> amaranth_engine::Report {
    let r = e.verify().expect("verify");
    assert!(r.leaked_nodes.is_empty(), "leaked {:?}", r.leaked_nodes);
    assert!(r.references.is_clean(), "{}", r.references.describe());
    r
}

#[test]
fn a_snapshot_keeps_the_tree_as_it_was_and_its_deletion_gives_the_space_back() {
    let dev = Arc::new(MemDevice::new(256 << 20));
    let e = Engine::create(dev.clone(), small_format(), roomy_options()).unwrap();
    let mut m = Model::new();
    fill_family(&e, &mut m, "a/", 20_000, 100);
    fill_family(&e, &mut m, "b/", 5_000, 50);
    e.flush_buffers(0, usize::MAX).unwrap();
    e.put(b"a/buffered", b"in the root's buffer").unwrap();
    m.insert(b"a/buffered".to_vec(), b"in the root's buffer".to_vec());
    e.checkpoint().unwrap();
    let dirty = e.stats().dirty_nodes;
    e.snapshot_create("one").unwrap();
    assert!(
        e.stats().dirty_nodes <= dirty + 2,
        "a snapshot copies the root only"
    );
    let at_one = m.clone();
    let r = verified(&e);
    assert!(r.shared_nodes > 0, "the root's children are shared");
    // The live tree changes: writes, a range delete, a clone, a move.
    let mut b = Batch::new();
    for i in (0..20_000u32).step_by(7) {
        let k = format!("a/{i:07}").into_bytes();
        m.insert(k.clone(), b"new".to_vec());
        b.put(k, b"new".to_vec());
    }
    e.write(&b).unwrap();
    e.range_delete(b"b/", &prefix_end(b"b/", 256)).unwrap();
    m.retain(|k, _| !k.starts_with(b"b/"));
    let mut b = Batch::new();
    b.range_clone(b"a/".to_vec(), b"c/".to_vec(), 0);
    e.write(&b).unwrap();
    let copied: Vec<_> = m
        .range(b"a/".to_vec()..prefix_end(b"a/", 256))
        .map(|(k, v)| ([b"c/", &k[2..]].concat(), v.clone()))
        .collect();
    m.extend(copied);
    e.reclaim_space(u64::MAX).unwrap();
    e.snapshot_create("two").unwrap();
    let at_two = m.clone();
    e.put(b"z", b"after two").unwrap();
    m.insert(b"z".to_vec(), b"after two".to_vec());
    {
        let one = e.snapshot_view("one").unwrap();
        assert!(view_dump(&one) == at_one, "snapshot one changed");
        assert_eq!(
            one.get(b"a/buffered").unwrap().as_deref(),
            Some(&b"in the root's buffer"[..])
        );
        assert_eq!(one.get(b"z").unwrap(), None);
        let two = e.snapshot_view("two").unwrap();
        assert!(view_dump(&two) == at_two, "snapshot two changed");
        assert!(matches!(e.snapshot_delete("one"), Err(Error::InUse(_))));
    }
    assert!(dump(&e) == m);
    verified(&e);
    // Errors change nothing.
    assert!(matches!(
        e.snapshot_create("one"),
        Err(Error::SnapshotExists(_))
    ));
    assert!(matches!(
        e.snapshot_delete("three"),
        Err(Error::NoSuchSnapshot(_))
    ));
    assert!(matches!(
        e.snapshot_create("a/b"),
        Err(Error::InvalidArgument(_))
    ));
    let names: Vec<String> = e.snapshots().into_iter().map(|s| s.name).collect();
    assert_eq!(names, ["one", "two"]);
    // A clean reopen keeps them (the catalog is in the checkpoint).
    e.close().unwrap();
    let e = Engine::open(dev.clone(), roomy_options()).unwrap();
    verified(&e);
    assert!(view_dump(&e.snapshot_view("one").unwrap()) == at_one);
    assert!(view_dump(&e.snapshot_view("two").unwrap()) == at_two);
    assert!(dump(&e) == m);
    // A crash after deleting one and taking another: the log replays both.
    e.snapshot_delete("one").unwrap();
    e.snapshot_create("three").unwrap();
    let at_three = m.clone();
    e.put(b"z", b"after three").unwrap();
    m.insert(b"z".to_vec(), b"after three".to_vec());
    e.sync().unwrap();
    e.abandon();
    let e = Engine::open(dev.clone(), roomy_options()).unwrap();
    assert_eq!(e.stats().skipped_records, 0);
    verified(&e);
    let names: Vec<String> = e.snapshots().into_iter().map(|s| s.name).collect();
    assert_eq!(names, ["three", "two"]);
    assert!(view_dump(&e.snapshot_view("two").unwrap()) == at_two);
    assert!(view_dump(&e.snapshot_view("three").unwrap()) == at_three);
    assert!(dump(&e) == m);
    // Every snapshot deleted and collected: nothing dead, nothing leaked (every node left is
    // the live tree's: the space of the old data is back).
    let before = e.space_use();
    e.snapshot_delete("two").unwrap();
    e.snapshot_delete("three").unwrap();
    e.reclaim_space(u64::MAX).unwrap();
    e.collect_garbage(usize::MAX).unwrap();
    let r = verified(&e);
    assert_eq!(r.dead_nodes, 0);
    let after = e.space_use();
    eprintln!("space before the deletes {before:?}, after {after:?}");
    assert!(after.used() < before.used(), "no space came back");
    assert!(e.snapshots().is_empty());
    assert!(dump(&e) == m);
    e.close().unwrap();
}

/// A snapshot never holds part of an atomic group: taken while one is open, it waits for the
/// commit and then holds all of it.
#[test]
fn a_snapshot_waits_for_an_open_atomic_group() {
    let e = Arc::new(roomy_engine(64 << 20));
    let g = e.begin_atomic().unwrap();
    let mut b = Batch::new();
    b.put(b"x".to_vec(), b"1".to_vec());
    e.write_atomic(g, &b).unwrap();
    let taker = {
        let e = e.clone();
        std::thread::spawn(move || e.snapshot_create("mid").unwrap())
    };
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(e.snapshots().is_empty(), "taken inside the group");
    let mut b = Batch::new();
    b.put(b"y".to_vec(), b"2".to_vec());
    e.write_atomic(g, &b).unwrap();
    e.commit_atomic(g).unwrap();
    taker.join().unwrap();
    let v = e.snapshot_view("mid").unwrap();
    assert_eq!(v.get(b"x").unwrap().as_deref(), Some(&b"1"[..]));
    assert_eq!(v.get(b"y").unwrap().as_deref(), Some(&b"2"[..]));
    drop(v);
    verified(&e);
}

/// A snapshot's engine handle (`Engine::snapshot_engine`): the queries of an engine answered
/// from the snapshot, every change refused, sync a no-op, close lets go of the view only.
#[test]
fn a_snapshot_engine_reads_the_snapshot_and_refuses_changes() {
    let e = roomy_engine(64 << 20);
    let mut m = Model::new();
    fill_family(&e, &mut m, "a/", 3_000, 60);
    e.snapshot_create("s").unwrap();
    let at_s = m.clone();
    e.range_delete(b"a/", &prefix_end(b"a/", 256)).unwrap();
    e.put(b"b", b"later").unwrap();
    let s = e.snapshot_engine("s").unwrap();
    assert!(s.is_read_only());
    assert_eq!(s.snapshot_name(), Some("s"));
    assert!(dump(&s) == at_s);
    assert_eq!(s.get(b"b").unwrap(), None);
    assert!(matches!(s.put(b"c", b"no"), Err(Error::ReadOnly(_))));
    assert!(matches!(
        s.range_delete(b"a", b"b"),
        Err(Error::ReadOnly(_))
    ));
    assert!(matches!(s.begin_atomic(), Err(Error::ReadOnly(_))));
    assert!(matches!(s.checkpoint(), Err(Error::ReadOnly(_))));
    assert!(matches!(s.snapshot_create("t"), Err(Error::ReadOnly(_))));
    s.sync().unwrap();
    assert!(matches!(e.snapshot_delete("s"), Err(Error::InUse(_))));
    s.close().unwrap();
    // The engine goes on.
    assert_eq!(e.get(b"b").unwrap().as_deref(), Some(&b"later"[..]));
    e.snapshot_delete("s").unwrap();
    verified(&e);
    e.close().unwrap();
}

/// `Engine::snapshot_sizes`: a new snapshot holds its root alone and shares the rest; once the
/// live tree has let go of everything, the snapshot holds it all, and deleting it gives back
/// about what its exclusive size said.
#[test]
fn snapshot_sizes_say_what_a_delete_gives_back() {
    let e = roomy_engine(256 << 20);
    let mut m = Model::new();
    fill_family(&e, &mut m, "a/", 30_000, 100);
    e.flush_buffers(0, usize::MAX).unwrap();
    e.snapshot_create("s").unwrap();
    e.checkpoint().unwrap();
    let new = e.snapshot_sizes("s").unwrap();
    eprintln!("new: {new:?}");
    assert_eq!(new.exclusive_nodes, 1, "the root copy alone");
    assert!(new.shared_nodes > 10 && new.shared_bytes > 0, "{new:?}");
    e.range_delete(b"a/", &prefix_end(b"a/", 256)).unwrap();
    e.reclaim_space(u64::MAX).unwrap();
    e.collect_garbage(usize::MAX).unwrap();
    e.checkpoint().unwrap();
    let alone = e.snapshot_sizes("s").unwrap();
    eprintln!("alone: {alone:?}");
    assert!(alone.exclusive_nodes >= new.shared_nodes, "{alone:?}");
    assert!(alone.exclusive_bytes >= new.shared_bytes, "{alone:?}");
    let free = e.space().0;
    e.snapshot_delete("s").unwrap();
    e.collect_garbage(usize::MAX).unwrap();
    e.checkpoint().unwrap();
    e.checkpoint().unwrap();
    let back = e.space().0 - free;
    eprintln!(
        "given back {back} bytes, exclusive {}",
        alone.exclusive_bytes
    );
    assert!(back * 10 >= alone.exclusive_bytes * 9, "{back} < {alone:?}");
    assert!(matches!(
        e.snapshot_sizes("s"),
        Err(Error::NoSuchSnapshot(_))
    ));
    verified(&e);
    e.close().unwrap();
}
