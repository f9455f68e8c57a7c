//! Read-ahead for sequential scans: the leaves after a scan that continues another are read in
//! the background and the next scans use them (counted as prefetch hits); results are the same
//! with and without it, also under concurrent writes; the cache bound holds.
//!
//! The model test prints its seed; replay one with `AMARANTH_SEED=<seed> cargo test --release
//! -p amaranth-engine --test read_ahead`.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use amaranth_device::{BlockDevice, MemDevice};
use amaranth_engine::{Batch, Engine, Format, Options};

const MIB: usize = 1 << 20;
const BLOCK: usize = 4096;
/// Blocks per scan: a 1 MiB FUSE read.
const PER_SCAN: u64 = 256;

fn key(blk: u64) -> Vec<u8> {
    format!("d/file/{blk:010}").into_bytes()
}

/// A 4 KiB value naming its block and version (checkable on its own).
fn value(blk: u64, version: u32) -> Vec<u8> {
    let mut v = vec![(blk % 251) as u8; BLOCK];
    v[..8].copy_from_slice(&blk.to_le_bytes());
    v[8..12].copy_from_slice(&version.to_le_bytes());
    v
}

fn options(cache: usize, read_ahead: usize) -> Options {
    Options {
        cache_size: cache,
        read_ahead,
        ..Options::default()
    }
}

/// An image holding a file of `blocks` 4 KiB blocks (version 0), closed (nothing in memory).
fn image(blocks: u64) -> Arc<dyn BlockDevice> {
    let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(1 << 30));
    let e = Engine::create(dev.clone(), Format::default(), options(64 * MIB, 0)).unwrap();
    for chunk in (0..blocks).collect::<Vec<_>>().chunks(64) {
        let mut b = Batch::new();
        for &blk in chunk {
            b.put(key(blk), value(blk, 0));
        }
        e.write(&b).unwrap();
    }
    e.close().unwrap();
    dev
}

/// Reads blocks `[from, to)` in 1 MiB scans, in order; `pause` runs after each scan.
fn read_in_order(e: &Engine, from: u64, to: u64, mut pause: impl FnMut(u64)) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut at = from;
    while at < to {
        let end = (at + PER_SCAN).min(to);
        e.scan(
            Bound::Included(&key(at)),
            Bound::Excluded(&key(end)),
            |_, v| {
                out.push(v.to_vec());
                true
            },
        )
        .unwrap();
        pause(at);
        at = end;
    }
    out
}

#[test]
fn sequential_scans_use_leaves_read_ahead_and_read_each_byte_once() {
    let blocks = 48 * MIB as u64 / BLOCK as u64;
    let dev = image(blocks);
    let mut results = Vec::new();
    for read_ahead in [0, 4] {
        let e = Engine::open(dev.clone(), options(256 * MIB, read_ahead)).unwrap();
        let before = e.stats().node_bytes_read;
        // After each scan the read-ahead it started completes, so the next leaves are in memory
        // before the scans reach them.
        let got = read_in_order(&e, 0, blocks, |_| e.wait_read_ahead());
        let st = e.stats();
        let read = st.node_bytes_read - before;
        eprintln!(
            "read_ahead {read_ahead}: {} prefetch loads, {} hits, {read} bytes read for {} (x{:.3})",
            st.prefetch_loads,
            st.prefetch_hits,
            blocks * BLOCK as u64,
            read as f64 / (blocks * BLOCK as u64) as f64
        );
        if read_ahead == 0 {
            assert_eq!((st.prefetch_loads, st.prefetch_hits), (0, 0));
        } else {
            // 12+ leaves: all but the first two are read ahead and then used.
            assert!(st.prefetch_loads >= 8, "{} loads", st.prefetch_loads);
            assert!(st.prefetch_hits >= 8, "{} hits", st.prefetch_hits);
            assert!(st.prefetch_hits <= st.prefetch_loads);
        }
        // No leaf read twice: the bytes read stay near the data's size.
        assert!(
            read < blocks * BLOCK as u64 * 11 / 10,
            "{read} bytes read for {} of data",
            blocks * BLOCK as u64
        );
        assert_eq!(got.len() as u64, blocks);
        for (i, v) in got.iter().enumerate() {
            assert_eq!(v, &value(i as u64, 0), "block {i}");
        }
        results.push(got);
        e.close().unwrap();
    }
    assert_eq!(results[0], results[1]);
}

#[test]
fn random_scans_read_nothing_ahead() {
    let blocks = 16 * MIB as u64 / BLOCK as u64;
    let dev = image(blocks);
    let e = Engine::open(dev, options(256 * MIB, 4)).unwrap();
    for i in 0..40u64 {
        // Even blocks only: no scan starts where another ended (block + 1), so none is sequential.
        let blk = 2 * ((i * 7919) % (blocks / 2));
        let before = e.stats();
        e.scan(
            Bound::Included(&key(blk)),
            Bound::Excluded(&key(blk + 1)),
            |_, _| true,
        )
        .unwrap();
        let after = e.stats();
        // What a cold point read of a block costs (the first reads also load the upper nodes).
        eprintln!(
            "point read {i} (block {blk}): {} device reads, {} bytes",
            after.node_reads - before.node_reads,
            after.node_bytes_read - before.node_bytes_read
        );
    }
    e.wait_read_ahead();
    assert_eq!(e.stats().prefetch_loads, 0);
    e.close().unwrap();
}

#[test]
fn read_ahead_keeps_to_the_cache_bound() {
    let blocks = 96 * MIB as u64 / BLOCK as u64;
    let dev = image(blocks);
    // The widest window asked for; the cache allows 32 MiB / 4 = two 4 MiB nodes ahead.
    let e = Engine::open(dev, options(32 * MIB, 1000)).unwrap();
    let got = read_in_order(&e, 0, blocks, |_| e.wait_read_ahead());
    let st = e.stats();
    eprintln!(
        "peak {} of {} bytes, {} prefetch loads, {} hits",
        st.cache_peak_bytes, st.cache_budget, st.prefetch_loads, st.prefetch_hits
    );
    assert!(st.prefetch_hits > 0);
    // A window wider than the cache allows evicts leaves read ahead before the scans reach them
    // (measured without the bound: 75 loads, 49 hits) and reads them again.
    assert!(
        st.prefetch_loads <= st.prefetch_hits + 2,
        "{} leaves read ahead, {} used",
        st.prefetch_loads,
        st.prefetch_hits
    );
    assert!(
        st.node_bytes_read < blocks * BLOCK as u64 * 11 / 10,
        "{} bytes read for {} of data",
        st.node_bytes_read,
        blocks * BLOCK as u64
    );
    assert!(
        st.cache_peak_bytes <= st.cache_budget,
        "peak {} above the bound {}",
        st.cache_peak_bytes,
        st.cache_budget
    );
    assert_eq!(got.len() as u64, blocks);
    e.close().unwrap();
}

#[test]
fn read_ahead_goes_on_once_the_read_has_filled_the_cache() {
    // Twice the cache: past the first half, room for a leaf read ahead is made by
    // shedding the partitions the scans have used (before, read-ahead waited for room a reader's
    // own load made, and with a small cache that was rarely there: 16 of 53 leaves read ahead in
    // the second read with this cache, 5 of 53 with a 32 MiB one).
    let blocks = 96 * MIB as u64 / BLOCK as u64;
    let dev = image(blocks);
    let e = Engine::open(dev, options(48 * MIB, 4)).unwrap();
    let got = read_in_order(&e, 0, blocks, |_| e.wait_read_ahead());
    let st = e.stats();
    let leaves = st.nodes - 1;
    // Read again: the leaves' skeletons stayed in memory, and partitions read ahead into them
    // must not be the first shed for the next leaf (they were: 115 loads, 48 used).
    let again = read_in_order(&e, 0, blocks, |_| e.wait_read_ahead());
    let st2 = e.stats();
    let (loads2, hits2) = (
        st2.prefetch_loads - st.prefetch_loads,
        st2.prefetch_hits - st.prefetch_hits,
    );
    eprintln!("second read: {loads2} prefetch loads, {hits2} hits");
    assert!(
        hits2 >= leaves * 3 / 4,
        "second read: {hits2} of {leaves} used"
    );
    assert!(
        loads2 <= hits2 + 2,
        "second read: {loads2} loads, {hits2} hits"
    );
    assert!(again == got);
    eprintln!(
        "{leaves} leaves, {} prefetch loads, {} hits, peak {} of {}",
        st.prefetch_loads, st.prefetch_hits, st.cache_peak_bytes, st.cache_budget
    );
    assert!(
        st.prefetch_hits >= leaves * 3 / 4,
        "{} of {leaves} leaves read ahead and used",
        st.prefetch_hits
    );
    assert!(st.prefetch_loads <= st.prefetch_hits + 2);
    assert!(st.cache_peak_bytes <= st.cache_budget);
    assert!(st.node_bytes_read < blocks * BLOCK as u64 * 11 / 10);
    assert_eq!(got.len() as u64, blocks);
    e.close().unwrap();
}

#[test]
fn sequential_scans_under_concurrent_overwrites_see_whole_blocks() {
    let blocks = 32 * MIB as u64 / BLOCK as u64;
    let dev = image(blocks);
    let opts = Options {
        checkpoint_interval: Duration::from_millis(200),
        ..options(40 * MIB, 4)
    };
    let e = Arc::new(Engine::open(dev, opts).unwrap());
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let (e, done) = (e.clone(), done.clone());
        std::thread::spawn(move || {
            let mut x: u64 = 0x2545_f491_4f6c_dd1d;
            let mut version = 1u32;
            while !done.load(Ordering::Relaxed) {
                let mut b = Batch::new();
                for _ in 0..16 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let blk = x % blocks;
                    b.put(key(blk), value(blk, version));
                }
                e.write(&b).unwrap();
                version += 1;
            }
        })
    };
    for _ in 0..3 {
        let got = read_in_order(&e, 0, blocks, |_| {});
        assert_eq!(got.len() as u64, blocks, "a block went missing");
        for (i, v) in got.iter().enumerate() {
            let blk = u64::from_le_bytes(v[..8].try_into().unwrap());
            let version = u32::from_le_bytes(v[8..12].try_into().unwrap());
            assert_eq!(blk, i as u64);
            assert_eq!(v, &value(blk, version), "block {i} torn");
        }
    }
    done.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let st = e.stats();
    eprintln!(
        "{} prefetch loads, {} hits",
        st.prefetch_loads, st.prefetch_hits
    );
    Arc::into_inner(e).unwrap().close().unwrap();
}

/// Random writes, deletes, range deletes and cold reopenings against a model, read back by
/// sequential runs of scans of random sizes (read-ahead on, sometimes waited for).
#[test]
fn model_sequential_reads_match_with_read_ahead() {
    let seed = std::env::var("AMARANTH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("seed {seed} (AMARANTH_SEED={seed} to replay)");
    let mut x = seed | 1;
    let mut rnd = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let blocks = 24 * MIB as u64 / BLOCK as u64;
    let dev = image(blocks);
    let mut model: BTreeMap<u64, Vec<u8>> = (0..blocks).map(|b| (b, value(b, 0))).collect();
    let mut e = Engine::open(dev.clone(), options(48 * MIB, 3)).unwrap();
    for step in 0..60u32 {
        match rnd(6) {
            0 => {
                let mut b = Batch::new();
                let start = rnd(blocks);
                for blk in start..(start + rnd(300)).min(blocks) {
                    b.put(key(blk), value(blk, step + 1));
                    model.insert(blk, value(blk, step + 1));
                }
                e.write(&b).unwrap();
            }
            1 => {
                let blk = rnd(blocks);
                let mut b = Batch::new();
                b.delete(key(blk));
                model.remove(&blk);
                e.write(&b).unwrap();
            }
            2 => {
                let (lo, n) = (rnd(blocks), rnd(200));
                let mut b = Batch::new();
                b.range_delete(key(lo), key(lo + n));
                e.write(&b).unwrap();
                for blk in lo..lo + n {
                    model.remove(&blk);
                }
            }
            3 => {
                e.close().unwrap();
                e = Engine::open(dev.clone(), options(48 * MIB, 3)).unwrap();
            }
            _ => {
                let mut at = rnd(blocks);
                let end = (at + rnd(blocks)).min(blocks);
                let wait = rnd(2) == 0;
                while at < end {
                    let next = (at + 1 + rnd(2 * PER_SCAN)).min(end);
                    let mut got = Vec::new();
                    e.scan(
                        Bound::Included(&key(at)),
                        Bound::Excluded(&key(next)),
                        |k, v| {
                            got.push((k.to_vec(), v.to_vec()));
                            true
                        },
                    )
                    .unwrap();
                    let want: Vec<(Vec<u8>, Vec<u8>)> = model
                        .range(at..next)
                        .map(|(b, v)| (key(*b), v.clone()))
                        .collect();
                    assert!(
                        got == want,
                        "seed {seed} step {step}: scan [{at}, {next}) differs"
                    );
                    if wait {
                        e.wait_read_ahead();
                    }
                    at = next;
                }
            }
        }
    }
    let st = e.stats();
    eprintln!(
        "seed {seed}: {} prefetch loads, {} hits",
        st.prefetch_loads, st.prefetch_hits
    );
    e.close().unwrap();
}

#[test]
fn a_forward_range_iteration_reads_ahead() {
    let blocks = 32 * MIB as u64 / BLOCK as u64;
    let dev = image(blocks);
    let e = Engine::open(dev, options(256 * MIB, 4)).unwrap();
    let mut n = 0u64;
    for (i, kv) in e
        .range(Bound::Included(&key(0)), Bound::Excluded(&key(blocks)))
        .enumerate()
    {
        let (k, v) = kv.unwrap();
        assert_eq!(k, key(i as u64));
        assert_eq!(v, value(i as u64, 0));
        if (i as u64).is_multiple_of(PER_SCAN) {
            e.wait_read_ahead();
        }
        n += 1;
    }
    assert_eq!(n, blocks);
    let st = e.stats();
    eprintln!(
        "{} prefetch loads, {} hits",
        st.prefetch_loads, st.prefetch_hits
    );
    assert!(st.prefetch_hits >= 4, "{} hits", st.prefetch_hits);
    e.close().unwrap();
}

/// A device whose reads take time (about 1 GB/s plus a fixed cost), so that read-ahead workers
/// and readers overlap as they do on a disk.
struct SlowDevice(Arc<dyn BlockDevice>);

impl BlockDevice for SlowDevice {
    fn len(&self) -> u64 {
        self.0.len()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        std::thread::sleep(Duration::from_micros(100 + buf.len() as u64 / 1000));
        self.0.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        self.0.write_at(offset, buf)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.0.flush()
    }
    fn describe(&self) -> String {
        "slow memory device".into()
    }
    fn io_stats(&self) -> amaranth_device::IoStats {
        self.0.io_stats()
    }
}

/// Reads blocks `[0, blocks)` in 1 MiB scans taken in order by `readers` threads (several
/// scans in flight, as the kernel's read-ahead sends FUSE reads), never waiting for read-ahead.
fn read_concurrently(e: &Engine, blocks: u64, readers: u64) {
    let next = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..readers {
            s.spawn(|| loop {
                let at = next.fetch_add(PER_SCAN, Ordering::SeqCst);
                if at >= blocks {
                    break;
                }
                let end = (at + PER_SCAN).min(blocks);
                let mut n = 0;
                e.scan(
                    Bound::Included(&key(at)),
                    Bound::Excluded(&key(end)),
                    |k, v| {
                        assert_eq!(k, key(at + n).as_slice());
                        assert_eq!(v, value(at + n, 0).as_slice());
                        n += 1;
                        true
                    },
                )
                .unwrap();
                assert_eq!(n, end - at);
            });
        }
    });
}

#[test]
fn every_leaf_read_ahead_is_used_by_readers_that_do_not_wait() {
    // A small cache (12 leaves, 3 read ahead) and a device that takes time, so that read-ahead
    // workers race the readers. Before, read-ahead shed the leaves an earlier read-ahead had
    // loaded for the readers, and marked leaves a reader had loaded itself as read ahead (after
    // their use): 58 leaves read ahead, 51 used, 5 shed unused with one reader; 57, 25 and 18
    // with four.
    let blocks = 128 * MIB as u64 / BLOCK as u64;
    let dev = image(blocks);
    for readers in [1u64, 4] {
        let slow: Arc<dyn BlockDevice> = Arc::new(SlowDevice(dev.clone()));
        let e = Engine::open(slow, options(48 * MIB, 4)).unwrap();
        let before = e.stats().node_bytes_read;
        read_concurrently(&e, blocks, readers);
        e.wait_read_ahead();
        let st = e.stats();
        let read = st.node_bytes_read - before;
        let leaves = st.nodes - 1;
        eprintln!(
            "{readers} readers: {leaves} leaves, {} read ahead, {} used, {} shed unused, \
             {read} bytes read (x{:.3})",
            st.prefetch_loads,
            st.prefetch_hits,
            st.prefetch_shed,
            read as f64 / (blocks * BLOCK as u64) as f64
        );
        // One reader never needs the room of a leaf read ahead for it. Several readers pin
        // and window more of the 12 leaves, and a reader's own miss sheds to 90% of the bound
        // (`Tree::make_room`), leaves read ahead and unused last: when a thread is descheduled
        // (CI saw one such leaf in 52) that can leave nothing else to shed. The bound wins over
        // read-ahead; what this test guards is the ranking, which before shed 18 of 57.
        let slack = if readers == 1 { 0 } else { 2 };
        assert!(
            st.prefetch_shed <= slack,
            "{} leaves read ahead and shed before use",
            st.prefetch_shed
        );
        assert!(
            st.prefetch_loads.saturating_sub(st.prefetch_hits) <= slack,
            "{} leaves read ahead and never used",
            st.prefetch_loads.saturating_sub(st.prefetch_hits)
        );
        assert!(
            st.prefetch_hits >= leaves / 2,
            "{} of {leaves} read ahead",
            st.prefetch_hits
        );
        assert!(read < blocks * BLOCK as u64 * 11 / 10);
        assert!(st.cache_peak_bytes <= st.cache_budget);
        e.close().unwrap();
    }
}
