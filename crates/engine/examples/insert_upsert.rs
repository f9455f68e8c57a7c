//! The engine benchmark's insert and upsert phases in one small program, for profiling the CPU
//! cost per operation (`perf record -g`): random inserts of 24-byte keys with 100-byte values,
//! then 4-byte upserts into 4 KiB values, in batches of 1,000 as `bench/engine-bench` writes them
//! (its key and value layout), on an image file with the background threads on.
//!
//! `cargo run --release -p amaranth-engine --example insert_upsert -- [KEYS] [UPSERT_KEYS]
//! [UPSERTS] [CACHE_MIB]` (defaults 1000000, 50000, 1000000, 256). `INSERT_UPSERT_IMAGE` sets the
//! image path (default /var/tmp/amaranth-insert-upsert.img, removed at the end);
//! `INSERT_UPSERT_PHASES` = `insert`, `upsert` or both (default).

use std::sync::Arc;
use std::time::Instant;

use amaranth_device::FileDevice;
use amaranth_engine::{Batch, Engine, Format, Options, Patch};

const BATCH: u64 = 1000;

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The benchmark's key: set byte, 7 bytes of index, 16 bytes of hash.
fn key(set: u8, i: u64) -> Vec<u8> {
    let mut k = vec![0u8; 24];
    k[0] = set;
    k[1..8].copy_from_slice(&i.to_be_bytes()[1..8]);
    let h1 = splitmix(i ^ ((set as u64) << 56));
    k[8..16].copy_from_slice(&h1.to_le_bytes());
    k[16..24].copy_from_slice(&splitmix(h1).to_le_bytes());
    k
}

fn value(i: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    let mut s = splitmix(i);
    while out.len() < len {
        s = splitmix(s);
        out.extend_from_slice(&s.to_le_bytes());
    }
    out.truncate(len);
    out
}

fn arg(i: usize, default: u64) -> u64 {
    std::env::args()
        .nth(i)
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Runs `n` operations in batches made by `fill`, printing the rate.
fn phase(e: &Engine, name: &str, n: u64, mut fill: impl FnMut(&mut Batch, u64)) {
    let t = Instant::now();
    let mut i = 0;
    while i < n {
        let mut b = Batch::new();
        for j in i..(i + BATCH).min(n) {
            fill(&mut b, j);
        }
        e.write_owned(b).expect("write");
        i += BATCH;
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "{name}: {n} ops in {secs:.2} s, {:.0} ops/s",
        n as f64 / secs
    );
}

fn main() {
    let keys = arg(1, 1_000_000);
    let upsert_keys = arg(2, 50_000);
    let upserts = arg(3, 1_000_000);
    let cache_mib = arg(4, 256) as usize;
    let phases = std::env::var("INSERT_UPSERT_PHASES").unwrap_or_else(|_| "insert,upsert".into());
    let path = std::env::var("INSERT_UPSERT_IMAGE")
        .unwrap_or_else(|_| "/var/tmp/amaranth-insert-upsert.img".into());
    let path = std::path::Path::new(&path);
    let dev = Arc::new(FileDevice::create_image(path, 8 << 30).expect("create the image"));
    let opts = Options {
        cache_size: cache_mib << 20,
        ..Options::default()
    };
    let e = Engine::create(dev, Format::default(), opts).expect("create");
    if phases.contains("insert") {
        // Random keys (a hash of the operation's number; a few repeat).
        phase(&e, "insert", keys, |b, j| {
            let k = splitmix(j) % keys;
            b.put(key(0, k), value(k, 100));
        });
    }
    if phases.contains("upsert") {
        phase(&e, "upsert-load", upsert_keys, |b, j| {
            b.put(key(1, j), value(j, 4096));
        });
        phase(&e, "upsert", upserts, |b, j| {
            let r = splitmix(j ^ 0xABCD);
            b.upsert(
                key(1, r % upsert_keys),
                Patch::Write {
                    offset: ((r >> 32) % 1023) as u32 * 4,
                    data: (r as u32).to_le_bytes().to_vec(),
                },
            );
        });
    }
    e.sync().expect("sync");
    let st = e.stats();
    println!(
        "height {}, nodes {}, flushes {}, checkpoints {}, cache peak {} MiB",
        st.height,
        st.nodes,
        st.flushes,
        st.checkpoints,
        st.cache_peak_bytes >> 20
    );
    e.close().expect("close");
    let _ = std::fs::remove_file(path);
}
