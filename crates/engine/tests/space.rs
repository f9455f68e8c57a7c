//! Space accounting: what [`Engine::space_use`] reports follows the writes at every moment (data
//! in dirty nodes counts before any checkpoint writes it), does not jump when a checkpoint or a
//! reopen writes it, and the space of deleted data comes back by the next checkpoint.

use std::sync::Arc;

use amaranth_device::MemDevice;
use amaranth_engine::{Engine, Format, Options};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const MIB: u64 = 1 << 20;

fn options() -> Options {
    Options {
        cache_size: 160 << 20,
        background_threads: false,
        ..Options::default()
    }
}

fn key(i: u64) -> Vec<u8> {
    format!("file{:03}/block{:08}", i % 20, i).into_bytes()
}

#[test]
fn used_follows_writes_and_does_not_jump_at_reopen() {
    let dev = Arc::new(MemDevice::new(384 << 20));
    let format = Format {
        log_size: Some(64 << 20),
        ..Format::default()
    };
    let e = Engine::create(dev.clone(), format, options()).unwrap();
    let used0 = e.space_use().used();
    let mut rng = SmallRng::seed_from_u64(16);
    let mut value = vec![0u8; 4096];
    let mut written = 0u64;
    let mut worst = f64::MAX;
    for i in 0..(96 * MIB / 4096) {
        rng.fill(&mut value[..]);
        e.put(&key(i), &value).unwrap();
        written += 4096;
        if written.is_multiple_of(4 * MIB) {
            e.sync().unwrap();
            let s = e.space_use();
            let grown = s.used() - used0;
            worst = worst.min(grown as f64 / written as f64);
            // Keys, entry headers and partition padding: a few percent over the data; the
            // buffers' copies of messages not yet flushed are replaced, not added, when they
            // reach the leaves.
            assert!(
                grown >= written && grown <= written + written / 8 + 8 * MIB,
                "after {} MiB written (and synced) used grew by {} MiB: {s:?}",
                written / MIB,
                grown / MIB
            );
        }
    }
    e.check_space_accounting();
    let before = e.space_use().used();
    let checkpoints = e.stats().checkpoints;
    eprintln!(
        "{} MiB written, used {} MiB (lowest ratio seen {worst:.3}), {checkpoints} checkpoints",
        written / MIB,
        (before - used0) / MIB
    );
    e.close().unwrap();
    let e = Engine::open(dev, options()).unwrap();
    let after = e.space_use().used();
    eprintln!("after reopen: used {} MiB", (after - used0) / MIB);
    let diff = after.abs_diff(before);
    assert!(
        diff <= before / 50,
        "used changed from {} to {} MiB at reopen",
        before / MIB,
        after / MIB
    );
    assert_eq!(e.space_use().dirty_next, 0);
}

fn mid_format() -> Format {
    Format {
        node_size: 256 << 10,
        partition_size: 32 << 10,
        max_key_len: 1024,
        max_value_len: 8192,
        log_size: Some(32 << 20),
        ..Format::default()
    }
}

fn fill(e: &Engine, n: u64) {
    let mut rng = SmallRng::seed_from_u64(n);
    let mut value = vec![0u8; 4096];
    for i in 0..n {
        rng.fill(&mut value[..]);
        e.put(&key(i), &value).unwrap();
    }
}

/// Deleted data sitting under range deletes that were not pushed down yet: a close pushes them
/// down, so the image does not keep the deleted data (the next session would not know it is
/// there). The 5% kept take about 10% of the space (tree and partition overhead of a family
/// spread over leaves shared with deleted ones); before, all of it stayed.
#[test]
fn deleted_data_does_not_stay_across_a_reopen() {
    let dev = Arc::new(MemDevice::new(256 << 20));
    let e = Engine::create(dev.clone(), mid_format(), options()).unwrap();
    let used0 = e.space_use().used();
    fill(&e, 64 * MIB / 4096);
    e.checkpoint().unwrap();
    let full = e.space_use().used() - used0;
    // Delete all but one of the 20 key families.
    e.range_delete(b"file001", b"file999").unwrap();
    e.close().unwrap();
    let e = Engine::open(dev, options()).unwrap();
    let left = e.space_use().used() - used0;
    eprintln!(
        "{} MiB stored, {} KiB after deleting 95% and a reopen",
        full / MIB,
        left >> 10
    );
    assert!(
        left <= full / 8,
        "{} of {} MiB still used after deleting 95% and a reopen",
        left / MIB,
        full / MIB
    );
}

/// With the background threads: space freed by range deletes is free once the next periodic
/// checkpoint completes (a pass pushes range deletes down before every checkpoint), without
/// waiting for the engine to be idle.
#[test]
fn deleted_space_is_free_after_the_next_checkpoint() {
    let dev = Arc::new(MemDevice::new(256 << 20));
    let opts = Options {
        background_threads: true,
        checkpoint_interval: std::time::Duration::from_millis(100),
        ..options()
    };
    let e = Engine::create(dev, mid_format(), opts).unwrap();
    let used0 = e.space_use().used();
    fill(&e, 64 * MIB / 4096);
    e.sync().unwrap();
    let full = e.space_use().used() - used0;
    e.range_delete(b"file001", b"file999").unwrap();
    // Keep writing (so the engine is never idle) until two more checkpoints completed: the first
    // may have started before the delete.
    let start = e.stats().checkpoints;
    let mut i = 1 << 30;
    while e.stats().checkpoints < start + 2 {
        e.put(&key(i), b"busy").unwrap();
        i += 1;
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let left = e.space_use().used() - used0;
    eprintln!(
        "{} MiB stored, {} KiB two checkpoints after deleting 95%",
        full / MIB,
        left >> 10
    );
    assert!(
        left <= full / 8,
        "{} of {} MiB still used two checkpoints after deleting 95%",
        left / MIB,
        full / MIB
    );
}
