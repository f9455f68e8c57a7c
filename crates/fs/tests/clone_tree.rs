//! `amaranth clone` at the file-system layer (`Fs::clone_entry`, docs/SURGERY.md §5.4): a tree
//! cloned reads as its source did, with fresh inode numbers and hard links split; writes,
//! deletes and clones on either side leave the other alone; files unlinked while held go home
//! first, under the source and at the destination; every refusal leaves the image as it was
//! (every key and value); an unprivileged caller's clone drops the set-id bits and capabilities
//! of the inodes it does not own; fsck is clean throughout. The random mix with clones is in
//! `model.rs`, power cuts in `crash_clones.rs`.

mod common;

use std::collections::BTreeSet;
use std::ops::Bound;
use std::sync::Arc;

use amaranth_device::MemDevice;
use amaranth_engine::{Engine, Format};
use amaranth_fs::check::{self, Class};
use amaranth_fs::{Caller, Cloned, Ctx, Errno, Fs, Kind, SetAttr, ROOT_INO};
use common::{engine_options, format, fs_options, normalize, snapshot, write_all, Snapshot};

const ROOT: Ctx = Ctx {
    uid: 0,
    gid: 0,
    pid: 1,
};
const USER: Ctx = Ctx {
    uid: 1000,
    gid: 1000,
    pid: 2,
};

fn user() -> Caller {
    Caller {
        uid: 1000,
        gid: 1000,
        groups: vec![],
    }
}

fn new_fs(f: Format) -> (Arc<MemDevice>, Fs) {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let engine = Engine::create(dev.clone(), f, engine_options()).unwrap();
    Fs::mkfs(&engine, 0, 0).unwrap();
    (dev, Fs::new(Arc::new(engine), fs_options()).unwrap())
}

fn reopen(dev: &Arc<MemDevice>, fs: Fs) -> Fs {
    fs.end_session().unwrap();
    common::close_engine(fs);
    let engine = Engine::open(dev.clone(), engine_options()).unwrap();
    Fs::new(Arc::new(engine), fs_options()).unwrap()
}

/// Creates `name` in `dir` holding `data` as `ctx` (the creation's lookup stays held).
fn file(fs: &Fs, dir: u64, name: &str, data: &[u8], ctx: Ctx) -> u64 {
    let (i, fh) = fs
        .create(dir, name.as_bytes(), 0o644, libc::O_RDWR, ctx)
        .unwrap();
    write_all(fs, i.ino, fh, 0, data).unwrap();
    fs.release(i.ino, fh).unwrap();
    i.ino
}

fn mkdir(fs: &Fs, dir: u64, name: &str) -> u64 {
    fs.mkdir(dir, name.as_bytes(), 0o755, ROOT).unwrap().ino
}

fn chmod(fs: &Fs, ino: u64, mode: u32) {
    let set = SetAttr {
        mode: Some(mode),
        ..SetAttr::default()
    };
    fs.setattr(ino, &set, ROOT).unwrap();
}

/// The inode at `path` (lookups held, as the kernel's would be).
fn ino_of(fs: &Fs, path: &str) -> u64 {
    path.split('/')
        .filter(|c| !c.is_empty())
        .fold(ROOT_INO, |dir, c| fs.lookup(dir, c.as_bytes()).unwrap().ino)
}

fn data(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
}

/// fsck's problems, but for files unlinked while held (orphans until the kernel forgets them).
fn problems(fs: &Fs) -> Vec<Class> {
    check::check(fs.engine(), false, |_| {})
        .problems
        .into_iter()
        .map(|p| p.class)
        .filter(|c| *c != Class::OrphanInode)
        .collect()
}

/// What is under `path` in a snapshot, re-rooted there, as a clone must read: link groups and
/// files' link counts left out (a clone splits hard links).
fn under(s: &Snapshot, path: &str) -> Snapshot {
    let root: Vec<Vec<u8>> = path.split('/').map(|c| c.as_bytes().to_vec()).collect();
    s.iter()
        .filter(|(p, _)| p.len() > root.len() && p.starts_with(&root))
        .map(|(p, seen)| {
            let mut v = seen.clone();
            v.ino_group = 0;
            if v.kind != Kind::Dir {
                v.nlink = 1;
            }
            (p[root.len()..].to_vec(), v)
        })
        .collect()
}

/// A snapshot without what is under `path`.
fn without(s: &Snapshot, path: &str) -> Snapshot {
    let root: Vec<Vec<u8>> = path.split('/').map(|c| c.as_bytes().to_vec()).collect();
    normalize(
        &s.iter()
            .filter(|(p, _)| !p.starts_with(&root))
            .map(|(p, v)| (p.clone(), v.clone()))
            .collect(),
    )
}

/// Every key and value of the image.
fn image(fs: &Fs) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    fs.engine()
        .scan(Bound::Unbounded, Bound::Unbounded, |k, v| {
            out.push((k.to_vec(), v.to_vec()));
            true
        })
        .unwrap();
    out
}

/// Removes `dir/name` and everything under it, as `rm -rf`.
fn remove_tree(fs: &Fs, dir: u64, name: &[u8]) {
    let i = fs.lookup(dir, name).unwrap();
    if i.kind == Kind::Dir {
        let fh = fs.opendir(i.ino).unwrap();
        let mut names = Vec::new();
        fs.readdir(i.ino, fh, 0, false, |e| {
            if e.name != b"." && e.name != b".." {
                names.push(e.name.clone());
            }
            true
        })
        .unwrap();
        fs.releasedir(fh);
        for n in names {
            remove_tree(fs, i.ino, &n);
        }
        fs.rmdir(dir, name).unwrap();
    } else {
        fs.unlink(dir, name).unwrap();
    }
}

/// The inode numbers of everything under `path`.
fn inodes_under(fs: &Fs, path: &str) -> BTreeSet<u64> {
    let s = snapshot(fs);
    let root: Vec<Vec<u8>> = path.split('/').map(|c| c.as_bytes().to_vec()).collect();
    s.keys()
        .filter(|p| p.len() > root.len() && p.starts_with(&root))
        .map(|p| {
            let names: Vec<String> = p
                .iter()
                .map(|c| String::from_utf8(c.clone()).unwrap())
                .collect();
            ino_of(fs, &names.join("/"))
        })
        .collect()
}

/// A clone to refuse: source, parent, name, caller, the error, what it is.
type Refusal<'a> = (u64, u64, &'a [u8], &'a Caller, Errno, &'a str);

/// Asserts that each clone is refused as said and leaves the image as it was.
fn refuse_all(fs: &Fs, cases: &[Refusal<'_>]) {
    let state = image(fs);
    for &(src, parent, name, who, e, what) in cases {
        let r = fs.clone_entry(src, parent, name, who).map(|c| c.inodes);
        assert_eq!(r, Err(e), "{what}");
        assert!(image(fs) == state, "{what}: the image changed");
    }
}

#[test]
fn a_cloned_tree_reads_like_its_source_and_each_side_changes_alone() {
    let (dev, fs) = new_fs(format());
    let a = mkdir(&fs, ROOT_INO, "A");
    let b = mkdir(&fs, a, "B");
    let c = mkdir(&fs, b, "C");
    let x = mkdir(&fs, ROOT_INO, "X");
    let z = mkdir(&fs, ROOT_INO, "Z");
    let small = file(&fs, a, "small", &data(100, 1), ROOT);
    // Out of line (writes of 64 KiB and more), inline, and a hole.
    file(&fs, b, "big", &data(600 << 10, 2), ROOT);
    let med = file(&fs, c, "med", &data(20_000, 3), ROOT);
    let fh = fs.open(med, libc::O_RDWR, ROOT).unwrap();
    fs.write(med, fh, 90_000, b"after a hole", false).unwrap();
    fs.release(med, fh).unwrap();
    // Hard links: both names under A, and one name outside it.
    let h = file(&fs, a, "h1", &data(9000, 4), ROOT);
    fs.link(h, b, b"h2").unwrap();
    let o = file(&fs, x, "out", &data(5000, 5), ROOT);
    fs.link(o, a, b"in").unwrap();
    fs.symlink(a, b"sym", b"small", ROOT).unwrap();
    fs.mknod(a, b"fifo", libc::S_IFIFO | 0o644, 0, ROOT)
        .unwrap();
    fs.setxattr(a, b"user.dir", b"on A", 0).unwrap();
    fs.setxattr(small, b"user.s", b"small's", 0).unwrap();
    fs.setxattr(h, b"user.h", b"linked", 0).unwrap();
    // Unlinked while held: parked under A/B, goes home before the clone copies anything.
    let parked = file(&fs, b, "parked", &data(7000, 6), ROOT);
    fs.unlink(b, b"parked").unwrap();
    let before = snapshot(&fs);

    let made = fs.clone_entry(a, z, b"A2", &Caller::root()).unwrap();
    let Cloned {
        inode,
        inodes,
        unlinked,
        ..
    } = made;
    assert_eq!((inodes, unlinked), (11, 3), "A2 and its ten names");
    assert_eq!((inode.kind, inode.nlink), (Kind::Dir, 3));
    let after = snapshot(&fs);
    assert_eq!(without(&after, "Z"), without(&before, "Z"), "the source");
    let copy = under(&after, "Z/A2");
    assert_eq!(copy, under(&before, "A"), "the clone reads as the source");
    let seen = |p: &str| {
        let k: Vec<Vec<u8>> = p.split('/').map(|c| c.as_bytes().to_vec()).collect();
        after[&k].clone()
    };
    assert_ne!(seen("Z/A2/h1").ino_group, seen("Z/A2/B/h2").ino_group);
    assert_eq!((seen("Z/A2/h1").nlink, seen("A/h1").nlink), (1, 2));
    assert_eq!(seen("Z").nlink, 3, "Z holds a directory more");
    let (src, dst) = (inodes_under(&fs, "A"), inodes_under(&fs, "Z/A2"));
    assert!(src.is_disjoint(&dst), "fresh numbers: {src:?} {dst:?}");
    assert!(!dst.contains(&inode.ino) && !src.contains(&inode.ino));
    assert_eq!(fs.read(parked, 0, 8000).unwrap(), data(7000, 6));
    assert_eq!(problems(&fs), vec![], "fsck after the clone");

    // Each side changes alone.
    let fh = fs.open(small, libc::O_RDWR, ROOT).unwrap();
    fs.write(small, fh, 10, b"source only", false).unwrap();
    fs.release(small, fh).unwrap();
    let big2 = ino_of(&fs, "Z/A2/B/big");
    let fh = fs.open(big2, libc::O_RDWR, ROOT).unwrap();
    fs.write(big2, fh, 4096, &[9u8; 70_000], false).unwrap();
    fs.release(big2, fh).unwrap();
    fs.setxattr(ino_of(&fs, "Z/A2/h1"), b"user.h", b"clone's", 0)
        .unwrap();
    let h2_clone = ino_of(&fs, "Z/A2/B");
    fs.unlink(h2_clone, b"h2").unwrap();
    let now = snapshot(&fs);
    let mut expect_src = under(&before, "A");
    let mut expect_dst = copy.clone();
    let small_key = vec![b"small".to_vec()];
    let mut d = data(100, 1);
    d[10..21].copy_from_slice(b"source only");
    expect_src.get_mut(&small_key).unwrap().data = d;
    let big_key = vec![b"B".to_vec(), b"big".to_vec()];
    let mut d = data(600 << 10, 2);
    d[4096..4096 + 70_000].fill(9);
    expect_dst.get_mut(&big_key).unwrap().data = d;
    let h1_key = vec![b"h1".to_vec()];
    expect_dst
        .get_mut(&h1_key)
        .unwrap()
        .xattrs
        .insert(b"user.h".to_vec(), b"clone's".to_vec());
    expect_dst.remove(&vec![b"B".to_vec(), b"h2".to_vec()]);
    assert_eq!(under(&now, "A"), expect_src, "the source after the edits");
    assert_eq!(under(&now, "Z/A2"), expect_dst, "the clone after the edits");
    assert_eq!(problems(&fs), vec![]);

    // A clone of the clone, then the source and the first clone go: the second keeps it all.
    let a2 = ino_of(&fs, "Z/A2");
    fs.clone_entry(a2, ROOT_INO, b"A3", &Caller::root())
        .unwrap();
    remove_tree(&fs, ROOT_INO, b"A");
    assert_eq!(
        under(&snapshot(&fs), "Z/A2"),
        expect_dst,
        "without its source"
    );
    remove_tree(&fs, z, b"A2");
    assert_eq!(under(&snapshot(&fs), "A3"), expect_dst, "the clone's clone");
    assert_eq!(fs.read(o, 0, 6000).unwrap(), data(5000, 5), "X/out");
    assert_eq!(problems(&fs), vec![]);
    fs.forget(parked, 1);
    let fs = reopen(&dev, fs);
    assert_eq!(under(&snapshot(&fs), "A3"), expect_dst, "after a remount");
    let rep = check::check(fs.engine(), false, |_| {});
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
}

#[test]
fn a_file_clone_and_a_clone_over_a_parked_path() {
    let (_dev, fs) = new_fs(format());
    let a = mkdir(&fs, ROOT_INO, "A");
    let f = file(&fs, a, "f", &data(300_000, 7), ROOT);
    fs.setxattr(f, b"user.f", b"x", 0).unwrap();
    // A regular file: its data and attributes; a hard-linked one (at its home) too.
    let made = fs.clone_entry(f, ROOT_INO, b"g", &Caller::root()).unwrap();
    assert_eq!((made.inodes, made.inode.kind), (1, Kind::File));
    fs.link(f, ROOT_INO, b"f-link").unwrap();
    fs.clone_entry(f, ROOT_INO, b"h", &Caller::root()).unwrap();
    for name in ["g", "h"] {
        let i = ino_of(&fs, name);
        assert_ne!(i, f);
        assert_eq!(fs.read(i, 0, 400_000).unwrap(), data(300_000, 7), "{name}");
        assert_eq!(fs.getxattr(i, b"user.f").unwrap(), b"x");
        assert_eq!(fs.getattr(i).unwrap().nlink, 1);
    }
    let fh = fs.open(f, libc::O_RDWR, ROOT).unwrap();
    fs.write(f, fh, 0, b"changed", false).unwrap();
    fs.release(f, fh).unwrap();
    assert_eq!(fs.read(ino_of(&fs, "g"), 0, 7).unwrap(), data(7, 7));
    // A file held after its unlink, parked at /D: a clone made there sends it home first.
    let held = file(&fs, ROOT_INO, "D", &data(5000, 8), ROOT);
    fs.setxattr(held, b"user.held", b"y", 0).unwrap();
    fs.unlink(ROOT_INO, b"D").unwrap();
    fs.clone_entry(a, ROOT_INO, b"D", &Caller::root()).unwrap();
    assert_eq!(fs.read(held, 0, 6000).unwrap(), data(5000, 8));
    assert_eq!(fs.getxattr(held, b"user.held").unwrap(), b"y");
    assert_eq!(
        fs.read(ino_of(&fs, "D/f"), 0, 7).unwrap(),
        b"changed",
        "cloned after the write"
    );
    assert_eq!(problems(&fs), vec![]);
    fs.forget(held, 1);
    fs.end_session().unwrap();
    let rep = check::check(fs.engine(), false, |_| {});
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
}

#[test]
fn every_refusal_leaves_the_image_as_it_was() {
    // A 2 MiB log: its records hold 256 KiB, fewer than the metadata of `wide`.
    let (_dev, fs) = new_fs(Format {
        log_size: Some(2 << 20),
        ..format()
    });
    let a = mkdir(&fs, ROOT_INO, "A");
    let b = mkdir(&fs, a, "B");
    file(&fs, b, "f", &data(1000, 1), ROOT);
    fs.symlink(ROOT_INO, b"link", b"A", ROOT).unwrap();
    mkdir(&fs, ROOT_INO, "D");
    let open = mkdir(&fs, ROOT_INO, "open");
    chmod(&fs, open, 0o777);
    let locked = mkdir(&fs, ROOT_INO, "locked");
    let inner = mkdir(&fs, locked, "inner");
    chmod(&fs, inner, 0o777);
    chmod(&fs, locked, 0o700);
    // Deep names: a key under a longer path would pass the 1,024-byte limit.
    let long = "n".repeat(200);
    let mut deep = mkdir(&fs, ROOT_INO, "deep");
    let top = deep;
    for _ in 0..4 {
        deep = mkdir(&fs, deep, &long);
    }
    file(&fs, deep, "leaf", b"x", ROOT);
    let far = mkdir(&fs, ROOT_INO, &long);
    // More metadata than one log record holds.
    let wide = mkdir(&fs, ROOT_INO, "wide");
    for i in 0..600 {
        let name = format!("{i:04}{}", "w".repeat(180));
        file(&fs, wide, &name, b"", ROOT);
    }
    let secret = file(&fs, b, "secret", b"s", ROOT);
    chmod(&fs, secret, 0o600);
    let root = Caller::root();
    let u = user();
    let link = ino_of(&fs, "link");
    refuse_all(
        &fs,
        &[
            (a, ROOT_INO, b"D", &root, Errno::EEXIST, "DST exists"),
            (a, b, b"x", &root, Errno::EINVAL, "DST inside SRC"),
            (a, a, b"x", &root, Errno::EINVAL, "DST in SRC"),
            (link, ROOT_INO, b"x", &root, Errno::EINVAL, "a symlink"),
            (a, ROOT_INO, b"a/b", &root, Errno::EINVAL, "a bad name"),
            (a, 999_999, b"x", &root, Errno::ENOENT, "no parent"),
            (
                top,
                far,
                b"deeper",
                &root,
                Errno::ENAMETOOLONG,
                "keys too long",
            ),
        ],
    );
    let next = file(&fs, open, "probe", b"", ROOT);
    fs.unlink(open, b"probe").unwrap();
    fs.forget(next, 1);
    // More than a record (after the inode numbers are taken), and unprivileged callers: a file
    // under SRC it may not read, a directory it may not write, one above DST it may not search,
    // one under SRC it may not list.
    refuse_all(
        &fs,
        &[
            (
                wide,
                ROOT_INO,
                b"w2",
                &root,
                Errno::EFBIG,
                "a record's worth",
            ),
            (a, open, b"x", &u, Errno::EACCES, "unreadable"),
            (b, ROOT_INO, b"x", &u, Errno::EACCES, "unwritable parent"),
        ],
    );
    chmod(&fs, secret, 0o644);
    refuse_all(
        &fs,
        &[(a, inner, b"x", &u, Errno::EACCES, "no search above")],
    );
    chmod(&fs, b, 0o711);
    refuse_all(&fs, &[(a, open, b"x", &u, Errno::EACCES, "no listing")]);
    chmod(&fs, b, 0o755);
    // The refusals gave their inode numbers back: the next number is the one after the probe.
    let made = fs.clone_entry(a, open, b"x", &u).unwrap();
    assert_eq!(made.inode.ino, next + 1, "numbers given back");
    assert_eq!(problems(&fs), vec![]);
}

#[test]
fn an_unprivileged_clone_drops_set_id_bits_and_capabilities_of_others_inodes() {
    let (_dev, fs) = new_fs(format());
    let s = mkdir(&fs, ROOT_INO, "S");
    let w = mkdir(&fs, ROOT_INO, "W");
    chmod(&fs, w, 0o777);
    // A program with set-id bits and capabilities, as `ctx`.
    let program = |name: &str, ctx: Ctx, mode: u32, caps: &[u8]| {
        let i = file(&fs, s, name, b"#!", ctx);
        chmod(&fs, i, mode);
        fs.setxattr(i, b"security.capability", caps, 0).unwrap();
        i
    };
    let theirs = program("theirs", ROOT, 0o4755, b"caps");
    program("mine", USER, 0o6755, b"my caps");
    let homed = program("homed", ROOT, 0o4755, b"caps");
    let sgid = mkdir(&fs, s, "shared");
    chmod(&fs, sgid, 0o2755);
    fs.link(homed, s, b"homed2").unwrap();
    let mode = |p: &str| fs.getattr(ino_of(&fs, p)).unwrap().perm;
    let caps = |p: &str| fs.getxattr(ino_of(&fs, p), b"security.capability");
    fs.clone_entry(s, w, b"by-user", &user()).unwrap();
    assert_eq!(mode("W/by-user/theirs"), 0o755);
    assert_eq!(caps("W/by-user/theirs"), Err(Errno::ENODATA));
    assert_eq!(mode("W/by-user/homed2"), 0o755, "a hard-linked file");
    assert_eq!(caps("W/by-user/homed"), Err(Errno::ENODATA));
    assert_eq!(mode("W/by-user/mine"), 0o6755, "the caller's own");
    assert_eq!(caps("W/by-user/mine").unwrap(), b"my caps");
    assert_eq!(mode("W/by-user/shared"), 0o755);
    assert_eq!(fs.getattr(ino_of(&fs, "W/by-user/theirs")).unwrap().uid, 0);
    // A single file too.
    fs.clone_entry(theirs, w, b"one", &user()).unwrap();
    assert_eq!((mode("W/one"), caps("W/one")), (0o755, Err(Errno::ENODATA)));
    // Root's clone keeps everything; the source is untouched.
    fs.clone_entry(s, w, b"by-root", &Caller::root()).unwrap();
    assert_eq!(mode("W/by-root/theirs"), 0o4755);
    assert_eq!(caps("W/by-root/homed2").unwrap(), b"caps");
    assert_eq!(mode("W/by-root/shared"), 0o2755);
    assert_eq!(
        (mode("S/theirs"), caps("S/theirs").unwrap()),
        (0o4755, b"caps".to_vec())
    );
    assert_eq!(problems(&fs), vec![]);
}
