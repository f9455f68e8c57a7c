//! Atomic groups: power cuts keep every group whole and the state a prefix of the log that ends
//! where no group is open; `sync`, checkpoints and new groups wait for the open group, which is
//! cut at its deadline; a group larger than its limit is refused.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use amaranth_device::{CrashPlan, FaultDevice, MemDevice};
use amaranth_engine::{Batch, Engine, Error, Options};
use common::crashsim::{hash_model, recover, synced_by};
use common::*;
use rand::Rng;

fn put(k: &str, v: &[u8]) -> Batch {
    let mut b = Batch::new();
    b.put(k.as_bytes(), v);
    b
}

struct Run {
    dev: Arc<FaultDevice>,
    states: Vec<u64>,
    /// Whether an atomic group was open (first record logged, no commit) after each prefix.
    open: Vec<bool>,
    syncs: Vec<(usize, usize)>,
    options: Options,
}

/// A seeded workload: plain batches from "other writers" interleaved with atomic groups of 1–6
/// batches, syncs (outside groups; the owner's `flush_log` inside), checkpoints outside groups.
fn workload(seed: u64, steps: usize) -> Run {
    let dev = Arc::new(FaultDevice::new(24 << 20));
    let options = Options {
        cache_size: 128 << 10,
        ..small_options()
    };
    let e = Engine::create(dev.clone(), small_format(), options.clone()).expect("create");
    dev.restart_recording();
    let mut g = Gen::new(seed, 300, 600);
    let mut m = Model::new();
    let (mut states, mut open, mut syncs) = (vec![hash_model(&m)], vec![false], Vec::new());
    let mut group: Option<(u64, usize, bool)> = None; // (id, batches left, has records)
    for step in 0..steps {
        let in_group = group.is_some() && g.rng.gen_bool(0.6);
        let mut b = Batch::new();
        b.push(g.simple_op());
        let lsn = match (in_group, group) {
            (true, Some((id, _, _))) => e.write_atomic(id, &b),
            _ => e.write(&b),
        };
        lsn.unwrap_or_else(|err| panic!("seed {seed} step {step}: {err}"));
        apply_model(&mut m, &b.ops()[0]);
        if let (true, Some(gr)) = (in_group, group.as_mut()) {
            gr.1 -= 1;
            gr.2 = true;
        }
        states.push(hash_model(&m));
        open.push(group.is_some_and(|gr| gr.2));
        match (group, g.rng.gen_range(0..100)) {
            (Some((id, 0, _)), _) => {
                e.commit_atomic(id).expect("commit");
                group = None;
                *open.last_mut().expect("a state") = false;
            }
            (Some(_), 0..=9) => e.flush_log().expect("flush_log"),
            (None, 0..=9) => {
                e.sync().expect("sync");
                syncs.push((dev.trace_len(), states.len() - 1));
            }
            (None, 10..=12) => e.checkpoint().expect("checkpoint"),
            (None, 13..=30) => {
                group = Some((
                    e.begin_atomic().expect("begin"),
                    g.rng.gen_range(1..7),
                    false,
                ))
            }
            _ => {}
        }
    }
    e.abandon();
    Run {
        dev,
        states,
        open,
        syncs,
        options,
    }
}

fn check(run: &Run, pos: usize, plan: &CrashPlan, what: &str) -> usize {
    let (e, _) = recover(run.dev.crash_image(pos, plan), &run.options, what);
    let h = hash_model(&common::dump(&e));
    let min = synced_by(&run.syncs, pos);
    let k = (min..run.states.len())
        .rev()
        .find(|&k| run.states[k] == h && !run.open[k])
        .unwrap_or_else(|| {
            let any = run.states.iter().position(|&s| s == h);
            panic!(
                "{what}: not a prefix of at least {min} operations outside an open group \
                 (matches {any:?}, open there: {:?})",
                any.map(|k| run.open[k])
            )
        });
    e.close().expect("close");
    k
}

#[test]
fn power_cuts_keep_atomic_groups_whole() {
    let mut checked = 0;
    for seed in 1..=6u64 {
        println!("seed {seed}");
        let run = workload(seed, 220);
        let len = run.dev.trace_len();
        let mut points = run.dev.flush_points();
        let mut rng = Gen::new(seed ^ 0xa70, 1, 1).rng;
        points.extend((0..40).map(|_| rng.gen_range(0..=len)));
        points.push(len);
        points.sort();
        points.dedup();
        for (i, pos) in points.into_iter().enumerate() {
            for plan in [
                CrashPlan::DropAll,
                CrashPlan::KeepAll,
                CrashPlan::Random {
                    seed: seed << 16 | i as u64,
                    keep: 0.5,
                    tear: 0.3,
                },
            ] {
                check(
                    &run,
                    pos,
                    &plan,
                    &format!("seed {seed}, crash at {pos}, {plan:?}"),
                );
                checked += 1;
            }
        }
    }
    println!("{checked} crash states");
}

fn engine(timeout: Duration) -> (Arc<MemDevice>, Engine) {
    let dev = Arc::new(MemDevice::new(24 << 20));
    let options = Options {
        atomic_group_timeout: timeout,
        ..small_options()
    };
    let e = Engine::create(dev.clone(), small_format(), options).expect("create");
    (dev, e)
}

fn reopen(dev: &Arc<MemDevice>) -> Engine {
    let img = dev.to_bytes();
    Engine::open(Arc::new(MemDevice::from_bytes(img)), small_options()).expect("reopen")
}

#[test]
fn an_uncommitted_group_is_dropped_with_everything_after_its_first_record() {
    let (dev, e) = engine(Duration::from_secs(60));
    e.write(&put("before", b"1")).unwrap();
    let g = e.begin_atomic().unwrap();
    e.write(&put("other-early", b"1")).unwrap();
    e.write_atomic(g, &put("in-group", b"1")).unwrap();
    e.write(&put("derived", b"1")).unwrap();
    e.flush_log().unwrap();
    // A crash now: the image holds every record, but the group never committed.
    let r = reopen(&dev);
    assert_eq!(r.get(b"before").unwrap().as_deref(), Some(&b"1"[..]));
    assert_eq!(r.get(b"other-early").unwrap().as_deref(), Some(&b"1"[..]));
    assert_eq!(r.get(b"in-group").unwrap(), None);
    assert_eq!(
        r.get(b"derived").unwrap(),
        None,
        "a record after the group's start survived it"
    );
    drop(r);
    e.commit_atomic(g).unwrap();
    e.flush_log().unwrap();
    let r = reopen(&dev);
    for k in ["before", "other-early", "in-group", "derived"] {
        assert!(
            r.get(k.as_bytes()).unwrap().is_some(),
            "{k} lost after the commit"
        );
    }
}

#[test]
fn sync_waits_for_a_group_that_began_before_it() {
    let (dev, e) = engine(Duration::from_secs(60));
    let e = Arc::new(e);
    let g = e.begin_atomic().unwrap();
    e.write_atomic(g, &put("a", b"1")).unwrap();
    e.write(&put("b", b"1")).unwrap();
    let committed = Arc::new(AtomicBool::new(false));
    let syncer = {
        let (e, committed) = (e.clone(), committed.clone());
        std::thread::spawn(move || {
            e.sync().unwrap();
            committed.load(Ordering::SeqCst)
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    committed.store(true, Ordering::SeqCst);
    e.commit_atomic(g).unwrap();
    assert!(
        syncer.join().unwrap(),
        "sync returned before the group committed"
    );
    let r = reopen(&dev);
    assert!(r.get(b"a").unwrap().is_some() && r.get(b"b").unwrap().is_some());
    // A group that has logged nothing yet does not hold sync up.
    let g = e.begin_atomic().unwrap();
    e.write(&put("c", b"1")).unwrap();
    e.sync().unwrap();
    e.commit_atomic(g).unwrap();
}

#[test]
fn a_group_past_its_deadline_is_cut_by_a_waiter_and_refuses_more() {
    let (dev, e) = engine(Duration::from_millis(150));
    let g = e.begin_atomic().unwrap();
    e.write_atomic(g, &put("a", b"1")).unwrap();
    e.write(&put("b", b"1")).unwrap();
    let t = Instant::now();
    e.sync().unwrap(); // the owner does not answer: cut at the deadline
    assert!(t.elapsed() >= Duration::from_millis(100));
    assert!(matches!(
        e.write_atomic(g, &put("c", b"1")),
        Err(Error::GroupExpired(x)) if x == g
    ));
    assert!(matches!(e.commit_atomic(g), Err(Error::GroupExpired(_))));
    assert!(matches!(e.commit_atomic(g), Err(Error::InvalidArgument(_))));
    let r = reopen(&dev);
    assert!(r.get(b"a").unwrap().is_some() && r.get(b"b").unwrap().is_some());
    assert_eq!(r.get(b"c").unwrap(), None);
    drop(r);
    // The owner itself finds the deadline passed.
    let g = e.begin_atomic().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(matches!(
        e.write_atomic(g, &put("d", b"1")),
        Err(Error::GroupExpired(_))
    ));
    assert_eq!(e.get(b"d").unwrap(), None);
    // A second group waits for the first (here: until its deadline).
    let g1 = e.begin_atomic().unwrap();
    e.write_atomic(g1, &put("e", b"1")).unwrap();
    let g2 = e.begin_atomic().unwrap();
    assert_ne!(g1, g2);
    assert!(matches!(e.commit_atomic(g1), Err(Error::GroupExpired(_))));
    e.commit_atomic(g2).unwrap();
}

#[test]
fn a_group_larger_than_its_limit_is_refused_and_keeps_what_it_had() {
    let (dev, e) = engine(Duration::from_secs(60));
    let max = e.max_batch_bytes();
    let g = e.begin_atomic().unwrap();
    let chunk = vec![7u8; 1000];
    let mut n = 0;
    let err = loop {
        match e.write_atomic(g, &put(&format!("k{n:05}"), &chunk)) {
            Ok(_) => n += 1,
            Err(err) => break err,
        }
        assert!(
            n * 1000 <= 2 * max,
            "the limit of {max} bytes was not enforced"
        );
    };
    assert!(
        matches!(err, Error::GroupTooLarge { bytes, max: m, .. } if bytes > m && m == max),
        "{err}"
    );
    assert_eq!(e.get(format!("k{n:05}").as_bytes()).unwrap(), None);
    e.commit_atomic(g).unwrap();
    e.sync().unwrap();
    let r = reopen(&dev);
    for i in 0..n {
        assert!(r.get(format!("k{i:05}").as_bytes()).unwrap().is_some());
    }
}

#[test]
fn checkpoints_wait_for_the_open_group_and_close_commits_it() {
    let (dev, e) = engine(Duration::from_secs(60));
    let e = Arc::new(e);
    let g = e.begin_atomic().unwrap();
    e.write_atomic(g, &put("a", b"1")).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let ckpt = {
        let (e, done) = (e.clone(), done.clone());
        std::thread::spawn(move || {
            e.checkpoint().unwrap();
            done.load(Ordering::SeqCst)
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    done.store(true, Ordering::SeqCst);
    e.commit_atomic(g).unwrap();
    assert!(
        ckpt.join().unwrap(),
        "the checkpoint did not wait for the group"
    );
    // Close with a group open: it is committed as it stands.
    let g = e.begin_atomic().unwrap();
    e.write_atomic(g, &put("b", b"1")).unwrap();
    Arc::try_unwrap(e).ok().expect("one owner").close().unwrap();
    let r = Engine::open(dev, small_options()).unwrap();
    assert!(r.get(b"a").unwrap().is_some() && r.get(b"b").unwrap().is_some());
}
