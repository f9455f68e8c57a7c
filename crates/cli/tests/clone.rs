//! Whole-file clones on a real mount (docs/SURGERY.md §5.3, increment 8): `copy_file_range` of a
//! whole file into an empty one is one range clone in the daemon; the copy reads back equal,
//! writes to either side stay on it, `amaranth stat` shows what is shared (live and offline),
//! and `amaranth fsck` is clean with shared nodes in the image (its survey walks a shared node
//! under each parent) and after the source is deleted.
//!
//! - `a_copied_file_is_a_clone_shown_by_stat_and_fsck_is_clean`.

mod support;

use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;

use serde_json::Value;
use support::{errno, mount_env_ok, pattern, serial, MountOpts, Scratch};

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
