//! A read-only engine writes nothing to its device, whether it was opened read-only (even with a
//! log to replay and a cache too small for the replayed nodes) or switched to read-only while open
//! (a remount); and it can become writable again without losing anything.

mod common;

use std::sync::Arc;

use amaranth_device::{BlockDevice, MemDevice};
use amaranth_engine::{downgrade_for_tests, upgrade, Engine, Error, Options, Superblock};

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

/// An image of 24 MiB holding keys 0..n of round 1, closed cleanly.
fn closed_image(n: u32) -> Arc<MemDevice> {
    let mem = Arc::new(MemDevice::new(24 << 20));
    let e = Engine::create(mem.clone(), small_format(), small_options()).unwrap();
    write_round(&e, n, 1);
    e.close().unwrap();
    mem
}

fn plain_read_only() -> Options {
    Options {
        read_only: true,
        ..small_options()
    }
}

#[test]
fn read_only_heals_nothing_and_becoming_writable_heals_the_superblock_copies() {
    let mem = closed_image(800);
    let dev: Arc<dyn BlockDevice> = mem.clone();
    // The start of the image overwritten: the backups are used.
    mem.with_bytes_mut(|b| b[..64 << 10].fill(0));
    let before = mem.to_bytes();
    let e = Engine::open(dev.clone(), plain_read_only()).unwrap();
    check_round(&e, 800, 1);
    assert!(
        mem.to_bytes() == before,
        "a read-only open healed the superblock copies"
    );
    e.set_read_only(false).unwrap();
    let healed = Superblock::locate(&*dev, false).unwrap();
    assert!(
        healed.problems.is_empty() && !healed.fell_back,
        "{healed:?}"
    );
    write_round(&e, 100, 2);
    e.close().unwrap();
    let e = Engine::open(dev, plain_read_only()).unwrap();
    assert!(e.stats().superblock_notes.is_empty());
    check_round(&e, 100, 2);
}

#[test]
fn a_format_1_image_is_refused_read_only_and_upgraded_gets_its_backups_and_label() {
    let mem = closed_image(500);
    let dev: Arc<dyn BlockDevice> = mem.clone();
    let backups = Superblock::read_newest(&*dev, false).unwrap().backups;
    // As format 1 left it: full keys, version 1 in the newest slot, the other slot and the
    // backups blank.
    downgrade_for_tests(dev.clone(), 1).unwrap();
    let sb = Superblock::read_newest(&*dev, false).unwrap();
    assert_eq!((sb.version, sb.backups.len()), (1, 0));
    let before = mem.to_bytes();
    let err = Engine::open(dev.clone(), plain_read_only()).err().unwrap();
    assert!(
        err.to_string()
            .contains("format 1 image: run `amaranth upgrade IMAGE`"),
        "{err}"
    );
    assert!(mem.to_bytes() == before, "a refused read-only open wrote");
    let r = upgrade(dev.clone(), &mut |_, _| {}).unwrap();
    assert_eq!((r.from_version, r.to_version), (1, 4));
    let sb = Superblock::read_newest(&*dev, false).unwrap();
    assert_eq!((sb.version, &sb.backups), (4, &backups));
    let e = Engine::open(dev.clone(), plain_read_only()).unwrap();
    check_round(&e, 500, 1);
    e.set_read_only(false).unwrap();
    e.set_identity(sb.uuid, "upgraded").unwrap();
    e.close().unwrap();
    // The newest copies, backups included, carry the label.
    let newest = Superblock::read_newest(&*dev, false).unwrap();
    assert_eq!(newest.label, "upgraded");
    for &blk in backups.iter().chain([newest.generation % 2].iter()) {
        let copy = mem.with_bytes_mut(|b| {
            Superblock::decode(&b[blk as usize * 4096..(blk as usize + 1) * 4096], 0)
        });
        assert_eq!(copy.unwrap(), newest, "copy at block {blk}");
    }
    mem.with_bytes_mut(|b| b[..8192].fill(0));
    let e = Engine::open(dev, plain_read_only()).unwrap();
    assert_eq!(e.identity().1, "upgraded");
}

/// Flips a byte in the last block of some non-root node of several blocks.
fn damage_a_node(mem: &MemDevice) {
    let probe = Arc::new(MemDevice::from_bytes(mem.to_bytes()));
    let e = Engine::open(probe, plain_read_only()).unwrap();
    let (_, block, blocks) = e
        .node_extents()
        .into_iter()
        .find(|&(id, _, blocks)| id != 1 && blocks > 1)
        .expect("a node of several blocks");
    let at = ((block + blocks - 1) * 4096 + 100) as usize;
    mem.with_bytes_mut(|b| b[at] ^= 0xff);
}

fn scan_all(e: &Engine) -> Result<(), Error> {
    e.scan(
        std::ops::Bound::Unbounded,
        std::ops::Bound::Unbounded,
        |_, _| true,
    )
}

#[test]
fn damage_found_read_only_is_not_written_and_refuses_becoming_writable() {
    let mem = closed_image(3000);
    let dev: Arc<dyn BlockDevice> = mem.clone();
    damage_a_node(&mem);
    let before = mem.to_bytes();
    let e = Engine::open(dev.clone(), plain_read_only()).unwrap();
    assert!(scan_all(&e).unwrap_err().is_damage());
    assert!(e.stats().known_damage.is_some());
    assert!(mem.to_bytes() == before, "read-only recorded the damage");
    let err = e.set_read_only(false).unwrap_err();
    assert!(matches!(err, Error::Damaged(_)), "{err}");
    assert!(e.is_read_only());
    assert!(matches!(e.put(b"x", b"y"), Err(Error::ReadOnly(_))));
    drop(e);
    assert!(mem.to_bytes() == before, "a refused switch wrote");
    // Damage recorded in the superblock by a read-write open: read-only opens, writable refused.
    let e = Engine::open(dev.clone(), small_options()).unwrap();
    assert!(scan_all(&e).is_err());
    drop(e);
    assert!(Superblock::read_newest(&*dev, false).unwrap().damaged);
    let before = mem.to_bytes();
    let e = Engine::open(dev.clone(), plain_read_only()).unwrap();
    let err = e.set_read_only(false).unwrap_err();
    assert!(matches!(err, Error::Damaged(_)), "{err}");
    assert!(err.to_string().contains("fsck --repair"), "{err}");
    drop(e);
    assert!(mem.to_bytes() == before);
}

#[test]
fn damage_found_after_a_switch_to_read_only_is_not_written() {
    let mem = closed_image(3000);
    let dev: Arc<dyn BlockDevice> = mem.clone();
    let e = Engine::open(dev.clone(), small_options()).unwrap();
    e.set_read_only(true).unwrap();
    damage_a_node(&mem);
    let before = mem.to_bytes();
    assert!(scan_all(&e).unwrap_err().is_damage());
    assert!(mem.to_bytes() == before, "read-only recorded the damage");
    assert!(matches!(e.set_read_only(false), Err(Error::Damaged(_))));
    e.close().unwrap();
    assert!(mem.to_bytes() == before);
}
