//! Inserts of path-like keys in memory: `d/usr/src/linux/drivers/dirNNNN/fileNNNNNNN` with
//! 100-byte values (1,000 files per directory), written in batches of puts (1,000 by default, as
//! in the first measurement of issue 9) on a `MemDevice` with a large cache, so the time measured
//! is the engine's CPU: message buffering, flushes, splits, leaf applies. Then random point reads.
//! Made to compare key lifting (docs/SURGERY.md §2.5) against a build without it.
//!
//! `cargo run --release -p amaranth-engine --example path_inserts -- [ORDER] [KEYS] [CACHE_MIB]
//! [BATCH]` ORDER is `random` (keys shuffled) or `create` (the order a file system creates them
//! in: directory after directory, files in order); BATCH is the number of puts per `Batch` (1:
//! one `Engine::put` per key); defaults `random`, 1000000, 1024, 1000. Prints inserts per second
//! (wall clock) and the process's CPU seconds (user + system, all threads) for the insert phase:
//! on a shared machine the CPU seconds are the steadier measure. The writer (main) thread's time
//! is split into running, runnable (waiting for a CPU) and blocked (waiting for the engine).

use std::sync::Arc;
use std::time::Instant;

use amaranth_device::MemDevice;
use amaranth_engine::{Batch, Engine, Format, Options};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn key(k: u64) -> Vec<u8> {
    format!("d/usr/src/linux/drivers/dir{:04}/file{:07}", k / 1000, k).into_bytes()
}

/// User + system CPU seconds of this process so far.
fn cpu_secs() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    assert_eq!(rc, 0, "getrusage");
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// This thread's time on a CPU and waiting for one (run queue), in seconds, from
/// `/proc/thread-self/schedstat`: wall time minus both is time the writer was blocked (latches,
/// back-pressure, the log).
fn sched_secs() -> (f64, f64) {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    let mut f = s
        .split_whitespace()
        .map(|x| x.parse::<f64>().unwrap_or(0.0) / 1e9);
    (f.next().unwrap_or(0.0), f.next().unwrap_or(0.0))
}

fn arg(i: usize, default: u64) -> u64 {
    std::env::args()
        .nth(i)
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let order_name = std::env::args().nth(1).unwrap_or_else(|| "random".into());
    let n = arg(2, 1_000_000);
    let cache_mib = arg(3, 1024) as usize;
    let batch = arg(4, 1000).max(1) as usize;
    let mut rng = SmallRng::seed_from_u64(1);
    let mut order: Vec<u64> = (0..n).collect();
    match order_name.as_str() {
        "random" => {
            for i in (1..order.len()).rev() {
                order.swap(i, rng.gen_range(0..=i));
            }
        }
        "create" => {}
        other => panic!("ORDER is random or create, not {other}"),
    }
    let dev = Arc::new(MemDevice::new(3 << 30));
    let opts = Options {
        cache_size: cache_mib << 20,
        ..Options::default()
    };
    let e = Engine::create(dev, Format::default(), opts).expect("create");
    let value = vec![7u8; 100];
    let (t, c, s0) = (Instant::now(), cpu_secs(), sched_secs());
    for chunk in order.chunks(batch) {
        if batch == 1 {
            e.put(&key(chunk[0]), &value).unwrap();
            continue;
        }
        let mut b = Batch::new();
        for &k in chunk {
            b.put(key(k), value.clone());
        }
        e.write_owned(b).unwrap();
    }
    e.sync().unwrap();
    let (secs, cpu, s1) = (t.elapsed().as_secs_f64(), cpu_secs() - c, sched_secs());
    let (run, queued) = (s1.0 - s0.0, s1.1 - s0.1);
    let st = e.stats();
    println!(
        "insert {order_name} (batch {batch}): {:.1} k/s, {:.2} s wall, {:.2} s CPU; writer thread \
         {run:.2} s running, {queued:.2} s runnable, {:.2} s blocked; height {}, nodes {}",
        n as f64 / secs / 1e3,
        secs,
        cpu,
        secs - run - queued,
        st.height,
        st.nodes
    );
    let reads = n / 5;
    let t = Instant::now();
    for _ in 0..reads {
        let k = key(rng.gen_range(0..n));
        assert!(e.get(&k).unwrap().is_some(), "a key lost");
    }
    println!(
        "get: {:.1} k/s",
        reads as f64 / t.elapsed().as_secs_f64() / 1e3
    );
    e.close().unwrap();
}
