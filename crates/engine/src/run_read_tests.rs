//! Point queries into shed partitions read one run of them (`node/runs.rs`): the answers are the
//! partition's, the bytes read are a few KiB per query, a partition read often is loaded whole,
//! and a run whose bytes changed on the device is refused.

use std::sync::Arc;

use amaranth_device::{BlockDevice, MemDevice};

use crate::{Batch, Engine, Format, Options};

fn options(cache: usize) -> Options {
    Options {
        cache_size: cache,
        background_threads: false,
        ..Options::default()
    }
}

/// 1 MiB nodes with the default 128 KiB partitions, so that an 8 MiB cache is allowed.
fn format() -> Format {
    Format {
        node_size: 1 << 20,
        ..Format::default()
    }
}

fn value(i: u32) -> Vec<u8> {
    let mut v = vec![(i % 253) as u8; 200 + (i as usize % 5) * 100];
    v[..4].copy_from_slice(&i.to_le_bytes());
    v
}

fn key(i: u32) -> Vec<u8> {
    format!("r/{i:08}").into_bytes()
}

/// Even keys 0..2n, written and checkpointed, closed (the odd ones are absent).
fn image(n: u32) -> Arc<MemDevice> {
    let dev = Arc::new(MemDevice::new(256 << 20));
    let e = Engine::create(dev.clone(), format(), options(64 << 20)).unwrap();
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        let mut b = Batch::new();
        for &i in chunk {
            b.put(key(2 * i), value(2 * i));
        }
        e.write(&b).unwrap();
    }
    e.close().unwrap();
    dev
}

fn xorshift(x: &mut u32) -> u32 {
    *x ^= *x << 13;
    *x ^= *x >> 17;
    *x ^= *x << 5;
    *x
}

#[test]
fn point_queries_into_shed_partitions_read_one_run_and_answer_as_the_partition() {
    let n = 60_000u32; // ~24 MB of values, three times the cache
    let dev = image(n);
    let e = Engine::open(dev, options(8 << 20)).unwrap();
    let before = e.stats();
    let mut x = 0x2545_f491u32;
    for _ in 0..20_000 {
        let i = xorshift(&mut x) % (2 * n);
        let got = e.get(&key(i)).unwrap();
        let want = i.is_multiple_of(2).then(|| value(i));
        assert_eq!(got, want, "key {i}");
    }
    let st = e.stats();
    let runs = st.run_reads - before.run_reads;
    let loads = st.partition_loads - before.partition_loads;
    let read = st.node_bytes_read - before.node_bytes_read;
    println!(
        "run reads {runs}, partition loads {loads}, bytes read {read} ({} per query)",
        read / 20_000
    );
    assert!(runs > 5_000, "{runs} queries answered from runs");
    assert!(
        read / 20_000 < 64 << 10,
        "{} bytes read per query: runs are not read alone",
        read / 20_000
    );
    assert!(st.cache_peak_bytes <= st.cache_budget);
    e.close().unwrap();
}

#[test]
fn a_partition_read_often_is_loaded_whole() {
    let dev = image(20_000);
    let e = Engine::open(dev, options(8 << 20)).unwrap();
    // Read every key once: the cache fills and sheds, and shed partitions keep runs.
    for i in 0..20_000 {
        assert!(e.get(&key(2 * i)).unwrap().is_some());
    }
    // Then one key again and again: run reads up to about the partition's size in bytes (one
    // per run of it), then its partition is loaded and stays.
    let before = e.stats();
    for _ in 0..100 {
        assert_eq!(e.get(&key(2)).unwrap(), Some(value(2)));
    }
    let st = e.stats();
    let most = (format().partition_size / crate::node::RUN_BYTES + 1) as u64;
    assert!(st.run_reads - before.run_reads <= most);
    assert!(st.partition_loads - before.partition_loads <= 1);
    e.close().unwrap();
}

#[test]
fn a_run_changed_on_the_device_is_refused() {
    let n = 60_000u32;
    let dev = image(n);
    let e = Engine::open(dev.clone(), options(8 << 20)).unwrap();
    for i in 0..n {
        e.get(&key(2 * i)).unwrap();
    }
    // Find a shed partition with runs, and damage a byte in its middle on the device.
    let tree = e.tree();
    let mut damaged = None;
    for cn in tree.cache.all() {
        let g = cn.read();
        let crate::node::Body::Leaf(l) = &g.body else {
            continue;
        };
        for (p, slot) in l.parts.iter().enumerate() {
            let st = slot.state.lock();
            if let (None, Some(_), Some(loc)) = (&st.data, &st.runs, st.loc) {
                let ext = tree.store.location(cn.id).unwrap();
                // Inside the first run: the first query into the partition reads that run.
                let at = ext.offset() + loc.offset as u64 + 100;
                let first = if p == 0 {
                    None
                } else {
                    Some(l.pivots[p - 1].clone())
                };
                damaged = Some((at, first));
                break;
            }
        }
        if damaged.is_some() {
            break;
        }
    }
    let (at, _first) = damaged.expect("a shed partition with runs");
    let block = at / 4096 * 4096;
    let mut buf = amaranth_device::AlignedBuf::zeroed(4096);
    dev.read_at(block, &mut buf).unwrap();
    buf[(at - block) as usize] ^= 0x5a;
    dev.write_at(block, &buf).unwrap();
    // Queries in key order: the first ones into the partition read the damaged run and are
    // refused by its checksum, later ones load the partition whole and are refused by the
    // partition's; never a wrong answer.
    let (mut refused, mut by_run) = (0, 0);
    for i in 0..n {
        match e.get(&key(2 * i)) {
            Ok(v) => assert_eq!(v, Some(value(2 * i)), "key {}", 2 * i),
            // Refused by the run's checksum, or by the partition's own when it is loaded whole.
            Err(err) => {
                assert!(err.to_string().contains("checksum"), "{err}");
                refused += 1;
                by_run += usize::from(err.to_string().contains("run at"));
            }
        }
    }
    assert!(
        by_run > 0,
        "the damaged run was never read ({refused} refused)"
    );
}
