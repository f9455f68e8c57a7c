//! Resident memory beside the cache bound under a mail-server-like load: random deliveries
//! (a metadata key and 1–32 KiB of data) and deletes (a range delete of the message's data)
//! spread over 160 mailboxes, a tree far larger than the cache, checkpoints and the pushing down
//! of range deletes running. Prints, each time the process's resident size above its start sets
//! a new high, what holds it: live aligned buffers (node images being read or written), the
//! heap in use and free (glibc's mallinfo2), and the cache's accounted usage; at the end the
//! accounted peak against the budget. The allocator is set as the daemon sets it
//! (cli/src/memlimit.rs) unless `MALLOPT=0`.
//!
//! `cargo run --release -p amaranth-engine --example memory_probe`; knobs (environment):
//! `CACHE_MIB` (64), `PER_BOX` messages per mailbox to start with (200), `OPS` (200000),
//! `THREADS` (2), `CKPT_MS` checkpoint interval (1000), `RANGE=0` point deletes instead of range
//! deletes, `EXP_DIR` for the image file (/var/tmp/amaranth-memory-probe, removed at the end).
//! This is the reproduction of the daemon's excursions above its bound in the paper-size
//! mail-server aging run (docs/DESIGN.md, the daemon's memory bound).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use amaranth_device::FileDevice;
use amaranth_engine::{Batch, Engine, Format, Options};

const MIB: usize = 1 << 20;

fn rss() -> usize {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let l = s.lines().find(|l| l.starts_with("VmRSS")).unwrap();
    l.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<usize>()
        .unwrap()
        * 1024
}

fn env(k: &str, d: u64) -> u64 {
    std::env::var(k).map(|v| v.parse().unwrap()).unwrap_or(d)
}

fn main() {
    let dir = std::env::var("EXP_DIR").unwrap_or("/var/tmp/amaranth-memory-probe".into());
    std::fs::create_dir_all(&dir).unwrap();
    let path = std::path::Path::new(&dir).join("exp.img");
    let _ = std::fs::remove_file(&path);
    let dev = Arc::new(FileDevice::create_image(&path, 8 << 30).unwrap());
    let cache = env("CACHE_MIB", 64) as usize * MIB;
    let opts = Options {
        cache_size: cache,
        checkpoint_interval: Duration::from_millis(env("CKPT_MS", 1000)),
        ..Options::default()
    };
    if env("MALLOPT", 1) == 1 {
        // SAFETY: as the daemon does (cli memlimit.rs), before the engine's threads start.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 8);
            libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 10);
        }
    }
    let base = rss();
    let engine = Arc::new(Engine::create(dev, Format::default(), opts).unwrap());
    let key = |b: u64, m: u64| format!("d/box{:04}/msg{:08}/", b, m);
    let boxes = 160;
    let per = env("PER_BOX", 200);
    for m in 0..per {
        for b in 0..boxes {
            let mut bt = Batch::new();
            bt.put(
                format!("m/box{:04}/msg{:08}", b, m).into_bytes(),
                vec![1; 100],
            );
            bt.put(
                (key(b, m) + "0").into_bytes(),
                vec![3; 1024 + ((b * 7 + m * 13) % 31) as usize * 1024],
            );
            engine.write(&bt).unwrap();
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let worst = Arc::new(AtomicUsize::new(0));
    let sampler = {
        let (e, stop, worst) = (engine.clone(), stop.clone(), worst.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let over = rss().saturating_sub(base);
                if over > worst.load(Ordering::Relaxed) {
                    worst.store(over, Ordering::Relaxed);
                    // SAFETY: mallinfo2 only reads the allocator's statistics.
                    let mi = unsafe { libc::mallinfo2() };
                    let st = e.stats();
                    eprintln!(
                        "rss+{:.0} MiB: aligned live {:.0} MiB, heap in use {:.0} MiB, heap free {:.0} MiB, mmapped by malloc {:.0} MiB, accounted cache {:.0} MiB",
                        over as f64 / MIB as f64,
                        amaranth_device::aligned_bytes().0 as f64 / MIB as f64,
                        mi.uordblks as f64 / MIB as f64,
                        mi.fordblks as f64 / MIB as f64,
                        mi.hblkhd as f64 / MIB as f64,
                        st.cache_bytes as f64 / MIB as f64
                    );
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let threads = env("THREADS", 2);
    let ops = env("OPS", 200_000);
    let mut hs = Vec::new();
    for t in 0..threads {
        let e = engine.clone();
        hs.push(std::thread::spawn(move || {
            let mut x: u64 = 0x1234_5678 + t * 7919;
            for i in 0..ops / threads {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let b = x % 160;
                let m = per + (i * threads + t);
                let mut bt = Batch::new();
                if x.is_multiple_of(2) {
                    bt.put(
                        format!("m/box{:04}/msg{:08}", b, m).into_bytes(),
                        vec![1; 100],
                    );
                    bt.put(
                        (key(b, m) + "0").into_bytes(),
                        vec![5; 1024 + (x % 31) as usize * 1024],
                    );
                } else {
                    let victim = (x >> 20) % (m + 1);
                    bt.delete(format!("m/box{:04}/msg{:08}", b, victim).into_bytes());
                    let k = key(b, victim);
                    let mut hi = k.clone().into_bytes();
                    *hi.last_mut().unwrap() += 1;
                    if env("RANGE", 1) == 1 {
                        bt.range_delete(k.into_bytes(), hi);
                    } else {
                        bt.delete((k + "0").into_bytes());
                    }
                }
                e.write(&bt).unwrap();
            }
        }));
    }
    for h in hs {
        h.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let st = engine.stats();
    eprintln!(
        "cache {} MiB: accounted peak {:.1} MiB of budget {:.1} MiB; resident above the start at most {:.1} MiB; nodes {} height {}",
        cache / MIB,
        st.cache_peak_bytes as f64 / MIB as f64,
        st.cache_budget as f64 / MIB as f64,
        worst.load(Ordering::Relaxed) as f64 / MIB as f64,
        st.nodes,
        st.height
    );
    Arc::try_unwrap(engine)
        .ok()
        .expect("the writers and the sampler are done")
        .close()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_dir(&dir);
}
