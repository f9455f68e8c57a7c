//! Damage through the real command: an overwritten start of the image mounts from a backup
//! superblock; damaged nodes are named by `amaranth fsck`, a read-write mount of an image with
//! known damage is refused (read-only works), and `amaranth fsck --repair` makes it mountable with
//! every file outside the damaged ranges intact.

mod support;

use std::collections::BTreeSet;
use std::fs::{self, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::Arc;

use amaranth_device::FileDevice;
use amaranth_engine::{Damage, DamagedPart, Engine, Options};
use amaranth_fs::keys;
use support::*;

fn can_mount() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root || !Path::new("/dev/fuse").exists() {
        eprintln!("skipping: needs root and /dev/fuse");
        return false;
    }
    true
}

fn out(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Twelve directories of files with known contents.
fn populate(m: &Mount) -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    for d in 0..12 {
        fs::create_dir(m.p(&format!("d{d}"))).unwrap();
        for f in 0..40 {
            let rel = format!("d{d}/f{f}");
            let data = pattern((d * 1000 + f) as u64, 1000 + (d * 40 + f) * 37 % 20_000);
            fs::write(m.p(&rel), &data).unwrap();
            files.push((rel, data));
        }
    }
    files
}

#[test]
fn an_overwritten_start_mounts_from_a_backup_and_fsck_repairs_it() {
    if !can_mount() {
        return;
    }
    let _g = serial();
    let s = Scratch::new("sbcopy");
    let img = s.mkfs("fs.img", "128M");
    let m = s.mount(&img, "mnt", &MountOpts::default());
    let files = populate(&m);
    m.umount();
    // Someone writes 64 KiB over the start (a partition table, another file system's label...).
    let mut f = OpenOptions::new().write(true).open(&img).unwrap();
    f.write_all(&vec![0x33; 64 << 10]).unwrap();
    f.sync_all().unwrap();
    drop(f);
    // fsck names the damage, does not suggest mkfs, and leaves it.
    let o = s.run(&["fsck", img.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(4), "{}", out(&o));
    assert!(
        out(&o).contains("superblock copy at block 0"),
        "{}",
        out(&o)
    );
    assert!(!out(&o).contains("mkfs"), "{}", out(&o));
    // Mount falls back to a backup and says so on stderr and in the log.
    let m = s.mount(&img, "mnt", &MountOpts::default());
    let log = m.session_log();
    assert!(log.contains("using the superblock copy at block"), "{log}");
    for (rel, data) in &files {
        assert_eq!(&fs::read(m.p(rel)).unwrap(), data, "{rel}");
    }
    m.umount();
    // The read-write mount rewrote the primary copies: fsck is clean.
    s.assert_fsck_clean(&img);
    // The same damage repaired by fsck instead of a mount.
    let mut f = OpenOptions::new().write(true).open(&img).unwrap();
    f.write_all(&vec![0; 64 << 10]).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let o = s.run(&["fsck", "--repair", img.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    s.assert_fsck_clean(&img);
}

/// Zeroes the last block of three large nodes (leaves holding file data: the few small leaves of
/// metadata hold every name, and the file-system test covers their loss).
fn damage_nodes(img: &Path, seed: u64, files: &[(String, Vec<u8>)]) -> usize {
    let dev = FileDevice::open_read_only(img).unwrap();
    let e = Engine::open(Arc::new(dev), options()).unwrap();
    let mut nodes: Vec<(u64, u64, u64)> = e
        .node_extents()
        .into_iter()
        .filter(|&(id, _, n)| id != 1 && n >= 32)
        .collect();
    drop(e);
    nodes.sort();
    let mut rng = Rng::new(seed);
    let mut f = OpenOptions::new().read(true).write(true).open(img).unwrap();
    let mut hit = BTreeSet::new();
    let mut tries = 0;
    while hit.len() < 3.min(nodes.len()) && tries < 100 {
        tries += 1;
        let (id, b, n) = nodes[rng.below(nodes.len() as u64) as usize];
        // Only blocks that hold something count (a zeroed zero block damages nothing).
        let mut old = vec![0u8; 4096];
        f.seek(SeekFrom::Start((b + n - 1) * 4096)).unwrap();
        f.read_exact(&mut old).unwrap();
        if hit.contains(&id) || old.iter().all(|&x| x == 0) {
            continue;
        }
        f.seek(SeekFrom::Start((b + n - 1) * 4096)).unwrap();
        f.write_all(&[0; 4096]).unwrap();
        f.sync_all().unwrap();
        // Only a leaf's partition, and some file left untouched: damage to an internal node's
        // buffer or index, or to a leaf's last partition (its range runs to the end), can cover
        // every file (names are in hash order), leaving this test nothing intact to check.
        let damage = survey_damage(img);
        let ranges: Vec<_> = damage.iter().filter_map(|d| d.range.clone()).collect();
        let leaves_only = damage.iter().all(|d| {
            matches!(d.part, DamagedPart::Partition { .. })
                || matches!(d.part, DamagedPart::Node { height: Some(0) })
        });
        let some_left = files.iter().any(|(rel, _)| {
            let (d, f) = rel.split_once('/').unwrap();
            !file_touched(&ranges, d.as_bytes(), f.as_bytes())
                && !dir_touched(&ranges, d.as_bytes())
        });
        if leaves_only && some_left {
            hit.insert(id);
        } else {
            f.seek(SeekFrom::Start((b + n - 1) * 4096)).unwrap();
            f.write_all(&old).unwrap();
        }
    }
    f.sync_all().unwrap();
    hit.len()
}

fn survey_damage(img: &Path) -> Vec<Damage> {
    let dev = FileDevice::open_read_only(img).unwrap();
    Engine::survey(Arc::new(dev), options()).unwrap().damage
}

fn options() -> Options {
    Options {
        read_only: true,
        background_threads: false,
        cache_size: 64 << 20,
        ..Options::default()
    }
}

fn hits(ranges: &[(Vec<u8>, Option<Vec<u8>>)], lo: &[u8], hi: &[u8]) -> bool {
    ranges
        .iter()
        .any(|(a, b)| a.as_slice() < hi && b.as_ref().is_none_or(|b| lo < b.as_slice()))
}

/// Whether file `d/f` had records (name, inode, data) in a damaged range.
fn file_touched(ranges: &[(Vec<u8>, Option<Vec<u8>>)], d: &[u8], f: &[u8]) -> bool {
    let fk = keys::path_key(&[d, f]);
    let mk = keys::meta_key(&fk);
    let data = keys::data_prefix(&fk);
    hits(ranges, &mk, &[mk.as_slice(), &[0]].concat())
        || hits(ranges, &data, &amaranth_engine::prefix_end(&data, 1 << 16))
}

/// Whether directory `d`'s inode was in a damaged range.
fn dir_touched(ranges: &[(Vec<u8>, Option<Vec<u8>>)], d: &[u8]) -> bool {
    let mk = keys::meta_key(&keys::path_key(&[d]));
    hits(ranges, &mk, &[mk.as_slice(), &[0]].concat())
}

#[test]
fn damaged_nodes_are_refused_read_write_until_fsck_repairs_them() {
    if !can_mount() {
        return;
    }
    let _g = serial();
    let s = Scratch::new("salvage");
    let img = s.path("fs.img");
    let o = s.run(&[
        "mkfs",
        img.to_str().unwrap(),
        "--size",
        "96M",
        "--node-size",
        "512K",
    ]);
    assert!(o.status.success(), "{}", out(&o));
    let m = s.mount(&img, "mnt", &MountOpts::default());
    let files = populate(&m);
    m.umount();
    let damaged = damage_nodes(&img, seed("repair"), &files);
    // fsck names every damaged node and changes nothing.
    let o = s.run(&["fsck", img.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(4), "{}", out(&o));
    let named = String::from_utf8_lossy(&o.stdout)
        .matches("DamagedNode")
        .count();
    assert_eq!(named, damaged, "{}", out(&o));
    // Not known to the image yet: a read-write mount works (unless the damage is in what a mount
    // reads), and reading finds the damage and records it.
    match s.try_mount(&img, "mnt", &MountOpts::default()) {
        Ok(m) => {
            let unreadable = files
                .iter()
                .filter(|(rel, _)| fs::read(m.p(rel)).is_err())
                .count();
            m.umount();
            assert!(unreadable > 0, "the damage was never read");
        }
        Err(e) => assert!(e.contains("amaranth fsck --repair"), "{e}"),
    }
    // Now it is known: read-write refused (naming fsck), read-only allowed (unless the damage is
    // in what every mount reads: the root, the counters).
    let e = s
        .try_mount(&img, "mnt", &MountOpts::default())
        .err()
        .expect("refused");
    assert!(
        e.contains("known damage") && e.contains("amaranth fsck --repair"),
        "{e}"
    );
    let ro = MountOpts {
        extra: vec!["-o".into(), "ro".into()],
        ..MountOpts::default()
    };
    match s.try_mount(&img, "mnt", &ro) {
        Ok(m) => m.umount(),
        Err(e) => assert!(e.contains("amaranth fsck --repair"), "{e}"),
    }
    // The damaged key ranges, as the engine reports them (fsck prints them in words).
    let ranges: Vec<(Vec<u8>, Option<Vec<u8>>)> = {
        let dev = FileDevice::open_read_only(&img).unwrap();
        Engine::survey(Arc::new(dev), options())
            .unwrap()
            .damage
            .into_iter()
            .filter_map(|d| d.range)
            .collect()
    };
    // Repair, then everything outside the damaged ranges is there.
    let o = s.run(&["fsck", "--repair", img.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    let report = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        report.contains("files with records in damaged ranges"),
        "{report}"
    );
    s.assert_fsck_clean(&img);
    let m = s.mount(&img, "mnt", &MountOpts::default());
    let (mut intact, mut found, mut skipped) = (0, 0, 0);
    let mut lost_found: Option<BTreeSet<u64>> = None;
    for (rel, data) in &files {
        let (d, f) = rel.split_once('/').unwrap();
        if file_touched(&ranges, d.as_bytes(), f.as_bytes()) {
            skipped += 1;
            continue;
        }
        if !dir_touched(&ranges, d.as_bytes()) {
            let got = fs::read(m.p(rel)).unwrap_or_else(|e| panic!("{rel} (intact): {e}"));
            assert_eq!(&got, data, "{rel} (intact)");
            intact += 1;
            continue;
        }
        // Its directory's inode was in a damaged range (a newer copy may have survived in a
        // buffer): the file is in place or in /lost+found (as #<inode>), intact.
        if fs::read(m.p(rel)).is_ok_and(|got| &got == data) {
            intact += 1;
            continue;
        }
        let lost = lost_found.get_or_insert_with(|| {
            fs::read_dir(m.p("lost+found"))
                .unwrap_or_else(|e| panic!("{rel}: no lost+found: {e}"))
                .filter_map(|e| fs::read(e.unwrap().path()).ok())
                .map(|d| fnv(&d))
                .collect::<BTreeSet<u64>>()
        });
        assert!(
            lost.contains(&fnv(data)),
            "{rel}: neither in place nor in /lost+found"
        );
        found += 1;
    }
    assert!(intact + found > 0, "the damage left nothing to check");
    fs::write(m.p("after-repair"), b"ok").unwrap();
    eprintln!(
        "{damaged} damaged nodes: {intact} files intact in place, {found} in /lost+found, \
         {skipped} with records in damaged ranges"
    );
    s.finish(m);
}
