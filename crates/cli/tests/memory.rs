//! The daemon's memory bound on a real mount: in a memory cgroup of its cache plus the documented
//! overhead it is not OOM-killed by 120,000 files created and read back; past its limit the inode
//! table makes the kernel forget inodes instead of growing. Needs root, /dev/fuse and the cgroup
//! v1 memory controller (at /sys/fs/cgroup/memory); fails with the reason otherwise.

mod support;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use support::*;

const MIB: u64 = 1 << 20;
/// The daemon's documented overhead above its cache (`DAEMON_OVERHEAD` in src/memlimit.rs).
const OVERHEAD: u64 = 128 * MIB;

/// A fresh cgroup v1 memory group, removed when dropped (after the processes left in it, if
/// any, are moved to the parent group).
struct Cgroup {
    dir: PathBuf,
}

impl Cgroup {
    fn new(name: &str, limit: u64) -> Cgroup {
        let root = Path::new("/sys/fs/cgroup/memory");
        assert!(
            root.join("memory.limit_in_bytes").exists(),
            "this test needs the cgroup v1 memory controller at {}",
            root.display()
        );
        let dir = root.join(format!("{name}-{}", std::process::id()));
        let _ = fs::remove_dir(&dir);
        fs::create_dir(&dir).unwrap();
        let cg = Cgroup { dir };
        cg.write("memory.limit_in_bytes", limit);
        // No swap for the group: memory+swap gets the same limit (when the kernel counts swap).
        if cg.dir.join("memory.memsw.limit_in_bytes").exists() {
            cg.write("memory.memsw.limit_in_bytes", limit);
        }
        cg
    }
    fn write(&self, file: &str, v: u64) {
        fs::write(self.dir.join(file), v.to_string())
            .unwrap_or_else(|e| panic!("writing {v} to {}/{file}: {e}", self.dir.display()));
    }
    fn read(&self, file: &str) -> String {
        fs::read_to_string(self.dir.join(file)).unwrap_or_default()
    }
    fn number(&self, file: &str) -> u64 {
        self.read(file).trim().parse().unwrap_or(0)
    }
    /// OOM kills in the group (`oom_kill` of memory.oom_control).
    fn oom_kills(&self) -> u64 {
        self.read("memory.oom_control")
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }
    fn report(&self) -> String {
        format!(
            "limit {} MiB, peak usage {:.1} MiB, failcnt {}, oom kills {}",
            self.number("memory.limit_in_bytes") / MIB,
            self.number("memory.max_usage_in_bytes") as f64 / MIB as f64,
            self.number("memory.failcnt"),
            self.oom_kills()
        )
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let parent = self.dir.parent().unwrap().join("cgroup.procs");
        for _ in 0..100 {
            if fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            for pid in self.read("cgroup.procs").split_whitespace() {
                let _ = fs::write(&parent, pid);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("could not remove {}", self.dir.display());
    }
}

fn file_path(root: &Path, i: u64) -> PathBuf {
    root.join(format!("d{:03}/f{:06}", i / 1000, i))
}

fn file_len(i: u64) -> usize {
    1024 + (Rng::new(i).below(15 * 1024 + 1)) as usize
}

fn stat_json(s: &Scratch, m: &Mount) -> serde_json::Value {
    let out = s.run(&["stat", m.mp.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "stat failed");
    serde_json::from_slice(&out.stdout).unwrap()
}

fn alive_or_dump(m: &Mount, cg: &Cgroup, what: &str) {
    assert!(
        alive(m.pid()),
        "the daemon died {what} ({}); log:\n{}",
        cg.report(),
        m.log_tail(20)
    );
}

/// The case: 120,000 files of 1–16 KiB with `--cache-size 256M` peaked at 377–470 MiB
/// resident, so in a 320 MiB cgroup the daemon was OOM-killed within seconds (and in a 384 MiB
/// one, cache plus today's documented overhead, too).
#[test]
fn daemon_stays_within_cache_plus_overhead_for_120k_files() {
    if !mount_env_ok() {
        return;
    }
    let _g = serial();
    let cache = 256 * MIB;
    let cg = Cgroup::new("amaranth-memory-test", cache + OVERHEAD);
    let s = Scratch::new("m");
    let img = s.mkfs("fs.img", "8G");
    let opts = MountOpts {
        cache_size: "256M".into(),
        cgroup: Some(cg.dir.clone()),
        ..MountOpts::default()
    };
    let m = s.mount(&img, "mnt", &opts);
    assert!(
        cg.read("cgroup.procs")
            .split_whitespace()
            .any(|p| p == m.pid().to_string()),
        "the daemon is not in {}",
        cg.dir.display()
    );
    let files = 120_000u64;
    let t = Instant::now();
    for i in 0..files {
        let p = file_path(&m.mp, i);
        if i % 1000 == 0 {
            fs::create_dir(p.parent().unwrap()).unwrap();
            if i % 20_000 == 0 {
                alive_or_dump(&m, &cg, "while creating");
            }
        }
        fs::write(&p, pattern(i, file_len(i)))
            .unwrap_or_else(|e| panic!("writing {}: {e} ({})", p.display(), cg.report()));
    }
    let created = t.elapsed();
    let t = Instant::now();
    for i in 0..files {
        let p = file_path(&m.mp, i);
        let got = fs::read(&p)
            .unwrap_or_else(|e| panic!("reading {}: {e} ({})", p.display(), cg.report()));
        assert!(got == pattern(i, file_len(i)), "{} differs", p.display());
    }
    let read = t.elapsed();
    let st = stat_json(&s, &m);
    eprintln!(
        "{files} files created in {:.1} s, read back in {:.1} s; {}; daemon: {} MiB resident, \
         cache {} of {} MiB, table {} MiB for {} inodes",
        created.as_secs_f64(),
        read.as_secs_f64(),
        cg.report(),
        st["rss_bytes"].as_u64().unwrap_or(0) / MIB,
        st["cache_bytes"].as_u64().unwrap_or(0) / MIB,
        st["cache_budget"].as_u64().unwrap_or(0) / MIB,
        st["fs"]["table_bytes"].as_u64().unwrap_or(0) / MIB,
        st["fs"]["cached_inodes"]
    );
    alive_or_dump(&m, &cg, "after the read-back");
    assert_eq!(cg.oom_kills(), 0, "OOM kills in the group: {}", cg.report());
    s.finish(m);
}

/// With the smallest cache the table's limit is its uncharged part (8 MiB, ~23,000 inodes): past
/// it the daemon asks the kernel to forget inodes, and every file stays reachable.
#[test]
fn inode_table_past_its_limit_makes_the_kernel_forget() {
    if !mount_env_ok() {
        return;
    }
    let _g = serial();
    let s = Scratch::new("mf");
    let img = s.mkfs("fs.img", "4G");
    let opts = MountOpts {
        cache_size: "32M".into(),
        ..MountOpts::default()
    };
    let m = s.mount(&img, "mnt", &opts);
    let files = 40_000u64;
    for i in 0..files {
        let p = file_path(&m.mp, i);
        if i % 1000 == 0 {
            fs::create_dir(p.parent().unwrap()).unwrap();
        }
        fs::File::create(&p).unwrap();
    }
    // The kernel may forget inodes on its own (another program's drop_caches): looking every name
    // up again makes it know them all, until the daemon asks it to forget.
    for _ in 0..3 {
        if m.session_log().contains("asking the kernel to forget") {
            break;
        }
        for i in 0..files {
            assert!(fs::metadata(file_path(&m.mp, i)).is_ok());
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    // The forgetting thread looks every 100 ms; FORGETs follow the invalidations.
    let mut st = stat_json(&s, &m);
    for _ in 0..50 {
        if st["fs"]["table_bytes"].as_u64() <= st["fs"]["table_limit"].as_u64() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
        st = stat_json(&s, &m);
    }
    let (bytes, limit) = (
        st["fs"]["table_bytes"].as_u64().unwrap(),
        st["fs"]["table_limit"].as_u64().unwrap(),
    );
    eprintln!(
        "{files} files: table {:.1} MiB (limit {:.1} MiB) for {} inodes",
        bytes as f64 / MIB as f64,
        limit as f64 / MIB as f64,
        st["fs"]["cached_inodes"]
    );
    assert!(
        bytes <= limit,
        "the table holds {bytes} bytes, above its limit {limit}"
    );
    assert!(
        m.session_log().contains("asking the kernel to forget"),
        "no forgetting in the log"
    );
    for i in 0..files {
        let p = file_path(&m.mp, i);
        assert!(p.exists(), "{} is gone", p.display());
    }
    s.finish(m);
}
