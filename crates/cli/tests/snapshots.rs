//! `amaranth snapshot create|delete|list` on a real mount (docs/SURGERY.md §5.5, increment 10):
//! taken while a writer runs, listed with its time, refused with a clear reason and nothing
//! changed (name taken, no such snapshot, bad name, not the mount's root, not root), counted by
//! `amaranth stat`, kept across `kill -9` of the daemon, checked by `amaranth fsck`, and deleted.

mod support;

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde_json::Value;
use support::{mount_env_ok, pattern, serial, walk, MountOpts, Scratch, BIN};

const NOBODY: u32 = 65534;

/// `amaranth snapshot ARGS` as root (`uid` None) or as another user, printing what it said.
fn snap(args: &[&str], mp: &Path, uid: Option<u32>) -> Output {
    let mut c = Command::new(BIN);
    c.arg("snapshot").args(args).arg(mp).stdin(Stdio::null());
    if let Some(u) = uid {
        c.uid(u).gid(u);
    }
    let out = c.output().unwrap();
    eprintln!(
        "$ amaranth snapshot {args:?} {} (uid {uid:?}) -> {:?}\n  stdout: {}\n  stderr: {}",
        mp.display(),
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    out
}

/// The snapshots' names, as `snapshot list --json` gives them.
fn names(mp: &Path) -> Vec<String> {
    let out = snap(&["list", "--json"], mp, None);
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect()
}

/// A refused request on `target`: exit 1, `why` in its message, nothing changed (the tree and
/// the list of mount point `mp`).
fn refused(args: &[&str], target: &Path, mp: &Path, uid: Option<u32>, why: &str) {
    let (tree, list) = (walk(mp), names(mp));
    let out = snap(args, target, uid);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    assert!(err.contains(why), "{args:?}: {err:?} should say {why:?}");
    assert!(err.contains("nothing was changed"), "{err}");
    assert!(walk(mp) == tree, "{args:?} changed the mount");
    assert_eq!(names(mp), list, "{args:?} changed the snapshots");
}

#[test]
fn snapshots_are_taken_listed_refused_kept_across_a_kill_and_deleted() {
    if !mount_env_ok() {
        return;
    }
    let _serial = serial();
    let s = Scratch::new("snapshots");
    let img = s.mkfs("fs.img", "512M");
    let m = s.mount(&img, "mnt", &MountOpts::default());
    fs::create_dir_all(m.p("d/e")).unwrap();
    fs::write(m.p("d/big"), pattern(1, 3 << 20)).unwrap();
    fs::write(m.p("d/e/small"), b"small\n").unwrap();
    assert!(names(&m.mp).is_empty());

    // Taken while a writer runs (creating, rewriting and deleting files meanwhile).
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, dir) = (stop.clone(), m.p("w"));
        std::thread::spawn(move || {
            fs::create_dir_all(&dir).unwrap();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                fs::write(dir.join(format!("f{}", i % 50)), pattern(i, 20_000)).unwrap();
                if i.is_multiple_of(7) {
                    let _ = fs::remove_file(dir.join(format!("f{}", (i + 25) % 50)));
                }
                i += 1;
            }
            i
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(300));
    let t = std::time::Instant::now();
    let out = snap(&["create", "one"], &m.mp, None);
    let took = t.elapsed();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("taken at"));
    eprintln!(
        "snapshot create under a writer: {:.1} ms (command included)",
        took.as_secs_f64() * 1e3
    );
    let out = snap(&["create", "two"], &m.mp, None);
    assert!(out.status.success());
    stop.store(true, Ordering::Relaxed);
    let writes = writer.join().unwrap();
    eprintln!("{writes} writes ran beside the snapshots");
    assert_eq!(names(&m.mp), ["one", "two"]);
    let out = snap(&["list"], &m.mp, None);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("NAME") && text.contains("one") && text.contains("two"),
        "{text}"
    );
    // With sizes: each holds something alone (at least its root); this small tree may be one
    // root leaf, which shares no node (the engine's test checks the shared part).
    let out = snap(&["list", "--sizes", "--json"], &m.mp, None);
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    for sn in v.as_array().unwrap() {
        assert!(sn["exclusive_bytes"].as_u64().unwrap() > 0, "{sn}");
        assert!(sn["shared_bytes"].as_u64().is_some(), "{sn}");
    }
    let out = snap(&["list", "--sizes"], &m.mp, None);
    assert!(String::from_utf8_lossy(&out.stdout).contains("EXCLUSIVE"));

    // Refusals: each says why and changes nothing.
    fs::set_permissions(&m.mp, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mp = &m.mp;
    refused(&["create", "one"], mp, mp, None, "exists already");
    refused(&["delete", "none"], mp, mp, None, "no snapshot named");
    refused(&["create", "a/b"], mp, mp, None, "bad snapshot name");
    refused(&["create", "x"], &m.p("d"), mp, None, "not the root");
    refused(
        &["create", "x"],
        &s.path("."),
        mp,
        None,
        "not an Amaranth mount",
    );
    refused(&["create", "x"], mp, mp, Some(NOBODY), "only root");
    refused(&["delete", "one"], mp, mp, Some(NOBODY), "only root");
    // Listing is open to everyone.
    let out = snap(&["list"], &m.mp, Some(NOBODY));
    assert!(out.status.success());

    // `amaranth stat` counts them.
    let out = s.run(&["stat".as_ref(), m.mp.as_os_str(), "--json".as_ref()]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["sharing"]["snapshots"].as_u64(), Some(2), "{v}");

    // A snapshot synced survives kill -9; fsck checks the snapshots' trees and finds them clean.
    let out = snap(&["delete", "two"], &m.mp, None);
    assert!(out.status.success());
    fs::File::open(&m.mp).unwrap().sync_all().unwrap();
    m.kill9();
    s.assert_fsck_clean_after_crash(&img);
    let m = s.mount(&img, "mnt", &MountOpts::default());
    assert_eq!(names(&m.mp), ["one"]);
    let out = snap(&["delete", "one"], &m.mp, None);
    assert!(out.status.success());
    assert!(names(&m.mp).is_empty());
    assert_eq!(fs::read(m.p("d/e/small")).unwrap(), b"small\n");
    s.finish(m);
    s.assert_fsck_clean(&img);
}

/// `amaranth snapshot mount`: a snapshot mounted read-only beside the live tree reads as the
/// tree did when it was taken (`diff -r` against a copy made then), after the live files were
/// changed and deleted; it has its own device number, refuses writes with `EROFS`, cannot be
/// deleted while mounted; `amaranth umount` unmounts it, and the image checks clean.
#[test]
fn a_mounted_snapshot_reads_as_the_tree_did_and_refuses_writes() {
    if !mount_env_ok() {
        return;
    }
    let _serial = serial();
    let s = Scratch::new("snapmount");
    let img = s.mkfs("fs.img", "512M");
    let m = s.mount(&img, "mnt", &MountOpts::default());
    fs::create_dir_all(m.p("t/a/b")).unwrap();
    fs::write(m.p("t/big"), pattern(7, 5 << 20)).unwrap();
    fs::write(m.p("t/a/small"), b"small\n").unwrap();
    fs::write(m.p("t/a/b/mid"), pattern(8, 70_000)).unwrap();
    std::os::unix::fs::symlink("a/small", m.p("t/link")).unwrap();
    // The copy made at snapshot time, outside the mount.
    let copy = s.path("copy");
    let cp = Command::new("cp")
        .arg("-a")
        .arg(m.p("t"))
        .arg(&copy)
        .status()
        .unwrap();
    assert!(cp.success());
    assert!(snap(&["create", "then"], &m.mp, None).status.success());
    // The live tree changes: rewritten, appended, deleted, new.
    fs::write(m.p("t/big"), b"rewritten").unwrap();
    fs::remove_file(m.p("t/a/small")).unwrap();
    fs::remove_dir_all(m.p("t/a/b")).unwrap();
    fs::write(m.p("t/new"), b"new").unwrap();
    let dir = s.path("snap");
    fs::create_dir_all(&dir).unwrap();
    assert!(
        snap(&["mount", "then", &m.mp.to_string_lossy()], &dir, None)
            .status
            .success()
    );
    let mounted = || support::is_mounted(&dir);
    let result = std::panic::catch_unwind(|| {
        let diff = Command::new("diff")
            .arg("-r")
            .arg(&copy)
            .arg(dir.join("t"))
            .status()
            .unwrap();
        assert!(
            diff.success(),
            "the snapshot differs from the copy made then"
        );
        assert_eq!(fs::read(m.p("t/big")).unwrap(), b"rewritten");
        use std::os::unix::fs::MetadataExt;
        assert_ne!(
            fs::metadata(&dir).unwrap().dev(),
            fs::metadata(&m.mp).unwrap().dev(),
            "its own device number"
        );
        let w = fs::write(dir.join("t/x"), b"no");
        assert_eq!(w.unwrap_err().raw_os_error(), Some(libc::EROFS));
        let w = fs::OpenOptions::new().write(true).open(dir.join("t/big"));
        assert_eq!(w.unwrap_err().raw_os_error(), Some(libc::EROFS));
        refused(&["delete", "then"], &m.mp, &m.mp, None, "is mounted");
    });
    // Unmounted even when a check failed.
    let out = s.run(&["umount".as_ref(), dir.as_os_str()]);
    eprintln!("umount: {}", String::from_utf8_lossy(&out.stderr));
    if mounted() {
        let _ = Command::new("umount").arg("-l").arg(&dir).status();
    }
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
    assert!(out.status.success());
    assert!(!mounted());
    // Unmounted: it can be deleted.
    let deleted = || snap(&["delete", "then"], &m.mp, None).status.success();
    let t = std::time::Instant::now();
    while !deleted() {
        assert!(
            t.elapsed().as_secs() < 10,
            "the unmounted snapshot stays in use"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(names(&m.mp).is_empty());
    // A snapshot still mounted when the live tree is unmounted goes with it.
    assert!(snap(&["create", "again"], &m.mp, None).status.success());
    assert!(
        snap(&["mount", "again", &m.mp.to_string_lossy()], &dir, None)
            .status
            .success()
    );
    assert!(mounted());
    s.finish(m);
    let gone = !mounted();
    if !gone {
        let _ = Command::new("umount").arg("-l").arg(&dir).status();
    }
    assert!(gone, "the snapshot stayed mounted after the daemon ended");
    s.assert_fsck_clean(&img);
}
