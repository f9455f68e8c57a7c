//! The child process: opens one store on its own loop file system, inside its own memory
//! cgroup, runs the phases and prints one `@@` line per phase for the parent.

use std::path::PathBuf;
use std::time::Instant;

use amaranth_engine::Compression;
use rand::{Rng, RngCore, SeedableRng};

use crate::data::{bound, key, value, Perm, KEY_LEN, MAIN_SET, UPSERT_SET};
#[cfg(feature = "rocksdb")]
use crate::stores::Rocks;
use crate::stores::{Access, Amaranth, Lmdb, Res, Store};
use crate::sys;
use crate::Cfg;

pub struct ChildArgs {
    pub store: String,
    pub compression: String,
    pub mnt: PathBuf,
    pub dev: String,
    pub cgroup: Option<PathBuf>,
    pub space: u64,
}

struct Ctx<'a> {
    cfg: &'a Cfg,
    a: &'a ChildArgs,
}

#[derive(Default)]
struct Meas {
    ops: u64,
    user_bytes: u64,
    secs: f64,
    settle_secs: f64,
    /// Time spent after the timed part that the phase must not count (the fill after a cap).
    fill_secs: f64,
    /// User bytes written by the whole phase including the fill (for write amplification).
    all_user_bytes: u64,
    note: String,
}

impl Ctx<'_> {
    fn measure(
        &self,
        phase: &str,
        store: &mut Box<dyn Store>,
        prepare: Option<Access>,
        settle: bool,
        body: &mut dyn FnMut(&mut Box<dyn Store>) -> Res<Meas>,
    ) -> Res<()> {
        if let Some(access) = prepare {
            // Cold: close and reopen the store, and drop its files from the page cache.
            store.reopen(access)?;
            sys::evict_page_cache(&self.a.mnt);
        }
        let before = store.counters();
        let cg = self.a.cgroup.as_deref();
        if let Some(cg) = cg {
            sys::cgroup_peak_and_reset(cg);
        }
        sys::reset_hwm();
        let fail0 = cg.map(sys::cgroup_failcnt).unwrap_or(0);
        let (r0, w0) = sys::block_bytes(&self.a.dev);
        eprintln!("[{}] {phase}: start", self.label());
        let t0 = Instant::now();
        let mut m = body(store)?;
        if m.secs == 0.0 {
            m.secs = t0.elapsed().as_secs_f64();
        }
        let t1 = Instant::now();
        if settle {
            store.settle()?;
        }
        sys::syncfs(&self.a.mnt);
        m.settle_secs = t1.elapsed().as_secs_f64();
        let (r1, w1) = sys::block_bytes(&self.a.dev);
        let hwm = sys::vm_hwm();
        let cg_peak = cg.map(sys::cgroup_peak_and_reset).unwrap_or(0);
        let fails = cg.map(sys::cgroup_failcnt).unwrap_or(0) - fail0;
        let used = store.used_bytes().unwrap_or_else(|| sys::du(&self.a.mnt));
        let after = store.counters();
        println!(
            "@@ phase={phase} ops={} user_bytes={} wa_user_bytes={} fill_secs={:.1} secs={:.6} settle_secs={:.6} dev_read={} dev_written={} hwm={} cg_peak={} cg_failcnt={} used={} note={}",
            m.ops,
            m.user_bytes,
            if m.all_user_bytes > 0 { m.all_user_bytes } else { m.user_bytes },
            m.fill_secs,
            m.secs,
            m.settle_secs,
            r1 - r0,
            w1 - w0,
            hwm,
            cg_peak,
            fails,
            used,
            m.note.replace(' ', "_"),
        );
        let mut line = format!("@@C phase={phase}");
        for ((k, a), (_, b)) in after.iter().zip(before.iter()) {
            line.push_str(&format!(" {k}={a}|{}", a - b));
        }
        println!("{line}");
        eprintln!(
            "[{}] {phase}: {} ops in {:.1}s ({:.0}/s) + settle {:.1}s, dev written {:.1} MiB, read {:.1} MiB, VmHWM {:.0} MiB {}",
            self.label(),
            m.ops,
            m.secs,
            m.ops as f64 / m.secs,
            m.settle_secs,
            (w1 - w0) as f64 / 1048576.0,
            (r1 - r0) as f64 / 1048576.0,
            hwm as f64 / 1048576.0,
            m.note
        );
        Ok(())
    }

    fn label(&self) -> String {
        format!("{}/{}", self.a.store, self.a.compression)
    }
}

fn progress(label: &str, phase: &str, done: u64, total: u64, t0: Instant, last: &mut Instant) {
    if last.elapsed().as_secs_f64() >= 15.0 {
        *last = Instant::now();
        let s = t0.elapsed().as_secs_f64();
        eprintln!(
            "[{label}] {phase}: {done}/{total} ({:.0}/s, {:.0}s)",
            done as f64 / s,
            s
        );
    }
}

/// Inserts `n` keys of a set in random order, for at most `cap` seconds. If the cap is reached,
/// the keys not yet inserted are added in key order afterwards (untimed, reported as the fill
/// time) so that every later phase sees the same data set in every store.
#[allow(clippy::too_many_arguments)]
fn load(
    ctx: &Ctx,
    phase: &str,
    s: &mut Box<dyn Store>,
    set: u8,
    n: u64,
    vlen: usize,
    seed: u64,
    cap: f64,
) -> Res<Meas> {
    let perm = Perm::new(n, seed);
    let batch = ctx.cfg.batch.max(1);
    let mut items: Vec<(Vec<u8>, Vec<u8>)> = Vec::with_capacity(batch);
    let mut v = Vec::with_capacity(vlen);
    let t0 = Instant::now();
    let mut last = Instant::now();
    let mut j = 0;
    while j < n && t0.elapsed().as_secs_f64() < cap {
        items.clear();
        let end = (j + batch as u64).min(n);
        for x in j..end {
            let i = perm.get(x);
            value(i, 0, vlen, &mut v);
            items.push((key(set, i).to_vec(), v.clone()));
        }
        s.put_batch(&mut items)?;
        j = end;
        progress(&ctx.label(), phase, j, n, t0, &mut last);
    }
    let mut m = Meas {
        ops: j,
        user_bytes: j * (KEY_LEN + vlen) as u64,
        ..Meas::default()
    };
    if j < n {
        m.secs = t0.elapsed().as_secs_f64();
        let done = j;
        eprintln!(
            "[{}] {phase}: time cap {cap}s reached after {done} of {n} keys; filling the rest in key order (untimed)",
            ctx.label()
        );
        let tf = Instant::now();
        let mut i = 0;
        while i < n {
            items.clear();
            while i < n && items.len() < batch {
                if perm.inverse(i) >= done {
                    value(i, 0, vlen, &mut v);
                    items.push((key(set, i).to_vec(), v.clone()));
                }
                i += 1;
            }
            if !items.is_empty() {
                s.put_batch(&mut items)?;
            }
            progress(&ctx.label(), "fill", i, n, tf, &mut last);
        }
        m.fill_secs = tf.elapsed().as_secs_f64();
        m.all_user_bytes = n * (KEY_LEN + vlen) as u64;
        m.note = format!(
            "time cap {cap}s: {done} of {n} keys in random order; the other {} filled in key order in {:.0}s (not counted)",
            n - done,
            m.fill_secs
        );
    }
    Ok(m)
}

pub fn run_child(cfg: &Cfg, a: &ChildArgs) -> Res<()> {
    if let Some(cg) = &a.cgroup {
        sys::join_cgroup(cg)?;
    }
    let ctx = Ctx { cfg, a };
    let cache = (cfg.cache_mb << 20) as usize;
    let mut store: Box<dyn Store> = match a.store.as_str() {
        "amaranth" => {
            // The allocator as the daemon sets it (`amaranth_cli::memlimit::bound_allocator`):
            // eight arenas, and blocks of 64 KiB and more mapped on their own, so that memory the
            // engine frees goes back (with glibc's defaults a process per-CPU arenas and a
            // sliding mmap threshold keep freed partitions in its heaps). Set before the engine
            // starts its threads.
            // SAFETY: mallopt only changes allocator parameters.
            unsafe {
                libc::mallopt(libc::M_ARENA_MAX, 8);
                libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 10);
            }
            let c = Compression::from_name(&a.compression)
                .ok_or_else(|| format!("unknown compression {}", a.compression))?;
            Box::new(Amaranth::create(
                &a.mnt,
                a.space,
                cache,
                c,
                cfg.partition_kb,
            )?)
        }
        #[cfg(feature = "rocksdb")]
        "rocksdb" => Box::new(Rocks::create(&a.mnt, cache)?),
        #[cfg(not(feature = "rocksdb"))]
        "rocksdb" => return Err("built without the rocksdb feature".into()),
        "lmdb" => Box::new(Lmdb::create(&a.mnt, a.space as usize)?),
        s => return Err(format!("unknown store {s}")),
    };
    let n = cfg.keys;
    let cap = cfg.phase_secs;
    for phase in &cfg.phases {
        let label = ctx.label();
        match phase.as_str() {
            "insert" => ctx.measure("insert", &mut store, None, true, &mut |s| {
                load(
                    &ctx,
                    "insert",
                    s,
                    MAIN_SET,
                    n,
                    cfg.value_size,
                    cfg.seed,
                    cfg.load_secs,
                )
            })?,
            "upsert-load" => ctx.measure("upsert-load", &mut store, None, true, &mut |s| {
                load(
                    &ctx,
                    "upsert-load",
                    s,
                    UPSERT_SET,
                    cfg.upsert_keys,
                    cfg.upsert_value_size,
                    cfg.seed ^ 0x5555,
                    cfg.load_secs,
                )
            })?,
            "upsert" => ctx.measure("upsert", &mut store, None, true, &mut |s| {
                let mut rng = rand::rngs::SmallRng::seed_from_u64(cfg.seed ^ 0xABCD);
                let batch = cfg.batch.max(1);
                let slots = (cfg.upsert_value_size / 4).max(1) as u32;
                let mut items = Vec::with_capacity(batch);
                let t0 = Instant::now();
                let mut last = Instant::now();
                let mut done = 0u64;
                while done < cfg.upserts && t0.elapsed().as_secs_f64() < cap {
                    items.clear();
                    let end = (done + batch as u64).min(cfg.upserts);
                    for _ in done..end {
                        let i = rng.gen_range(0..cfg.upsert_keys);
                        let off = rng.gen_range(0..slots) * 4;
                        let d = rng.next_u32().to_le_bytes();
                        items.push((key(UPSERT_SET, i).to_vec(), off, d));
                    }
                    s.upsert_batch(&items)?;
                    done = end;
                    progress(&label, "upsert", done, cfg.upserts, t0, &mut last);
                }
                Ok(Meas {
                    ops: done,
                    user_bytes: done * (KEY_LEN + 4) as u64,
                    note: if done < cfg.upserts {
                        format!("time cap {cap}s reached")
                    } else {
                        String::new()
                    },
                    ..Meas::default()
                })
            })?,
            "read" => ctx.measure("read", &mut store, Some(Access::Random), false, &mut |s| {
                let mut rng = rand::rngs::SmallRng::seed_from_u64(cfg.seed ^ 0x1234);
                let t0 = Instant::now();
                let mut last = Instant::now();
                let (mut done, mut found, mut bytes) = (0u64, 0u64, 0u64);
                while done < cfg.reads && (done % 256 != 0 || t0.elapsed().as_secs_f64() < cap) {
                    let i = rng.gen_range(0..n);
                    if let Some(l) = s.get(&key(MAIN_SET, i))? {
                        found += 1;
                        bytes += (KEY_LEN + l) as u64;
                    }
                    done += 1;
                    if done % 4096 == 0 {
                        progress(&label, "read", done, cfg.reads, t0, &mut last);
                    }
                }
                let mut note = format!("found {found}/{done}");
                if done < cfg.reads {
                    note.push_str(&format!("; time cap {cap}s reached"));
                }
                Ok(Meas {
                    ops: done,
                    user_bytes: bytes,
                    note,
                    ..Meas::default()
                })
            })?,
            "scan" => ctx.measure(
                "scan",
                &mut store,
                Some(Access::Sequential),
                false,
                &mut |s| {
                    let (cnt, bytes) = s.scan(&bound(MAIN_SET, 0), &bound(MAIN_SET, n))?;
                    Ok(Meas {
                        ops: cnt,
                        user_bytes: bytes,
                        note: format!("entries {cnt} (expected {n} before the range delete)"),
                        ..Meas::default()
                    })
                },
            )?,
            "rangedel" => {
                let (lo_i, hi_i) = (n * 45 / 100, n * 55 / 100);
                let (lo, hi) = (bound(MAIN_SET, lo_i), bound(MAIN_SET, hi_i));
                ctx.measure("rangedel", &mut store, None, true, &mut |s| {
                    let removed = s.range_delete(&lo, &hi)?;
                    Ok(Meas {
                        ops: hi_i - lo_i,
                        user_bytes: (lo.len() + hi.len()) as u64,
                        note: removed.map(|r| format!("removed {r}")).unwrap_or_default(),
                        ..Meas::default()
                    })
                })?;
                // Check (not timed): nothing is left in the range, and the neighbours survive.
                let (left, _) = store.scan(&lo, &hi)?;
                let below = store.get(&key(MAIN_SET, lo_i.saturating_sub(1)))?.is_some();
                let above = store.get(&key(MAIN_SET, hi_i))?.is_some();
                println!(
                    "@@V phase=rangedel left_in_range={left} below_kept={below} above_kept={above}"
                );
                if left != 0 || !below || !above {
                    return Err(format!(
                        "range delete check failed: {left} keys left in range, neighbours kept {below}/{above}"
                    ));
                }
            }
            p => return Err(format!("unknown phase {p}")),
        }
    }
    store.close()?;
    Ok(())
}
