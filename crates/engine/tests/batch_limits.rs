//! The limits a batch is checked against before it is logged: every key a prefix move or copy
//! would produce (against the key limit), and the batch's size (against the largest log record).
//! A batch past a limit is an error value that changes nothing, logs nothing and leaves the engine
//! writable; a batch within them is applied whole and survives a crash, however large.

mod common;

use std::ops::Bound;
use std::sync::Arc;

use amaranth_device::{CrashPlan, FaultDevice, MemDevice};
use amaranth_engine::{Batch, Engine, Error, Format, Options};
use common::*;

/// Every key and value, in order.
fn all(e: &Engine) -> Model {
    dump(e)
}

/// Closes nothing: abandons the engine (a crash with the log written) and opens the image again.
fn crash_and_reopen(e: Engine, dev: Arc<MemDevice>, options: &Options) -> Engine {
    e.sync().unwrap();
    e.abandon();
    let e = Engine::open(dev, options.clone()).expect("reopen");
    e.verify().expect("verify");
    e
}

#[test]
fn a_prefix_move_whose_keys_do_not_fit_changes_nothing() {
    let dev = Arc::new(MemDevice::new(16 << 20));
    let f = small_format();
    let max = f.max_key_len;
    let e = Engine::create(dev.clone(), f, small_options()).unwrap();
    // Under a/: keys up to the limit minus 10 bytes, and many others so that the move spans leaves.
    let deepest = [b"a/".as_slice(), &vec![b'z'; max - 12]].concat();
    e.put(&deepest, b"deepest").unwrap();
    for i in 0..300u32 {
        e.put(format!("a/{i:05}").as_bytes(), &[7; 40]).unwrap();
    }
    e.put(b"b/1", b"b").unwrap();
    let before = all(&e);
    // Growth by 11 bytes: one key would be `max + 1` long.
    let too_far = Batch::from(vec![amaranth_engine::Op::MovePrefix {
        from: b"a/".to_vec(),
        to: b"a-longer-123/".to_vec(),
    }]);
    match e.write(&too_far) {
        Err(Error::KeyTooLong { len, max: m }) => assert_eq!((len, m), (max + 1, max)),
        other => panic!("expected KeyTooLong, got {other:?}"),
    }
    let copy = Batch::from(vec![amaranth_engine::Op::CopyPrefix {
        from: b"a/".to_vec(),
        to: b"a-longer-123/".to_vec(),
    }]);
    assert!(matches!(e.write(&copy), Err(Error::KeyTooLong { .. })));
    assert_eq!(all(&e), before, "a refused move changed something");
    assert!(
        e.failure().is_none(),
        "a refused move is not an engine failure"
    );
    // Growth by 10 bytes fits exactly.
    let mut fits = Batch::new();
    fits.move_prefix(b"a/".to_vec(), b"a-longer-12/".to_vec());
    e.write(&fits).unwrap();
    let e = crash_and_reopen(e, dev, &small_options());
    let after = all(&e);
    assert_eq!(after.len(), before.len());
    let longest = after.keys().map(Vec::len).max().unwrap();
    assert_eq!(longest, max);
    assert!(after.keys().all(|k| !k.starts_with(b"a/")));
    e.close().unwrap();
}

#[test]
fn an_exchange_through_a_short_temporary_works_at_the_key_limit() {
    let dev = Arc::new(MemDevice::new(16 << 20));
    let f = small_format();
    let max = f.max_key_len;
    let e = Engine::create(dev.clone(), f, small_options()).unwrap();
    // x/ holds a key exactly at the limit. Swapping x/ with a prefix through t/ (no longer than
    // either) is checked step by step with what earlier steps moved: the final lengths decide.
    let full = [b"x/".as_slice(), &vec![b'k'; max - 2]].concat();
    e.put(&full, b"full").unwrap();
    e.put(b"yz/1", b"one").unwrap();
    let mut swap = Batch::new();
    swap.move_prefix(b"x/".to_vec(), b"t/".to_vec())
        .move_prefix(b"yz/".to_vec(), b"x/".to_vec())
        .move_prefix(b"t/".to_vec(), b"yz/".to_vec());
    // yz/ is one byte longer than x/: the full key would grow past the limit.
    assert!(matches!(e.write(&swap), Err(Error::KeyTooLong { .. })));
    // With a partner of the same length the swap works.
    e.put(b"y/1", b"one").unwrap();
    e.delete(b"yz/1").unwrap();
    let mut swap = Batch::new();
    swap.move_prefix(b"x/".to_vec(), b"t/".to_vec())
        .move_prefix(b"y/".to_vec(), b"x/".to_vec())
        .move_prefix(b"t/".to_vec(), b"y/".to_vec());
    e.write(&swap).unwrap();
    let e = crash_and_reopen(e, dev, &small_options());
    let want = [b"y/".as_slice(), &vec![b'k'; max - 2]].concat();
    assert_eq!(e.get(&want).unwrap().as_deref(), Some(&b"full"[..]));
    assert_eq!(e.get(b"x/1").unwrap().as_deref(), Some(&b"one"[..]));
    assert_eq!(
        e.range(Bound::Included(&b"t/"[..]), Bound::Excluded(&b"t0"[..]))
            .count(),
        0
    );
    e.close().unwrap();
}

/// Nodes of 256 KiB and a 12 MiB log (its largest record: 1.5 MiB), values of up to 8 KiB.
fn large_format() -> Format {
    Format {
        node_size: 256 << 10,
        partition_size: 64 << 10,
        max_fanout: 8,
        max_key_len: 1024,
        max_value_len: 8 << 10,
        log_size: Some(12 << 20),
        ..Format::default()
    }
}

/// A batch of `blocks` 4 KiB puts, keys `prefix` + a number.
fn blocks(prefix: &str, blocks: u32, fill: u8) -> Batch {
    let mut b = Batch::new();
    for i in 0..blocks {
        b.put(format!("{prefix}{i:06}").into_bytes(), vec![fill; 4096]);
    }
    b
}

#[test]
fn batches_of_more_than_a_mebibyte_survive_crashes_and_larger_ones_are_refused() {
    let dev = Arc::new(FaultDevice::new(96 << 20));
    let options = Options {
        cache_size: 4 << 20,
        background_threads: false,
        ..Options::default()
    };
    let e = Engine::create(dev.clone(), large_format(), options.clone()).unwrap();
    assert_eq!(e.max_batch_bytes(), (12 << 20) / 8);
    dev.restart_recording();
    // 320 blocks: 1.25 MiB of values, one record of about 1.3 MiB.
    let big = blocks("f/", 320, 1);
    assert!(big.log_bytes() > 1 << 20 && big.log_bytes() <= e.max_batch_bytes());
    e.write(&big).unwrap();
    let after_first = dev.trace_len();
    e.write(&blocks("f/", 320, 2)).unwrap();
    e.sync().unwrap();
    let synced = dev.trace_len();
    // Too large for one record: an error value, nothing changed, still writable.
    let huge = blocks("g/", 400, 3);
    assert!(huge.log_bytes() > e.max_batch_bytes());
    assert!(matches!(e.write(&huge), Err(Error::InvalidArgument(_))));
    assert!(e.failure().is_none());
    assert_eq!(e.get(b"g/000000").unwrap(), None);
    e.put(b"after", b"ok").unwrap();
    e.sync().unwrap();
    let end = dev.trace_len();
    drop(e);
    // Every crash point: the second batch is all there or not at all, never a part.
    let mut points = dev.flush_points();
    points.extend([0, after_first, synced, end]);
    points.extend((0..end).step_by((end / 40).max(1)));
    points.sort();
    points.dedup();
    for (i, pos) in points.into_iter().enumerate() {
        for plan in [
            CrashPlan::DropAll,
            CrashPlan::KeepAll,
            CrashPlan::Random {
                seed: i as u64,
                keep: 0.5,
                tear: 0.5,
            },
        ] {
            let img = Arc::new(MemDevice::from_bytes(dev.crash_image(pos, &plan)));
            let e = Engine::open(img, options.clone())
                .unwrap_or_else(|err| panic!("crash at {pos} {plan:?}: {err}"));
            let m = all(&e);
            let fills: std::collections::BTreeSet<u8> = m
                .iter()
                .filter(|(k, _)| k.starts_with(b"f/"))
                .map(|(_, v)| v[0])
                .collect();
            let count = m.keys().filter(|k| k.starts_with(b"f/")).count();
            assert!(
                count == 0 || count == 320 && fills.len() == 1,
                "crash at {pos} {plan:?}: {count} blocks, fills {fills:?}"
            );
            if pos >= synced {
                assert_eq!(fills.into_iter().collect::<Vec<_>>(), vec![2]);
            }
            assert!(m.keys().all(|k| !k.starts_with(b"g/")));
        }
    }
}

#[test]
fn large_batches_wait_for_log_space_and_never_hang() {
    // Background threads on: admission waits for checkpoints; 40 batches of ~1.4 MiB go
    // through a 12 MiB log several times over.
    let dev = Arc::new(MemDevice::new(128 << 20));
    let options = Options {
        cache_size: 8 << 20,
        ..Options::default()
    };
    let e = Engine::create(dev.clone(), large_format(), options.clone()).unwrap();
    for round in 0..40u32 {
        let b = blocks(&format!("r{:02}/", round % 5), 340, round as u8);
        assert!(b.log_bytes() <= e.max_batch_bytes());
        e.write(&b).unwrap();
    }
    assert!(
        e.stats().checkpoints > 1,
        "the log wrapped through checkpoints"
    );
    let e = crash_and_reopen(e, dev, &options);
    for r in 0..5u32 {
        let v = e
            .get(format!("r{r:02}/000339").as_bytes())
            .unwrap()
            .unwrap();
        assert_eq!(v[0], (35 + r) as u8);
    }
    e.close().unwrap();
}
