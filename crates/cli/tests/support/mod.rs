//! Shared helpers for the tests that run the `amaranth` binary on real FUSE mounts (integrity,
//! posix, programs, concurrency, crash_mount): scratch directories with sparse images, a mount
//! guard that always unmounts, fsck, a seeded PRNG, the cached Linux source tree, tree comparison.
//!
//! These tests need root and `/dev/fuse`. Without them they FAIL with a message saying so (CI runs
//! as root with /dev/fuse); set `AMARANTH_SKIP_MOUNT_TESTS=1` to skip them knowingly.
//!
//! Environment:
//! - `AMARANTH_TEST_DIR`: where images and mount points go (default `/var/tmp/amaranth-tests`;
//!   images are sparse files, removed at the end of each test).
//! - `AMARANTH_TEST_CACHE`: inputs prepared once and reused (default
//!   `/var/tmp/amaranth-test-cache`: the uncompressed Linux tar, its extracted tree, subsets).
//! - `AMARANTH_TEST_SEED`: the seed of the random workloads (default: from the clock; printed).
//! - `AMARANTH_TEST_TRANSPORT`: `uring`, `dev` or `auto` (default: the daemon's, `auto`).
//! - `AMARANTH_KEEP_FAILED=1`: keep a failed test's scratch directory (image, daemon log).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr};
use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_amaranth");

/// Checks that mounts are possible. Panics with the reason when they are not (a test that cannot
/// run must not pass silently), unless `AMARANTH_SKIP_MOUNT_TESTS=1`: then it returns false and the
/// caller returns early.
pub fn mount_env_ok() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let fuse = Path::new("/dev/fuse").exists();
    let fusermount = Command::new("fusermount3")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if root && fuse && fusermount {
        return true;
    }
    let why = format!(
        "this test mounts Amaranth through FUSE and needs root ({}), /dev/fuse ({}) and \
         fusermount3 ({})",
        if root { "yes" } else { "NO" },
        if fuse { "yes" } else { "MISSING" },
        if fusermount {
            "yes"
        } else {
            "MISSING: apt-get install fuse3"
        },
    );
    if std::env::var("AMARANTH_SKIP_MOUNT_TESTS").as_deref() == Ok("1") {
        eprintln!("SKIPPED (AMARANTH_SKIP_MOUNT_TESTS=1): {why}");
        return false;
    }
    panic!("{why}; set AMARANTH_SKIP_MOUNT_TESTS=1 to skip the mount tests knowingly");
}

/// Serializes the heavy tests of one test binary (they share two cores with everything else).
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where scratch directories go.
pub fn test_root() -> PathBuf {
    std::env::var_os("AMARANTH_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/amaranth-tests"))
}

/// Where prepared inputs are cached between runs.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("AMARANTH_TEST_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/amaranth-test-cache"))
}

/// The seed for a random workload: `AMARANTH_TEST_SEED` or the clock. Printed, so a failure can be
/// replayed with `AMARANTH_TEST_SEED=<seed>`.
pub fn seed(what: &str) -> u64 {
    let s = match std::env::var("AMARANTH_TEST_SEED") {
        Ok(v) => v
            .trim()
            .parse()
            .expect("AMARANTH_TEST_SEED must be a number"),
        Err(_) => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap();
            t.as_nanos() as u64 ^ (std::process::id() as u64).rotate_left(32)
        }
    };
    eprintln!("{what}: seed {s} (replay with AMARANTH_TEST_SEED={s})");
    s
}

/// xoshiro256** seeded by splitmix64: fast, deterministic, good enough for workloads.
#[derive(Clone, Debug)]
pub struct Rng([u64; 4]);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        Rng([next(), next(), next(), next()])
    }
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let r = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        r
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
    /// Uniform in `lo..hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo)
    }
    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
    pub fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len() as u64) as usize]
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_mut(8) {
            let r = self.next_u64().to_le_bytes();
            c.copy_from_slice(&r[..c.len()]);
        }
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        self.fill(&mut v);
        v
    }
}

/// Deterministic contents: `len` bytes derived from `seed` (never all zero).
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng::new(seed ^ 0x5151_a3a3);
    let mut v = r.bytes(len);
    if let Some(b) = v.first_mut() {
        *b |= 1;
    }
    v
}

/// FNV-1a, 64 bits: cheap content fingerprints for logs.
pub fn fnv(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in data {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

pub fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

pub fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// `0` on success, else the errno.
pub fn rc(r: libc::c_int) -> i32 {
    if r == 0 {
        0
    } else {
        errno()
    }
}

pub fn renameat2(from: &Path, to: &Path, flags: u32) -> i32 {
    let (a, b) = (cstr(from), cstr(to));
    // SAFETY: valid NUL-terminated paths; renameat2 through syscall for older libcs.
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            flags,
        )
    };
    if r == 0 {
        0
    } else {
        errno()
    }
}

pub fn fallocate(f: &File, mode: i32, off: u64, len: u64) -> i32 {
    // SAFETY: a valid fd.
    rc(unsafe { libc::fallocate(f.as_raw_fd(), mode, off as i64, len as i64) })
}

/// `lseek` with `SEEK_DATA`/`SEEK_HOLE`: the offset or the errno.
pub fn seek_data_hole(f: &File, off: u64, whence: i32) -> Result<u64, i32> {
    // SAFETY: a valid fd.
    let r = unsafe { libc::lseek(f.as_raw_fd(), off as i64, whence) };
    if r < 0 {
        Err(errno())
    } else {
        Ok(r as u64)
    }
}

/// Drops the kernel's cached pages of a file, so the next read asks the daemon.
pub fn drop_cache(f: &File) {
    // SAFETY: a valid fd.
    unsafe {
        libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
}

pub fn statvfs(p: &Path) -> libc::statvfs {
    let c = cstr(p);
    // SAFETY: valid path; the struct is plain data.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(
        unsafe { libc::statvfs(c.as_ptr(), &mut st) },
        0,
        "statvfs {}",
        p.display()
    );
    st
}

/// Bytes in use according to statfs.
pub fn used_bytes(p: &Path) -> u64 {
    let st = statvfs(p);
    (st.f_blocks - st.f_bfree) * st.f_frsize
}

/// `syncfs` on the file system holding `p`.
/// A durability point for the whole mount at `p`: `syncfs(2)`, then an fsync of `p` itself. The
/// kernel does not pass syncfs on to a FUSE daemon (it sends `FUSE_SYNCFS` only to virtiofs,
/// docs/GUARANTEES.md 3.), so on an Amaranth mount the directory's FSYNCDIR is what makes the
/// daemon sync its log, which holds everything acknowledged before it.
/// `amaranth umount MP --timeout SECS` with the daemon's run directory, retried for up to 10 s
/// while the mount is busy (naming the processes that hold it): programs outside the test, or a
/// child another test of the same binary spawned, holding copies of descriptors from its fork
/// until its exec closes them, can hold a mount for a moment. Returns the last attempt's output.
pub fn umount_retrying(run_dir: &Path, mp: &Path, timeout_secs: u32) -> Output {
    let t = Instant::now();
    loop {
        let out = Command::new(BIN)
            .env("AMARANTH_RUN_DIR", run_dir)
            .arg("umount")
            .arg(mp)
            .args(["--timeout", &timeout_secs.to_string()])
            .output()
            .unwrap();
        let busy = String::from_utf8_lossy(&out.stderr).contains("is busy");
        if out.status.success() || !busy || t.elapsed() > Duration::from_secs(10) {
            return out;
        }
        eprintln!(
            "umount {}: busy, held by {:?}; retrying",
            mp.display(),
            holders(mp)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub fn syncfs(p: &Path) -> std::io::Result<()> {
    let f = File::open(p)?;
    // SAFETY: a valid fd.
    if unsafe { libc::syncfs(f.as_raw_fd()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    f.sync_all()
}

pub fn is_mounted(mp: &Path) -> bool {
    let mp = mp.canonicalize().unwrap_or_else(|_| mp.to_path_buf());
    let want = mp.as_os_str().as_bytes();
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(4).map(unescape) == Some(want.to_vec()))
}

fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 4 <= b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = b[i + 1..i + 4]
                .iter()
                .fold(0u32, |acc, c| acc * 8 + (c - b'0') as u32);
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// Mount points (from /proc/self/mountinfo) at or below `dir`.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let dir = dir.as_os_str().as_bytes().to_vec();
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(unescape))
        .filter(|m| m.starts_with(&dir))
        .map(|m| PathBuf::from(OsStr::from_bytes(&m)))
        .collect()
}

pub fn alive(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !matches!(
            s.rsplit_once(')')
                .and_then(|(_, r)| r.trim_start().chars().next()),
            Some('Z') | Some('X') | None
        ),
        Err(_) => false,
    }
}

/// Waits until `pid` is gone (or a zombie); false on timeout.
pub fn wait_gone(pid: i32, limit: Duration) -> bool {
    let t = Instant::now();
    while alive(pid) {
        if t.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

/// Waits until nobody holds the `flock` of `image` (the engine's in-use lock); false on timeout.
pub fn wait_unlocked(image: &Path, limit: Duration) -> bool {
    let t = Instant::now();
    loop {
        let Ok(f) = File::open(image) else {
            return true;
        };
        // SAFETY: a valid fd; the lock goes with it when `f` is dropped.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return true;
        }
        if t.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Removes scratch directories of earlier test processes that died without cleaning up (a
/// SIGKILLed `cargo test`), after undoing their mounts.
fn reap_stale(root: &Path) {
    let Ok(rd) = fs::read_dir(root) else { return };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        // "<name>-<pid>-<n>"
        let mut parts = name.rsplitn(3, '-');
        let (_, pid) = (parts.next(), parts.next());
        let Some(pid) = pid.and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        if pid as u32 == std::process::id() || alive(pid) {
            continue;
        }
        let dir = e.path();
        for mp in mounts_under(&dir) {
            let _ = Command::new("fusermount3")
                .args(["-u", "-z"])
                .arg(&mp)
                .output();
            let c = cstr(&mp);
            // SAFETY: a valid path.
            unsafe {
                libc::umount2(c.as_ptr(), libc::MNT_DETACH);
            }
        }
        if mounts_under(&dir).is_empty() {
            let _ = fs::remove_dir_all(&dir);
        }
    }
}

/// A scratch directory (images, mount points, logs, the run directory); removed when dropped.
/// Declare it before the mounts that live in it so it is dropped after them.
pub struct Scratch {
    pub dir: PathBuf,
}

/// The transport every mount of the tests uses (`AMARANTH_TEST_TRANSPORT`: `uring`, `dev` or
/// `auto`); unset: the daemon's default (`auto`).
pub fn test_transport() -> Option<String> {
    std::env::var("AMARANTH_TEST_TRANSPORT")
        .ok()
        .filter(|t| !t.is_empty())
}

/// Options of one mount.
#[derive(Clone, Debug)]
pub struct MountOpts {
    pub cache_size: String,
    pub extra: Vec<String>,
    /// Environment of the daemon (test hooks such as `AMARANTH_FUSE_NO_URING`).
    pub env: Vec<(String, String)>,
    /// A cgroup directory the daemon is started in (it joins `cgroup.procs` before exec).
    pub cgroup: Option<PathBuf>,
}

impl Default for MountOpts {
    fn default() -> Self {
        MountOpts {
            cache_size: "256M".into(),
            extra: Vec::new(),
            env: Vec::new(),
            cgroup: None,
        }
    }
}

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        static N: AtomicUsize = AtomicUsize::new(0);
        let root = test_root();
        fs::create_dir_all(&root).unwrap();
        reap_stale(&root);
        let dir = root.join(format!(
            "{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("run")).unwrap();
        Scratch { dir }
    }
    pub fn path(&self, p: &str) -> PathBuf {
        self.dir.join(p)
    }
    /// `amaranth` with this scratch's run directory (pid files, control sockets).
    pub fn amaranth(&self) -> Command {
        let mut c = Command::new(BIN);
        c.env("AMARANTH_RUN_DIR", self.path("run"));
        c.stdin(Stdio::null());
        c
    }
    /// Runs `amaranth ARGS`, printing the command and its output.
    pub fn run<S: AsRef<OsStr>>(&self, args: &[S]) -> Output {
        self.run_env(args, &[])
    }
    /// [`Scratch::run`] with extra environment variables.
    pub fn run_env<S: AsRef<OsStr>>(&self, args: &[S], env: &[(String, String)]) -> Output {
        self.run_in(args, env, None)
    }
    /// [`Scratch::run_env`] in the cgroup `cgroup` (a directory of a cgroup hierarchy).
    pub fn run_in<S: AsRef<OsStr>>(
        &self,
        args: &[S],
        env: &[(String, String)],
        cgroup: Option<&Path>,
    ) -> Output {
        let mut c = self.amaranth();
        c.args(args);
        for (k, v) in env {
            c.env(k, v);
        }
        if let Some(cg) = cgroup {
            use std::os::unix::process::CommandExt;
            let procs = cstr(&cg.join("cgroup.procs"));
            // SAFETY: only open/write/close between fork and exec (no allocation).
            unsafe {
                c.pre_exec(move || {
                    let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    let n = libc::write(fd, b"0\n".as_ptr().cast(), 2);
                    let e = std::io::Error::last_os_error();
                    libc::close(fd);
                    if n == 2 {
                        Ok(())
                    } else {
                        Err(e)
                    }
                });
            }
        }
        let out = c.output().unwrap();
        let shown: Vec<_> = args
            .iter()
            .map(|a| a.as_ref().to_string_lossy().into_owned())
            .collect();
        eprintln!(
            "$ amaranth {}  -> {:?}{}{}",
            shown.join(" "),
            out.status.code(),
            indent("stdout", &out.stdout),
            indent("stderr", &out.stderr),
        );
        out
    }
    /// `amaranth mkfs` of a new sparse image.
    pub fn mkfs(&self, name: &str, size: &str) -> PathBuf {
        let img = self.path(name);
        let out = self.run(&[
            OsStr::new("mkfs"),
            img.as_os_str(),
            "--size".as_ref(),
            size.as_ref(),
        ]);
        assert!(out.status.success(), "mkfs {} failed", img.display());
        img
    }
    /// Mounts `image` on `self/dir` (created); the returned guard always unmounts.
    pub fn mount(&self, image: &Path, dir: &str, o: &MountOpts) -> Mount {
        match self.try_mount(image, dir, o) {
            Ok(m) => m,
            Err(e) => panic!("mount failed: {e}"),
        }
    }
    /// Mounts like [`Scratch::mount`], or returns what `amaranth mount` said when it failed.
    pub fn try_mount(&self, image: &Path, dir: &str, o: &MountOpts) -> Result<Mount, String> {
        let mp = self.path(dir);
        fs::create_dir_all(&mp).unwrap();
        let pid_file = self.path(&format!("{dir}.pid"));
        let _ = fs::remove_file(&pid_file);
        let log = self.path(&format!("{dir}.log"));
        let mut args: Vec<&OsStr> = vec![
            "mount".as_ref(),
            image.as_os_str(),
            mp.as_os_str(),
            "--cache-size".as_ref(),
            o.cache_size.as_ref(),
            "--pid-file".as_ref(),
            pid_file.as_os_str(),
            "--log-file".as_ref(),
            log.as_os_str(),
        ];
        // AMARANTH_TEST_TRANSPORT=uring|dev|auto runs every mount test on that transport
        // (unless the test chose one itself).
        let transport = test_transport();
        if let Some(t) = &transport {
            if !o.extra.iter().any(|e| e == "--transport") {
                args.push("--transport".as_ref());
                args.push(t.as_ref());
            }
        }
        for e in &o.extra {
            args.push(e.as_ref());
        }
        // The log is appended to: this session's lines start here.
        let log_from = fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
        let out = self.run_in(&args, &o.env, o.cgroup.as_deref());
        let pid = fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse().ok());
        // The guard exists before the assertions, so a half-made mount is undone too.
        let m = Mount {
            mp: mp.clone(),
            image: image.to_path_buf(),
            pid,
            run_dir: self.path("run"),
            log,
            log_from,
        };
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        assert!(is_mounted(&mp), "not mounted after `amaranth mount`");
        assert!(m.pid.is_some(), "no pid in {}", pid_file.display());
        Ok(m)
    }
    /// `amaranth fsck IMAGE`: the exit code and stdout.
    pub fn fsck(&self, image: &Path) -> (i32, String) {
        let out = self.run(&[OsStr::new("fsck"), image.as_os_str()]);
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }
    /// fsck must say clean (exit 0).
    pub fn assert_fsck_clean(&self, image: &Path) {
        let (code, out) = self.fsck(image);
        assert_eq!(code, 0, "fsck of {} is not clean:\n{out}", image.display());
    }
    /// After a crash: fsck must find nothing but files unlinked while the kernel still held
    /// them (they live until the kernel forgets them; the next mount deletes them, as ext4's
    /// orphan list), and nothing at all after that mount.
    pub fn assert_fsck_clean_after_crash(&self, image: &Path) {
        let (code, out) = self.fsck(image);
        let problems: Vec<&str> = out
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("benign ") || l.starts_with("CORRUPTION "))
            .collect();
        let only_orphans = !problems.is_empty()
            && problems
                .iter()
                .all(|l| l.starts_with("benign OrphanInode:"));
        assert!(
            code == 0 || (code == 4 && only_orphans),
            "fsck of {} after the crash finds more than orphans:\n{out}",
            image.display()
        );
    }
    /// Unmounts (asserting a clean close) and requires a clean fsck.
    pub fn finish(&self, m: Mount) {
        let img = m.image.clone();
        m.umount();
        self.assert_fsck_clean(&img);
    }
}

fn indent(what: &str, b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    let s = s.trim();
    if s.is_empty() {
        String::new()
    } else {
        format!("\n  {what}: {}", s.replace('\n', "\n    "))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() && std::env::var("AMARANTH_KEEP_FAILED").as_deref() == Ok("1") {
            eprintln!("keeping {} (AMARANTH_KEEP_FAILED=1)", self.dir.display());
            return;
        }
        // Never recurse into a live mount.
        let left = mounts_under(&self.dir);
        if !left.is_empty() {
            eprintln!(
                "not removing {}: still mounted: {left:?}",
                self.dir.display()
            );
            return;
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A live mount. Dropping it unmounts, whatever happened: `amaranth umount`, then
/// `fusermount3 -u -z` / `umount -l`, then SIGKILL of the daemon from its pid file.
pub struct Mount {
    pub mp: PathBuf,
    pub image: PathBuf,
    pid: Option<i32>,
    run_dir: PathBuf,
    pub log: PathBuf,
    /// Where this session's lines start in the (appended) log.
    log_from: u64,
}

impl Mount {
    pub fn p(&self, rel: &str) -> PathBuf {
        self.mp.join(rel)
    }
    /// The daemon's pid.
    pub fn pid(&self) -> i32 {
        self.pid.expect("daemon pid")
    }
    /// What the daemon logged since this mount.
    pub fn session_log(&self) -> String {
        let all = fs::read(&self.log).unwrap_or_default();
        let from = (self.log_from as usize).min(all.len());
        String::from_utf8_lossy(&all[from..]).into_owned()
    }
    pub fn log_tail(&self, lines: usize) -> String {
        let s = fs::read_to_string(&self.log).unwrap_or_default();
        let v: Vec<&str> = s.lines().collect();
        v[v.len().saturating_sub(lines)..].join("\n")
    }
    /// `amaranth umount`; asserts that it worked, that the daemon exited and closed cleanly.
    ///
    /// A mount found busy is retried for up to 10 s, naming the processes that hold it: programs
    /// outside the test (a `du` or `find` over /var/tmp by someone else on a shared machine) can
    /// hold it for a moment; the test's own open files are all closed by then.
    pub fn umount(mut self) {
        let t = Instant::now();
        let out = umount_retrying(&self.run_dir, &self.mp, 300);
        assert!(
            out.status.success(),
            "umount {} failed: {} (held by {:?})",
            self.mp.display(),
            String::from_utf8_lossy(&out.stderr),
            holders(&self.mp)
        );
        assert!(!is_mounted(&self.mp), "still mounted after umount");
        let pid = self.pid.take().unwrap();
        assert!(
            wait_gone(pid, Duration::from_secs(30)),
            "daemon {pid} alive after umount"
        );
        assert!(
            self.session_log().contains("closed cleanly"),
            "daemon log lacks the clean close:\n{}",
            self.log_tail(30)
        );
        eprintln!(
            "umount {} in {:.1} s",
            self.mp.display(),
            t.elapsed().as_secs_f64()
        );
    }
    /// Waits for a daemon that was told to stop (a signal) to exit; asserts that it did within
    /// `limit`, that the mount is gone and that the engine closed cleanly.
    pub fn expect_clean_exit(mut self, limit: Duration) {
        let pid = self.pid();
        assert!(
            wait_gone(pid, limit),
            "daemon {pid} still running {limit:?} after it was told to stop"
        );
        self.pid = None;
        assert!(
            !is_mounted(&self.mp),
            "still mounted after the daemon exited"
        );
        assert!(
            self.session_log().contains("closed cleanly"),
            "daemon log lacks the clean close:\n{}",
            self.log_tail(30)
        );
    }
    /// `kill -9` of the daemon, then the dead mount is detached. Returns once the daemon is gone.
    pub fn kill9(mut self) {
        let pid = self.pid.take().unwrap();
        // SAFETY: signals the daemon this guard mounted.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
        assert!(
            wait_gone(pid, Duration::from_secs(60)),
            "daemon {pid} survived SIGKILL for 60 s"
        );
        // The leader can be a zombie while other threads still finish an I/O and hold the
        // image (and its lock): wait until the lock is free, as the next opener needs it.
        assert!(
            wait_unlocked(&self.image, Duration::from_secs(60)),
            "{} still locked 60 s after the daemon was killed",
            self.image.display()
        );
        detach(&self.mp);
        // An unclean stop: the log must not claim a clean close for this session.
        self.pid = None;
    }
}

/// Detaches a (dead or busy) mount: fusermount3 -u -z, then umount2(MNT_DETACH).
pub fn detach(mp: &Path) {
    if is_mounted(mp) {
        let _ = Command::new("fusermount3")
            .args(["-u", "-z"])
            .arg(mp)
            .stderr(Stdio::null())
            .output();
    }
    if is_mounted(mp) {
        let c = cstr(mp);
        // SAFETY: a valid path.
        unsafe {
            libc::umount2(c.as_ptr(), libc::MNT_DETACH);
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- daemon log {} (last lines) ---\n{}\n---",
                self.log.display(),
                self.log_tail(40)
            );
        }
        if is_mounted(&self.mp) {
            let _ = Command::new(BIN)
                .env("AMARANTH_RUN_DIR", &self.run_dir)
                .args([
                    "umount".as_ref(),
                    self.mp.as_os_str(),
                    "--timeout".as_ref(),
                    "60".as_ref(),
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .output();
        }
        detach(&self.mp);
        if let Some(pid) = self.pid.take() {
            if !wait_gone(pid, Duration::from_secs(30)) {
                // SAFETY: kills the daemon this guard mounted.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
                wait_gone(pid, Duration::from_secs(30));
            }
        }
    }
}

/// Runs a shell command line, returning its output (not asserting).
pub fn sh(script: &str) -> Output {
    let out = Command::new("bash")
        .args(["-c", script])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    out
}

/// Runs a shell command line and asserts success; returns stdout.
pub fn sh_ok(script: &str) -> String {
    let t = Instant::now();
    let out = sh(script);
    let show = |b: &[u8]| {
        let s = String::from_utf8_lossy(b);
        let v: Vec<&str> = s.lines().collect();
        v[v.len().saturating_sub(30)..].join("\n")
    };
    assert!(
        out.status.success(),
        "`{script}` failed ({:?}):\nstdout: {}\nstderr: {}",
        out.status,
        show(&out.stdout),
        show(&out.stderr)
    );
    eprintln!("$ {script}  ({:.1} s)", t.elapsed().as_secs_f64());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Shell-quotes a path.
pub fn q(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', r"'\''"))
}

/// An exclusive lock on a file, held while the guard lives (for the shared input cache).
pub struct FileLock(File);

impl FileLock {
    pub fn new(path: &Path) -> FileLock {
        if let Some(d) = path.parent() {
            fs::create_dir_all(d).unwrap();
        }
        let f = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .unwrap();
        // SAFETY: a valid fd.
        assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) }, 0);
        FileLock(f)
    }
}

const LINUX_XZ: &str = "/usr/src/linux-source-6.1.tar.xz";

fn linux_xz() -> PathBuf {
    let p = PathBuf::from(LINUX_XZ);
    assert!(
        p.exists(),
        "{LINUX_XZ} is missing: install the Debian package linux-source-6.1 \
         (scripts/install-deps.sh does)"
    );
    p
}

/// The uncompressed Linux 6.1 tar (about 1.3 GB), made once in the cache.
pub fn linux_tar() -> PathBuf {
    let dir = cache_dir();
    let tar = dir.join("linux-source-6.1.tar");
    let _l = FileLock::new(&dir.join(".lock"));
    if !tar.exists() {
        let xz = linux_xz();
        let tmp = dir.join("linux-source-6.1.tar.tmp");
        sh_ok(&format!("xz -dc {} > {}", q(&xz), q(&tmp)));
        fs::rename(&tmp, &tar).unwrap();
    }
    tar
}

/// The extracted Linux tree on the host file system (the reference for comparisons):
/// `<cache>/linux/linux-source-6.1`.
pub fn linux_tree() -> PathBuf {
    let tar = linux_tar();
    let dir = cache_dir();
    let top = dir.join("linux");
    let _l = FileLock::new(&dir.join(".lock"));
    if !top.join(".complete").exists() {
        let tmp = dir.join("linux.tmp");
        let _ = fs::remove_dir_all(&tmp);
        let _ = fs::remove_dir_all(&top);
        fs::create_dir_all(&tmp).unwrap();
        sh_ok(&format!("tar -xf {} -C {}", q(&tar), q(&tmp)));
        fs::write(tmp.join(".complete"), b"").unwrap();
        fs::rename(&tmp, &top).unwrap();
    }
    top.join("linux-source-6.1")
}

/// A variant of the Linux tar (made once, with its extracted reference tree): the directories
/// `include` (relative to `linux-source-6.1/`; empty = everything) minus those in `exclude`.
/// Returns the tar and the extracted `linux-source-6.1` directory.
pub fn linux_variant(name: &str, include: &[&str], exclude: &[&str]) -> (PathBuf, PathBuf) {
    let tree = linux_tree();
    let dir = cache_dir();
    let tar = dir.join(format!("{name}.tar"));
    let ref_top = dir.join(name);
    let _l = FileLock::new(&dir.join(".lock"));
    if !tar.exists() {
        let tmp = dir.join(format!("{name}.tar.tmp"));
        let inc: Vec<String> = if include.is_empty() {
            vec![q(Path::new("linux-source-6.1"))]
        } else {
            include
                .iter()
                .map(|d| q(&PathBuf::from("linux-source-6.1").join(d)))
                .collect()
        };
        let exc: Vec<String> = exclude
            .iter()
            .map(|d| {
                format!(
                    "--exclude={}",
                    q(&PathBuf::from("linux-source-6.1").join(d))
                )
            })
            .collect();
        sh_ok(&format!(
            "tar -cf {} -C {} {} {}",
            q(&tmp),
            q(tree.parent().unwrap()),
            exc.join(" "),
            inc.join(" ")
        ));
        fs::rename(&tmp, &tar).unwrap();
    }
    if !ref_top.join(".complete").exists() {
        let tmp = dir.join(format!("{name}.tmp"));
        let _ = fs::remove_dir_all(&tmp);
        let _ = fs::remove_dir_all(&ref_top);
        fs::create_dir_all(&tmp).unwrap();
        sh_ok(&format!("tar -xf {} -C {}", q(&tar), q(&tmp)));
        fs::write(tmp.join(".complete"), b"").unwrap();
        fs::rename(&tmp, &ref_top).unwrap();
    }
    (tar, ref_top.join("linux-source-6.1"))
}

/// One entry of a tree walk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub kind: char,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub mtime: (i64, i64),
    pub nlink: u64,
    pub target: Option<PathBuf>,
}

/// Every entry below `root` (relative paths, sorted), without following symlinks.
pub fn walk(root: &Path) -> BTreeMap<PathBuf, Entry> {
    let mut out = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let rd = fs::read_dir(root.join(&rel))
            .unwrap_or_else(|e| panic!("read_dir {}: {e}", root.join(&rel).display()));
        for e in rd {
            let e = e.unwrap();
            let r = rel.join(e.file_name());
            let p = root.join(&r);
            let m =
                fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("lstat {}: {e}", p.display()));
            let ft = m.file_type();
            let kind = if ft.is_dir() {
                'd'
            } else if ft.is_file() {
                'f'
            } else if ft.is_symlink() {
                'l'
            } else if ft.is_fifo() {
                'p'
            } else if ft.is_char_device() {
                'c'
            } else if ft.is_block_device() {
                'b'
            } else {
                's'
            };
            let target = if kind == 'l' {
                Some(fs::read_link(&p).unwrap())
            } else {
                None
            };
            if kind == 'd' {
                stack.push(r.clone());
            }
            out.insert(
                r,
                Entry {
                    kind,
                    mode: m.mode() & 0o7777,
                    uid: m.uid(),
                    gid: m.gid(),
                    size: if kind == 'd' { 0 } else { m.size() },
                    mtime: (m.mtime(), m.mtime_nsec()),
                    nlink: if kind == 'd' { 0 } else { m.nlink() },
                    target,
                },
            );
        }
    }
    out
}

/// What to compare besides names, kinds, sizes and symlink targets.
#[derive(Clone, Copy, Debug, Default)]
pub struct Compare {
    pub mode: bool,
    pub owner: bool,
    /// Modification times of files and symlinks (seconds and nanoseconds).
    pub mtime: bool,
    /// Directory mtimes too.
    pub dir_mtime: bool,
    /// Link counts of non-directories.
    pub nlink: bool,
}

impl Compare {
    /// Everything.
    pub fn all() -> Compare {
        Compare {
            mode: true,
            owner: true,
            mtime: true,
            dir_mtime: true,
            nlink: true,
        }
    }
}

/// Compares two trees' metadata; panics with the first differences.
pub fn compare_trees(a: &Path, b: &Path, c: Compare) -> usize {
    let (wa, wb) = (walk(a), walk(b));
    let mut diffs = Vec::new();
    for (k, ea) in &wa {
        match wb.get(k) {
            None => diffs.push(format!("only in {}: {}", a.display(), k.display())),
            Some(eb) => {
                let mut d = Vec::new();
                if ea.kind != eb.kind {
                    d.push(format!("kind {} vs {}", ea.kind, eb.kind));
                }
                if ea.kind != 'd' && ea.size != eb.size {
                    d.push(format!("size {} vs {}", ea.size, eb.size));
                }
                if ea.target != eb.target {
                    d.push(format!("target {:?} vs {:?}", ea.target, eb.target));
                }
                if c.mode && ea.kind != 'l' && ea.mode != eb.mode {
                    d.push(format!("mode {:o} vs {:o}", ea.mode, eb.mode));
                }
                if c.owner && (ea.uid, ea.gid) != (eb.uid, eb.gid) {
                    d.push(format!(
                        "owner {}:{} vs {}:{}",
                        ea.uid, ea.gid, eb.uid, eb.gid
                    ));
                }
                if c.nlink && ea.nlink != eb.nlink {
                    d.push(format!("nlink {} vs {}", ea.nlink, eb.nlink));
                }
                let mt = if ea.kind == 'd' { c.dir_mtime } else { c.mtime };
                if mt && ea.mtime != eb.mtime {
                    d.push(format!("mtime {:?} vs {:?}", ea.mtime, eb.mtime));
                }
                if !d.is_empty() {
                    diffs.push(format!("{}: {}", k.display(), d.join(", ")));
                }
            }
        }
    }
    for k in wb.keys() {
        if !wa.contains_key(k) {
            diffs.push(format!("only in {}: {}", b.display(), k.display()));
        }
    }
    assert!(
        diffs.is_empty(),
        "{} differences between {} and {}, first ones:\n{}",
        diffs.len(),
        a.display(),
        b.display(),
        diffs[..diffs.len().min(30)].join("\n")
    );
    wa.len()
}

/// `diff -r` of two trees (contents), asserting no difference.
pub fn diff_r(a: &Path, b: &Path) {
    let out = sh(&format!("diff -r --no-dereference {} {}", q(a), q(b)));
    if !out.status.success() {
        let s = String::from_utf8_lossy(&out.stdout);
        let v: Vec<&str> = s.lines().take(30).collect();
        panic!(
            "diff -r {} {} found differences ({:?}):\n{}\n{}",
            a.display(),
            b.display(),
            out.status,
            v.join("\n"),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `setxattr`: 0 or the errno.
pub fn xattr_set(p: &Path, name: &str, value: &[u8], flags: i32) -> i32 {
    let (c, n) = (cstr(p), CString::new(name).unwrap());
    // SAFETY: valid pointers and lengths.
    rc(unsafe {
        libc::setxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    })
}

/// `getxattr`: the value or the errno.
pub fn xattr_get(p: &Path, name: &str) -> Result<Vec<u8>, i32> {
    let (c, n) = (cstr(p), CString::new(name).unwrap());
    // SAFETY: a size probe with a null buffer, then a read into a buffer of that size.
    unsafe {
        let len = libc::getxattr(c.as_ptr(), n.as_ptr(), std::ptr::null_mut(), 0);
        if len < 0 {
            return Err(errno());
        }
        let mut buf = vec![0u8; len as usize];
        let got = libc::getxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len());
        if got < 0 {
            return Err(errno());
        }
        buf.truncate(got as usize);
        Ok(buf)
    }
}

/// `listxattr`: the names, sorted.
pub fn xattr_list(p: &Path) -> Vec<String> {
    let c = cstr(p);
    // SAFETY: a size probe, then a read into a buffer of that size.
    unsafe {
        let len = libc::listxattr(c.as_ptr(), std::ptr::null_mut(), 0);
        assert!(len >= 0, "listxattr: errno {}", errno());
        let mut buf = vec![0u8; len as usize];
        let got = libc::listxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len());
        assert!(got >= 0);
        buf.truncate(got as usize);
        let mut v: Vec<String> = buf
            .split(|&b| b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect();
        v.sort();
        v
    }
}

/// `removexattr`: 0 or the errno.
pub fn xattr_remove(p: &Path, name: &str) -> i32 {
    let (c, n) = (cstr(p), CString::new(name).unwrap());
    // SAFETY: valid pointers.
    rc(unsafe { libc::removexattr(c.as_ptr(), n.as_ptr()) })
}

/// Reads a whole file, `None` when it does not exist.
pub fn read_opt(p: &Path) -> Option<Vec<u8>> {
    match fs::read(p) {
        Ok(v) => Some(v),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => None,
        Err(e) => panic!("read {}: {e}", p.display()),
    }
}

/// Lines of a file, for logs written by workloads.
pub fn read_lines(p: &Path) -> Vec<String> {
    match File::open(p) {
        Ok(f) => BufReader::new(f).lines().map_while(Result::ok).collect(),
        Err(_) => Vec::new(),
    }
}

/// Prints a line that can be quoted (`== ...`) and appends it, with the date, to
/// `<AMARANTH_TEST_DIR>/reports.log` (the test harness hides a passing test's output).
pub fn report(line: &str) {
    eprintln!("== {line}");
    let _ = fs::create_dir_all(test_root());
    if let Ok(mut f) = OpenOptions::new()
        .create(true)
        .append(true)
        .open(test_root().join("reports.log"))
    {
        use std::io::Write;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let _ = writeln!(f, "{now} {line}");
    }
}

/// The processes (pid, command) with an open file, working directory or root under `mp`.
pub fn holders(mp: &Path) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    let Ok(procs) = fs::read_dir("/proc") else {
        return found;
    };
    for p in procs.flatten() {
        let Ok(pid) = p.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let dir = p.path();
        let mut links: Vec<PathBuf> = vec![dir.join("cwd"), dir.join("root")];
        if let Ok(fds) = fs::read_dir(dir.join("fd")) {
            links.extend(fds.flatten().map(|f| f.path()));
        }
        if links
            .iter()
            .filter_map(|l| fs::read_link(l).ok())
            .any(|t| t.starts_with(mp))
        {
            let comm = fs::read_to_string(dir.join("comm")).unwrap_or_default();
            found.push((pid, comm.trim().to_string()));
        }
    }
    found
}
