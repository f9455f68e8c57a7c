//! Crash, failure and corruption tests through the fault-injecting device.
//!
//! A workload runs on a [`FaultDevice`] that records every write and flush. Afterwards, for every
//! flush point and for random points in between, the image a power cut would have left is rebuilt
//! (everything before the last flush, plus none, all, or a random torn subset of the later writes),
//! opened, and compared with the model: it must equal the state after some prefix of the
//! operations, and that prefix must include every operation acknowledged by a completed `sync`.

mod common;

use std::sync::Arc;

use amaranth_device::{BlockDevice, CrashPlan, FaultDevice, FaultRule, IoKind, MemDevice};
use amaranth_engine::{Batch, Engine, Error, Options};
use common::crashsim::*;
use common::*;
use rand::Rng;

#[test]
fn crash_at_every_flush_and_between() {
    let runs: u64 = std::env::var("AMARANTH_CRASH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(6);
    let mut states = 0usize;
    for seed in 0..runs {
        let seed = 0xc4a5_0000 + seed;
        eprintln!("crash seed {seed}");
        let run = workload(seed, 300);
        states += check_crash_points(&run, seed, 40);
    }
    eprintln!("checked {states} crash states");
}

/// Range moves, by surgery and by copy, and snapshots taken and deleted, crashed at every flush
/// and between: each moved range is wholly at its source or wholly at its destination, each
/// snapshot there or not and, when there, equal to the model at its record (the state, snapshots
/// included, is a prefix of the operations), and the recovered tree verifies with no leaked node.
#[test]
fn range_moves_are_whole_after_a_crash_anywhere() {
    let runs: u64 = std::env::var("AMARANTH_CRASH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    let mut states = 0usize;
    for seed in 0..runs {
        let seed = 0x5a9e_0000 + seed;
        eprintln!("range move crash seed {seed}");
        let run = workload_with(seed, 300, true);
        for (pos, plan) in crash_states(&run, seed, 30) {
            let what = format!("seed {seed} crash at {pos} with {plan:?}");
            check_crash(&run, pos, &plan, &what);
            states += 1;
        }
    }
    eprintln!("checked {states} crash states");
}

#[test]
fn failing_writes_and_flushes_lose_nothing_acknowledged() {
    for (kind, after) in [
        (IoKind::Write, 40),
        (IoKind::Flush, 5),
        (IoKind::Write, 200),
        (IoKind::Flush, 30),
    ] {
        let dev = Arc::new(FaultDevice::new(24 << 20));
        let options = small_options();
        let e = Engine::create(dev.clone(), small_format(), options.clone()).unwrap();
        dev.add_rule(FaultRule::always_after(kind, after));
        let mut m = Model::new();
        let mut synced = Model::new();
        let mut g = Gen::new(after, 300, 500);
        let mut failed = false;
        for step in 0..2000 {
            let op = g.simple_op();
            match e.write(&Batch::from(vec![op.clone()])) {
                Ok(_) => apply_model(&mut m, &op),
                Err(err) => {
                    // Once the device failed, the engine refuses writes with a clear error.
                    assert!(
                        matches!(err, Error::Io { .. } | Error::ReadOnly(_)),
                        "{kind:?}/{after} step {step}: {err}"
                    );
                    failed = true;
                    break;
                }
            }
            if step % 10 == 9 {
                match e.sync() {
                    Ok(()) => synced = m.clone(),
                    Err(_) => {
                        failed = true;
                        break;
                    }
                }
            }
        }
        assert!(failed, "{kind:?} after {after}: the fault never surfaced");
        assert!(
            e.put(b"x", b"y").is_err(),
            "writes after a failure must be refused"
        );
        e.abandon();
        dev.clear_rules();
        // The device "recovers" (power cycle): whatever reached it is what a restart sees.
        let img = dev.crash_image(dev.trace_len(), &CrashPlan::DropAll);
        let e = Engine::open(Arc::new(MemDevice::from_bytes(img)), options).unwrap();
        let got = dump(&e);
        for (k, v) in &synced {
            // Everything synced is there unless a later acknowledged write changed it.
            let later = m.get(k);
            assert!(
                got.get(k) == Some(v) || got.get(k) == later,
                "{kind:?}/{after}: synced key {k:?} lost"
            );
        }
    }
}

#[test]
fn failing_reads_are_errors_not_wrong_data() {
    let dev = Arc::new(FaultDevice::new(24 << 20));
    let options = Options {
        cache_size: 128 << 10,
        ..small_options()
    };
    let e = Engine::create(dev.clone(), small_format(), options.clone()).unwrap();
    let mut m = Model::new();
    for i in 0..3000u32 {
        let k = format!("key{i:06}").into_bytes();
        let v = vec![(i % 200) as u8; 100];
        e.put(&k, &v).unwrap();
        m.insert(k, v);
    }
    e.close().unwrap();
    let e = Engine::open(dev.clone(), options).unwrap();
    dev.add_rule(FaultRule::always_after(IoKind::Read, 3));
    let mut errors = 0;
    for (k, v) in m.iter().step_by(37) {
        match e.get(k) {
            Ok(Some(got)) => assert_eq!(&got, v),
            Ok(None) => panic!("a failed read must not look like a missing key"),
            Err(err) => {
                assert!(matches!(err, Error::Io { .. }), "unexpected error {err}");
                errors += 1;
            }
        }
    }
    assert!(errors > 0);
    dev.clear_rules();
    for (k, v) in m.iter().step_by(41) {
        assert_eq!(e.get(k).unwrap().as_ref(), Some(v));
    }
}

/// A node write that fails while a read makes room in the cache (it writes a dirty node back)
/// fails the engine as a failed write on a write path does: the reader gets the error, and the
/// next write is refused even though it would only go to the log's buffer. The switch to
/// read-only reports the failure, the switch back refuses, and a restart has everything synced.
#[test]
fn a_failed_write_back_during_a_read_refuses_later_writes() {
    let dev = Arc::new(FaultDevice::new(24 << 20));
    // The small options' cache (256 KiB): the writes below leave dirty leaves in it for the reads
    // to write back. (128 KiB did before decoded buffers were counted at their real size; with
    // them counted, the writes evicted all but the root and one child.)
    let options = small_options();
    let e = Engine::create(dev.clone(), small_format(), options.clone()).unwrap();
    let key = |i: u32| format!("key{i:06}").into_bytes();
    let value = |i: u32| vec![(i % 200) as u8; 100];
    for i in 0..3000u32 {
        e.put(&key(i), &value(i)).unwrap();
    }
    e.sync().unwrap();
    let dirty = e.stats().dirty_nodes;
    assert!(
        dirty > 4,
        "only {dirty} dirty nodes: nothing for a read to write back"
    );
    dev.add_rule(FaultRule::always_after(IoKind::Write, 0));
    let read_error = (0..3000u32)
        .step_by(7)
        .find_map(|i| e.get(&key(i)).err())
        .expect("no read wrote a dirty node back");
    assert!(matches!(read_error, Error::Io { .. }), "{read_error}");
    let w = e.put(b"after", b"failure");
    assert!(
        matches!(w, Err(Error::ReadOnly(_))),
        "a write after a failed write-back: {w:?}"
    );
    assert!(e.failure().is_some());
    assert!(e.set_read_only(true).is_err());
    assert!(e.is_read_only());
    assert!(matches!(e.set_read_only(false), Err(Error::ReadOnly(_))));
    e.abandon();
    dev.clear_rules();
    let img = dev.crash_image(dev.trace_len(), &CrashPlan::DropAll);
    let e = Engine::open(Arc::new(MemDevice::from_bytes(img)), options).unwrap();
    for i in (0..3000u32).step_by(13) {
        assert_eq!(e.get(&key(i)).unwrap(), Some(value(i)), "synced key {i}");
    }
    assert_eq!(e.get(b"after").unwrap(), None);
}

#[test]
fn flipped_bytes_give_errors_never_wrong_data() {
    let dev = Arc::new(MemDevice::new(24 << 20));
    let options = Options {
        cache_size: 128 << 10,
        ..small_options()
    };
    let e = Engine::create(dev.clone(), small_format(), options.clone()).unwrap();
    let mut m = Model::new();
    let mut g = Gen::new(99, 800, 600);
    for _ in 0..3000 {
        let op = g.simple_op();
        apply_model(&mut m, &op);
        e.write(&Batch::from(vec![op])).unwrap();
    }
    // Leave some work in the log too.
    e.checkpoint().unwrap();
    for _ in 0..200 {
        let op = g.simple_op();
        apply_model(&mut m, &op);
        e.write(&Batch::from(vec![op])).unwrap();
    }
    e.sync().unwrap();
    e.abandon();
    let image = dev.to_bytes();
    // Flip bytes where they matter: superblocks, the log, and every written block of the data area.
    let used: Vec<usize> = (0..image.len() / 4096)
        .filter(|b| image[b * 4096..(b + 1) * 4096].iter().any(|&x| x != 0))
        .collect();
    // The blocks of the checkpoint's node images.
    let in_nodes: std::collections::HashSet<usize> = {
        let clean = Engine::open(
            Arc::new(MemDevice::from_bytes(image.clone())),
            Options {
                read_only: true,
                ..options.clone()
            },
        )
        .unwrap();
        clean
            .node_extents()
            .into_iter()
            .flat_map(|(_, b, n)| (b as usize)..(b + n) as usize)
            .collect()
    };
    let mut rng = Gen::new(7, 1, 1).rng;
    let (mut errors, mut intact) = (0, 0);
    let (mut node_flips, mut node_errors) = (0, 0);
    for trial in 0..300 {
        let block = used[rng.gen_range(0..used.len())];
        let in_node = in_nodes.contains(&block);
        node_flips += usize::from(in_node);
        // A byte that holds something (zeros are mostly the padding after 4 KiB-aligned
        // partitions, which no checksum needs to cover).
        let set: Vec<usize> = (0..4096)
            .filter(|&i| image[block * 4096 + i] != 0)
            .collect();
        let off = block * 4096 + set[rng.gen_range(0..set.len())];
        let mut bad = image.clone();
        bad[off] ^= 1 << rng.gen_range(0..8);
        let dev = Arc::new(MemDevice::from_bytes(bad));
        let outcome = Engine::open(
            dev,
            Options {
                read_only: true,
                ..options.clone()
            },
        )
        .and_then(|e| {
            let mut got = Model::new();
            for r in e.range(std::ops::Bound::Unbounded, std::ops::Bound::Unbounded) {
                let (k, v) = r?;
                got.insert(k, v);
            }
            e.verify()?;
            Ok(got)
        });
        match outcome {
            Ok(got) => {
                assert!(
                    got == m,
                    "trial {trial}: flipped byte at {off} gave wrong data silently"
                );
                intact += 1;
            }
            Err(err) => {
                assert!(
                    err.is_corruption()
                        || matches!(err, Error::UnsupportedVersion { .. } | Error::TooSmall(_)),
                    "trial {trial}: {err}"
                );
                errors += 1;
                node_errors += usize::from(in_node);
            }
        }
    }
    eprintln!(
        "flipped bytes: {errors} detected, {intact} harmless (unused bytes); in node images \
         {node_errors} of {node_flips} detected"
    );
    // Most written blocks outside the node images are log space past its live records and
    // superblock fields no reader uses, where a flip is harmless; inside the images every byte
    // that holds something is checksummed.
    assert!(node_flips >= 20, "too few flips landed in node images");
    assert!(
        node_errors * 20 >= node_flips * 19,
        "flips in node images must be detected: {node_errors} of {node_flips}"
    );
    // Both primary superblocks damaged: the backups still hold the checkpoint.
    let mut bad = image.clone();
    bad[100] ^= 1;
    bad[4096 + 100] ^= 1;
    let e = Engine::open(
        Arc::new(MemDevice::from_bytes(bad.clone())),
        options.clone(),
    )
    .unwrap();
    assert_eq!(dump(&e), m);
    e.abandon();
    // Every copy damaged: a clear error.
    for b in amaranth_engine::backup_blocks(image.len() as u64 / 4096) {
        bad[b as usize * 4096 + 100] ^= 1;
    }
    assert!(matches!(
        Engine::open(Arc::new(MemDevice::from_bytes(bad)), options.clone()),
        Err(Error::Checksum { .. })
    ));
    let zero = vec![0u8; image.len()];
    assert!(matches!(
        Engine::open(Arc::new(MemDevice::from_bytes(zero)), options.clone()),
        Err(Error::BadMagic(_))
    ));
    let short = image[..image.len() / 2].to_vec();
    assert!(matches!(
        Engine::open(Arc::new(MemDevice::from_bytes(short)), options),
        Err(Error::TooSmall(_))
    ));
}

#[test]
fn bad_input_is_refused_with_typed_errors() {
    let dev = Arc::new(MemDevice::new(24 << 20));
    let e = Engine::create(dev.clone(), small_format(), small_options()).unwrap();
    let f = small_format();
    assert!(matches!(
        e.put(&vec![1; f.max_key_len + 1], b"v"),
        Err(Error::KeyTooLong { .. })
    ));
    assert!(matches!(
        e.put(b"k", &vec![1; f.max_value_len + 1]),
        Err(Error::ValueTooLarge { .. })
    ));
    assert!(matches!(
        e.range_delete(b"b", b"a"),
        Err(Error::InvalidArgument(_))
    ));
    let patch = amaranth_engine::Patch::Write {
        offset: f.max_value_len as u32,
        data: vec![1],
    };
    assert!(matches!(
        e.upsert(b"k", patch),
        Err(Error::ValueTooLarge { .. })
    ));
    assert!(e.get(b"k").unwrap().is_none());
    // A second engine on the same image file is refused (the device layer locks it).
    let dir = std::env::temp_dir().join(format!("amaranth-lock-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("img");
    let fdev: Arc<dyn BlockDevice> =
        Arc::new(amaranth_device::FileDevice::create_image(&path, 24 << 20).unwrap());
    let e1 = Engine::create(fdev, small_format(), small_options()).unwrap();
    let err = amaranth_device::FileDevice::open(&path)
        .map_err(|e| Error::io("opening", e))
        .unwrap_err();
    assert!(matches!(err, Error::InUse(_)), "{err}");
    e1.close().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Regression: after a sync, the log writes an end marker where the next chunk would go. When that
/// place is near the end of the ring and the next chunk does not fit there, the chunk goes to the
/// start of the next lap and the old marker stays behind; recovery must not take that stale marker
/// for the end of the log (it did, losing every synced record after the wrap). Batches of varying
/// size meet the end of the ring at every alignment; a crash after every sync must keep all of them.
#[test]
fn synced_records_survive_a_crash_after_the_log_wraps() {
    let dev = Arc::new(FaultDevice::new(24 << 20));
    let options = Options {
        checkpoint_log_fraction: 0.95,
        ..small_options()
    };
    let e = Engine::create(dev.clone(), small_format(), options.clone()).unwrap();
    let value = vec![5u8; 900];
    let mut synced: Vec<(usize, usize)> = Vec::new(); // (trace position, keys written)
    let mut keys = 0usize;
    let batch = |s: usize| 1 + (s * 7 + s / 3) % 6;
    for step in 0..700 {
        if step == 100 {
            // Move the log's tail forward so that the ring wraps long before it fills up.
            e.checkpoint().unwrap();
        }
        for _ in 0..batch(step) {
            e.put(format!("k{keys:06}").as_bytes(), &value).unwrap();
            keys += 1;
        }
        e.sync().unwrap();
        synced.push((dev.trace_len(), keys));
    }
    let wraps = e.stats().log.bytes_written / e.stats().log.capacity;
    assert!(wraps >= 1, "the workload must wrap the log ring");
    e.abandon();
    for &(pos, n) in &synced {
        let img = dev.crash_image(pos, &CrashPlan::KeepAll);
        let d = Arc::new(FaultDevice::from_bytes(img));
        let r = Engine::open(d, options.clone())
            .unwrap_or_else(|err| panic!("crash at trace position {pos}: recovery: {err}"));
        for k in [0, n / 2, n - 1] {
            assert!(
                r.get(format!("k{k:06}").as_bytes()).unwrap().is_some(),
                "crash at trace position {pos}: synced key {k} of {n} lost"
            );
        }
        r.abandon();
    }
}
