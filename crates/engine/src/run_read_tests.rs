//! Point queries into shed partitions read one run of them (`node/runs.rs`): the answers are the
//! partition's, the bytes read are a few KiB per query, a partition read often is loaded whole,
//! and a run whose bytes changed on the device is refused. The same for shed child buffers of
//! internal nodes, whose messages for the key lie in one run.

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
    flip(&dev, at);
    // Queries in key order: the first ones into the partition read the damaged run and are
    // refused by its checksum, later ones load the partition whole and are refused by the
    // partition's; never a wrong answer.
    let (refused, by_run) = refusals(&e, 2 * n, "partition", |i| {
        i.is_multiple_of(2).then(|| value(i))
    });
    assert!(
        by_run > 0,
        "the damaged run was never read ({refused} refused)"
    );
}

/// Changes the byte at `at` on the device.
fn flip(dev: &MemDevice, at: u64) {
    let block = at / 4096 * 4096;
    let mut buf = amaranth_device::AlignedBuf::zeroed(4096);
    dev.read_at(block, &mut buf).unwrap();
    buf[(at - block) as usize] ^= 0x5a;
    dev.write_at(block, &buf).unwrap();
}

/// Asks keys `0..n` in order after damage: each answer is `want`'s or a checksum error, never
/// another value. Returns how many were refused, and how many of those by the checksum of a run
/// of a `what` ("partition" or "buffer").
fn refusals(
    e: &Engine,
    n: u32,
    what: &str,
    want: impl Fn(u32) -> Option<Vec<u8>>,
) -> (usize, usize) {
    let (mut refused, mut by_run) = (0, 0);
    for i in 0..n {
        match e.get(&key(i)) {
            Ok(v) => assert_eq!(v, want(i), "key {i}"),
            // Refused by a run's checksum, or by the sub-block's own when it is loaded whole.
            Err(err) => {
                let err = err.to_string();
                assert!(err.contains("checksum"), "{err}");
                refused += 1;
                by_run += usize::from(err.contains(what) && err.contains("run at"));
            }
        }
    }
    (refused, by_run)
}

/// Even keys 0..2n written (`image`), then in a second session every fourth overwritten, every
/// sixth deleted and every tenth patched, so that internal nodes' buffers hold messages for a
/// good share of the keys when it closes. The model's answer for key `i`.
fn updated(i: u32) -> Option<Vec<u8>> {
    if !i.is_multiple_of(2) || i.is_multiple_of(6) {
        return None;
    }
    let mut v = if i.is_multiple_of(4) {
        value(i + 1)
    } else {
        value(i)
    };
    if i.is_multiple_of(10) {
        v[5..8].copy_from_slice(b"abc");
    }
    Some(v)
}

fn updated_image(n: u32) -> Arc<MemDevice> {
    let dev = image(n);
    let e = Engine::open(dev.clone(), options(64 << 20)).unwrap();
    for chunk in (0..2 * n).step_by(2).collect::<Vec<_>>().chunks(500) {
        let mut b = Batch::new();
        for &i in chunk {
            if i.is_multiple_of(4) {
                b.put(key(i), value(i + 1));
            }
            if i.is_multiple_of(10) {
                b.upsert(
                    key(i),
                    crate::Patch::Write {
                        offset: 5,
                        data: b"abc".to_vec(),
                    },
                );
            }
            if i.is_multiple_of(6) {
                b.delete(key(i));
            }
        }
        e.write(&b).unwrap();
    }
    e.close().unwrap();
    dev
}

#[test]
fn point_queries_into_shed_child_buffers_read_one_run_and_answer_as_the_buffer() {
    let n = 60_000u32;
    let dev = updated_image(n);
    let e = Engine::open(dev, options(8 << 20)).unwrap();
    let before = e.stats();
    let mut x = 0x1234_5679u32;
    let queries = 30_000;
    for _ in 0..queries {
        let i = xorshift(&mut x) % (2 * n);
        assert_eq!(e.get(&key(i)).unwrap(), updated(i), "key {i}");
    }
    let st = e.stats();
    let runs = st.buffer_run_reads - before.buffer_run_reads;
    let loads = st.buffer_loads - before.buffer_loads;
    println!(
        "buffer run reads {runs}, buffer loads {loads}, partition run reads {}, bytes read per \
         query {}",
        st.run_reads - before.run_reads,
        (st.node_bytes_read - before.node_bytes_read) / queries
    );
    assert!(runs > 1_000, "{runs} queries read a run of a buffer");
    assert!(
        runs > 5 * loads,
        "{runs} buffer runs read, {loads} buffers loaded"
    );
    assert!(st.cache_peak_bytes <= st.cache_budget);
    e.close().unwrap();
}

#[test]
fn a_buffer_run_changed_on_the_device_is_refused() {
    let n = 60_000u32;
    let dev = updated_image(n);
    let e = Engine::open(dev.clone(), options(8 << 20)).unwrap();
    for i in 0..2 * n {
        assert_eq!(e.get(&key(i)).unwrap(), updated(i), "key {i}");
    }
    // Damage a byte inside every run of every shed buffer that kept runs (a shed buffer's
    // place in the image, past its header).
    let tree = e.tree();
    let mut spots = Vec::new();
    for cn in tree.cache.all() {
        let g = cn.read();
        let crate::node::Body::Internal(n) = &g.body else {
            continue;
        };
        for slot in &n.buffers {
            if slot.has_runs() {
                let loc = slot.missing_at().expect("shed");
                let ext = tree.store.location(cn.id).unwrap();
                let mut off = 4096u64;
                while off < loc.raw_len as u64 {
                    spots.push(ext.offset() + loc.offset as u64 + off);
                    off += 2048;
                }
            }
        }
    }
    assert!(!spots.is_empty(), "a shed buffer with runs");
    for at in spots {
        flip(&dev, at);
    }
    // Never a wrong answer: refused by a run's checksum, or by the buffer's own when loaded.
    let (refused, by_run) = refusals(&e, 2 * n, "buffer", updated);
    assert!(
        by_run > 0,
        "no damaged buffer run was read ({refused} refused)"
    );
}
