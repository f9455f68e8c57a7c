//! Power cuts with out-of-line blocks (docs/WRITEONCE.md §3), through the fault-injecting
//! device: random workloads with block puts, a record whose data did not reach the device, torn
//! data writes, and blocks released by an overwrite that must not be reused before the next
//! checkpoint completes, however hard the allocator is pushed to reuse them.

mod common;

use std::sync::Arc;

use amaranth_device::{CrashPlan, FaultDevice};
use amaranth_engine::{Batch, Engine, Error, Options};
use common::crashsim::*;
use common::*;

#[test]
fn random_workloads_with_blocks_keep_a_prefix_through_power_cuts() {
    crash_runs(0xb10c_0000, 3, 250, false, 40);
}

/// The same with range moves among the operations (most by surgery, some with a `copy_max` of a
/// few thousand bytes, where whether a family's blocks are stored as references or inline would
/// change the choice): a replay must choose as the original did, or it takes other message
/// numbers and the recovery fails ("log record expects message number ...").
#[test]
fn random_workloads_with_blocks_and_range_moves_keep_a_prefix_through_power_cuts() {
    crash_runs(0xb10c_1000, 4, 300, true, 20);
}

/// Random workloads with blocks (seeds from `base`, `AMARANTH_CRASH_RUNS` halved or `runs`), each
/// checked at every flush point and `random` points between.
fn crash_runs(base: u64, runs: u64, steps: usize, range_moves: bool, random: usize) {
    let runs: u64 = std::env::var("AMARANTH_CRASH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(runs, |r: u64| r.div_ceil(2));
    let mut states = 0usize;
    for seed in base..base + runs {
        eprintln!("crash (blocks, range moves {range_moves}) seed {seed}");
        let run = workload_in(seed, steps, blocks_format(), true, range_moves);
        states += check_crash_points(&run, seed, random);
    }
    eprintln!("checked {states} crash states");
}

/// A range move's choice between copying and surgery must not depend on how values happen to be
/// stored. Here the blocks of `m/` carry 1.2 KB of patches each: a flush the log does not record
/// (the background cleaner's) makes them inline at the leaves (4 KiB each), while the replay,
/// which starts from the checkpoint before the patches, still has them as references with
/// patches (about 1.2 KB). With the choice made on stored bytes the original took the surgery
/// (one message number) and the replay copied (one per key): the next record then expected
/// another message number and the image did not open.
#[test]
fn a_range_moves_choice_is_the_same_at_replay_whatever_the_flushes_did() {
    choice_is_the_same_at_replay(false);
}

/// The same for a range clone, which makes the same choice (one message number by surgery, one
/// per key and no range delete by copy).
#[test]
fn a_range_clones_choice_is_the_same_at_replay_whatever_the_flushes_did() {
    choice_is_the_same_at_replay(true);
}

/// A range move (or clone) of `m/`, whose four blocks have patches that an unlogged flush made
/// inline, then a put after it, a sync and a power cut that keeps everything: the recovered
/// contents are those before the cut.
fn choice_is_the_same_at_replay(clone: bool) {
    let dev = Arc::new(FaultDevice::new(24 << 20));
    let e = Engine::create(dev.clone(), blocks_format(), options()).unwrap();
    // Enough other data for an internal root, so that messages wait in buffers.
    for f in 0..12 {
        e.write(&blocks(&format!("o{f:02}"), 0, 8, f as u8))
            .unwrap();
    }
    for i in 0..40u8 {
        e.put(format!("p/{i:03}").as_bytes(), &[i; 4096]).unwrap();
    }
    e.write(&blocks("m", 0, 4, 7)).unwrap();
    e.flush_buffers(0, 1000).unwrap();
    e.checkpoint().unwrap();
    for i in 0..4 {
        for half in 0..2u32 {
            let mut b = Batch::new();
            b.upsert(
                format!("m/b{i:04}").into_bytes(),
                amaranth_engine::Patch::Write {
                    offset: half * 2000,
                    data: vec![0xa0 + i as u8; 600],
                },
            );
            e.write(&b).unwrap();
        }
    }
    // Unlogged: the patched references reach the leaves and are made inline there.
    e.flush_buffers(0, 1000).unwrap();
    let mut b = Batch::new();
    // Logical size of `m/`: 4 × 4 KiB; stored as references with patches: about 5 KB.
    if clone {
        b.range_clone(b"m/".to_vec(), b"n/".to_vec(), 8000);
    } else {
        b.range_move(b"m/".to_vec(), b"n/".to_vec(), 8000);
    }
    e.write(&b).unwrap();
    let by_surgery = |e: &Engine| {
        let st = e.stats();
        if clone {
            st.range_clones
        } else {
            st.range_moves
        }
    };
    assert_eq!(by_surgery(&e), 1, "the original took the surgery");
    e.put(b"after", b"the move").unwrap();
    let before = contents(&e);
    e.sync().unwrap();
    e.abandon();
    let img = dev.crash_image(dev.trace_len(), &CrashPlan::KeepAll);
    let (e, _) = recover(img, &options(), "after the move");
    assert_eq!(by_surgery(&e), 1, "the replay took the surgery");
    assert!(contents(&e) == before, "the recovered contents differ");
    e.close().unwrap();
}

fn options() -> Options {
    Options {
        cache_size: 512 << 10,
        ..small_options()
    }
}

/// Every (key, value) of an engine, the values read through `get` too (a point read resolves a
/// reference on its own).
fn contents(e: &Engine) -> Model {
    let m = dump(e);
    for (k, v) in &m {
        assert_eq!(e.get(k).unwrap().as_ref(), Some(v), "get {k:?}");
    }
    m
}

/// A put of `n` blocks under `file`, block `i` filled with `fill + i`.
fn blocks(file: &str, first: u32, n: u32, fill: u8) -> Batch {
    let keys = (first..first + n)
        .map(|i| format!("{file}/b{i:04}").into_bytes())
        .collect();
    let data: Vec<u8> = (0..n)
        .flat_map(|i| vec![fill.wrapping_add(i as u8); 4096])
        .collect();
    let mut b = Batch::new();
    b.put_blocks(keys, &data);
    b
}

/// A record is appended only after its data write completed, but the device may keep the record
/// and lose the data (or keep part of it) when the power goes before a flush. Each such image
/// must recover to the state before the record (it was never acknowledged durable), the blocks
/// it named free again; with the data whole, to the state after it.
#[test]
fn a_record_whose_data_did_not_reach_the_device_is_not_replayed() {
    let dev = Arc::new(FaultDevice::new(16 << 20));
    // The data written in the caller's thread: the trace has it before the record's chunk.
    let options = Options {
        data_writers: 0,
        ..options()
    };
    let e = Engine::create(dev.clone(), blocks_format(), options.clone()).unwrap();
    e.write(&blocks("f", 0, 4, 10)).unwrap();
    e.put(b"inline", b"before").unwrap();
    e.sync().unwrap();
    let before = dump(&e);
    dev.restart_recording();
    e.write(&blocks("g", 0, 3, 20)).unwrap();
    let after = dump(&e);
    e.sync().unwrap();
    e.abandon();
    // The trace: the data write (3 blocks), the log chunk (1 block), the flush (then an end
    // marker, now or later from the log thread).
    let flush = dev.flush_points()[0];
    assert_eq!(
        dev.unflushed_writes_at(flush - 1),
        2,
        "data then record before the flush"
    );
    let cases: [(&str, Vec<u64>, bool); 6] = [
        ("neither", vec![0, 0], false),
        ("the data only", vec![0b111, 0], false),
        ("the record only", vec![0, 1], false),
        ("the record and torn data", vec![0b101, 1], false),
        (
            "the record and the data's first blocks",
            vec![0b011, 1],
            false,
        ),
        ("the record and all of the data", vec![0b111, 1], true),
    ];
    let mut free = None;
    for (what, masks, whole) in cases {
        let img = dev.crash_image(flush - 1, &CrashPlan::Exact(masks));
        let (r, report) = recover(img, &options, what);
        assert!(report.leaked_nodes.is_empty(), "{what}");
        let got = contents(&r);
        if whole {
            assert!(got == after, "{what}: the put is lost");
            assert_eq!(report.data_blocks, 7, "{what}");
        } else {
            assert!(got == before, "{what}: not the state before the put");
            assert_eq!(report.data_blocks, 4, "{what}");
            // The extent the lost record named is free again, in every case alike.
            let f = r.space().0;
            assert_eq!(*free.get_or_insert(f), f, "{what}: free space differs");
        }
        r.close().unwrap();
    }
}

/// Blocks released by an overwrite stay allocated until the checkpoint after the overwrite
/// completes: the last checkpoint's tree and the log's records still name them. Here a 64-block
/// file is written (B1) after a checkpoint and at once overwritten (B2, folded over B1 in the
/// root's buffer, which releases B1's blocks); a crash must replay B1's record with its data
/// intact, then B2's. The free space is cut into 8-block holes (every other 8-block file
/// deleted), so that once the space after the last data extent is used up, B1's extent is the
/// only free one that takes a 64-block write: such writes must fail for lack of space until the
/// next checkpoint, and take it after. Power cuts are simulated at every third write and every
/// flush of the trace.
#[test]
fn blocks_released_by_an_overwrite_are_not_reused_before_the_checkpoint() {
    let dev = Arc::new(FaultDevice::new(16 << 20));
    let e = Engine::create(dev.clone(), blocks_format(), options()).unwrap();
    let mut m = Model::new();
    let put = |e: &Engine, m: &mut Model, b: Batch| -> Result<(), Error> {
        e.write(&b)?;
        for op in b.ops() {
            apply_model(m, op);
        }
        Ok(())
    };
    let mut n = 0u32;
    while e.space().0 > 3 << 20 {
        put(&e, &mut m, blocks(&format!("fill{n:04}"), 0, 8, n as u8)).unwrap();
        n += 1;
    }
    for f in (0..n).step_by(2) {
        let lo = format!("fill{f:04}/").into_bytes();
        let hi = amaranth_engine::prefix_end(&lo, 256);
        let mut b = Batch::new();
        b.range_delete(lo, hi);
        put(&e, &mut m, b).unwrap();
    }
    e.reclaim_space(u64::MAX).unwrap();
    e.sync().unwrap();
    e.checkpoint().unwrap();
    dev.restart_recording();
    let mut states = vec![hash_model(&m)];
    let mut syncs = Vec::new();
    let checkpoints = e.stats().checkpoints;
    put(&e, &mut m, blocks("big", 0, 64, 0xaa)).unwrap();
    states.push(hash_model(&m));
    let old = e.blocks_under_for_tests(b"big/");
    assert_eq!(old.len(), 64);
    let overlaps = |b: u64, n: u64| old.iter().any(|x| (b..b + n).contains(x));
    put(&e, &mut m, blocks("big", 0, 64, 0xee)).unwrap();
    states.push(hash_model(&m));
    assert!(
        e.space_use().checkpoint_held >= 64 * 4096,
        "the overwrite did not release the first write's blocks"
    );
    let mut refused = false;
    for i in 0..64 {
        match put(&e, &mut m, blocks(&format!("more{i:04}"), 0, 64, i as u8)) {
            Ok(()) => {}
            Err(Error::NoSpace(_)) => {
                refused = true;
                break;
            }
            Err(err) => panic!("write {i}: {err}"),
        }
        states.push(hash_model(&m));
        assert_eq!(
            e.stats().checkpoints,
            checkpoints,
            "a checkpoint ran: nothing is held any more"
        );
        let got = e.blocks_under_for_tests(format!("more{i:04}/").as_bytes());
        assert!(
            got.iter().all(|b| !old.contains(b)),
            "released blocks reused before the checkpoint: {got:?}"
        );
        e.sync().unwrap();
        syncs.push((dev.trace_len(), states.len() - 1));
        let leaves = e.verify().unwrap().leaf_extents;
        assert!(
            !leaves.iter().any(|&(b, n)| overlaps(b, n)),
            "released blocks hold a node image before the checkpoint"
        );
    }
    assert!(
        refused,
        "the free space never ran short: the test tempts nothing"
    );
    e.checkpoint().unwrap();
    // Now they are free, and the largest free extent once the space after the last write is used
    // up: 64-block writes or node images take them.
    let mut reused = false;
    for j in 0..16 {
        match put(&e, &mut m, blocks(&format!("late{j:04}"), 0, 64, j as u8)) {
            Ok(()) => {}
            Err(Error::NoSpace(_)) => break,
            Err(err) => panic!("late write {j}: {err}"),
        }
        states.push(hash_model(&m));
        e.sync().unwrap();
        syncs.push((dev.trace_len(), states.len() - 1));
        let leaves = e.verify().unwrap().leaf_extents;
        reused |= leaves.iter().any(|&(b, n)| overlaps(b, n))
            || e.blocks_under_for_tests(format!("late{j:04}/").as_bytes())
                .iter()
                .any(|b| old.contains(b));
        if reused {
            break;
        }
    }
    assert!(
        reused,
        "the released blocks were never reused: the test tempts nothing"
    );
    e.abandon();
    let run = Run {
        dev,
        states,
        syncs,
        options: options(),
    };
    let flushes = run.dev.flush_points();
    let mut checked = 0;
    for pos in 0..=run.dev.trace_len() {
        if pos % 3 != 0 && !flushes.contains(&pos) && pos != run.dev.trace_len() {
            continue;
        }
        for plan in [
            CrashPlan::DropAll,
            CrashPlan::KeepAll,
            CrashPlan::Random {
                seed: pos as u64,
                keep: 0.5,
                tear: 0.5,
            },
        ] {
            let what = format!("crash at {pos} with {plan:?}");
            check_crash(&run, pos, &plan, &what);
            checked += 1;
        }
    }
    eprintln!("checked {checked} crash states");
}

/// A device whose large writes (the out-of-line data) take 30 ms: a write handed to the data
/// writers completes long after the batch was logged and applied.
struct SlowData(Arc<FaultDevice>);

impl amaranth_device::BlockDevice for SlowData {
    fn len(&self) -> u64 {
        self.0.len()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.0.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        if buf.len() >= 64 << 10 {
            std::thread::sleep(std::time::Duration::from_millis(30));
        }
        self.0.write_at(offset, buf)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.0.flush()
    }
    fn describe(&self) -> String {
        "slow data writes".into()
    }
    fn io_stats(&self) -> amaranth_device::IoStats {
        self.0.io_stats()
    }
}

/// With the data written by the writer threads: a read right after the put waits for the block's
/// write (it never sees what was there before), and a `sync` waits for the data writes before its
/// flush, so a power cut right after it keeps every put, data whole.
#[test]
fn reads_and_syncs_wait_for_the_data_writes_in_flight() {
    let fault = Arc::new(FaultDevice::new(16 << 20));
    let dev = Arc::new(SlowData(fault.clone()));
    assert!(options().data_writers > 0, "the writer threads run");
    let e = Engine::create(dev, blocks_format(), options()).unwrap();
    let mut m = Model::new();
    let mut synced = Vec::new();
    for i in 0..6u32 {
        let b = blocks(&format!("f{i}"), 0, 16, i as u8 * 16);
        e.write(&b).unwrap();
        for op in b.ops() {
            apply_model(&mut m, op);
        }
        if i % 2 == 0 {
            let key = format!("f{i}/b0003").into_bytes();
            assert_eq!(e.get(&key).unwrap().as_ref(), m.get(&key), "read of {i}");
        } else {
            // The write of this put is still in flight.
            e.sync().unwrap();
            synced.push((fault.trace_len(), m.clone()));
        }
    }
    e.abandon();
    for (pos, want) in synced {
        let img = fault.crash_image(pos, &CrashPlan::DropAll);
        let (r, _) = recover(img, &options(), &format!("crash at {pos}"));
        assert!(
            contents(&r) == want,
            "crash at {pos}: a synced put is missing"
        );
        r.close().unwrap();
    }
}
