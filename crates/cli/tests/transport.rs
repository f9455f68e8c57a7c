//! The two FUSE transports through real mounts: FUSE-over-io_uring serves and counts requests,
//! the /dev/fuse fallback takes over when io_uring is unavailable, and `kill -9` of a daemon with
//! requests in flight on the ring leaves a detachable mount and a consistent image.

use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod support;
use support::{is_mounted, mount_env_ok, serial, MountOpts, Scratch};

fn uring_in_kernel() -> bool {
    let there = Path::new("/sys/module/fuse/parameters/enable_uring").exists();
    if !there {
        eprintln!("SKIPPED: this kernel has no FUSE-over-io_uring");
    }
    there
}

fn stat_json(s: &Scratch, mp: &Path) -> serde_json::Value {
    let out = s.run(&[OsStr::new("stat"), OsStr::new("--json"), mp.as_os_str()]);
    assert!(out.status.success(), "amaranth stat failed");
    serde_json::from_slice(&out.stdout).expect("stat --json prints JSON")
}

fn requests(v: &serde_json::Value, opcode: &str) -> u64 {
    v["fuse"]["requests_by_opcode"][opcode]
        .as_u64()
        .unwrap_or(0)
}

/// Mount options for transport `t` with the test hook that holds every fsync in the daemon while
/// `hold` exists (`AMARANTH_TEST_HOLD_FSYNC`).
fn with_fsync_hold(hold: &Path, t: &str) -> MountOpts {
    MountOpts {
        env: vec![(
            amaranth_fuse::HOLD_FSYNC_ENV.to_string(),
            hold.display().to_string(),
        )],
        ..with_transport(t)
    }
}

fn with_transport(t: &str) -> MountOpts {
    MountOpts {
        extra: vec!["--transport".into(), t.into()],
        ..MountOpts::default()
    }
}

/// On io_uring: files work, `stat` names the transport, one WRITE per 4 KiB `pwrite`, no OPEN,
/// FLUSH or RELEASE requests for an open and close, and a create is a MKNOD (no RELEASE after it).
#[test]
fn uring_serves_requests_one_write_per_call_and_no_open_or_flush() {
    if !mount_env_ok() || !uring_in_kernel() {
        return;
    }
    let _g = serial();
    let s = Scratch::new("ur");
    let img = s.mkfs("a.img", "1G");
    let m = s.mount(&img, "mnt", &with_transport("uring"));
    let before = stat_json(&s, &m.mp);
    assert_eq!(before["fuse"]["transport"], "uring");
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(m.p("f"))
        .unwrap();
    let block = vec![7u8; 4096];
    for i in 0..100u64 {
        f.write_at(&block, i * 4096).unwrap();
    }
    drop(f);
    drop(File::open(m.p("f")).unwrap());
    let opened = stat_json(&s, &m.mp);
    for _ in 0..10 {
        drop(File::open(m.p("f")).unwrap());
    }
    let g = OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(m.p("g"))
        .unwrap();
    g.write_at(b"g", 0).unwrap();
    drop(g);
    let after = stat_json(&s, &m.mp);
    assert_eq!(requests(&after, "WRITE") - requests(&before, "WRITE"), 101);
    // OPEN, FLUSH and CREATE are answered ENOSYS once and never sent again; files are made with
    // MKNOD and carry no handle, so no RELEASE ever (none after the first create's close either).
    for op in ["OPEN", "FLUSH", "CREATE"] {
        assert_eq!(
            requests(&after, op),
            requests(&opened, op),
            "open/close sent {op}: {after}"
        );
        assert!(requests(&after, op) <= 1, "{op}: {after}");
    }
    assert_eq!(requests(&after, "MKNOD"), 2, "{after}");
    // RELEASE is asynchronous: wait a little for one that should not come.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let after = stat_json(&s, &m.mp);
    assert_eq!(requests(&after, "RELEASE"), 0, "{after}");
    // The handler time of the writes is counted too (bench/tools/floor.py reads it).
    let ns = |v: &serde_json::Value| v["fuse"]["handler_ns_by_opcode"]["WRITE"].as_u64();
    assert!(
        ns(&after).unwrap_or(0) > ns(&before).unwrap_or(0),
        "no handler time for WRITE: {after}"
    );
    assert_eq!(fs::read(m.p("f")).unwrap(), vec![7u8; 409600]);
    s.finish(m);
}

/// When io_uring is unavailable, `auto` serves over /dev/fuse and `uring` refuses clearly.
#[test]
fn dev_fallback_when_uring_is_unavailable() {
    if !mount_env_ok() {
        return;
    }
    let _g = serial();
    let s = Scratch::new("fb");
    let img = s.mkfs("a.img", "1G");
    let no_uring = vec![("AMARANTH_FUSE_NO_URING".to_string(), "1".to_string())];
    fs::create_dir_all(s.path("mnt")).unwrap();
    let refused = s.run_env(
        &[
            OsStr::new("mount"),
            img.as_os_str(),
            s.path("mnt").as_os_str(),
            OsStr::new("--transport"),
            OsStr::new("uring"),
        ],
        &no_uring,
    );
    assert!(
        !refused.status.success(),
        "--transport uring mounted without io_uring"
    );
    assert!(!is_mounted(&s.path("mnt")));
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(why.contains("--transport uring"), "unclear refusal: {why}");
    let m = s.mount(
        &img,
        "mnt",
        &MountOpts {
            env: no_uring,
            ..with_transport("auto")
        },
    );
    assert_eq!(stat_json(&s, &m.mp)["fuse"]["transport"], "dev");
    fs::write(m.p("a"), b"through /dev/fuse").unwrap();
    fs::create_dir(m.p("d")).unwrap();
    fs::rename(m.p("a"), m.p("d/b")).unwrap();
    assert_eq!(fs::read(m.p("d/b")).unwrap(), b"through /dev/fuse");
    assert!(m.session_log().contains("using /dev/fuse"));
    s.finish(m);
}

/// Over /dev/fuse the daemon turns on the fuse module's `wake_here` where the kernel has it (as
/// root), says so in the log, and reads a large out-of-line file back whole through the READ
/// buffer of each thread's own; with the test hook it leaves the parameter as it is.
#[test]
fn dev_turns_on_wake_here_and_reads_through_its_own_buffer() {
    if !mount_env_ok() {
        return;
    }
    let param = Path::new("/sys/module/fuse/parameters/wake_here");
    let _g = serial();
    let s = Scratch::new("wh");
    let img = s.mkfs("a.img", "1G");
    let m = s.mount(&img, "mnt", &with_transport("dev"));
    assert_eq!(stat_json(&s, &m.mp)["fuse"]["transport"], "dev");
    if param.exists() {
        assert_eq!(fs::read_to_string(param).unwrap().trim(), "Y");
        assert!(m.session_log().contains("wake_here is on"));
    } else {
        eprintln!("(this kernel has no wake_here parameter)");
    }
    // 3 MiB + 5 KiB of patterned data: whole blocks go out of line, each READ of 1 MiB is read
    // straight into the thread's buffer, the tail is inline.
    let data: Vec<u8> = (0..(3u32 << 20) + 5 * 1024)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    fs::write(m.p("big"), &data).unwrap();
    s.finish(m);
    let o = MountOpts {
        env: vec![(amaranth_fuse::NO_WAKE_HERE_ENV.to_string(), "1".to_string())],
        ..with_transport("dev")
    };
    let m = s.mount(&img, "mnt", &o);
    assert!(m.session_log().contains("without"), "no word on wake_here");
    assert_eq!(fs::read(m.p("big")).unwrap(), data);
    let f = File::open(m.p("big")).unwrap();
    let at = (1 << 20) + 4096 * 3 + 100;
    let mut part = vec![0u8; 8192];
    f.read_exact_at(&mut part, at as u64).unwrap();
    assert_eq!(part, data[at..at + 8192]);
    drop(f);
    s.finish(m);
}

/// The daemon's ring threads (`amaranth-q*`): their names and `/proc` directories.
fn ring_threads(pid: i32) -> Vec<(String, std::path::PathBuf)> {
    fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| {
            let dir = t.ok()?.path();
            let comm = fs::read_to_string(dir.join("comm")).ok()?; // gone: a thread that ended
            let name = comm.trim();
            name.starts_with("amaranth-q")
                .then(|| (name.to_string(), dir))
        })
        .collect()
}

/// The scheduling policies of the daemon's ring threads, by thread name.
fn ring_thread_policies(pid: i32) -> Vec<(String, i32)> {
    ring_threads(pid)
        .into_iter()
        .filter_map(|(name, dir)| {
            let stat = fs::read_to_string(dir.join("stat")).ok()?;
            // Field 41 is the policy; field 3 follows the command name in parentheses.
            let rest = &stat[stat.rfind(')')? + 2..];
            Some((name, rest.split(' ').nth(41 - 3)?.parse().ok()?))
        })
        .collect()
}

/// On io_uring, as root, ring threads commit their replies at SCHED_IDLE (so that a caller wakes
/// on the serving CPU) and are back at their own policy before they wait for the next request:
/// once the callers have gone quiet, no ring thread is left idle-policy. `-o ring_wake=any`
/// commits plainly and says so.
#[test]
fn uring_replies_wake_callers_here_and_no_ring_thread_stays_idle_policy() {
    if !mount_env_ok() || !uring_in_kernel() {
        return;
    }
    let _g = serial();
    let s = Scratch::new("rw");
    let img = s.mkfs("a.img", "1G");
    let m = s.mount(&img, "mnt", &with_transport("uring"));
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let log = m.session_log();
    if root {
        assert!(
            log.contains("ring replies wake their callers on the serving CPU"),
            "{log}"
        );
    } else {
        assert!(log.contains("ring replies leave the caller's CPU"), "{log}");
    }
    // Serial calls and concurrent ones (both CPUs' queues, several threads of each).
    fs::create_dir(m.p("d")).unwrap();
    std::thread::scope(|sc| {
        for t in 0..4 {
            let m = &m;
            sc.spawn(move || {
                for i in 0..300 {
                    let p = m.p(&format!("d/f{t}-{i}"));
                    fs::write(&p, [t as u8; 100]).unwrap();
                    let mut perm = fs::metadata(&p).unwrap().permissions();
                    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o600);
                    fs::set_permissions(&p, perm).unwrap();
                }
            });
        }
    });
    assert_eq!(fs::read_dir(m.p("d")).unwrap().count(), 1200);
    // A thread preempted right after its commit is idle-policy until it next runs: give it time.
    let mut policies = ring_thread_policies(m.pid());
    for _ in 0..50 {
        if policies.iter().all(|(_, p)| *p == libc::SCHED_OTHER) {
            break;
        }
        std::thread::sleep(Duration::from_millis(40));
        policies = ring_thread_policies(m.pid());
    }
    assert!(!policies.is_empty(), "no ring threads found");
    let idle: Vec<_> = policies
        .iter()
        .filter(|(_, p)| *p != libc::SCHED_OTHER)
        .collect();
    assert!(
        idle.is_empty(),
        "ring threads not at SCHED_OTHER while quiet: {idle:?}"
    );
    s.finish(m);
    let o = MountOpts {
        extra: vec![
            "--transport".into(),
            "uring".into(),
            "-o".into(),
            "ring_wake=any".into(),
        ],
        ..MountOpts::default()
    };
    let m = s.mount(&img, "mnt", &o);
    assert!(m.session_log().contains("(ring_wake=any)"));
    assert_eq!(fs::read(m.p("d/f3-299")).unwrap(), [3u8; 100]);
    s.finish(m);
}

/// `kill -9` of the daemon while clients have requests in flight on the ring: the clients get
/// errors (not a hang), the dead mount detaches, the image is consistent, and a remount sees
/// every file that an fsync acknowledged.
#[test]
fn kill_9_with_requests_in_flight_on_uring() {
    if !mount_env_ok() || !uring_in_kernel() {
        return;
    }
    let _g = serial();
    let s = Scratch::new("uk");
    let img = s.mkfs("a.img", "1G");
    let m = s.mount(&img, "mnt", &with_transport("uring"));
    fs::write(m.p("synced"), b"acknowledged").unwrap();
    File::open(m.p("synced")).unwrap().sync_all().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for t in 0..4 {
        let (dir, stop) = (m.mp.clone(), stop.clone());
        clients.push(std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let p = dir.join(format!("c{t}-{i}"));
                let r = File::create(&p).and_then(|mut f| f.write_all(&[t as u8; 3000]));
                if r.is_err() {
                    return i; // the connection is gone
                }
                i += 1;
            }
            i
        }));
    }
    std::thread::sleep(Duration::from_millis(300));
    let mp = m.mp.clone();
    m.kill9();
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        let n = c.join().expect("a client thread panicked");
        assert!(n > 0, "a client made no progress before the kill");
    }
    assert!(!is_mounted(&mp), "the dead mount is still attached");
    s.assert_fsck_clean(&img);
    let m = s.mount(&img, "mnt", &with_transport("uring"));
    assert_eq!(fs::read(m.p("synced")).unwrap(), b"acknowledged");
    s.finish(m);
}

/// Unmount under load on io_uring: writers keep their files open and write while the mount is
/// detached (`amaranth umount --lazy`); the daemon serves them until they close, then exits
/// cleanly, and the image holds everything they wrote.
#[test]
fn lazy_unmount_under_load_on_uring() {
    if !mount_env_ok() || !uring_in_kernel() {
        return;
    }
    let _g = serial();
    let s = Scratch::new("ul");
    let img = s.mkfs("a.img", "1G");
    let m = s.mount(&img, "mnt", &with_transport("uring"));
    let files: Vec<File> = (0..4)
        .map(|t| File::create(m.p(&format!("w{t}"))).unwrap())
        .collect();
    let detached = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = files
        .into_iter()
        .map(|f| {
            let detached = detached.clone();
            std::thread::spawn(move || {
                let block = [5u8; 4096];
                let mut n = 0u64;
                // Write before and after the detach, at least 200 blocks after it.
                let mut after = 0;
                while after < 200 && n < 20_000 {
                    f.write_at(&block, n * 4096)
                        .expect("a write on a detached mount");
                    n += 1;
                    if detached.load(Ordering::Relaxed) {
                        after += 1;
                    }
                }
                assert!(after > 0, "no write after the detach");
                n
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    // `amaranth umount --lazy` returns when the daemon has exited, that is after the writers
    // close: run it beside them and let them go on once the mount is detached.
    let umount = s
        .amaranth()
        .args([OsStr::new("umount"), m.mp.as_os_str(), OsStr::new("--lazy")])
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while is_mounted(&m.mp) {
        assert!(t0.elapsed() < Duration::from_secs(30), "not detached");
        std::thread::sleep(Duration::from_millis(5));
    }
    detached.store(true, Ordering::Relaxed);
    let written: Vec<u64> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    let out = umount.wait_with_output().unwrap();
    assert!(out.status.success(), "lazy umount failed");
    m.expect_clean_exit(Duration::from_secs(60));
    s.assert_fsck_clean(&img);
    let m = s.mount(&img, "mnt", &with_transport("uring"));
    for (t, n) in written.iter().enumerate() {
        let got = fs::read(m.p(&format!("w{t}"))).unwrap();
        assert_eq!(got.len() as u64, n * 4096, "w{t}");
        assert!(got.iter().all(|&b| b == 5), "w{t} holds other bytes");
    }
    s.finish(m);
}

/// Pins the calling thread to CPU 0; returns the mask it had.
fn pin_to_cpu0() -> libc::cpu_set_t {
    pin_to_cpu(0)
}

/// Pins the calling thread (and the processes it starts) to `cpu`; returns the mask it had.
fn pin_to_cpu(cpu: usize) -> libc::cpu_set_t {
    // SAFETY: cpu_set_t values on the stack, applied to the calling thread.
    unsafe {
        let mut old: libc::cpu_set_t = std::mem::zeroed();
        libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut old);
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
            0
        );
        old
    }
}

fn restore_affinity(old: &libc::cpu_set_t) {
    // SAFETY: a mask read by sched_getaffinity, applied to the calling thread.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), old) };
}

/// A request that blocks in the daemon (an fsync held there by the test hook
/// `AMARANTH_TEST_HOLD_FSYNC`) does not hold up the other requests issued on the same CPU: on
/// io_uring another thread of that CPU's queue serves them, on /dev/fuse another reader. A
/// watchdog releases the hold after 30 s, so a stall fails the test instead of hanging it.
#[test]
fn a_blocked_request_does_not_stall_its_cpu() {
    if !mount_env_ok() {
        return;
    }
    let _g = serial();
    let mut transports = vec!["dev"];
    if uring_in_kernel() {
        transports.push("uring");
    }
    for t in transports {
        let s = Scratch::new(&format!("hold-{t}"));
        let img = s.mkfs("a.img", "1G");
        let hold = s.path("hold");
        let o = with_fsync_hold(&hold, t);
        let m = s.mount(&img, "mnt", &o);
        assert_eq!(stat_json(&s, &m.mp)["fuse"]["transport"], t);
        let f = File::create(m.p("f")).unwrap();
        fs::write(&hold, b"").unwrap();
        let synced = Arc::new(AtomicBool::new(false));
        let watchdog = {
            let hold = hold.clone();
            let synced = synced.clone();
            std::thread::spawn(move || {
                let t0 = std::time::Instant::now();
                while !synced.load(Ordering::Relaxed) && t0.elapsed() < Duration::from_secs(30) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                let _ = fs::remove_file(&hold);
            })
        };
        let syncer = {
            let synced = synced.clone();
            std::thread::spawn(move || {
                pin_to_cpu0();
                f.sync_all().unwrap();
                synced.store(true, Ordering::Relaxed);
            })
        };
        // Wait until the daemon holds the FSYNC.
        let t0 = std::time::Instant::now();
        while requests(&stat_json(&s, &m.mp), "FSYNC") == 0 {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "no FSYNC reached the daemon"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let old = pin_to_cpu0();
        for i in 0..20 {
            let p = m.p(&format!("n{i}"));
            fs::write(&p, b"served").unwrap();
            assert_eq!(fs::read(&p).unwrap(), b"served");
        }
        fs::create_dir(m.p("d")).unwrap();
        fs::rename(m.p("n0"), m.p("d/n0")).unwrap();
        let held_meanwhile = !synced.load(Ordering::Relaxed);
        restore_affinity(&old);
        fs::remove_file(&hold).ok();
        syncer.join().unwrap();
        watchdog.join().unwrap();
        assert!(
            held_meanwhile,
            "{t}: requests on the fsync's CPU waited for it (served only after the hold ended)"
        );
        s.finish(m);
    }
}

/// The CPUs a task may run on, as the `Cpus_allowed_list` of its status file (`/proc/.../status`)
/// gives them.
fn cpus_allowed(status: impl AsRef<Path>) -> Option<String> {
    let status = fs::read_to_string(status).ok()?;
    let cpus = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?;
    Some(cpus.trim().to_string())
}

/// The daemon's threads that serve ring queue 0: (thread number in the queue, the CPUs it may
/// run on, as `Cpus_allowed_list` gives them).
fn queue0_threads(pid: i32) -> Vec<(usize, String)> {
    let mut out: Vec<(usize, String)> = ring_threads(pid)
        .into_iter()
        .filter_map(|(name, dir)| {
            let k = name.strip_prefix("amaranth-q0-")?.parse().ok()?;
            Some((k, cpus_allowed(dir.join("status"))?))
        })
        .collect();
    out.sort();
    out
}

/// Each CPU's ring queue has 16 threads by default (so that 16 READs of one CPU, a sequential
/// reader's read-ahead, are served at once), and `-o ring_threads=N` sets another number. Every
/// thread of a queue waits pinned to its CPU, so a request is served where it was made whichever
/// entry the kernel hands it to (a thread free to run anywhere is woken on the idle CPU), unless
/// `-o ring_affinity=any` leaves them to the scheduler.
#[test]
fn each_ring_queue_has_16_threads_unless_told_otherwise() {
    if !mount_env_ok() || !uring_in_kernel() {
        return;
    }
    let _g = serial();
    let s = Scratch::new("ringthreads");
    let img = s.mkfs("a.img", "1G");
    let all = cpus_allowed("/proc/self/status").expect("Cpus_allowed_list");
    for (opts, want, cpus_want) in [
        (vec![], 16, "0"),
        (vec!["-o".to_string(), "ring_threads=3".into()], 3, "0"),
        (
            vec!["-o".to_string(), "ring_affinity=any".into()],
            16,
            all.as_str(),
        ),
    ] {
        let mut o = with_transport("uring");
        o.extra.extend(opts);
        let m = s.mount(&img, "mnt", &o);
        assert_eq!(stat_json(&s, &m.mp)["fuse"]["transport"], "uring");
        let threads = queue0_threads(m.pid());
        assert_eq!(threads.len(), want, "{:?}: {threads:?}", o.extra);
        for (k, cpus) in &threads {
            assert_eq!(
                cpus, cpus_want,
                "{:?}: thread {k} of queue 0 may run on {cpus}",
                o.extra
            );
        }
        m.umount();
    }
}

/// A queue with more than 8 requests in hand lets the threads that take the extra ones run on
/// any CPU (a sequential reader's read-ahead: their checksums and copies need not queue on the
/// reader's CPU), and a thread pins itself again once its queue is back to one request at a
/// time (the unit tests of `uring::QueueLoad`). Ten fsyncs made on CPU 0 are held in the daemon
/// (`AMARANTH_TEST_HOLD_FSYNC`): the ninth and tenth are served by widened threads; requests made
/// one at a time afterwards widen none.
#[test]
fn a_busy_queue_spreads_and_a_quiet_one_pins_again() {
    if !mount_env_ok() || !uring_in_kernel() {
        return;
    }
    let all = cpus_allowed("/proc/self/status").expect("Cpus_allowed_list");
    if all == "0" {
        eprintln!("SKIPPED: one CPU");
        return;
    }
    let _g = serial();
    let s = Scratch::new("spread");
    let img = s.mkfs("a.img", "1G");
    let hold = s.path("hold");
    let o = with_fsync_hold(&hold, "uring");
    let m = s.mount(&img, "mnt", &o);
    let files: Vec<File> = (0..10)
        .map(|i| File::create(m.p(&format!("f{i}"))).unwrap())
        .collect();
    assert_eq!(stat_json(&s, &m.mp)["fuse"]["ring_spread"], 0);
    fs::write(&hold, b"").unwrap();
    let released = Arc::new(AtomicBool::new(false));
    let watchdog = {
        let (hold, released) = (hold.clone(), released.clone());
        std::thread::spawn(move || {
            let t0 = std::time::Instant::now();
            while !released.load(Ordering::Relaxed) && t0.elapsed() < Duration::from_secs(30) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = fs::remove_file(&hold);
        })
    };
    // This thread, and the `amaranth stat` it runs, on CPU 1: their requests go to queue 1 and
    // cannot add to queue 0's count.
    let main_mask = pin_to_cpu(1);
    let syncers: Vec<_> = files
        .into_iter()
        .map(|f| {
            std::thread::spawn(move || {
                pin_to_cpu0();
                f.sync_all().unwrap();
            })
        })
        .collect();
    let t0 = std::time::Instant::now();
    while requests(&stat_json(&s, &m.mp), "FSYNC") < 10 {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the ten fsyncs did not all reach the daemon"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let held = stat_json(&s, &m.mp);
    let wide: Vec<_> = queue0_threads(m.pid())
        .into_iter()
        .filter(|(_, cpus)| *cpus == all)
        .collect();
    released.store(true, Ordering::Relaxed);
    fs::remove_file(&hold).ok();
    for t in syncers {
        t.join().unwrap();
    }
    watchdog.join().unwrap();
    restore_affinity(&main_mask);
    assert_eq!(
        held["fuse"]["ring_spread"], 2,
        "the 9th and 10th requests in hand widen their threads"
    );
    assert_eq!(wide.len(), 2, "widened threads while held: {wide:?}");
    // One request at a time on CPU 0 again: the threads the kernel hands them to (the entries
    // committed last) pin themselves.
    let old = pin_to_cpu0();
    for i in 0..40 {
        fs::write(m.p(&format!("s{i}")), b"one at a time").unwrap();
    }
    restore_affinity(&old);
    let after = stat_json(&s, &m.mp);
    assert_eq!(after["fuse"]["ring_spread"], 2, "no widening one at a time");
    s.finish(m);
}

fn inodes_used(v: &serde_json::Value) -> u64 {
    v["fs"]["inodes_used"].as_u64().expect("fs.inodes_used")
}

/// Waits (at most 30 s) until the daemon counts `want` inodes in use.
fn wait_inodes(s: &Scratch, mp: &Path, want: u64) -> u64 {
    let t0 = std::time::Instant::now();
    loop {
        let n = inodes_used(&stat_json(s, mp));
        if n == want || t0.elapsed() > Duration::from_secs(30) {
            return n;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Without OPEN and RELEASE, a file unlinked while open lives until the kernel forgets its inode:
/// readable through the descriptor until the close, deleted (inode count back) right after it,
/// without an unmount; one unlinked while open when the daemon is killed is gone after the next
/// mount. A file unlinked while not open is deleted at once (the kernel forgets it at once).
#[test]
fn an_unlinked_open_file_lives_until_its_close() {
    if !mount_env_ok() {
        return;
    }
    let _g = serial();
    let s = Scratch::new("unl");
    let img = s.mkfs("a.img", "1G");
    let m = s.mount(&img, "mnt", &MountOpts::default());
    // The first OPEN is answered ENOSYS: from then on the kernel sends no OPEN and no RELEASE
    // (files created and closed before it were released).
    fs::write(m.p("first"), b"1").unwrap();
    drop(File::open(m.p("first")).unwrap());
    let base = stat_json(&s, &m.mp);
    let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 253) as u8).collect();
    fs::write(m.p("u"), &data).unwrap();
    fs::write(m.p("plain"), b"x").unwrap();
    let used = inodes_used(&stat_json(&s, &m.mp));
    fs::remove_file(m.p("plain")).unwrap();
    assert_eq!(wait_inodes(&s, &m.mp, used - 1), used - 1);
    let f = File::open(m.p("u")).unwrap();
    fs::remove_file(m.p("u")).unwrap();
    assert!(!m.p("u").exists());
    // Dropping the page cache makes the reads reach the daemon.
    support::drop_cache(&f);
    let mut back = vec![0u8; data.len()];
    f.read_exact_at(&mut back, 0).unwrap();
    assert!(back == data, "the unlinked file's data changed");
    assert_eq!(
        inodes_used(&stat_json(&s, &m.mp)),
        used - 1,
        "deleted while open"
    );
    drop(f);
    assert_eq!(
        wait_inodes(&s, &m.mp, used - 2),
        used - 2,
        "not deleted after its close"
    );
    let v = stat_json(&s, &m.mp);
    for op in ["OPEN", "RELEASE", "FLUSH"] {
        assert_eq!(requests(&v, op), requests(&base, op), "{op}: {v}");
    }
    // Open and unlinked when the daemon dies: the next mount deletes it.
    fs::write(m.p("held"), &data).unwrap();
    let held = File::open(m.p("held")).unwrap();
    fs::remove_file(m.p("held")).unwrap();
    // Durable (FSYNCDIR syncs the daemon's log; syncfs does not reach FUSE daemons).
    File::open(&m.mp).unwrap().sync_all().unwrap();
    m.kill9();
    drop(held);
    let m = s.mount(&img, "mnt", &MountOpts::default());
    let names: Vec<_> = fs::read_dir(&m.mp)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("first")]);
    assert_eq!(
        inodes_used(&stat_json(&s, &m.mp)),
        used - 2,
        "{}",
        m.session_log()
    );
    s.finish(m);
}

fn names_of(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// A listing follows every change made through the mount, also after the same directory was
/// listed before (directory handles carry nothing: offsets say where a listing is), and each
/// listing costs one OPENDIR and one RELEASEDIR, not more.
#[test]
fn listings_follow_changes_with_one_opendir_each() {
    if !mount_env_ok() {
        return;
    }
    let _g = serial();
    let s = Scratch::new("ls");
    let img = s.mkfs("a.img", "1G");
    let m = s.mount(&img, "mnt", &MountOpts::default());
    let d = m.p("d");
    fs::create_dir(&d).unwrap();
    let mut want: Vec<String> = (0..300).map(|i| format!("f{i:03}")).collect();
    for n in &want {
        fs::write(d.join(n), b"x").unwrap();
    }
    assert_eq!(names_of(&d), want);
    let base = stat_json(&s, &m.mp);
    for _ in 0..3 {
        assert_eq!(names_of(&d), want);
    }
    fs::write(d.join("new"), b"y").unwrap();
    fs::remove_file(d.join("f007")).unwrap();
    fs::rename(d.join("f008"), d.join("g008")).unwrap();
    want.retain(|n| n != "f007" && n != "f008");
    want.extend(["g008".to_string(), "new".to_string()]);
    want.sort();
    assert_eq!(names_of(&d), want);
    // RELEASEDIR is not waited for: let the last one arrive.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let v = stat_json(&s, &m.mp);
    for op in ["OPENDIR", "RELEASEDIR"] {
        assert_eq!(requests(&v, op) - requests(&base, op), 4, "{op}: {v}");
    }
    s.finish(m);
}
