//! A read-only engine writes nothing to its device, whether it was opened read-only (even with a
//! log to replay and a cache too small for the replayed nodes) or switched to read-only while open
//! (a remount); and it can become writable again without losing anything.

mod common;

use std::sync::Arc;

use amaranth_device::{BlockDevice, MemDevice};
use amaranth_engine::{Engine, Error, Options, Superblock};

use common::{small_format, small_options};

fn key(i: u32) -> Vec<u8> {
    format!("key-{i:06}").into_bytes()
}

fn value(i: u32, round: u32) -> Vec<u8> {
    format!("value-{i}-{round}-")
        .repeat(1 + (i % 7) as usize)
        .into_bytes()
}

fn write_round(e: &Engine, n: u32, round: u32) {
    for i in 0..n {
        e.put(&key(i), &value(i, round)).unwrap();
    }
}

fn check_round(e: &Engine, n: u32, round: u32) {
    for i in 0..n {
        assert_eq!(e.get(&key(i)).unwrap(), Some(value(i, round)), "key {i}");
    }
}

fn read_only_options() -> Options {
    Options {
        read_only: true,
        // The smallest cache (eight nodes): the replayed nodes cannot all stay in it.
        cache_size: small_format().node_size * 8,
        ..small_options()
    }
}

/// Options that let the log fill before a checkpoint, so that a crash leaves much to replay.
fn long_log_options() -> Options {
    Options {
        checkpoint_log_fraction: 0.95,
        ..small_options()
    }
}

#[test]
fn a_read_only_open_with_a_log_to_replay_writes_nothing() {
    let mem = Arc::new(MemDevice::new(64 << 20));
    let dev: Arc<dyn BlockDevice> = mem.clone();
    let e = Engine::create(dev.clone(), small_format(), long_log_options()).unwrap();
    write_round(&e, 3000, 1);
    assert!(
        e.stats().log.used > 256 << 10,
        "most of the rounds is in the log only"
    );
    e.sync().unwrap();
    // A crash: the records after the last checkpoint are only in the log.
    e.abandon();
    let before = mem.to_bytes();
    let e = Engine::open(dev.clone(), read_only_options()).unwrap();
    assert!(e.is_read_only());
    assert!(e.stats().opened_after_crash);
    // The replayed nodes are dirty and the cache is far smaller than them: eviction must keep
    // them rather than write them back.
    check_round(&e, 3000, 1);
    assert!(matches!(e.put(b"x", b"y"), Err(Error::ReadOnly(_))));
    e.close().unwrap();
    assert!(
        mem.to_bytes() == before,
        "a read-only open wrote to the device"
    );
    // The image still opens read-write, replays the same log and keeps everything.
    let e = Engine::open(dev, small_options()).unwrap();
    check_round(&e, 3000, 1);
    e.close().unwrap();
}

#[test]
fn switching_to_read_only_and_back_loses_nothing_and_writes_nothing_while_read_only() {
    let mem = Arc::new(MemDevice::new(64 << 20));
    let dev: Arc<dyn BlockDevice> = mem.clone();
    let opts = Options {
        background_threads: true,
        ..small_options()
    };
    let e = Engine::create(dev.clone(), small_format(), opts.clone()).unwrap();
    write_round(&e, 2000, 1);
    e.set_read_only(true).unwrap();
    // The switch wrote a clean checkpoint: the image is as after an unmount.
    let sb = Superblock::read_newest(&*dev, false).unwrap();
    assert!(
        sb.clean,
        "the last checkpoint before read-only is marked clean"
    );
    let before = mem.to_bytes();
    assert!(matches!(e.put(b"x", b"y"), Err(Error::ReadOnly(_))));
    assert!(matches!(
        e.range_delete(b"a", b"z"),
        Err(Error::ReadOnly(_))
    ));
    e.sync().unwrap();
    e.checkpoint().unwrap();
    check_round(&e, 2000, 1);
    // Long enough for the background threads' periods, had they kept running.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert!(
        mem.to_bytes() == before,
        "a read-only engine wrote to the device"
    );
    // Writable again: new writes, a crash, and the log replays them.
    e.set_read_only(false).unwrap();
    assert!(!e.is_read_only());
    write_round(&e, 2000, 2);
    e.sync().unwrap();
    e.abandon();
    let e = Engine::open(dev, small_options()).unwrap();
    check_round(&e, 2000, 2);
    e.close().unwrap();
}

#[test]
fn a_read_only_open_becomes_writable_when_the_device_allows_it() {
    let mem = Arc::new(MemDevice::new(64 << 20));
    let dev: Arc<dyn BlockDevice> = mem.clone();
    let e = Engine::create(dev.clone(), small_format(), small_options()).unwrap();
    write_round(&e, 1000, 1);
    e.sync().unwrap();
    e.abandon();
    let e = Engine::open(dev.clone(), read_only_options()).unwrap();
    e.set_read_only(false).unwrap();
    write_round(&e, 500, 2);
    e.close().unwrap();
    let e = Engine::open(dev, small_options()).unwrap();
    check_round(&e, 500, 2);
    for i in 500..1000 {
        assert_eq!(e.get(&key(i)).unwrap(), Some(value(i, 1)));
    }
    e.close().unwrap();
}
