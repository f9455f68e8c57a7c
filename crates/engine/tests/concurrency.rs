//! Threads: concurrent writers, readers, scanners, syncs and checkpoints, with the background
//! threads running, on a small cache.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use amaranth_device::MemDevice;
use amaranth_engine::{Engine, Options, Patch};
use common::*;
use rand::{Rng, SeedableRng};

#[test]
fn concurrent_writers_readers_and_checkpoints() {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let options = Options {
        cache_size: 256 << 10,
        background_threads: true,
        log_flush_interval: Duration::from_millis(20),
        checkpoint_interval: Duration::from_millis(150),
        check_invariants: true,
        ..Options::default()
    };
    let e = Arc::new(Engine::create(dev.clone(), small_format(), options.clone()).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let writers = 3u32;
    let per_writer = 4000u32;
    let mut handles = Vec::new();
    // Each writer owns a key family; it ends with a known state we can check.
    for w in 0..writers {
        let e = e.clone();
        handles.push(std::thread::spawn(move || {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(w as u64);
            for i in 0..per_writer {
                let k = format!("w{w}/{:05}", i % 700).into_bytes();
                match rng.gen_range(0..10) {
                    0 => {
                        e.delete(&k).unwrap();
                    }
                    1..=3 => {
                        e.upsert(
                            &k,
                            Patch::Write {
                                offset: 4,
                                data: vec![w as u8; 4],
                            },
                        )
                        .unwrap();
                    }
                    _ => {
                        e.put(&k, format!("{w}-{i}-payload").as_bytes()).unwrap();
                    }
                }
                if i % 500 == 0 {
                    e.sync().unwrap();
                }
            }
            // A final, deterministic state for the family.
            e.range_delete(format!("w{w}/").as_bytes(), format!("w{w}0").as_bytes())
                .unwrap();
            for i in 0..300u32 {
                e.put(
                    format!("w{w}/{i:05}").as_bytes(),
                    format!("final-{w}-{i}").as_bytes(),
                )
                .unwrap();
            }
        }));
    }
    // Readers and scanners: results must always be well formed and in order.
    for r in 0..2 {
        let e = e.clone();
        let stop = stop.clone();
        handles.push(std::thread::spawn(move || {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(100 + r);
            while !stop.load(Ordering::Relaxed) {
                let w = rng.gen_range(0..3);
                let k = format!("w{w}/{:05}", rng.gen_range(0..700)).into_bytes();
                if let Some(v) = e.get(&k).unwrap() {
                    assert!(!v.is_empty());
                }
                let lo = format!("w{w}/").into_bytes();
                let hi = format!("w{w}0").into_bytes();
                let mut prev: Option<Vec<u8>> = None;
                for item in e
                    .range(
                        std::ops::Bound::Included(&lo[..]),
                        std::ops::Bound::Excluded(&hi[..]),
                    )
                    .take(200)
                {
                    let (k, _) = item.unwrap();
                    assert!(prev.as_ref().is_none_or(|p| *p < k), "scan out of order");
                    prev = Some(k);
                }
            }
        }));
    }
    let checkpointer = {
        let e = e.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                e.checkpoint().unwrap();
                std::thread::sleep(Duration::from_millis(30));
            }
        })
    };
    let readers: Vec<_> = handles.drain(writers as usize..).collect();
    for h in handles {
        h.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for h in readers {
        h.join().unwrap();
    }
    checkpointer.join().unwrap();
    e.check_space_accounting();
    let mut expect = Model::new();
    for w in 0..writers {
        for i in 0..300u32 {
            expect.insert(
                format!("w{w}/{i:05}").into_bytes(),
                format!("final-{w}-{i}").into_bytes(),
            );
        }
    }
    assert!(dump(&e) == expect, "final state differs");
    let report = e.verify().unwrap();
    assert!(report.leaked_nodes.is_empty());
    let st = e.stats();
    assert!(st.failure.is_none(), "{st:?}");
    let e = Arc::try_unwrap(e).ok().expect("sole owner");
    e.close().unwrap();
    let e = Engine::open(
        dev,
        Options {
            background_threads: false,
            ..options
        },
    )
    .unwrap();
    assert!(dump(&e) == expect, "state differs after reopen");
}

/// The space of range-deleted data comes back while the engine is idle (the background cleaner
/// pushes range deletes down to the leaves, merges emptied leaves into their siblings and
/// checkpoints), without any further write. With these tiny nodes (1000 leaves of 16 KiB) one pass
/// merges emptied leaves pairwise, so the tree keeps part of its empty leaves: at least half of the
/// space must come back (with 4 MiB nodes a 64 MiB file's space comes back whole, see the mount
/// test `space_from_deletes_comes_back`).
#[test]
fn idle_engine_gives_back_the_space_of_range_deletes() {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let options = Options {
        cache_size: 256 << 10,
        background_threads: true,
        checkpoint_interval: Duration::from_secs(3600),
        check_invariants: true,
        ..Options::default()
    };
    let e = Engine::create(dev.clone(), small_format(), options.clone()).unwrap();
    let (free0, _) = e.space();
    let value = vec![7u8; 900];
    for i in 0..6000u32 {
        e.put(format!("d/{i:06}").as_bytes(), &value).unwrap();
    }
    e.put(b"keep", b"me").unwrap();
    e.checkpoint().unwrap();
    let used1 = free0 - e.space().0;
    assert!(used1 > 4 << 20, "the data took {used1} bytes");
    e.range_delete(b"d/", b"d0").unwrap();
    e.sync().unwrap();
    let t = std::time::Instant::now();
    let mut used2 = free0 - e.space().0;
    while used2 > used1 / 2 && t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(200));
        used2 = free0 - e.space().0;
    }
    assert!(
        used2 <= used1 / 2,
        "space not given back while idle: {used2} of {used1} bytes still used after {:?}: {:?}",
        t.elapsed(),
        e.stats()
    );
    assert_eq!(e.get(b"keep").unwrap().as_deref(), Some(&b"me"[..]));
    assert_eq!(e.get(b"d/000042").unwrap(), None);
    e.verify().unwrap();
    e.close().unwrap();
}

/// Range moves by surgery while readers look keys up and scan, and the background threads flush,
/// heal and checkpoint: a reader finds a moved key at its old or its new place with its value,
/// never a wrong value or an error, and every scan is in order.
#[test]
fn readers_see_range_moves_whole() {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let options = Options {
        cache_size: 512 << 10,
        background_threads: true,
        log_flush_interval: Duration::from_millis(20),
        checkpoint_interval: Duration::from_millis(150),
        check_invariants: true,
        ..Options::default()
    };
    let e = Arc::new(Engine::create(dev, small_format(), options).unwrap());
    let value = |i: u32| format!("value-{i:05}").into_bytes();
    for i in 0..3000u32 {
        e.put(format!("a/{i:05}").as_bytes(), &value(i)).unwrap();
        e.put(format!("m/{i:05}").as_bytes(), b"other").unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let lookups = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut readers = Vec::new();
    for r in 0..2u64 {
        let (e, stop, lookups) = (e.clone(), stop.clone(), lookups.clone());
        readers.push(std::thread::spawn(move || {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(r);
            let (mut found, mut tried) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                tried += 1;
                lookups.fetch_add(1, Ordering::Relaxed);
                let i = rng.gen_range(0..3000u32);
                let side = if rng.gen_bool(0.5) { "a" } else { "z" };
                if let Some(v) = e.get(format!("{side}/{i:05}").as_bytes()).unwrap() {
                    assert_eq!(v, value(i), "{side}/{i:05}");
                    found += 1;
                }
                if rng.gen_bool(0.05) {
                    let mut prev: Option<Vec<u8>> = None;
                    for kv in e.range(std::ops::Bound::Unbounded, std::ops::Bound::Unbounded) {
                        let (k, v) = kv.unwrap();
                        assert!(prev.as_ref().is_none_or(|p| *p < k), "scan out of order");
                        if k[0] == b'a' || k[0] == b'z' {
                            let i: u32 = std::str::from_utf8(&k[2..]).unwrap().parse().unwrap();
                            assert_eq!(v, value(i));
                        }
                        prev = Some(k);
                    }
                }
            }
            eprintln!("reader {r}: {found} of {tried} lookups found their key");
            found
        }));
    }
    // Moves go on until the readers have looked up a few thousand keys (at least 200 moves).
    let mut moves = 0;
    for n in 0..20_000 {
        if n >= 200 && n % 2 == 0 && lookups.load(Ordering::Relaxed) >= 4000 {
            break;
        }
        let (from, to) = if n % 2 == 0 {
            ("a/", "z/")
        } else {
            ("z/", "a/")
        };
        let mut b = amaranth_engine::Batch::new();
        b.range_move(from.as_bytes(), to.as_bytes(), 0);
        e.write(&b).unwrap();
        moves += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let found: u64 = readers.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(found > 0, "the readers found moved keys");
    assert!(e.stats().range_moves >= moves, "by surgery");
    for i in (0..3000u32).step_by(97) {
        assert_eq!(
            e.get(format!("a/{i:05}").as_bytes()).unwrap(),
            Some(value(i))
        );
        assert_eq!(e.get(format!("z/{i:05}").as_bytes()).unwrap(), None);
    }
    e.verify().unwrap();
}

/// Range deletes pushed down to the leaves (`reclaim_space`, and the background cleaner) while
/// readers load cold nodes into a cache far smaller than the tree, so that their room-making
/// sheds the partitions and buffers of clean nodes all the time. A pass pushing deletes down
/// used to deliver into a child whose sub-blocks another thread's eviction shed between the
/// child's load and its latch: it panicked in the middle of a delivery (in an aging run of the
/// mail server), leaving a leaf without partitions and losing the messages it carried.
#[test]
fn range_deletes_pushed_down_while_readers_shed_nodes() {
    let dev = Arc::new(MemDevice::new(256 << 20));
    let options = Options {
        cache_size: 384 << 10,
        background_threads: true,
        log_flush_interval: Duration::from_millis(20),
        checkpoint_interval: Duration::from_millis(100),
        check_invariants: true,
        ..Options::default()
    };
    let e = Arc::new(Engine::create(dev.clone(), small_format(), options.clone()).unwrap());
    let families = 24u32;
    let per_family = 1500u32;
    let mut model = Model::new();
    for f in 0..families {
        fill_family(&e, &mut model, &format!("f{f:02}/"), per_family, 60);
    }
    e.checkpoint().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    for r in 0..6u64 {
        let e = e.clone();
        let stop = stop.clone();
        readers.push(std::thread::spawn(move || {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(7 + r);
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let f = rng.gen_range(0..families);
                let k = format!("f{f:02}/{:07}", rng.gen_range(0..per_family));
                let _ = e.get(k.as_bytes()).unwrap();
                n += 1;
            }
            n
        }));
    }
    let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
    let t = std::time::Instant::now();
    let mut rounds = 0u32;
    while t.elapsed() < Duration::from_secs(4) {
        let f = rng.gen_range(0..families);
        let prefix = format!("f{f:02}/");
        let lo = format!("f{f:02}/{:07}", rng.gen_range(0..per_family / 2));
        let hi = format!("f{f:02}/{:07}", rng.gen_range(per_family / 2..per_family));
        e.range_delete(lo.as_bytes(), hi.as_bytes()).unwrap();
        let gone: Vec<Vec<u8>> = model
            .range(lo.clone().into_bytes()..hi.clone().into_bytes())
            .map(|(k, _)| k.clone())
            .collect();
        for k in gone {
            model.remove(&k);
        }
        e.reclaim_space(u64::MAX).unwrap();
        // Refill what was deleted, so that the tree keeps its size.
        let mut b = amaranth_engine::Batch::new();
        for i in 0..per_family {
            let k = format!("{prefix}{i:07}").into_bytes();
            if !model.contains_key(&k) && rng.gen_bool(0.5) {
                let v = vec![(i % 251) as u8; 60];
                model.insert(k.clone(), v.clone());
                b.put(k, v);
            }
        }
        e.write(&b).unwrap();
        rounds += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let reads: u64 = readers.into_iter().map(|h| h.join().unwrap()).sum();
    let st = e.stats();
    eprintln!("{rounds} rounds of range delete + reclaim, {reads} reads, {st:?}");
    assert!(st.failure.is_none(), "{st:?}");
    assert!(dump(&e) == model, "the state differs from the model");
    let report = e.verify().unwrap();
    assert!(report.leaked_nodes.is_empty());
    let e = Arc::try_unwrap(e).ok().expect("sole owner");
    e.close().unwrap();
    let e = Engine::open(
        dev,
        Options {
            background_threads: false,
            ..options
        },
    )
    .unwrap();
    assert!(dump(&e) == model, "the state differs after reopen");
}
