//! Power-cut simulation shared by the crash tests and the soak.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use amaranth_device::{CrashPlan, FaultDevice, MemDevice};
use amaranth_engine::{Batch, Engine, Format, Op, Options, Report};
use rand::Rng;

use super::*;

pub fn hash_model(m: &Model) -> u64 {
    let mut h = DefaultHasher::new();
    m.hash(&mut h);
    h.finish()
}

/// The state a crash must recover to: the live contents and, when there are snapshots, each
/// snapshot's name and contents (the live contents' hash alone when there is none).
pub fn state_hash(m: &Model, snaps: &BTreeMap<String, Model>) -> u64 {
    if snaps.is_empty() {
        return hash_model(m);
    }
    let mut h = DefaultHasher::new();
    hash_model(m).hash(&mut h);
    for (name, s) in snaps {
        (name, hash_model(s)).hash(&mut h);
    }
    h.finish()
}

/// [`state_hash`] of what the engine holds: its contents and every snapshot's, read through
/// their views.
pub fn engine_state(e: &Engine) -> u64 {
    let snaps: BTreeMap<String, Model> = e
        .snapshots()
        .into_iter()
        .map(|s| {
            let m = super::snaps::snapshot_dump(e, &s.name);
            (s.name, m)
        })
        .collect();
    state_hash(&dump(e), &snaps)
}

pub struct Run {
    pub dev: Arc<FaultDevice>,
    /// Hash of the model after each prefix of operations (index = number of operations).
    pub states: Vec<u64>,
    /// (trace position right after a completed sync, operations acknowledged before it).
    pub syncs: Vec<(usize, usize)>,
    pub options: Options,
}

pub fn workload(seed: u64, steps: usize) -> Run {
    workload_in(seed, steps, small_format(), false, false)
}

/// [`workload`], with range moves (docs/SURGERY.md) among the operations when `range_moves`:
/// each into a destination emptied by a range delete just before it in its batch.
pub fn workload_with(seed: u64, steps: usize, range_moves: bool) -> Run {
    workload_in(seed, steps, small_format(), false, range_moves)
}

/// A random workload on an image of `format`; with `blocks`, a fifth of the operations are puts
/// of out-of-line blocks and a tenth upserts of block keys (`format` must allow 4 KiB values);
/// with `range_moves`, range moves among them (see [`workload_with`]).
pub fn workload_in(
    seed: u64,
    steps: usize,
    format: Format,
    blocks: bool,
    range_moves: bool,
) -> Run {
    let dev = Arc::new(FaultDevice::new(24 << 20));
    let options = Options {
        cache_size: (128 << 10).max(8 * format.node_size),
        ..small_options()
    };
    let max_value = if blocks { 4096 } else { 700 };
    let e = Engine::create(dev.clone(), format, options.clone()).expect("create");
    dev.restart_recording();
    let mut m = Model::new();
    // Fewer key families with range moves: they hold more keys, and most moves take the surgery.
    let mut g = Gen::new(seed, if range_moves { 40 } else { 400 }, max_value);
    // Range clones among the range moves: shared subtrees written through and dropped.
    g.clones = 0.3;
    let mut states = vec![hash_model(&m)];
    let mut syncs = Vec::new();
    let mut holding = false;
    // With range moves, snapshots too (docs/SURGERY.md §4.7): each a frozen copy of the model.
    let mut snaps: BTreeMap<String, Model> = BTreeMap::new();
    let mut snap_names = 0;
    for step in 0..steps {
        if range_moves && g.rng.gen_bool(0.04) {
            // A snapshot taken, or one deleted: one record, all or nothing at a crash.
            if snaps.len() < 4 && (snaps.is_empty() || g.rng.gen_bool(0.6)) {
                snap_names += 1;
                let name = format!("s{snap_names}");
                e.snapshot_create(&name)
                    .unwrap_or_else(|err| panic!("seed {seed} step {step}: snapshot: {err}"));
                snaps.insert(name, m.clone());
            } else {
                let name = snaps.keys().next().expect("a snapshot").clone();
                e.snapshot_delete(&name)
                    .unwrap_or_else(|err| panic!("seed {seed} step {step}: delete: {err}"));
                snaps.remove(&name);
            }
            states.push(state_hash(&m, &snaps));
            continue;
        }
        let mut b = Batch::new();
        let n = if g.rng.gen_bool(0.2) {
            g.rng.gen_range(2..5)
        } else {
            1
        };
        for _ in 0..n {
            if range_moves && g.rng.gen_bool(0.25) {
                if let Some(mut mv) = g.range_move() {
                    let (Op::RangeMove { to, copy_max, .. } | Op::RangeClone { to, copy_max, .. }) =
                        &mut mv
                    else {
                        unreachable!()
                    };
                    if g.rng.gen_bool(0.8) {
                        *copy_max = 0;
                    }
                    let to = to.clone();
                    b.range_delete(to.clone(), amaranth_engine::prefix_end(&to, 256));
                    b.push(mv);
                    continue;
                }
            }
            let op = if g.rng.gen_bool(0.02) {
                let a = format!("k{:04}/", g.rng.gen_range(0..400)).into_bytes();
                let b = format!("k{:04}/", g.rng.gen_range(0..400)).into_bytes();
                if a == b {
                    g.simple_op()
                } else {
                    Op::MovePrefix { from: a, to: b }
                }
            } else if blocks && g.rng.gen_bool(0.2) {
                g.blocks_op()
            } else if blocks && g.rng.gen_bool(0.1) {
                g.block_upsert()
            } else {
                g.simple_op()
            };
            b.push(op);
        }
        // A batch with a prefix move applies its operations in order against the model too.
        for op in b.ops() {
            apply_model(&mut m, op);
        }
        e.write(&b)
            .unwrap_or_else(|err| panic!("seed {seed} step {step}: {err}"));
        states.push(state_hash(&m, &snaps));
        match g.rng.gen_range(0..100) {
            0..=11 => {
                e.sync().unwrap();
                syncs.push((dev.trace_len(), states.len() - 1));
            }
            12..=14 => e.checkpoint().unwrap(),
            // With range moves, subtrees are shared now and then (the test hook, as a snapshot
            // would hold them) and dead nodes collected: checkpoints write reference counts,
            // held-only subtrees as dead (holds do not survive a crash).
            15..=16 if range_moves => {
                if holding {
                    e.release_holds_for_tests()
                        .unwrap_or_else(|err| panic!("seed {seed} step {step}: {err}"));
                    holding = false;
                } else {
                    holding = e.hold_for_tests(g.rng.gen_range(0..2), 2).unwrap() > 0;
                }
            }
            17 if range_moves => {
                e.collect_garbage(8).unwrap();
            }
            // With blocks: flushes the log does not record (as the background cleaner's), so a
            // replay meets values stored otherwise (a reference with many patches made inline at
            // a leaf, or not yet) and must not decide differently because of it. Apart from the
            // steps above, so that a workload with both has both.
            18..=27 if blocks => {
                e.flush_buffers(0, g.rng.gen_range(1..40)).unwrap();
            }
            _ => {}
        }
    }
    if range_moves {
        let moved = e.stats().range_moves + e.stats().range_clones;
        let st = e.stats();
        eprintln!(
            "{moved} range moves and clones by surgery ({} clones), {} copies of shared nodes, {} subtrees dropped, {} nodes collected, {snap_names} snapshots taken",
            st.range_clones, st.cow_copies, st.subtrees_dropped, st.nodes_collected
        );
        assert!(moved > 0, "seed {seed}: no range move took the surgery");
    }
    e.abandon();
    Run {
        dev,
        states,
        syncs,
        options,
    }
}

/// Opens the image `img` a power cut left and reads and checks every node (the data table
/// against the tree's references among the rest): the engine and what its check found. Panics,
/// naming `what`, if either fails.
pub fn recover(img: Vec<u8>, options: &Options, what: &str) -> (Engine, Report) {
    let e = Engine::open(Arc::new(MemDevice::from_bytes(img)), options.clone())
        .unwrap_or_else(|err| panic!("{what}: recovery failed: {err}"));
    let report = e
        .verify()
        .unwrap_or_else(|err| panic!("{what}: verify after recovery: {err}"));
    assert!(
        report.references.is_clean(),
        "{what}: {}",
        report.references.describe()
    );
    (e, report)
}

/// How many operations a crash at trace position `pos` must keep: those acknowledged before the
/// last sync that completed by then (`syncs`: trace position right after a sync, operations
/// acknowledged before it).
pub fn synced_by(syncs: &[(usize, usize)], pos: usize) -> usize {
    syncs
        .iter()
        .filter(|(p, _)| *p <= pos)
        .map(|(_, k)| *k)
        .max()
        .unwrap_or(0)
}

/// Opens a crashed image and checks it against the run. Returns the recovered prefix length.
pub fn check_crash(run: &Run, pos: usize, plan: &CrashPlan, what: &str) -> usize {
    let (e, report) = recover(run.dev.crash_image(pos, plan), &run.options, what);
    assert!(
        report.leaked_nodes.is_empty(),
        "{what}: leaked nodes after recovery"
    );
    let h = engine_state(&e);
    let min = synced_by(&run.syncs, pos);
    let found = (min..run.states.len()).rev().find(|&k| run.states[k] == h);
    let k = found.unwrap_or_else(|| {
        let any = run.states.iter().position(|&s| s == h);
        panic!("{what}: recovered state is not a prefix of at least {min} operations (matches prefix {any:?})")
    });
    e.close().unwrap();
    k
}

/// Checks the crash states of `run` at every flush point and `random` points between, each with
/// every write dropped, every write kept, and a random torn subset. Returns the states checked.
pub fn check_crash_points(run: &Run, seed: u64, random: usize) -> usize {
    let mut states = 0;
    for (i, pos) in crash_points(run, seed, random).into_iter().enumerate() {
        let plans = [
            CrashPlan::DropAll,
            CrashPlan::KeepAll,
            CrashPlan::Random {
                seed: seed + i as u64,
                keep: 0.5,
                tear: 0.5,
            },
        ];
        for plan in plans {
            let what = format!("seed {seed} crash at {pos} with {plan:?}");
            check_crash(run, pos, &plan, &what);
            states += 1;
        }
    }
    states
}

/// Every crash point of [`crash_points`], each with two plans: every unflushed write dropped,
/// and a random half of them kept (some torn).
pub fn crash_states(run: &Run, seed: u64, random: usize) -> Vec<(usize, CrashPlan)> {
    crash_points(run, seed, random)
        .into_iter()
        .enumerate()
        .flat_map(|(i, pos)| {
            [
                (pos, CrashPlan::DropAll),
                (
                    pos,
                    CrashPlan::Random {
                        seed: seed + i as u64,
                        keep: 0.5,
                        tear: 0.5,
                    },
                ),
            ]
        })
        .collect()
}

pub fn crash_points(run: &Run, seed: u64, random: usize) -> Vec<usize> {
    let mut points = run.dev.flush_points();
    let len = run.dev.trace_len();
    let mut rng = Gen::new(seed ^ 0xc0ffee, 1, 1).rng;
    for _ in 0..random {
        points.push(rng.gen_range(0..=len));
    }
    points.push(len);
    points.sort();
    points.dedup();
    points
}
