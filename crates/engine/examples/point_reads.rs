//! A quick measurement of the engine on an image file: random inserts (24-byte keys, 100-byte
//! values), random 4-byte upserts, then cold random point reads with the I/O each one costs.
//! Smaller and faster than `bench/engine-bench` (no peers, no cgroup); for looking at one change.
//!
//! `cargo run --release -p amaranth-engine --example point_reads -- [KEYS] [CACHE_MIB] [READS]`
//! (defaults 2000000, 64, 5000). `POINT_READS_IMAGE` sets the image path (default
//! /var/tmp/amaranth-point-reads.img, removed at the end); `POINT_READS_QUIET=1` turns the
//! background threads off during the reads (no cleaner competing with them).

use std::sync::Arc;
use std::time::Instant;

use amaranth_device::FileDevice;
use amaranth_engine::{Engine, Format, Options, Patch};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn key(k: u64, n: u64) -> String {
    format!("{:024}", k * 2_654_435_761 % (n * 10))
}

fn arg(i: usize, default: u64) -> u64 {
    std::env::args()
        .nth(i)
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let n = arg(1, 2_000_000);
    let cache_mib = arg(2, 64) as usize;
    let reads = arg(3, 5000);
    let path = std::env::var("POINT_READS_IMAGE")
        .unwrap_or_else(|_| "/var/tmp/amaranth-point-reads.img".into());
    let path = std::path::Path::new(&path);
    let dev = Arc::new(FileDevice::create_image(path, 8 << 30).expect("create the image"));
    let mut opts = Options {
        cache_size: cache_mib << 20,
        ..Options::default()
    };
    let e = Engine::create(dev.clone(), Format::default(), opts.clone()).expect("create");
    let mut rng = SmallRng::seed_from_u64(1);
    let mut order: Vec<u64> = (0..n).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.gen_range(0..=i));
    }
    let value = vec![7u8; 100];
    let t = Instant::now();
    for &k in &order {
        e.put(key(k, n).as_bytes(), &value).unwrap();
    }
    e.sync().unwrap();
    let st = e.stats();
    println!(
        "insert: {:.0} ops/s, write amplification {:.2}, height {}, nodes {}, cache peak {} MiB of {}",
        n as f64 / t.elapsed().as_secs_f64(),
        st.write_amplification,
        st.height,
        st.nodes,
        st.cache_peak_bytes >> 20,
        cache_mib
    );
    let t = Instant::now();
    let m = n / 4;
    for _ in 0..m {
        let k = key(rng.gen_range(0..n), n);
        let patch = Patch::Write {
            offset: rng.gen_range(0..96),
            data: vec![1, 2, 3, 4],
        };
        e.upsert(k.as_bytes(), patch).unwrap();
    }
    e.sync().unwrap();
    println!("upsert: {:.0} ops/s", m as f64 / t.elapsed().as_secs_f64());
    e.checkpoint().unwrap();
    let e = if std::env::var("POINT_READS_QUIET").as_deref() == Ok("1") {
        e.close().unwrap();
        opts.background_threads = false;
        Engine::open(dev, opts).expect("reopen")
    } else {
        e
    };
    let before = e.stats();
    let t = Instant::now();
    for _ in 0..reads {
        let k = key(rng.gen_range(0..n), n);
        assert!(e.get(k.as_bytes()).unwrap().is_some(), "key {k} lost");
    }
    let secs = t.elapsed().as_secs_f64();
    let after = e.stats();
    let per = |a: u64, b: u64| (a - b) as f64 / reads as f64;
    println!(
        "get: {:.0} ops/s; per read: {:.2} node/sub-block reads, {:.0} bytes read, {:.2} cache misses",
        reads as f64 / secs,
        per(after.node_reads, before.node_reads),
        per(after.node_bytes_read, before.node_bytes_read),
        per(after.cache_misses, before.cache_misses),
    );
    println!(
        "cache peak {} MiB (bound {} MiB)",
        after.cache_peak_bytes.max(st.cache_peak_bytes) >> 20,
        cache_mib
    );
    e.close().unwrap();
    let _ = std::fs::remove_file(path);
}
