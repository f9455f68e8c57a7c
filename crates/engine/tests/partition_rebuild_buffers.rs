//! Flushes that rebuild leaf partitions build them in the memory of partitions freed before (the
//! engine's buffer pool), not in newly mapped memory: overwriting data already in leaves replaces
//! partitions, and each replaced partition's buffer serves the next one built. One test in this
//! file: the pool is shared by the process.

use std::sync::Arc;

use amaranth_device::{BlockDevice, MemDevice};
use amaranth_engine::{Batch, Engine, Format, Options};

const MIB: usize = 1 << 20;
const VALUE: usize = 1000;

fn key(i: u64) -> Vec<u8> {
    format!("d/dir/{i:08}").into_bytes()
}

/// A permutation of `0..n` from a small linear congruential generator (seeded, reproducible).
fn shuffled(n: u64, seed: u64) -> Vec<u64> {
    let mut v: Vec<u64> = (0..n).collect();
    let mut s = seed;
    for i in (1..v.len()).rev() {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        v.swap(i, (s >> 33) as usize % (i + 1));
    }
    v
}

#[test]
fn rebuilt_partitions_reuse_the_buffers_of_replaced_ones() {
    let n = (24 * MIB / VALUE) as u64;
    let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(1 << 30));
    let opts = Options {
        cache_size: 96 * MIB,
        ..Options::default()
    };
    let e = Engine::create(dev, Format::default(), opts).unwrap();
    let write_all = |round: u8| {
        for chunk in shuffled(n, round as u64).chunks(256) {
            let mut b = Batch::new();
            for &i in chunk {
                b.put(key(i), vec![round; VALUE]);
            }
            e.write(&b).unwrap();
        }
    };
    write_all(1);
    e.checkpoint().unwrap();
    let before = e.stats();
    for round in 2..=4 {
        write_all(round);
    }
    e.checkpoint().unwrap();
    let st = e.stats();
    let reused = st.partition_buffers_reused - before.partition_buffers_reused;
    // Each overwrite round passes every byte through the leaves again: at least the data's size
    // in partitions (128 KiB or less each) is rebuilt per round.
    let rebuilt_at_least = 3 * (24 * MIB / (128 << 10)) as u64;
    println!(
        "flushes {}, bytes flushed {}, buffers reused {reused}, cache peak {} of {}",
        st.flushes - before.flushes,
        st.bytes_flushed - before.bytes_flushed,
        st.cache_peak_bytes,
        st.cache_budget
    );
    assert!(
        reused >= rebuilt_at_least / 2,
        "{reused} partition buffers reused, expected at least {}",
        rebuilt_at_least / 2
    );
    assert!(st.cache_peak_bytes <= st.cache_budget);
    for i in shuffled(n, 9).into_iter().take(1000) {
        assert_eq!(e.get(&key(i)).unwrap().as_deref(), Some(&[4u8; VALUE][..]));
    }
    e.close().unwrap();
}
