//! Range moves (docs/SURGERY.md §3): the cost is the tree's height, not the range's size; a
//! destination holding a key is refused whole; a destination emptied earlier in the batch is not;
//! dead destination subtrees are released; and a logged move replays to the same state.

mod common;

use std::sync::Arc;

use amaranth_device::MemDevice;
use amaranth_engine::{prefix_end, Batch, Engine, Error};
use common::*;

fn moved(m: &mut Model, from: &str, to: &str) {
    apply_model(
        m,
        &amaranth_engine::Op::MovePrefix {
            from: from.into(),
            to: to.into(),
        },
    );
}

fn verified(e: &Engine) {
    let r = e.verify().expect("verify");
    assert!(r.leaked_nodes.is_empty(), "leaked {:?}", r.leaked_nodes);
}

#[test]
fn a_move_costs_the_height_not_the_size() {
    let e = Engine::create(
        Arc::new(MemDevice::new(256 << 20)),
        small_format(),
        roomy_options(),
    )
    .unwrap();
    let mut m = Model::new();
    // Families of 4 KiB to 4 MiB between neighbours, in a tree several levels high.
    let sizes = [(40u32, 100usize), (400, 100), (4_000, 100), (40_000, 100)];
    for (i, &(n, len)) in sizes.iter().enumerate() {
        fill_family(&e, &mut m, &format!("a{i}/"), 50, 20);
        fill_family(&e, &mut m, &format!("b{i}/"), n, len);
        fill_family(&e, &mut m, &format!("c{i}/"), 50, 20);
    }
    e.flush_buffers(0, usize::MAX).unwrap();
    let height = e.stats().height as usize;
    assert!(height >= 4, "height {height}");
    let mut dirtied = Vec::new();
    for (i, &(n, len)) in sizes.iter().enumerate() {
        e.checkpoint().unwrap();
        assert_eq!(e.stats().dirty_nodes, 0);
        let before = e.stats();
        let (from, to) = (format!("b{i}/"), format!("z{i}/"));
        let mut b = Batch::new();
        b.range_move(from.as_bytes(), to.as_bytes(), 0);
        e.write(&b).unwrap();
        moved(&mut m, &from, &to);
        let after = e.stats();
        assert_eq!(after.range_moves - before.range_moves, 1, "by surgery");
        eprintln!(
            "{} bytes moved: {} nodes dirty, height {height}, {} checkpoints, {} node writes",
            n as usize * (len + 12),
            after.dirty_nodes,
            after.checkpoints - before.checkpoints,
            after.node_writes - before.node_writes
        );
        dirtied.push(after.dirty_nodes);
        verified(&e);
    }
    // The two boundary paths at the source and at the destination, each cut at most once per
    // level, the two paths above the slicing nodes, and the chain of empty nodes the source's
    // slot keeps (one per level at most).
    let bound = 7 * height + 4;
    assert!(
        dirtied.iter().all(|&d| d <= bound),
        "dirty nodes per move {dirtied:?} over {bound}"
    );
    assert!(dump(&e) == m);
    // Healing the fringes keeps every key where it is.
    while e.heal_fringes(16).unwrap() > 0 {}
    verified(&e);
    assert!(dump(&e) == m);
    e.close().unwrap();
}

#[test]
fn a_destination_holding_a_key_is_refused_whole() {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let e = Engine::create(dev, small_format(), roomy_options()).unwrap();
    let mut m = Model::new();
    fill_family(&e, &mut m, "s/", 2_000, 60);
    fill_family(&e, &mut m, "d/", 1, 10);
    let mut b = Batch::new();
    b.put(b"x".to_vec(), b"1".to_vec());
    b.range_move(b"s/".to_vec(), b"d/".to_vec(), 0);
    match e.write(&b) {
        Err(Error::InvalidArgument(msg)) => assert!(msg.contains("non-empty"), "{msg}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(e.get(b"x").unwrap(), None, "nothing of the batch applied");
    assert!(dump(&e) == m);
    // A key deleted one by one earlier in the batch still counts (the check may refuse)...
    let mut b = Batch::new();
    b.delete(b"d/0000000".to_vec());
    b.range_move(b"s/".to_vec(), b"d/".to_vec(), 0);
    assert!(matches!(e.write(&b), Err(Error::InvalidArgument(_))));
    // ... a range delete of the destination does not, and the move goes through.
    let mut b = Batch::new();
    b.range_delete(b"d/".to_vec(), prefix_end(b"d/", 256));
    b.range_move(b"s/".to_vec(), b"d/".to_vec(), 0);
    e.write(&b).unwrap();
    m.retain(|k, _| !k.starts_with(b"d/"));
    moved(&mut m, "s/", "d/");
    assert!(dump(&e) == m);
    verified(&e);
    e.close().unwrap();
}

#[test]
fn dead_destination_subtrees_are_released() {
    let dev = Arc::new(MemDevice::new(128 << 20));
    let e = Engine::create(dev, small_format(), roomy_options()).unwrap();
    let mut m = Model::new();
    fill_family(&e, &mut m, "a/", 100, 20);
    fill_family(&e, &mut m, "d/", 20_000, 100);
    fill_family(&e, &mut m, "s/", 3_000, 100);
    fill_family(&e, &mut m, "z/", 100, 20);
    e.flush_buffers(0, usize::MAX).unwrap();
    e.checkpoint().unwrap();
    let nodes = e.verify().unwrap();
    let before = e.stats().range_move_released;
    // Overwrite d/ with s/: the old d/ leaves go without being read.
    let mut b = Batch::new();
    b.range_delete(b"d/".to_vec(), prefix_end(b"d/", 256));
    b.range_move(b"s/".to_vec(), b"d/".to_vec(), 0);
    let reads = e.stats().node_reads;
    e.write(&b).unwrap();
    m.retain(|k, _| !k.starts_with(b"d/"));
    moved(&mut m, "s/", "d/");
    let released = e.stats().range_move_released - before;
    assert!(released > 50, "{released} nodes released");
    assert!(
        e.stats().node_reads - reads < released / 4,
        "the dead leaves were not read"
    );
    let after = e.verify().unwrap();
    assert!(after.leaked_nodes.is_empty(), "{:?}", after.leaked_nodes);
    assert!(after.leaves + after.internal_nodes < nodes.leaves + nodes.internal_nodes);
    assert!(dump(&e) == m);
    e.close().unwrap();
}

#[test]
fn a_logged_move_replays_to_the_same_state() {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let e = Engine::create(dev.clone(), small_format(), roomy_options()).unwrap();
    let mut m = Model::new();
    fill_family(&e, &mut m, "s/", 3_000, 60);
    fill_family(&e, &mut m, "t/", 10, 60);
    fill_family(&e, &mut m, "u/", 3_000, 60);
    e.checkpoint().unwrap();
    // By surgery (copy_max 0) and by copy (a small range under a large copy_max), in one batch
    // and in separate ones, each followed by writes, then a crash with everything in the log.
    let mut b = Batch::new();
    b.range_move(b"s/".to_vec(), b"q/".to_vec(), 0);
    b.range_move(b"t/".to_vec(), b"r/".to_vec(), 1 << 20);
    b.put(b"q/late".to_vec(), b"1".to_vec());
    e.write(&b).unwrap();
    moved(&mut m, "s/", "q/");
    moved(&mut m, "t/", "r/");
    m.insert(b"q/late".to_vec(), b"1".to_vec());
    let mut b = Batch::new();
    b.range_move(b"u/".to_vec(), b"s/".to_vec(), 0);
    e.write(&b).unwrap();
    moved(&mut m, "u/", "s/");
    e.put(b"after", b"2").unwrap();
    m.insert(b"after".to_vec(), b"2".to_vec());
    assert_eq!(e.stats().range_moves, 2);
    e.sync().unwrap();
    e.abandon();
    let e = Engine::open(dev, roomy_options()).unwrap();
    assert_eq!(e.stats().skipped_records, 0);
    assert!(dump(&e) == m, "the replay reached another state");
    verified(&e);
    e.close().unwrap();
}

/// Out-of-line blocks put earlier in a move's batch count in its destination check (the check
/// panicked on them: it took every other operation for a prefix move).
#[test]
fn blocks_put_earlier_in_the_batch_count_in_the_destination_check() {
    let e = Engine::create(
        Arc::new(MemDevice::new(64 << 20)),
        blocks_format(),
        small_options(),
    )
    .unwrap();
    e.put(b"s/a", b"1").unwrap();
    let mut b = Batch::new();
    b.put_blocks(vec![b"d/0".to_vec()], &[7u8; 4096]);
    b.range_move(b"s/".to_vec(), b"d/".to_vec(), 0);
    assert!(matches!(e.write(&b), Err(Error::InvalidArgument(_))));
    let mut b = Batch::new();
    b.put_blocks(vec![b"x/0".to_vec()], &[7u8; 4096]);
    b.range_move(b"s/".to_vec(), b"d/".to_vec(), 0);
    e.write(&b).unwrap();
    assert_eq!(e.get(b"d/a").unwrap().as_deref(), Some(&b"1"[..]));
    assert_eq!(e.get(b"x/0").unwrap(), Some(vec![7u8; 4096]));
    e.verify().unwrap();
    e.close().unwrap();
}

/// Moves `from` to `to` (in the engine and the model) and heals the fringes the move left.
fn move_and_heal(e: &Engine, m: &mut Model, from: &str, to: &str) {
    let mut b = Batch::new();
    b.range_move(from.as_bytes(), to.as_bytes(), 0);
    e.write(&b).unwrap();
    moved(m, from, to);
    while e.heal_fringes(16).unwrap() > 0 {}
}

/// A range moved back and forth, the fringes healed after each move, the way `dirrename`
/// renames a directory: returns (leaf splits, merges, heavy slots queued) over `moves` moves
/// after two to settle, and the heavy slots queued by those two.
fn back_and_forth(moves: u32, buffered: bool) -> ((u64, u64, u64), u64) {
    // Wide nodes when messages are buffered: a run of many slots, each buffering some.
    let format = if buffered {
        amaranth_engine::Format {
            node_size: 64 << 10,
            max_fanout: 16,
            log_size: Some(4 << 20),
            ..small_format()
        }
    } else {
        small_format()
    };
    let e = Engine::create(Arc::new(MemDevice::new(256 << 20)), format, roomy_options()).unwrap();
    let mut m = Model::new();
    // A few small keys on each side of a family of many leaves (a directory beside the few
    // entries of its parent).
    fill_family(&e, &mut m, "a/", 5, 20);
    fill_family(&e, &mut m, "k/", 20_000, 60);
    fill_family(&e, &mut m, "z/", 5, 20);
    e.flush_buffers(0, usize::MAX).unwrap();
    if buffered {
        // Messages for the family left in the root's buffers (a fresh untar leaves megabytes
        // there): few enough that the root does not flush them down, spread over its slots.
        for chunk in (0..20_000u32).step_by(33).collect::<Vec<_>>().chunks(100) {
            let mut b = Batch::new();
            for &i in chunk {
                let k = format!("k/{i:07}").into_bytes();
                let v = vec![7u8; 60];
                m.insert(k.clone(), v.clone());
                b.put(k, v);
            }
            e.write(&b).unwrap();
        }
    }
    let (mut from, mut to) = ("k/", "m/");
    let mut at = None;
    for i in 0..=moves + 2 {
        if i == 2 {
            let s = e.stats();
            at = Some((s.leaf_splits, s.merges, s.range_move_drains));
        }
        if i == moves + 2 {
            break;
        }
        move_and_heal(&e, &mut m, from, to);
        std::mem::swap(&mut from, &mut to);
    }
    verified(&e);
    assert!(dump(&e) == m, "the moves changed the contents");
    let s = e.stats();
    let (l, g, d) = at.expect("two moves to settle");
    e.close().unwrap();
    (
        (s.leaf_splits - l, s.merges - g, s.range_move_drains - d),
        d,
    )
}

#[test]
fn a_range_moved_back_and_forth_does_not_cut_and_merge_its_leaves_each_time() {
    let ((splits, merges, _), _) = back_and_forth(10, false);
    eprintln!("10 moves: {splits} leaf splits, {merges} merges");
    // The family's first and last leaves, once cut from its neighbours, stay cut: merging them
    // back (the heal's old rule) re-lifted them, and the next move cut them again (30 leaf
    // splits in 10 moves). And the slot a move empties is kept as a hole, so the move back lands
    // in it without a cut: before, the hole closed and each move cut the neighbours' leaf at the
    // destination and merged the pieces afterwards (20 leaf splits and 30 merges in 10 moves).
    assert_eq!(
        (splits, merges),
        (0, 0),
        "leaf splits and merges in 10 moves"
    );
}

/// Every range moved once, each to a new place: the slots the moves empty are kept as holes
/// only for the latest moves (`KEPT_HOLES_MAX`); the older ones are healed away like any
/// fringe, so the tree does not fill with empty nodes.
#[test]
fn only_the_latest_holes_are_kept() {
    let e = roomy_engine(256 << 20);
    let mut m = Model::new();
    let families = 48;
    for i in 0..families {
        fill_family(&e, &mut m, &format!("f{i:02}/"), 300, 40);
    }
    e.flush_buffers(0, usize::MAX).unwrap();
    while e.heal_fringes(16).unwrap() > 0 {}
    let before = e.stats().nodes;
    for i in 0..families {
        move_and_heal(&e, &mut m, &format!("f{i:02}/"), &format!("g{i:02}/"));
    }
    let after = e.stats().nodes;
    let height = e.stats().height;
    eprintln!("{families} families moved: {before} nodes before, {after} after, height {height}");
    verified(&e);
    assert!(dump(&e) == m);
    // A kept hole is a chain of at most `height + 1` empty nodes, and 16 of them are kept; a
    // move can leave a piece at its destination that does not merge. With no hole kept the
    // moves add 39 nodes, with 16 kept 120, with every hole kept 263.
    let bound = before + 16 * (height as u64 + 1) + families as u64;
    assert!(
        after <= bound,
        "{after} nodes after the moves, over {bound}"
    );
    e.close().unwrap();
}

#[test]
fn heavy_run_buffers_are_flushed_after_a_move() {
    let ((_, _, queued_later), queued_first) = back_and_forth(4, true);
    eprintln!(
        "heavy slots queued: {queued_first} by the first two moves, {queued_later} by 4 more"
    );
    assert!(queued_first > 0, "the buffered family had heavy slots");
    assert_eq!(
        queued_later, 0,
        "a moved family's heavy buffers were flushed after its first move"
    );
}

/// A family of one small leaf (a large file's block references), between larger neighbours,
/// moved back and forth with the fringes healed after each move, the way the `rename` benchmark
/// renames a 64 MiB file. Returns the family's bytes (its keys and values) and the leaf bytes
/// re-lifted by `moves` moves after two to settle.
fn small_family_back_and_forth(moves: u32) -> (u64, u64) {
    let format = amaranth_engine::Format {
        node_size: 64 << 10,
        max_fanout: 16,
        log_size: Some(4 << 20),
        ..small_format()
    };
    let e = Engine::create(Arc::new(MemDevice::new(256 << 20)), format, roomy_options()).unwrap();
    let mut m = Model::new();
    fill_family(&e, &mut m, "a/", 2_000, 60);
    fill_family(&e, &mut m, "k/", 100, 60);
    fill_family(&e, &mut m, "z/", 2_000, 60);
    let family: u64 = m
        .iter()
        .filter(|(k, _)| k.starts_with(b"k/"))
        .map(|(k, v)| (k.len() + v.len()) as u64)
        .sum();
    e.flush_buffers(0, usize::MAX).unwrap();
    let (mut from, mut to) = ("k/", "m/");
    let mut at = None;
    for i in 0..moves + 2 {
        if i == 2 {
            at = Some(e.stats().leaf_bytes_relifted);
        }
        move_and_heal(&e, &mut m, from, to);
        std::mem::swap(&mut from, &mut to);
    }
    verified(&e);
    assert!(dump(&e) == m, "the moves changed the contents");
    let relifted = e.stats().leaf_bytes_relifted - at.expect("two moves to settle");
    e.close().unwrap();
    (family, relifted)
}

#[test]
fn a_small_leaf_moved_back_and_forth_is_not_merged_and_cut_each_time() {
    let (family, relifted) = small_family_back_and_forth(10);
    eprintln!("10 moves of a one-leaf family of {family} bytes: {relifted} leaf bytes re-lifted");
    // The heal's earlier rule (a re-lift of up to an eighth of a node, plus four times the
    // smaller half) merged the family's leaf with the neighbours' piece beside it after every
    // move, and the next move cut it out again: the family re-lifted twice per move. Now only
    // the few bytes of the pieces the moves cut at the destination are.
    assert!(
        relifted < family,
        "{relifted} leaf bytes re-lifted by 10 moves of a family of {family} bytes"
    );
}

/// The messages a moved run's slots buffer keep their key rewrite pending (docs/SURGERY.md §3.2,
/// "Changed (2026-12-05 …)"): moves to names of other lengths and back compose the rewrites, a
/// move and its reverse cancel, and what is read, checkpointed and reopened is the moved keys.
#[test]
fn buffered_messages_of_a_moved_run_are_rewritten_lazily_and_right() {
    let format = amaranth_engine::Format {
        node_size: 64 << 10,
        max_fanout: 16,
        log_size: Some(4 << 20),
        ..small_format()
    };
    let dev = Arc::new(MemDevice::new(256 << 20));
    let e = Engine::create(dev.clone(), format, roomy_options()).unwrap();
    let mut m = Model::new();
    fill_family(&e, &mut m, "a/", 5, 20);
    fill_family(&e, &mut m, "k/", 20_000, 60);
    fill_family(&e, &mut m, "z/", 5, 20);
    e.flush_buffers(0, usize::MAX).unwrap();
    // Messages left in the buffers above the family: puts, a range delete, and deletes.
    let mut b = Batch::new();
    for i in (0..20_000u32).step_by(41) {
        let k = format!("k/{i:07}").into_bytes();
        m.insert(k.clone(), vec![9u8; 30]);
        b.put(k, vec![9u8; 30]);
    }
    for i in (5..20_000u32).step_by(97) {
        let k = format!("k/{i:07}").into_bytes();
        m.remove(&k);
        b.delete(k);
    }
    let (lo, hi) = (b"k/0012000".to_vec(), b"k/0012500".to_vec());
    m.retain(|k, _| !(k >= &lo && k < &hi));
    b.range_delete(lo, hi);
    e.write(&b).unwrap();
    let mut names = ["k/", "mmmm/", "q/", "k/"].iter().peekable();
    while let Some(from) = names.next() {
        let Some(to) = names.peek() else { break };
        let before = e.stats();
        let mut b = Batch::new();
        b.range_move(from.as_bytes(), to.as_bytes(), 0);
        e.write(&b).unwrap();
        moved(&mut m, from, to);
        let after = e.stats();
        assert_eq!(
            after.range_moves - before.range_moves,
            1,
            "{from} -> {to} by surgery"
        );
        eprintln!(
            "{from} -> {to}: {} slots' re-keys deferred, {} cancelled",
            after.rekeys_deferred - before.rekeys_deferred,
            after.rekeys_cancelled - before.rekeys_cancelled
        );
    }
    let s = e.stats();
    assert!(s.rekeys_deferred > 0, "no re-key was left pending");
    assert!(
        s.rekeys_cancelled > 0,
        "the move back home did not cancel a pending re-key"
    );
    assert!(dump(&e) == m, "the moved keys as read");
    verified(&e);
    e.checkpoint().unwrap();
    e.close().unwrap();
    let e = Engine::open(dev, roomy_options()).unwrap();
    assert!(dump(&e) == m, "the moved keys after a reopen");
    verified(&e);
    e.close().unwrap();
}
