//! An administrator's habits from ext4, XFS and Btrfs work on Amaranth through the system's own
//! commands (issue 17): `mount(8)`, `umount(8)`, `fsck(8)` and `mkfs(8)` run our helpers.
//!
//! The helpers are installed by `amaranth install-helper --type amaranth-t<pid>` into /sbin
//! (mount(8) and umount(8) look only there), under a type of this test process's own, and removed
//! at the end: the machine's own `fuse.amaranth` helpers, and those of other test runs, are never
//! touched. Mounts are of type `fuse.amaranth-t<pid>`.
//!
//! - `mkfs_mount_and_umount_through_the_system_commands`: `mkfs -t` with `-L`/`-U`, `amaranth stat`
//!   shows both; `mount -t` prints nothing, works over a non-empty directory; fstab lines (mount by
//!   mount point, `fsck -A` by pass number);
//! - `remount_read_only_and_back`: `mount -o remount,ro` refuses writes with EROFS and writes
//!   nothing to the image (checksummed), `remount,rw` writes again; a `ro` mount writes nothing;
//! - `the_image_is_free_right_after_umount`: 64 MiB written, then `umount` returns with the image
//!   free (our helper runs: the mount is in utab), and `umount && mount`, `umount && fsck` work at
//!   once, also after `umount -i` (no helper: mount and fsck wait for the daemon);
//! - `lazy_umount_returns_at_once_and_timeout_is_honoured`;
//! - `mount_options_are_honoured_or_refused`: dev/suid/exec and negations, noatime, strictatime,
//!   relatime, lazytime, sync, unknown and impossible options (one line, exit 32);
//! - `fsck_flags_and_exit_codes`: `-n` changes nothing (an image with a log to replay), `-y`,
//!   `-p`, `-f`, usage errors;
//! - `known_damage_remount_rw_and_fsck_flags`: an image with recorded damage is refused
//!   read-write, mounts read-only without writing, `remount,rw` is refused with the reason; `fsck
//!   -n` checks it although it was closed cleanly (4, nothing written), `-p` repairs it (1);
//! - `messages_for_a_user_without_fuse_and_relative_paths`: one clear line for `/dev/fuse`
//!   permissions; relative `--log-file`/`--pid-file` are relative to the caller's directory.

mod support;

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::{is_mounted, mount_env_ok, serial, wait_gone, Scratch, BIN};

/// The helpers of this test process, installed into /sbin; removed when dropped.
struct Helpers {
    subtype: String,
    /// A directory put first on PATH for fsck(8) and mkfs(8) (they also look in /sbin).
    env_run: PathBuf,
}

impl Helpers {
    fn install(s: &Scratch) -> Helpers {
        let subtype = format!("amaranth-t{}", std::process::id());
        let out = Command::new(BIN)
            .args(["install-helper", "--type", &subtype, "--sbin-dir", "/sbin"])
            .arg("--bin-dir")
            .arg(s.path("bin"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "install-helper: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        for name in ["mount.fuse", "umount.fuse", "fsck", "fsck.fuse", "mkfs"] {
            let link = PathBuf::from(format!("/sbin/{name}.{subtype}"));
            assert_eq!(fs::read_link(&link).unwrap(), s.path("bin/amaranth"));
        }
        Helpers {
            subtype,
            env_run: s.path("run"),
        }
    }
    fn fstype(&self) -> String {
        format!("fuse.{}", self.subtype)
    }
    /// A system command with our run directory.
    fn cmd(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.env("AMARANTH_RUN_DIR", &self.env_run)
            .stdin(Stdio::null());
        c
    }
}

impl Drop for Helpers {
    fn drop(&mut self) {
        let _ = Command::new(BIN)
            .args(["install-helper", "--remove", "--type", &self.subtype])
            .args(["--sbin-dir", "/sbin"])
            .output();
    }
}

/// Runs a command, printing it and its output.
fn run(mut c: Command) -> Output {
    let shown = format!("{c:?}");
    let out = c.output().unwrap();
    eprintln!(
        "$ {shown} -> {:?}\n  stdout: {}\n  stderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    out
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A mount made with mount(8); dropping it unmounts (lazily if it must) and waits for the daemon.
struct SysMount {
    mp: PathBuf,
    run_dir: PathBuf,
}

impl SysMount {
    fn new(h: &Helpers, image: &Path, mp: &Path, opts: &str) -> (SysMount, Output) {
        fs::create_dir_all(mp).unwrap();
        let mut c = h.cmd("mount");
        c.arg("-t").arg(h.fstype());
        if !opts.is_empty() {
            c.arg("-o").arg(opts);
        }
        c.arg(image).arg(mp);
        let out = run(c);
        let m = SysMount {
            mp: mp.to_path_buf(),
            run_dir: h.env_run.clone(),
        };
        (m, out)
    }
    fn mounted(h: &Helpers, image: &Path, mp: &Path, opts: &str) -> SysMount {
        let (m, out) = SysMount::new(h, image, mp, opts);
        assert!(out.status.success(), "mount failed: {}", stderr(&out));
        assert!(is_mounted(mp));
        m
    }
    fn p(&self, rel: &str) -> PathBuf {
        self.mp.join(rel)
    }
    fn options(&self) -> Vec<String> {
        let mp = self.mp.to_string_lossy().into_owned();
        fs::read_to_string("/proc/self/mounts")
            .unwrap()
            .lines()
            .rfind(|l| l.split(' ').nth(1) == Some(mp.as_str()))
            .map(|l| {
                l.split(' ')
                    .nth(3)
                    .unwrap()
                    .split(',')
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default()
    }
    fn daemon_pid(&self) -> Option<i32> {
        let out = Command::new(BIN)
            .env("AMARANTH_RUN_DIR", &self.run_dir)
            .args([OsStr::new("stat"), "--json".as_ref(), self.mp.as_os_str()])
            .output()
            .ok()?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        v["pid"].as_i64().map(|p| p as i32)
    }
    /// `umount(8)`, asserting that it worked.
    fn umount(self, h: &Helpers) {
        let mut c = h.cmd("umount");
        c.arg(&self.mp);
        let out = run(c);
        assert!(out.status.success(), "umount: {}", stderr(&out));
        assert!(!is_mounted(&self.mp));
    }
}

impl Drop for SysMount {
    fn drop(&mut self) {
        if !is_mounted(&self.mp) {
            return;
        }
        let pid = self.daemon_pid();
        let _ = Command::new(BIN)
            .env("AMARANTH_RUN_DIR", &self.run_dir)
            .arg("umount")
            .arg(&self.mp)
            .args(["--timeout", "60"])
            .output();
        support::detach(&self.mp);
        if let Some(pid) = pid {
            if !wait_gone(pid, Duration::from_secs(60)) {
                // SAFETY: the daemon this guard's mount started.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        }
    }
}

fn sha(p: &Path) -> Vec<u8> {
    let out = Command::new("sha256sum").arg(p).output().unwrap();
    assert!(out.status.success());
    out.stdout[..64].to_vec()
}

fn mkfs(h: &Helpers, image: &Path, size: &str, extra: &[&str]) -> Output {
    let mut c = h.cmd("mkfs");
    c.arg("-t").arg(&h.subtype).args(extra).arg(image).arg(size);
    run(c)
}

fn fsck(h: &Helpers, image: &Path, flags: &[&str]) -> Output {
    let mut c = h.cmd("fsck");
    c.arg("-t").arg(&h.subtype).args(flags).arg(image);
    run(c)
}

fn stat_json(s: &Scratch, target: &Path) -> serde_json::Value {
    let out = s.run(&[OsStr::new("stat"), target.as_os_str(), "--json".as_ref()]);
    assert!(out.status.success(), "stat: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn log_opt(s: &Scratch, name: &str) -> String {
    format!("log={}", s.path(name).display())
}

#[test]
fn mkfs_mount_and_umount_through_the_system_commands() {
    if !mount_env_ok() {
        return;
    }
    let _serial = serial();
    let s = Scratch::new("habits-basic");
    let h = Helpers::install(&s);
    let img = s.path("fs.img");
    let uuid = "0b8f9a3e-4c1d-4f6a-9e2b-7d5c3a1f0e42";
    let out = mkfs(&h, &img, "512M", &["-L", "backup disk", "-U", uuid]);
    assert!(out.status.success(), "mkfs -t: {}", stderr(&out));
    let st = stat_json(&s, &img);
    assert_eq!(st["label"], "backup disk");
    assert_eq!(st["uuid"], uuid);
    let text = s.run(&[OsStr::new("stat"), img.as_os_str()]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("label:           backup disk") && text.contains(uuid),
        "{text}"
    );
    // The magic sits at byte 0 (FORMAT.md), the label at byte 1024.
    let head = fs::read(&img).unwrap();
    assert_eq!(&head[..8], b"AMARANTH");
    assert_eq!(&head[1024..1035], b"backup disk");
    // Over a directory that holds a file: it is hidden while mounted, back afterwards.
    let mp = s.path("mnt");
    fs::create_dir_all(&mp).unwrap();
    fs::write(mp.join("underneath"), b"x").unwrap();
    let (m, out) = SysMount::new(&h, &img, &mp, &log_opt(&s, "mnt.log"));
    assert!(out.status.success(), "mount -t: {}", stderr(&out));
    assert!(
        out.stdout.is_empty() && out.stderr.is_empty(),
        "mount printed something"
    );
    assert!(!m.p("underneath").exists());
    fs::write(m.p("hello"), b"hello").unwrap();
    m.umount(&h);
    assert!(mp.join("underneath").exists());
    // fstab: mount by mount point, fsck -A by pass number.
    let fstab = s.path("fstab");
    fs::write(
        &fstab,
        format!(
            "{} {} {} noatime,{} 0 2\n",
            img.display(),
            mp.display(),
            h.fstype(),
            log_opt(&s, "mnt.log")
        ),
    )
    .unwrap();
    let mut c = h.cmd("mount");
    c.env("LIBMOUNT_FSTAB", &fstab).arg(&mp);
    let out = run(c);
    assert!(
        out.status.success(),
        "mount DIR from fstab: {}",
        stderr(&out)
    );
    let m = SysMount {
        mp: mp.clone(),
        run_dir: h.env_run.clone(),
    };
    assert!(
        m.options().contains(&"noatime".to_string()),
        "{:?}",
        m.options()
    );
    assert_eq!(fs::read(m.p("hello")).unwrap(), b"hello");
    m.umount(&h);
    let mut c = h.cmd("fsck");
    c.env("LIBMOUNT_FSTAB", &fstab).args(["-A", "-f"]);
    let out = run(c);
    assert_eq!(out.status.code(), Some(0), "fsck -A: {}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("clean"));
}

#[test]
fn remount_read_only_and_back() {
    if !mount_env_ok() {
        return;
    }
    let _serial = serial();
    let s = Scratch::new("habits-remount");
    let h = Helpers::install(&s);
    let img = s.path("fs.img");
    assert!(mkfs(&h, &img, "512M", &[]).status.success());
    let mp = s.path("mnt");
    let m = SysMount::mounted(&h, &img, &mp, &log_opt(&s, "mnt.log"));
    fs::write(m.p("a"), vec![7u8; 300_000]).unwrap();
    let mut c = h.cmd("mount");
    c.args(["-o", "remount,ro"]).arg(&mp);
    let out = run(c);
    assert!(out.status.success(), "remount,ro: {}", stderr(&out));
    assert!(m.options().contains(&"ro".to_string()));
    let before = sha(&img);
    let e = fs::write(m.p("b"), b"no").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    let e = fs::create_dir(m.p("d")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS));
    assert_eq!(fs::read(m.p("a")).unwrap(), vec![7u8; 300_000]);
    // Longer than the daemon's log flush and checkpoint periods would allow.
    std::thread::sleep(Duration::from_millis(2500));
    assert!(sha(&img) == before, "a read-only mount wrote to its image");
    let mut c = h.cmd("mount");
    c.args(["-o", "remount,rw"]).arg(&mp);
    let out = run(c);
    assert!(out.status.success(), "remount,rw: {}", stderr(&out));
    fs::write(m.p("b"), b"yes").unwrap();
    m.umount(&h);
    assert_eq!(fsck(&h, &img, &["-f", "-n"]).status.code(), Some(0));
    // A read-only mount from the start writes nothing either, reads included.
    let before = sha(&img);
    let m = SysMount::mounted(
        &h,
        &img,
        &mp,
        &format!("ro,strictatime,{}", log_opt(&s, "mnt.log")),
    );
    assert_eq!(fs::read(m.p("b")).unwrap(), b"yes");
    let e = fs::write(m.p("c"), b"no").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS));
    m.umount(&h);
    assert!(sha(&img) == before, "a ro mount wrote to its image");
}

#[test]
fn the_image_is_free_right_after_umount() {
    if !mount_env_ok() {
        return;
    }
    let _serial = serial();
    let s = Scratch::new("habits-release");
    let h = Helpers::install(&s);
    let img = s.path("fs.img");
    assert!(mkfs(&h, &img, "1G", &[]).status.success());
    let mp = s.path("mnt");
    let data = support::pattern(17, 1 << 20);
    let write_64m = |m: &SysMount, round: usize| {
        for i in 0..64 {
            fs::write(m.p(&format!("f{round}-{i}")), &data).unwrap();
        }
    };
    for round in 0..4 {
        let m = SysMount::mounted(&h, &img, &mp, &log_opt(&s, "mnt.log"));
        write_64m(&m, round);
        if round < 2 {
            // umount(8) runs our helper, which returns once the daemon let go of the image.
            m.umount(&h);
            assert!(
                support::wait_unlocked(&img, Duration::ZERO),
                "umount returned before the image was free"
            );
        } else {
            // umount -i runs no helper: the next mount or fsck waits for the daemon instead.
            let mut c = h.cmd("umount");
            c.arg("-i").arg(&m.mp);
            assert!(run(c).status.success());
        }
        // At once: the next mount (or fsck) must not fail on "in use".
        if round % 2 == 0 {
            let m = SysMount::mounted(&h, &img, &mp, &log_opt(&s, "mnt.log"));
            assert_eq!(fs::read(m.p(&format!("f{round}-63"))).unwrap(), data);
            m.umount(&h);
        } else {
            let out = fsck(&h, &img, &["-f", "-n"]);
            assert_eq!(out.status.code(), Some(0), "fsck right after umount");
        }
    }
}

#[test]
fn lazy_umount_returns_at_once_and_timeout_is_honoured() {
    if !mount_env_ok() {
        return;
    }
    let _serial = serial();
    let s = Scratch::new("habits-lazy");
    let img = s.mkfs("fs.img", "256M");
    let m = s.mount(&img, "mnt", &support::MountOpts::default());
    let pid = m.pid();
    fs::write(m.p("held"), b"held").unwrap();
    let held = fs::File::open(m.p("held")).unwrap();
    let t = Instant::now();
    let out = s.run(&[OsStr::new("umount"), "-l".as_ref(), m.mp.as_os_str()]);
    assert!(out.status.success(), "umount -l: {}", stderr(&out));
    eprintln!("umount -l returned in {:.2} s", t.elapsed().as_secs_f64());
    assert!(!is_mounted(&m.mp));
    assert!(support::alive(pid), "the daemon still serves the open file");
    drop(held);
    assert!(
        wait_gone(pid, Duration::from_secs(60)),
        "daemon left after the last close"
    );
    std::mem::forget(m);
    // --timeout: a daemon that does not answer (stopped) cannot hold the command.
    let m = s.mount(&img, "mnt", &support::MountOpts::default());
    let pid = m.pid();
    // SAFETY: stops the daemon this test started.
    unsafe {
        libc::kill(pid, libc::SIGSTOP);
    }
    let mut c = s.amaranth();
    c.args([
        OsStr::new("umount"),
        "--timeout".as_ref(),
        "2".as_ref(),
        m.mp.as_os_str(),
    ]);
    let mut child = c.stderr(Stdio::piped()).spawn().unwrap();
    let t = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if t.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // SAFETY: resumes the daemon stopped above.
    unsafe {
        libc::kill(pid, libc::SIGCONT);
    }
    let status = status.expect("umount --timeout 2 still running after 60 s");
    eprintln!(
        "umount --timeout 2 gave up after {:.1} s",
        t.elapsed().as_secs_f64()
    );
    drop(m);
    assert!(
        !status.success(),
        "umount of a stopped daemon cannot have finished"
    );
}

#[test]
fn mount_options_are_honoured_or_refused() {
    if !mount_env_ok() {
        return;
    }
    let _serial = serial();
    let s = Scratch::new("habits-options");
    let h = Helpers::install(&s);
    let img = s.path("fs.img");
    assert!(mkfs(&h, &img, "512M", &[]).status.success());
    let mp = s.path("mnt");
    let log = log_opt(&s, "mnt.log");
    // mount(8) does not pass dev, suid, exec (its defaults): they must still hold.
    let m = SysMount::mounted(&h, &img, &mp, &format!("dev,suid,exec,{log}"));
    let o = m.options();
    for no in ["nodev", "nosuid", "noexec"] {
        assert!(!o.contains(&no.to_string()), "{no} in {o:?}");
    }
    fs::write(m.p("f"), b"data").unwrap();
    m.umount(&h);
    let m = SysMount::mounted(&h, &img, &mp, &format!("nodev,nosuid,noexec,noatime,{log}"));
    let o = m.options();
    for want in ["nodev", "nosuid", "noexec", "noatime"] {
        assert!(o.contains(&want.to_string()), "{want} not in {o:?}");
    }
    let t0 = fs::metadata(m.p("f")).unwrap().atime_nsec();
    std::thread::sleep(Duration::from_millis(20));
    fs::read(m.p("f")).unwrap();
    assert_eq!(fs::metadata(m.p("f")).unwrap().atime_nsec(), t0, "noatime");
    m.umount(&h);
    // strictatime: every read; relatime: the second read leaves it.
    for (opt, second_moves) in [("strictatime", true), ("relatime", false)] {
        let m = SysMount::mounted(&h, &img, &mp, &format!("{opt},{log}"));
        // /proc/mounts names relatime; strictatime is the absence of relatime and noatime.
        let o = m.options();
        assert_eq!(
            o.contains(&"relatime".to_string()),
            opt == "relatime",
            "{o:?}"
        );
        assert!(!o.contains(&"noatime".to_string()), "{o:?}");
        fs::write(m.p("f"), b"data").unwrap();
        let atime = || {
            let md = fs::metadata(m.p("f")).unwrap();
            (md.atime(), md.atime_nsec())
        };
        std::thread::sleep(Duration::from_millis(20));
        fs::read(m.p("f")).unwrap();
        let t1 = atime();
        std::thread::sleep(Duration::from_millis(20));
        // Another open: the kernel asks the daemon again (its page cache would answer).
        let f = fs::File::open(m.p("f")).unwrap();
        support::drop_cache(&f);
        drop(f);
        fs::read(m.p("f")).unwrap();
        assert_eq!(atime() != t1, second_moves, "{opt}: second read");
        m.umount(&h);
    }
    // lazytime and sync reach the kernel and the daemon.
    let m = SysMount::mounted(&h, &img, &mp, &format!("lazytime,sync,{log}"));
    let o = m.options();
    assert!(
        o.contains(&"lazytime".into()) && o.contains(&"sync".into()),
        "{o:?}"
    );
    fs::write(m.p("g"), b"synced").unwrap();
    let st = stat_json(&s, &mp);
    assert_eq!(
        st["log"]["durable_lsn"], st["log"]["next_lsn"],
        "sync: a write returned before it was durable"
    );
    m.umount(&h);
    // Unknown and impossible options: refused in one line, with mount(8)'s exit code (once the
    // daemon of the last mount is gone: a mount would say that it waits for it).
    assert!(support::wait_unlocked(&img, Duration::from_secs(60)));
    for bad in [
        "bogus",
        "cache_size=1T",
        "cache_size=1E",
        "threads=0",
        "user_id=5",
        "fsname=x",
    ] {
        let (m, out) = SysMount::new(&h, &img, &mp, &format!("{bad},{log}"));
        assert_eq!(out.status.code(), Some(32), "{bad} accepted");
        let e = stderr(&out);
        assert_eq!(e.trim().lines().count(), 1, "{bad}: {e}");
        assert!(!is_mounted(&m.mp));
    }
}

#[test]
fn fsck_flags_and_exit_codes() {
    if !mount_env_ok() {
        return;
    }
    let _serial = serial();
    let s = Scratch::new("habits-fsck");
    let h = Helpers::install(&s);
    let img = s.mkfs("fs.img", "256M");
    // An image with a log to replay: a daemon killed after synced writes.
    let m = s.mount(&img, "mnt", &support::MountOpts::default());
    fs::write(m.p("f"), b"kept").unwrap();
    support::syncfs(&m.mp).unwrap();
    m.kill9();
    let before = sha(&img);
    let out = fsck(&h, &img, &["-n"]);
    assert_eq!(out.status.code(), Some(0), "fsck -n: {}", stderr(&out));
    assert!(sha(&img) == before, "fsck -n changed the image");
    // Without -f a cleanly closed image is clean at once; -y, -p repair (nothing to repair).
    assert_eq!(fsck(&h, &img, &["-y"]).status.code(), Some(0));
    assert_eq!(fsck(&h, &img, &["-p"]).status.code(), Some(0));
    let out = fsck(&h, &img, &["-n"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("clean"));
    assert_eq!(fsck(&h, &img, &["-f", "-n"]).status.code(), Some(0));
    // Usage errors: 16.
    assert_eq!(fsck(&h, &img, &["-n", "-y"]).status.code(), Some(16));
    assert_eq!(fsck(&h, &img, &["-Q"]).status.code(), Some(16));
    let o = s.run(&["fsck", "-n", "-y", img.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(16));
    // Damage: 4 left with -n.
    let mut bytes = fs::read(&img).unwrap();
    let data_start = 8192 + (16 << 20);
    for off in (data_start..bytes.len()).step_by(64 << 10) {
        bytes[off..off + 64].fill(0xa5);
    }
    fs::write(&img, bytes).unwrap();
    assert_eq!(fsck(&h, &img, &["-f", "-n"]).status.code(), Some(4));
}

/// Zeroes the last block of one node (not the root) that holds something; records the damage in
/// the superblock the way a mount does, by reading it with a read-write engine.
fn damage_and_record(img: &Path) {
    use amaranth_engine::{Engine, Options};
    use std::io::{Read, Seek, SeekFrom, Write};
    use std::sync::Arc;
    let opts = |read_only| Options {
        read_only,
        background_threads: false,
        cache_size: 64 << 20,
        ..Options::default()
    };
    let dev = amaranth_device::FileDevice::open_read_only(img).unwrap();
    let nodes = Engine::open(Arc::new(dev), opts(true))
        .unwrap()
        .node_extents();
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(img)
        .unwrap();
    // A node whose damage a read-only mount survives: not one that holds what every mount
    // reads (the root directory, the counters), which depends on where hashed names landed.
    let mountable = || {
        let dev = amaranth_device::FileDevice::open_read_only(img).unwrap();
        Engine::open(Arc::new(dev), opts(true))
            .ok()
            .is_some_and(|e| amaranth_fs::Fs::new(Arc::new(e), Default::default()).is_ok())
    };
    let damaged = nodes
        .into_iter()
        .filter(|&(id, _, n)| id != 1 && n > 1)
        .any(|(_, b, n)| {
            let mut old = vec![0u8; 4096];
            f.seek(SeekFrom::Start((b + n - 1) * 4096)).unwrap();
            f.read_exact(&mut old).unwrap();
            if old.iter().all(|&x| x == 0) {
                return false;
            }
            f.seek(SeekFrom::Start((b + n - 1) * 4096)).unwrap();
            f.write_all(&[0; 4096]).unwrap();
            f.sync_all().unwrap();
            if mountable() {
                return true;
            }
            f.seek(SeekFrom::Start((b + n - 1) * 4096)).unwrap();
            f.write_all(&old).unwrap();
            f.sync_all().unwrap();
            false
        });
    assert!(damaged, "a node to damage");
    drop(f);
    let dev = amaranth_device::FileDevice::open(img).unwrap();
    let e = Engine::open(Arc::new(dev), opts(false)).unwrap();
    let r = e.scan(
        std::ops::Bound::Unbounded,
        std::ops::Bound::Unbounded,
        |_, _| true,
    );
    assert!(r.unwrap_err().is_damage());
    e.close().unwrap();
    let dev = amaranth_device::FileDevice::open_read_only(img).unwrap();
    let sb = amaranth_engine::Superblock::read_newest(&dev, false).unwrap();
    assert!(sb.damaged && sb.clean, "{sb:?}");
}

#[test]
fn known_damage_remount_rw_and_fsck_flags() {
    if !mount_env_ok() {
        return;
    }
    let _serial = serial();
    let s = Scratch::new("habits-damage");
    let h = Helpers::install(&s);
    let img = s.path("fs.img");
    let o = s.run(&[
        OsStr::new("mkfs"),
        img.as_os_str(),
        "--size".as_ref(),
        "128M".as_ref(),
        "--node-size".as_ref(),
        "512K".as_ref(),
    ]);
    assert!(o.status.success(), "mkfs: {}", stderr(&o));
    let m = s.mount(&img, "mnt", &support::MountOpts::default());
    for i in 0..200 {
        fs::write(m.p(&format!("f{i}")), support::pattern(i, 20_000)).unwrap();
    }
    m.umount();
    damage_and_record(&img);
    let mp = s.path("mnt");
    // Read-write: refused, naming the repair.
    let (m, out) = SysMount::new(&h, &img, &mp, &log_opt(&s, "mnt.log"));
    assert!(!out.status.success() && !is_mounted(&mp));
    assert!(stderr(&out).contains("fsck --repair"), "{}", stderr(&out));
    drop(m);
    // Read-only: mounts and writes nothing; remount,rw is refused with the reason and the mount
    // stays read-only.
    let before = sha(&img);
    let m = SysMount::mounted(&h, &img, &mp, &format!("ro,{}", log_opt(&s, "mnt.log")));
    let mut c = h.cmd("mount");
    c.args(["-o", "remount,rw"]).arg(&mp);
    let out = run(c);
    assert!(!out.status.success());
    let said = stderr(&out);
    assert!(
        said.contains("known damage")
            && said.contains("fsck --repair")
            && said.contains("stays read-only"),
        "{said}"
    );
    assert!(m.options().contains(&"ro".to_string()));
    let e = fs::write(m.p("new"), b"no").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    m.umount(&h);
    assert!(
        sha(&img) == before,
        "a read-only mount of a damaged image wrote"
    );
    // fsck -n without -f: the image was closed cleanly but records damage, so it is checked:
    // 4, and nothing changes.
    let out = fsck(&h, &img, &["-n"]);
    assert_eq!(out.status.code(), Some(4), "fsck -n: {}", stderr(&out));
    assert!(sha(&img) == before, "fsck -n changed the image");
    // -p repairs what --repair does (salvage, schema): 1; then clean without and with -f.
    let out = fsck(&h, &img, &["-p"]);
    assert_eq!(out.status.code(), Some(1), "fsck -p: {}", stderr(&out));
    let out = fsck(&h, &img, &["-n"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("clean"));
    assert_eq!(fsck(&h, &img, &["-f", "-n"]).status.code(), Some(0));
    let m = SysMount::mounted(&h, &img, &mp, &log_opt(&s, "mnt.log"));
    fs::write(m.p("after-repair"), b"ok").unwrap();
    m.umount(&h);
}

#[test]
fn messages_for_a_user_without_fuse_and_relative_paths() {
    if !mount_env_ok() {
        return;
    }
    let _serial = serial();
    let s = Scratch::new("habits-messages");
    let img = s.mkfs("fs.img", "256M");
    // A user who may not open /dev/fuse (mode 0600 root here; skip where it is open to all).
    let mode = fs::metadata("/dev/fuse").unwrap().mode() & 0o777;
    if mode & 0o006 == 0 {
        let dir = s.path("user");
        fs::create_dir_all(dir.join("mnt")).unwrap();
        let uid = 60_000 + std::process::id() % 1000;
        fs::copy(&img, dir.join("fs.img")).unwrap();
        for p in [dir.clone(), dir.join("mnt"), dir.join("fs.img")] {
            std::os::unix::fs::chown(&p, Some(uid), Some(uid)).unwrap();
        }
        let out = run({
            let mut c = Command::new("setpriv");
            c.args([
                format!("--reuid={uid}"),
                format!("--regid={uid}"),
                "--clear-groups".into(),
            ])
            .arg(BIN)
            .args(["mount", "fs.img", "mnt"])
            .current_dir(&dir)
            .env("AMARANTH_RUN_DIR", dir.join("run"))
            .env_remove("XDG_RUNTIME_DIR")
            .stdin(Stdio::null());
            c
        });
        assert!(!out.status.success());
        let e = stderr(&out);
        assert_eq!(e.trim().lines().count(), 1, "{e}");
        assert_eq!(e.matches("cannot open /dev/fuse").count(), 1, "{e}");
        assert!(e.contains("user_allow_other") && e.contains("group"), "{e}");
    }
    // A mount point may hold files, but not be / (it would hide the system, the daemon's files
    // with it, and the daemon would keep its own mount busy).
    let out = s.run(&[OsStr::new("mount"), img.as_os_str(), "/".as_ref()]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("refusing to mount on /"),
        "{}",
        stderr(&out)
    );
    // Relative --log-file and --pid-file: relative to the caller's directory.
    let work = s.path("work");
    fs::create_dir_all(work.join("mnt")).unwrap();
    let mut c = s.amaranth();
    c.current_dir(&work).args([
        "mount",
        img.to_str().unwrap(),
        "mnt",
        "--log-file",
        "daemon.log",
        "--pid-file",
        "daemon.pid",
    ]);
    let out = run(c);
    assert!(out.status.success(), "{}", stderr(&out));
    let mp = work.join("mnt");
    let guard = SysMount {
        mp: mp.clone(),
        run_dir: s.path("run"),
    };
    assert!(
        work.join("daemon.log").exists(),
        "the log is not in the caller's directory"
    );
    let pid: i32 = fs::read_to_string(work.join("daemon.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(support::alive(pid));
    drop(guard);
    assert!(wait_gone(pid, Duration::from_secs(60)));
    assert!(fs::read_to_string(work.join("daemon.log"))
        .unwrap()
        .contains("closed cleanly"));
}
