//! Patchgroups on a real mount: the C library, the Python module and `amaranth pg`, run as an
//! unprivileged user (nobody) on a root-owned mount (allow_other); atomic groups dropped whole
//! when the daemon is killed before their commit (with a change another process derived from
//! them, and a change a second thread made: FUSE requests carry thread ids); clients killed while
//! holding groups; the `fsync=ordered` mount option.

mod support;

use std::ffi::OsStr;
use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::*;

const NOBODY: u32 = 65534;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn setup(name: &str) -> (Scratch, Mount) {
    let s = Scratch::new(name);
    let img = s.mkfs("pg.img", "512M");
    let m = s.mount(&img, "mnt", &MountOpts::default());
    fs::set_permissions(&m.mp, fs::Permissions::from_mode(0o777)).unwrap();
    (s, m)
}

fn nobody(cmd: &mut Command) -> &mut Command {
    cmd.uid(NOBODY).gid(NOBODY).stdin(Stdio::null())
}

/// Runs a command as nobody; returns its exit code and stdout.
fn run_nobody(cmd: &mut Command) -> (i32, String) {
    let out = nobody(cmd).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!(
        "as nobody: {cmd:?} -> {:?}\n  stdout: {stdout}\n  stderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), stdout)
}

/// Starts a command as nobody and waits for it to print `line`.
fn start_nobody(cmd: &mut Command, line: &str) -> Child {
    let mut child = nobody(cmd).stdout(Stdio::piped()).spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut got = String::new();
    out.read_line(&mut got).unwrap();
    assert_eq!(got.trim(), line, "{cmd:?} did not get ready");
    child
}

/// Builds libamaranth_pg and the C test client in the scratch directory.
fn c_client(s: &Scratch) -> PathBuf {
    let lib = repo().join("clients/libamaranth_pg");
    let out_dir = s.path("lib");
    let st = Command::new("make")
        .arg("-s")
        .arg("-C")
        .arg(&lib)
        .arg(format!("OUT={}", out_dir.display()))
        .status()
        .unwrap();
    assert!(st.success(), "building libamaranth_pg failed");
    let exe = s.path("pg_client");
    let st = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(repo().join("crates/cli/tests/support/pg_client.c"))
        .arg(format!("-I{}", lib.display()))
        .arg(format!("-L{}", out_dir.display()))
        .arg(format!("-Wl,-rpath,{}", out_dir.display()))
        .args(["-lamaranth_pg", "-lpthread"])
        .status()
        .unwrap();
    assert!(st.success(), "building the C test client failed");
    exe
}

/// Kills the daemon, mounts the image again and returns the new mount.
fn crash_and_remount(s: &Scratch, m: Mount) -> Mount {
    let img = m.image.clone();
    m.kill9();
    let (code, out) = s.fsck(&img);
    assert_eq!(code, 0, "fsck after the kill:\n{out}");
    let m = s.mount(&img, "mnt", &MountOpts::default());
    fs::set_permissions(&m.mp, fs::Permissions::from_mode(0o777)).unwrap();
    m
}

fn present(m: &Mount, names: &[&str]) -> Vec<bool> {
    names.iter().map(|n| m.p(n).exists()).collect()
}

#[test]
fn c_library_rules_and_a_threaded_atomic_group_as_nobody() {
    if !mount_env_ok() {
        return;
    }
    let _serial = serial();
    let s = Scratch::new("pg-c");
    let img = s.mkfs("pg.img", "512M");
    let exe = c_client(&s);
    // Both FUSE transports carry the ioctls; the last mount stays for the crash below.
    let mut last = None;
    for transport in ["dev", "uring"] {
        if let Some(m) = last.take() {
            s.finish(m);
        }
        let o = MountOpts {
            extra: vec!["--transport".into(), transport.into()],
            ..MountOpts::default()
        };
        let m = s.mount(&img, "mnt", &o);
        fs::set_permissions(&m.mp, fs::Permissions::from_mode(0o777)).unwrap();
        let (code, out) = run_nobody(Command::new(&exe).arg("rules").arg(&m.mp));
        assert_eq!(
            (code, out.trim()),
            (0, "ok"),
            "the rules through the C library ({transport})"
        );
        last = Some(m);
    }
    let m = last.expect("a mount");
    // An atomic group engaged by a process whose second thread writes too.
    let mut holder = start_nobody(Command::new(&exe).arg("hold").arg(&m.mp), "engaged");
    fs::write(m.p("derived"), b"made while the group was open\n").unwrap();
    // The background log flush writes all of it; only the commit is missing.
    std::thread::sleep(Duration::from_millis(2500));
    let m = crash_and_remount(&s, m);
    let _ = holder.kill();
    let _ = holder.wait();
    assert_eq!(
        present(&m, &["main", "thread", "derived"]),
        [false; 3],
        "an uncommitted atomic group (or a change after it) survived the crash"
    );
    assert!(
        !fs::read_to_string(&m.log)
            .unwrap_or_default()
            .contains("outlived its limit"),
        "the second thread's fsync waited for its own process's group (taken for another process)"
    );
    assert_eq!(
        present(&m, &["in-p", "in-q", "in-a", "l1", "l2"]),
        [true; 5],
        "synced changes were lost"
    );
    s.finish(m);
}

#[test]
fn python_module_and_a_client_killed_holding_an_atomic_group() {
    if !mount_env_ok() {
        return;
    }
    let _serial = serial();
    let (s, m) = setup("pg-py");
    let module = repo().join("clients/python");
    let script = repo().join("crates/cli/tests/support/pg_client.py");
    let py = |mode: &str| {
        let mut c = Command::new("/usr/bin/python3");
        c.arg(&script).arg(&module).arg(mode).arg(&m.mp);
        c
    };
    let (code, out) = run_nobody(&mut py("rules"));
    assert_eq!(
        (code, out.trim()),
        (0, "ok"),
        "the rules through the Python module"
    );
    let mut holder = start_nobody(&mut py("hold"), "engaged");
    holder.kill().unwrap(); // SIGKILL
    holder.wait().unwrap();
    // The daemon notices the exit and commits the group: a durable sync does not wait for its
    // time limit.
    let t = Instant::now();
    let out = s.run(&[
        OsStr::new("pg"),
        "sync".as_ref(),
        "-C".as_ref(),
        m.mp.as_os_str(),
    ]);
    assert!(out.status.success(), "pg sync after the client was killed");
    eprintln!("pg sync returned after {:.2} s", t.elapsed().as_secs_f64());
    assert!(
        !m.session_log().contains("outlived its limit"),
        "the killed client's group was cut at its time limit instead of closed at its exit"
    );
    let m = crash_and_remount(&s, m);
    assert_eq!(
        present(&m, &["py-p", "py-q", "py-l", "py-in"]),
        [true; 4],
        "a group committed at its owner's exit, or a synced one, was lost"
    );
    s.finish(m);
}

#[test]
fn amaranth_pg_depend_and_run_as_nobody() {
    if !mount_env_ok() {
        return;
    }
    let _serial = serial();
    let (s, m) = setup("pg-cli");
    let trace = s.path("trace");
    fs::write(&trace, b"").unwrap();
    fs::set_permissions(&trace, fs::Permissions::from_mode(0o666)).unwrap();
    let pg = |args: &[&str]| {
        let mut c = s.amaranth();
        c.arg("pg").args(args).current_dir(&m.mp);
        c
    };
    let (code, _) = run_nobody(
        pg(&["depend", "--sync", "--trace"])
            .arg(&trace)
            .args(["echo 1 > d1", "cat d1 > d2; echo 2 >> d2"]),
    );
    assert_eq!(code, 0);
    assert_eq!(fs::read_to_string(m.p("d2")).unwrap(), "1\n2\n");
    let t = fs::read_to_string(&trace).unwrap();
    for call in ["Create", "Release", "Depend", "Sync", "Abandon"] {
        assert!(t.contains(call), "the trace lacks {call}:\n{t}");
    }
    // A failing command stops the chain with its status.
    let (code, _) = run_nobody(&mut pg(&["depend", "exit 3", "touch never"]));
    assert_eq!(code, 3);
    assert!(!m.p("never").exists());
    // Not on an Amaranth mount: a clear error.
    let out = nobody(s.amaranth().args(["pg", "sync", "-C", "/"]))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not an Amaranth mount"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // An atomic command (and the shell's children, which inherit its group) killed with the
    // daemon before it ends: none of its changes survive.
    let mut cmd = pg(&[
        "run",
        "--atomic",
        "--",
        "sh",
        "-c",
        "echo 1 > r1; mkdir r2; echo 3 > r2/r3; echo started; exec sleep 60",
    ]);
    let mut runner = start_nobody(&mut cmd, "started");
    std::thread::sleep(Duration::from_millis(2500));
    let m = crash_and_remount(&s, m);
    let _ = runner.kill();
    let _ = runner.wait();
    assert_eq!(present(&m, &["r1", "r2"]), [false; 2]);
    assert_eq!(
        present(&m, &["d1", "d2"]),
        [true; 2],
        "synced by pg depend --sync"
    );
    s.finish(m);
}

fn syncs(s: &Scratch, m: &Mount) -> u64 {
    let out = s.run(&[OsStr::new("stat"), m.mp.as_os_str(), "--json".as_ref()]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["syncs"].as_u64().expect("syncs in stat --json")
}

/// Calls fsync `n` times on `path` and returns the number of device syncs the daemon made.
fn fsyncs(s: &Scratch, m: &Mount, path: &Path, n: usize) -> u64 {
    let f = fs::OpenOptions::new().write(true).open(path).unwrap();
    // Let the background flush write what is pending, so that it adds no sync of its own.
    std::thread::sleep(Duration::from_millis(1500));
    let before = syncs(s, m);
    for _ in 0..n {
        f.sync_all().unwrap();
    }
    syncs(s, m) - before
}

#[test]
fn fsync_ordered_makes_fsync_an_ordering_point_and_pg_sync_stays_durable() {
    if !mount_env_ok() {
        return;
    }
    let _serial = serial();
    let s = Scratch::new("pg-fsync");
    let img = s.mkfs("pg.img", "512M");
    let bad = s.run(&[
        OsStr::new("mount"),
        img.as_os_str(),
        s.path("mnt").as_os_str(),
        "-o".as_ref(),
        "fsync=sometimes".as_ref(),
    ]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("fsync=durable or fsync=ordered"));
    let ordered = MountOpts {
        extra: vec!["-o".into(), "fsync=ordered".into()],
        ..MountOpts::default()
    };
    let m = s.mount(&img, "mnt", &ordered);
    fs::write(m.p("f"), b"x").unwrap();
    assert_eq!(
        fsyncs(&s, &m, &m.p("f"), 20),
        0,
        "fsync=ordered: fsync synced"
    );
    let before = syncs(&s, &m);
    let out = s.run(&[
        OsStr::new("pg"),
        "sync".as_ref(),
        "-C".as_ref(),
        m.mp.as_os_str(),
    ]);
    assert!(out.status.success());
    assert_eq!(
        syncs(&s, &m) - before,
        1,
        "pg sync is durable in every mode"
    );
    m.umount();
    let m = s.mount(&img, "mnt", &MountOpts::default());
    assert_eq!(
        fsyncs(&s, &m, &m.p("f"), 20),
        20,
        "the default fsync is durable"
    );
    s.finish(m);
}
