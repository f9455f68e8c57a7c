//! Whole-file clones on a real mount (docs/SURGERY.md §5.3, increment 8): `copy_file_range` of a
//! whole file into an empty one is one range clone in the daemon; the copy reads back equal,
//! writes to either side stay on it, `amaranth stat` shows what is shared (live and offline),
//! and `amaranth fsck` is clean with shared nodes in the image (its survey walks a shared node
//! under each parent) and after the source is deleted.
//!
//! And `amaranth clone SRC DST` (§5.4, increment 9): a tree with hard links, a symlink and
//! extended attributes cloned on the mount reads the same (`diff -r`, every mode, owner and
//! time), its hard links split; each side changes alone; every refusal (DST exists, DST inside
//! SRC, another mount, not Amaranth, not a directory or file, an unreadable file for an
//! unprivileged user) says why and changes nothing; nobody's clone clears the set-user-id bit
//! of root's file; a clone survives `kill -9` of the daemon after a sync, and one made just
//! before the kill is there whole or not at all.
//!
//! - `a_copied_file_is_a_clone_shown_by_stat_and_fsck_is_clean`;
//! - `amaranth_clone_of_a_tree_for_root_and_nobody_and_across_a_kill`.

mod support;

use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;
use support::{
    compare_trees, diff_r, errno, mount_env_ok, pattern, serial, walk, xattr_get, xattr_set,
    Compare, MountOpts, Scratch, BIN,
};

/// `copy_file_range` of all of `from` into `to` (created empty), as `cp` does: the bytes the
/// calls reported, and how many calls it took.
fn copy_whole(from: &Path, to: &Path) -> (u64, u32) {
    let src = File::open(from).unwrap();
    let dst = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(to)
        .unwrap();
    let len = src.metadata().unwrap().len();
    let (mut done, mut calls) = (0u64, 0u32);
    while done < len {
        // SAFETY: two open descriptors; null offsets use and advance the file positions.
        let n = unsafe {
            libc::copy_file_range(
                src.as_raw_fd(),
                std::ptr::null_mut(),
                dst.as_raw_fd(),
                std::ptr::null_mut(),
                (len - done) as usize,
                0,
            )
        };
        assert!(n > 0, "copy_file_range: {n}, errno {}", errno());
        done += n as u64;
        calls += 1;
    }
    dst.sync_all().unwrap();
    (done, calls)
}

/// `amaranth stat --json` of a mount point or an image.
fn stat(s: &Scratch, target: &Path) -> Value {
    let out = s.run(&[OsStr::new("stat"), target.as_os_str(), "--json".as_ref()]);
    assert!(out.status.success(), "stat {}", target.display());
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Whether `stat` shows something shared: subtrees (nodes with a count above 1), or at least
/// `data` bytes of out-of-line blocks named twice. A file's block references fit one leaf of
/// this format's 4 MiB nodes: the clone shares that leaf, and the heal of the cut fringe copies
/// it for the clone at once (a leaf's worth of references, not the data): its blocks are then
/// named by both leaves.
fn shares(v: &Value, data: u64) -> bool {
    let g = |k: &str| {
        v["sharing"][k]
            .as_u64()
            .unwrap_or_else(|| panic!("sharing.{k}"))
    };
    g("shared_nodes") > 0 || g("shared_data_bytes") >= data
}

#[test]
fn a_copied_file_is_a_clone_shown_by_stat_and_fsck_is_clean() {
    if !mount_env_ok() {
        return;
    }
    let _serial = serial();
    let s = Scratch::new("clone");
    let img = s.mkfs("fs.img", "512M");
    let m = s.mount(&img, "mnt", &MountOpts::default());
    // 24 MiB of out-of-line blocks.
    let data = pattern(7, 24 << 20);
    fs::write(m.p("src"), &data).unwrap();
    File::open(m.p("src")).unwrap().sync_all().unwrap();
    let before = stat(&s, &m.mp);
    let (n, calls) = copy_whole(&m.p("src"), &m.p("dst"));
    assert_eq!((n, calls), (data.len() as u64, 1), "one call: a clone");
    let after = stat(&s, &m.mp);
    assert_eq!(
        after["sharing"]["range_clones"].as_u64(),
        before["sharing"]["range_clones"].as_u64().map(|c| c + 1),
        "by surgery"
    );
    let len = data.len() as u64;
    assert!(shares(&after, len), "nothing shared: {}", after["sharing"]);
    assert!(fs::read(m.p("dst")).unwrap() == data);
    // 16 bytes into the copy, and a large write into the source: each stays on its side.
    let mut dst_data = data.clone();
    let f = OpenOptions::new().write(true).open(m.p("dst")).unwrap();
    f.write_all_at(b"sixteen bytes!!!", 4096).unwrap();
    f.sync_all().unwrap();
    drop(f);
    dst_data[4096..4112].copy_from_slice(b"sixteen bytes!!!");
    let mut src_data = data.clone();
    let f = OpenOptions::new().write(true).open(m.p("src")).unwrap();
    f.write_all_at(&vec![9u8; 2 << 20], 8 << 20).unwrap();
    f.sync_all().unwrap();
    drop(f);
    src_data[8 << 20..10 << 20].fill(9);
    // `cp` sends copy_file_range through FUSE when coreutils and the kernel do (docs/SURGERY.md
    // Q11): said, not required.
    let out = std::process::Command::new("cp")
        .args([m.p("dst"), m.p("by-cp")])
        .output()
        .unwrap();
    assert!(out.status.success(), "cp");
    let cp = stat(&s, &m.mp);
    eprintln!(
        "cp of a whole file: {} range clone(s)",
        cp["sharing"]["range_clones"].as_u64().unwrap_or(0)
            - after["sharing"]["range_clones"].as_u64().unwrap_or(0)
    );
    m.umount();
    // The image holds shared nodes: fsck (its survey and its checks) is clean, stat shows them.
    s.assert_fsck_clean(&img);
    let offline = stat(&s, &img);
    // The source's 2 MiB were rewritten, the copy's 16 bytes are a patch on its reference.
    assert!(shares(&offline, len - (2 << 20)), "{}", offline["sharing"]);
    let text = s.run(&[OsStr::new("stat"), img.as_os_str()]);
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("shared:"),
        "stat names what is shared"
    );
    let m = s.mount(&img, "mnt", &MountOpts::default());
    assert!(fs::read(m.p("src")).unwrap() == src_data, "the source");
    assert!(fs::read(m.p("dst")).unwrap() == dst_data, "the copy");
    assert!(fs::read(m.p("by-cp")).unwrap() == dst_data, "cp's copy");
    // The source deleted: the copies keep their bytes, fsck stays clean.
    fs::remove_file(m.p("src")).unwrap();
    support::syncfs(&m.mp).unwrap();
    assert!(
        fs::read(m.p("dst")).unwrap() == dst_data,
        "the copy without its source"
    );
    s.finish(m);
}

const NOBODY: u32 = 65534;

/// `amaranth clone ARGS` as root (`uid` None) or as another user, printing what it said.
fn clone_cmd(args: &[&Path], uid: Option<u32>) -> Output {
    let mut c = Command::new(BIN);
    c.arg("clone").args(args).stdin(Stdio::null());
    if let Some(u) = uid {
        c.uid(u).gid(u);
    }
    let out = c.output().unwrap();
    eprintln!(
        "$ amaranth clone {args:?} (uid {uid:?}) -> {:?}\n  stdout: {}\n  stderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    out
}

/// A refused clone: exit 1, a message saying `why`, and the mount as it was.
fn refused(m: &Path, args: &[&Path], uid: Option<u32>, why: &str) {
    let before = walk(m);
    let out = clone_cmd(args, uid);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    assert!(err.contains(why), "{args:?}: {err:?} should say {why:?}");
    assert!(err.contains("nothing was changed"), "{err}");
    assert!(walk(m) == before, "{args:?} changed the mount");
}

#[test]
fn amaranth_clone_of_a_tree_for_root_and_nobody_and_across_a_kill() {
    if !mount_env_ok() {
        return;
    }
    let _serial = serial();
    let s = Scratch::new("dclone");
    let img = s.mkfs("fs.img", "512M");
    let m = s.mount(&img, "mnt", &MountOpts::default());
    let src = m.p("src");
    for d in ["a/b/c", "empty"] {
        fs::create_dir_all(src.join(d)).unwrap();
    }
    fs::write(src.join("small"), b"small file\n").unwrap();
    fs::write(src.join("a/big"), pattern(3, 3 << 20)).unwrap();
    fs::write(src.join("a/b/mid"), pattern(4, 50_000)).unwrap();
    fs::write(src.join("a/h1"), pattern(5, 9000)).unwrap();
    fs::hard_link(src.join("a/h1"), src.join("a/b/h2")).unwrap();
    fs::write(m.p("outside"), b"one name outside\n").unwrap();
    fs::hard_link(m.p("outside"), src.join("in")).unwrap();
    std::os::unix::fs::symlink("small", src.join("sym")).unwrap();
    assert_eq!(xattr_set(&src.join("small"), "user.t", b"tag", 0), 0);
    assert_eq!(xattr_set(&src, "user.dir", b"top", 0), 0);
    fs::write(src.join("a/suid"), b"#!/bin/sh\n").unwrap();
    fs::set_permissions(src.join("a/suid"), fs::Permissions::from_mode(0o4755)).unwrap();
    fs::set_permissions(src.join("a/b/mid"), fs::Permissions::from_mode(0o640)).unwrap();
    std::os::unix::fs::chown(src.join("a/b/mid"), Some(1234), Some(4321)).unwrap();

    // Root's clone: the same bytes, modes, owners and times; hard links split.
    let dst = m.p("dst");
    let out = clone_cmd(&[Path::new("-v"), &src, &dst], None);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("13 inodes"));
    diff_r(&src, &dst);
    let same = Compare {
        nlink: false,
        ..Compare::all()
    };
    compare_trees(&src, &dst, same);
    let meta = |p: &Path| fs::metadata(p).unwrap();
    assert_eq!(meta(&src.join("a/h1")).nlink(), 2);
    let (h1, h2) = (meta(&dst.join("a/h1")), meta(&dst.join("a/b/h2")));
    assert_eq!((h1.nlink(), h2.nlink()), (1, 1), "hard links split");
    assert_ne!(h1.ino(), h2.ino());
    assert_ne!(meta(&src).ino(), meta(&dst).ino());
    assert_eq!(meta(&dst.join("a/suid")).mode() & 0o7777, 0o4755);
    assert_eq!(xattr_get(&dst.join("small"), "user.t").unwrap(), b"tag");
    assert_eq!(xattr_get(&dst, "user.dir").unwrap(), b"top");
    // Each side changes alone.
    OpenOptions::new()
        .append(true)
        .open(dst.join("small"))
        .unwrap()
        .write_all_at(b"more", 11)
        .unwrap();
    fs::write(src.join("a/h1"), b"rewritten").unwrap();
    assert_eq!(fs::read(src.join("small")).unwrap(), b"small file\n");
    assert_eq!(fs::read(dst.join("small")).unwrap(), b"small file\nmore");
    assert_eq!(fs::read(dst.join("a/b/h2")).unwrap(), pattern(5, 9000));
    assert_eq!(fs::read(src.join("a/b/h2")).unwrap(), b"rewritten");

    // Refusals, each with its reason and nothing changed.
    let host = s.path("host-dir");
    fs::create_dir_all(&host).unwrap();
    nix_mkfifo(&m.p("fifo"));
    refused(&m.mp, &[&src, &dst], None, "already exists");
    refused(&m.mp, &[&src, &src.join("a/x")], None, "into itself");
    refused(&m.mp, &[&src, &host.join("x")], None, "different mounts");
    refused(&m.mp, &[&host, &m.p("x")], None, "not on an Amaranth mount");
    refused(
        &m.mp,
        &[&m.p("fifo"), &m.p("x")],
        None,
        "not a directory or",
    );

    // Nobody, on the root-owned mount: may clone what it may read into a directory it may
    // write; root's set-user-id bit is not cloned for it; an unreadable file stops it all.
    fs::set_permissions(&m.mp, fs::Permissions::from_mode(0o777)).unwrap();
    fs::set_permissions(src.join("a/b/mid"), fs::Permissions::from_mode(0o644)).unwrap();
    let theirs = m.p("by-nobody");
    let out = clone_cmd(&[&src, &theirs], Some(NOBODY));
    assert!(out.status.success());
    diff_r(&src, &theirs);
    assert_eq!(meta(&theirs.join("a/suid")).mode() & 0o7777, 0o755);
    assert_eq!(meta(&theirs.join("a/b/mid")).uid(), 1234, "owners kept");
    fs::set_permissions(src.join("a/b/mid"), fs::Permissions::from_mode(0o600)).unwrap();
    refused(
        &m.mp,
        &[&src, &m.p("n2")],
        Some(NOBODY),
        "permission denied",
    );
    refused(
        &m.mp,
        &[&src.join("small"), &src.join("a/n3")],
        Some(NOBODY),
        "permission denied",
    );

    // A clone made durable survives kill -9; one made just before the kill is whole or absent.
    let out = clone_cmd(&[&src, &m.p("synced")], None);
    assert!(out.status.success());
    // fsync of a directory: FSYNCDIR reaches the daemon (syncfs(2) does not on a FUSE mount
    // that is not virtiofs: the kernel sends no SYNCFS).
    File::open(&m.mp).unwrap().sync_all().unwrap();
    let out = clone_cmd(&[&dst, &m.p("unsynced")], None);
    assert!(out.status.success());
    m.kill9();
    s.assert_fsck_clean_after_crash(&img);
    let m = s.mount(&img, "mnt", &MountOpts::default());
    let src = m.p("src");
    diff_r(&src, &m.p("synced"));
    if m.p("unsynced").exists() {
        diff_r(&m.p("dst"), &m.p("unsynced"));
        eprintln!("the clone made just before the kill is there, whole");
    } else {
        eprintln!("the clone made just before the kill is not there");
    }
    diff_r(&src, &m.p("by-nobody"));
    s.finish(m);
}

/// `mkfifo`.
fn nix_mkfifo(p: &Path) {
    let c = support::cstr(p);
    // SAFETY: a valid path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo");
}
