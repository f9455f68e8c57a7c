//! Side-by-side benchmark of Amaranth's engine, RocksDB and LMDB on the same data, larger than
//! the memory bound. See README.md beside Cargo.toml.

mod child;
mod data;
mod report;
mod stores;
mod sys;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub const ALL_PHASES: &[&str] = &[
    "insert",
    "upsert-load",
    "upsert",
    "read",
    "scan",
    "rangedel",
];

#[derive(Clone, Debug)]
pub struct Cfg {
    pub keys: u64,
    pub value_size: usize,
    pub upsert_keys: u64,
    pub upsert_value_size: usize,
    pub upserts: u64,
    pub reads: u64,
    pub batch: usize,
    pub cache_mb: u64,
    pub slack_mb: u64,
    pub phase_secs: f64,
    pub load_secs: f64,
    pub seed: u64,
    /// Amaranth's leaf partition size in KiB (0: the format's default).
    pub partition_kb: u64,
    pub stores: Vec<String>,
    pub phases: Vec<String>,
    pub compression: Vec<String>,
    pub compression_phases: Vec<String>,
    pub dir: PathBuf,
    pub out: PathBuf,
    pub quick: bool,
    pub fio: bool,
    pub cgroup: bool,
    pub note: String,
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

impl Cfg {
    fn defaults() -> Cfg {
        Cfg {
            keys: 10_000_000,
            value_size: 100,
            upsert_keys: 1_000_000,
            upsert_value_size: 4096,
            upserts: 1_000_000,
            reads: 1_000_000,
            batch: 1000,
            cache_mb: 256,
            slack_mb: 256,
            phase_secs: 120.0,
            load_secs: 600.0,
            seed: 42,
            partition_kb: 0,
            stores: vec!["amaranth".into(), "rocksdb".into(), "lmdb".into()],
            phases: ALL_PHASES.iter().map(|s| s.to_string()).collect(),
            compression: vec!["none".into(), "lz4".into(), "zstd".into()],
            compression_phases: vec!["insert".into(), "scan".into()],
            dir: PathBuf::from("/var/tmp/amaranth-engine-bench"),
            out: repo_root().join("docs/benchmarks/engine.md"),
            quick: false,
            fio: true,
            cgroup: true,
            note: String::new(),
        }
    }

    /// The arguments that carry the configuration to a child.
    fn to_args(&self) -> Vec<String> {
        vec![
            format!("--keys={}", self.keys),
            format!("--value-size={}", self.value_size),
            format!("--upsert-keys={}", self.upsert_keys),
            format!("--upsert-value-size={}", self.upsert_value_size),
            format!("--upserts={}", self.upserts),
            format!("--reads={}", self.reads),
            format!("--batch={}", self.batch),
            format!("--cache-mb={}", self.cache_mb),
            format!("--phase-secs={}", self.phase_secs),
            format!("--load-secs={}", self.load_secs),
            format!("--seed={}", self.seed),
            format!("--partition-kb={}", self.partition_kb),
        ]
    }
}

const USAGE: &str = "engine-bench: Amaranth's engine vs RocksDB vs LMDB, side by side

  --keys N               main key set (24-byte keys), default 10000000
  --value-size N         value size of the main set, default 100
  --upsert-keys N        keys of the upsert set, default 1000000
  --upsert-value-size N  value size of the upsert set, default 4096
  --upserts N            4-byte upserts (capped by --phase-secs), default 1000000
  --reads N              random point reads (capped by --phase-secs), default 1000000
  --batch N              operations per batch / write transaction, default 1000
  --partition-kb N       Amaranth's leaf partition size in KiB (default: the format's, 128);
                         the key and value limits shrink to fit a smaller one
  --cache-mb N           memory bound of every store, default 256
  --slack-mb N           cgroup limit = cache + slack (process + page cache), default 256
  --phase-secs S         time cap of the upsert and read phases, default 120
  --load-secs S          time cap of the random-order part of insert and upsert-load, default
                         600 (the rest is then filled in key order, untimed)
  --stores LIST          amaranth,rocksdb,lmdb (default all)
  --phases LIST          insert,upsert-load,upsert,read,scan,rangedel (default all)
  --compression LIST     Amaranth node compression to compare, default none,lz4,zstd
                         (the first runs every phase, the others --compression-phases)
  --compression-phases L default insert,scan
  --dir PATH             work directory on the disk, default /var/tmp/amaranth-engine-bench
  --out PATH             markdown report (relative: to the repository root),
                         default docs/benchmarks/engine.md; '-' for none
  --note TEXT            a sentence added to the report
  --quick                200k keys, 20k x 4 KiB upsert set, 200k upserts/reads, 32 MiB cache
  --no-fio               skip the fio measurement
  --no-cgroup            do not put the stores in memory cgroups
";

fn list(s: &str) -> Vec<String> {
    s.split(',')
        .filter(|x| !x.is_empty())
        .map(|x| x.trim().to_string())
        .collect()
}

fn parse(args: &[String]) -> Result<(Cfg, Option<child::ChildArgs>), String> {
    let mut c = Cfg::defaults();
    let mut child: Option<child::ChildArgs> = None;
    let mut quick = false;
    let mut explicit: Vec<String> = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        let (name, inline) = match a.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v.to_string())),
            _ => (a.clone(), None),
        };
        let flag = |n: &str| {
            matches!(
                n,
                "--quick" | "--no-fio" | "--no-cgroup" | "--child" | "--help" | "-h"
            )
        };
        let val = if flag(&name) {
            String::new()
        } else if let Some(v) = inline {
            v
        } else {
            i += 1;
            args.get(i)
                .cloned()
                .ok_or(format!("{name} needs a value"))?
        };
        let num = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| format!("{name}: bad number {v}"))
        };
        explicit.push(name.clone());
        match name.as_str() {
            "--help" | "-h" => {
                print!("{USAGE}");
                std::process::exit(0);
            }
            "--keys" => c.keys = num(&val)?,
            "--value-size" => c.value_size = num(&val)? as usize,
            "--upsert-keys" => c.upsert_keys = num(&val)?,
            "--upsert-value-size" => c.upsert_value_size = num(&val)? as usize,
            "--upserts" => c.upserts = num(&val)?,
            "--reads" => c.reads = num(&val)?,
            "--batch" => c.batch = num(&val)? as usize,
            "--cache-mb" => c.cache_mb = num(&val)?,
            "--slack-mb" => c.slack_mb = num(&val)?,
            "--phase-secs" => {
                c.phase_secs = val.parse().map_err(|_| format!("bad --phase-secs {val}"))?
            }
            "--load-secs" => {
                c.load_secs = val.parse().map_err(|_| format!("bad --load-secs {val}"))?
            }
            "--seed" => c.seed = num(&val)?,
            "--partition-kb" => c.partition_kb = num(&val)?,
            "--stores" => c.stores = list(&val),
            "--phases" => c.phases = list(&val),
            "--compression" => c.compression = list(&val),
            "--compression-phases" => c.compression_phases = list(&val),
            "--dir" => c.dir = PathBuf::from(val),
            "--out" => {
                c.out = if val == "-" {
                    PathBuf::new()
                } else if Path::new(&val).is_absolute() {
                    PathBuf::from(val)
                } else {
                    repo_root().join(val)
                }
            }
            "--note" => c.note = val,
            "--quick" => quick = true,
            "--no-fio" => c.fio = false,
            "--no-cgroup" => c.cgroup = false,
            "--child" => {
                child = Some(child::ChildArgs {
                    store: String::new(),
                    compression: "none".into(),
                    mnt: PathBuf::new(),
                    dev: String::new(),
                    cgroup: None,
                    space: 0,
                })
            }
            "--store" => child.as_mut().ok_or("--store is for --child")?.store = val,
            "--codec" => child.as_mut().ok_or("--codec is for --child")?.compression = val,
            "--mnt" => child.as_mut().ok_or("--mnt is for --child")?.mnt = PathBuf::from(val),
            "--dev" => child.as_mut().ok_or("--dev is for --child")?.dev = val,
            "--cgroup-path" => {
                child.as_mut().ok_or("--cgroup-path is for --child")?.cgroup =
                    Some(PathBuf::from(val))
            }
            "--space" => child.as_mut().ok_or("--space is for --child")?.space = num(&val)?,
            _ => return Err(format!("unknown argument {a}\n\n{USAGE}")),
        }
        i += 1;
    }
    if quick {
        c.quick = true;
        let set = |n: &str| explicit.iter().any(|e| e == n);
        if !set("--keys") {
            c.keys = 200_000;
        }
        if !set("--upsert-keys") {
            c.upsert_keys = 20_000;
        }
        if !set("--upserts") {
            c.upserts = 200_000;
        }
        if !set("--reads") {
            c.reads = 200_000;
        }
        if !set("--cache-mb") {
            c.cache_mb = 32;
        }
        if !set("--slack-mb") {
            c.slack_mb = 128;
        }
        if !set("--phase-secs") {
            c.phase_secs = 60.0;
        }
    }
    for p in c.phases.iter().chain(c.compression_phases.iter()) {
        if !ALL_PHASES.contains(&p.as_str()) {
            return Err(format!("unknown phase {p}"));
        }
    }
    if c.cache_mb < 32 {
        return Err("--cache-mb must be at least 32 (Amaranth needs eight 4 MiB nodes)".into());
    }
    Ok((c, child))
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// One child run: a store (with a compression for Amaranth) and its phases.
#[derive(Clone, Debug)]
pub struct Run {
    pub store: String,
    pub codec: String,
    pub phases: Vec<String>,
}

impl Run {
    pub fn label(&self) -> String {
        if self.store == "amaranth" {
            format!("amaranth ({})", self.codec)
        } else {
            self.store.clone()
        }
    }
}

/// What a child reported: phase -> key -> value, counters, checks, and how it ended.
#[derive(Default, Debug, Clone)]
pub struct RunResult {
    pub phases: Vec<(String, BTreeMap<String, String>)>,
    pub counters: Vec<(String, Vec<(String, String)>)>,
    pub checks: Vec<String>,
    pub error: Option<String>,
    pub wall_secs: f64,
}

impl RunResult {
    pub fn phase(&self, p: &str) -> Option<&BTreeMap<String, String>> {
        self.phases.iter().find(|(n, _)| n == p).map(|(_, m)| m)
    }
}

fn parse_kv(line: &str) -> BTreeMap<String, String> {
    line.split_whitespace()
        .skip(1)
        .filter_map(|t| {
            t.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect()
}

fn run_store(cfg: &Cfg, run: &Run, idx: usize) -> RunResult {
    let mut res = RunResult::default();
    let t0 = Instant::now();
    let r = run_store_inner(cfg, run, idx, &mut res);
    res.wall_secs = t0.elapsed().as_secs_f64();
    if let Err(e) = r {
        eprintln!("{}: FAILED: {e}", run.label());
        res.error = Some(e);
    }
    res
}

fn run_store_inner(cfg: &Cfg, run: &Run, idx: usize, res: &mut RunResult) -> Result<(), String> {
    let name = format!("{}-{}-{}", run.store, run.codec, std::process::id());
    let upsert = run.phases.iter().any(|p| p.starts_with("upsert"));
    let data = cfg.keys * (24 + cfg.value_size as u64)
        + if upsert {
            cfg.upsert_keys * (24 + cfg.upsert_value_size as u64)
        } else {
            0
        };
    // Room for the data, copy-on-write / compaction / LMDB's free pages; the file is sparse.
    let fs_bytes = (4 * data + (2 << 30)).max(4 << 30);
    let lfs = sys::LoopFs::create(
        &cfg.dir.join(format!("{name}.fs")),
        &cfg.dir.join(format!("{name}.mnt")),
        fs_bytes,
    )?;
    // What the store may occupy inside the file system (Amaranth: the image; LMDB: the map).
    let space = fs_bytes / 100 * 85 / 4096 * 4096;
    let cg = if cfg.cgroup {
        Some(sys::MemCgroup::create(
            &format!("amaranth-engine-bench-{}-{idx}", std::process::id()),
            (cfg.cache_mb + cfg.slack_mb) << 20,
        )?)
    } else {
        None
    };
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(exe);
    cmd.arg("--child")
        .args(cfg.to_args())
        .arg(format!("--phases={}", run.phases.join(",")))
        .arg(format!("--store={}", run.store))
        .arg(format!("--codec={}", run.codec))
        .arg(format!("--mnt={}", lfs.mnt.display()))
        .arg(format!("--dev={}", lfs.name()))
        .arg(format!("--space={space}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some(cg) = &cg {
        cmd.arg(format!("--cgroup-path={}", cg.path.display()));
    }
    eprintln!(
        "== {}: loop {} ({} GiB sparse), cgroup limit {} MiB",
        run.label(),
        lfs.dev,
        fs_bytes >> 30,
        cfg.cache_mb + cfg.slack_mb
    );
    let mut ch = cmd
        .spawn()
        .map_err(|e| format!("spawning the child: {e}"))?;
    let pid = ch.id() as libc::pid_t;
    let out = ch.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut lines = Vec::new();
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if l.starts_with("@@") {
                lines.push(l);
            } else {
                println!("{l}");
            }
        }
        lines
    });
    let status = loop {
        if STOP.load(Ordering::SeqCst) {
            // SAFETY: signalling our own child by its pid.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let _ = ch.wait();
            return Err("interrupted".into());
        }
        match ch.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => {
                // SAFETY: as above.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                let _ = ch.wait();
                return Err(format!("waiting for the child: {e}"));
            }
        }
    };
    let lines = reader.join().unwrap_or_default();
    for l in &lines {
        let kv = parse_kv(l);
        let phase = kv.get("phase").cloned().unwrap_or_default();
        if l.starts_with("@@ ") {
            res.phases.push((phase, kv));
        } else if l.starts_with("@@C ") {
            let c = kv
                .into_iter()
                .filter(|(k, _)| k != "phase")
                .collect::<Vec<_>>();
            res.counters.push((phase, c));
        } else if l.starts_with("@@V ") {
            res.checks.push(l.trim_start_matches("@@V ").to_string());
        }
    }
    let oom = cg
        .as_ref()
        .and_then(|g| std::fs::read_to_string(g.path.join("memory.oom_control")).ok())
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("oom_kill "))
                .map(|l| l.to_string())
        })
        .unwrap_or_default();
    drop(cg);
    drop(lfs);
    if !status.success() {
        // The phase that was running: the one after the last reported.
        let done = res.phases.len();
        let next = run.phases.get(done).cloned().unwrap_or_default();
        return Err(format!(
            "child exited with {status} {oom} during phase {next}"
        ));
    }
    Ok(())
}

/// Sequential read bandwidth of the disk under --dir, measured with fio (O_DIRECT).
#[derive(Default, Clone, Debug)]
pub struct FioResult {
    pub qd32_1m: f64,
    pub qd1_128k: f64,
    pub cmd: String,
    pub error: Option<String>,
}

fn fio_bw(json: &str) -> Option<f64> {
    let r = json.find("\"read\"")?;
    let rest = &json[r..];
    let b = rest.find("\"bw_bytes\"")?;
    let rest = &rest[b + 10..];
    let num: String = rest
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(|c| c.is_ascii_digit())
        .collect();
    num.parse().ok()
}

fn run_fio(dir: &Path) -> FioResult {
    let file = dir.join("fio-seqread.dat");
    let f = file.to_str().unwrap().to_string();
    let mk = |bs: &str, qd: &str| {
        vec![
            "--name=seqread".to_string(),
            format!("--filename={f}"),
            "--rw=read".into(),
            format!("--bs={bs}"),
            "--direct=1".into(),
            "--ioengine=libaio".into(),
            format!("--iodepth={qd}"),
            "--size=4G".into(),
            "--output-format=json".into(),
        ]
    };
    let mut r = FioResult {
        cmd: format!("fio {}", mk("1M", "32").join(" ")),
        ..FioResult::default()
    };
    for (bs, qd) in [("1M", "32"), ("128k", "1")] {
        let args = mk(bs, qd);
        let a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        match sys::run("fio", &a) {
            Ok(out) => {
                let bw = fio_bw(&out).unwrap_or(0.0);
                if qd == "32" {
                    r.qd32_1m = bw
                } else {
                    r.qd1_128k = bw
                }
            }
            Err(e) => r.error = Some(e),
        }
    }
    let _ = std::fs::remove_file(&file);
    r
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (cfg, child) = match parse(&args) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    if let Some(ch) = child {
        if let Err(e) = child::run_child(&cfg, &ch) {
            eprintln!("child {}: {e}", ch.store);
            std::process::exit(1);
        }
        return;
    }
    for s in &cfg.stores {
        if !["amaranth", "rocksdb", "lmdb"].contains(&s.as_str()) {
            eprintln!("unknown store {s}");
            std::process::exit(2);
        }
    }
    // SAFETY: installing a handler that only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGHUP, on_signal as *const () as libc::sighandler_t);
    }
    if let Err(e) = std::fs::create_dir_all(&cfg.dir) {
        eprintln!("{}: {e}", cfg.dir.display());
        std::process::exit(1);
    }
    let machine_before = report::Machine::probe(&cfg.dir);
    let started = Instant::now();
    let fio = if cfg.fio {
        eprintln!(
            "== fio: sequential read bandwidth of the disk under {}",
            cfg.dir.display()
        );
        let f = run_fio(&cfg.dir);
        eprintln!(
            "fio: {:.0} MB/s (1 MiB, QD32), {:.0} MB/s (128 KiB, QD1) {}",
            f.qd32_1m / 1e6,
            f.qd1_128k / 1e6,
            f.error.clone().unwrap_or_default()
        );
        Some(f)
    } else {
        None
    };
    let mut runs = Vec::new();
    for s in &cfg.stores {
        if s == "amaranth" {
            for (k, codec) in cfg.compression.iter().enumerate() {
                let phases = if k == 0 {
                    cfg.phases.clone()
                } else {
                    cfg.compression_phases.clone()
                };
                runs.push(Run {
                    store: s.clone(),
                    codec: codec.clone(),
                    phases,
                });
            }
        } else {
            runs.push(Run {
                store: s.clone(),
                codec: "none".into(),
                phases: cfg.phases.clone(),
            });
        }
    }
    // Interleave: main runs first, Amaranth's compression variants last.
    runs.sort_by_key(|r| {
        (r.store == "amaranth" && Some(&r.codec) != cfg.compression.first()) as u8
    });
    let mut results = Vec::new();
    for (i, r) in runs.iter().enumerate() {
        if STOP.load(Ordering::SeqCst) {
            break;
        }
        let res = run_store(&cfg, r, i);
        results.push((r.clone(), res));
    }
    let machine_after = report::Machine::probe(&cfg.dir);
    let total = started.elapsed().as_secs_f64();
    let md = report::render(
        &cfg,
        &args,
        &machine_before,
        &machine_after,
        fio.as_ref(),
        &results,
        total,
    );
    println!("{md}");
    if !cfg.out.as_os_str().is_empty() {
        if let Some(p) = cfg.out.parent() {
            let _ = std::fs::create_dir_all(p);
        }
        match std::fs::write(&cfg.out, &md) {
            Ok(()) => eprintln!("report written to {}", cfg.out.display()),
            Err(e) => eprintln!("{}: {e}", cfg.out.display()),
        }
    }
    let _ = std::fs::remove_dir(&cfg.dir);
    if STOP.load(Ordering::SeqCst) || results.iter().any(|(_, r)| r.error.is_some()) {
        std::process::exit(1);
    }
}
