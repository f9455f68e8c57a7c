//! Hard links and where a file's data lives: a file with two or more names lives at its home
//! (keyed by inode number); when its link count returns to one (unlink or rename over one of its
//! names), it moves back under its one remaining path, so that a walk by path reads it in place
//! (git's temporary name, `link()`, `unlink()`: docs/AGING.md). Every step is checked with fsck,
//! which also checks the names index that finds the remaining name.

mod common;

use std::sync::Arc;

use amaranth_device::MemDevice;
use amaranth_engine::{Batch, Engine};
use amaranth_fs::check::{self, Class};
use amaranth_fs::{keys, Ctx, Fs, FsOptions, Meta, ROOT_INO};
use common::{engine_options, format};

const CTX: Ctx = Ctx {
    uid: 0,
    gid: 0,
    pid: 1,
};

fn new_image() -> Arc<MemDevice> {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let engine = Engine::create(dev.clone(), format(), engine_options()).unwrap();
    Fs::mkfs(&engine, 0, 0).unwrap();
    engine.close().unwrap();
    dev
}

fn open(dev: &Arc<MemDevice>) -> Fs {
    let engine = Engine::open(dev.clone(), engine_options()).unwrap();
    Fs::new(Arc::new(engine), FsOptions::default()).unwrap()
}

fn close(fs: Fs) {
    fs.end_session().unwrap();
    common::close_engine(fs);
}

/// Creates `name` in `dir` holding `data` (the creation's lookup stays held, as the kernel's).
fn file(fs: &Fs, dir: u64, name: &[u8], data: &[u8]) -> u64 {
    let (i, fh) = fs.create(dir, name, 0o644, libc::O_RDWR, CTX).unwrap();
    common::write_all(fs, i.ino, fh, 0, data).unwrap();
    fs.release(i.ino, fh).unwrap();
    i.ino
}

/// Whether inode `ino` has a record at its home.
fn at_home(fs: &Fs, ino: u64) -> bool {
    let key = keys::meta_key(&keys::home_key(ino));
    fs.engine().get(&key).unwrap().is_some()
}

/// Whether `path` holds inode `ino` itself (not a redirect) with its first data block there.
fn at_path(fs: &Fs, path: &[&[u8]], ino: u64) -> bool {
    let pk = keys::path_key(path);
    let meta = fs.engine().get(&keys::meta_key(&pk)).unwrap();
    let inode =
        matches!(meta.map(|v| Meta::decode(&v).unwrap()), Some(Meta::Inode(i)) if i.ino == ino);
    inode && fs.engine().get(&keys::data_key(&pk, 0)).unwrap().is_some()
}

fn assert_clean(fs: &Fs, what: &str) {
    let r = check::check(fs.engine(), false, |_| {});
    assert!(r.problems.is_empty(), "{what}: {:?}", r.problems);
}

fn data(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
}

#[test]
fn gits_temporary_name_link_unlink_leaves_the_object_at_its_path() {
    let dev = new_image();
    let fs = open(&dev);
    let objects = fs.mkdir(ROOT_INO, b"objects", 0o755, CTX).unwrap().ino;
    let ab = fs.mkdir(objects, b"ab", 0o755, CTX).unwrap().ino;
    let body = data(10_000, 1);
    let ino = file(&fs, ab, b"tmp_obj_X", &body);
    fs.link(ino, ab, b"cdef").unwrap();
    assert!(at_home(&fs, ino));
    assert_clean(&fs, "linked");
    fs.unlink(ab, b"tmp_obj_X").unwrap();
    assert!(!at_home(&fs, ino), "still at its home");
    assert!(at_path(&fs, &[b"objects", b"ab", b"cdef"], ino));
    assert_clean(&fs, "unlinked");
    // The inode the kernel holds is usable at its new place, and its data is whole.
    assert_eq!(fs.read(ino, 0, 1 << 16).unwrap(), body);
    assert_eq!(fs.getattr(ino).unwrap().nlink, 1);
    fs.write(ino, 0, 10_000, b"more", false).unwrap();
    close(fs);
    let fs = open(&dev);
    let o = fs.lookup(ROOT_INO, b"objects").unwrap();
    let a = fs.lookup(o.ino, b"ab").unwrap();
    let f = fs.lookup(a.ino, b"cdef").unwrap();
    assert_eq!(f.ino, ino);
    assert_eq!(&fs.read(ino, 0, 1 << 16).unwrap()[..10_000], &body[..]);
    assert_clean(&fs, "remounted");
    close(fs);
}

#[test]
fn unlinking_either_name_or_the_middle_of_three_homes_as_it_should() {
    let dev = new_image();
    let fs = open(&dev);
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, CTX).unwrap().ino;
    let e = fs.mkdir(ROOT_INO, b"e", 0o755, CTX).unwrap().ino;
    // Second name removed: back at the first.
    let a = file(&fs, d, b"a", &data(5000, 2));
    fs.link(a, e, b"a2").unwrap();
    fs.unlink(e, b"a2").unwrap();
    assert!(!at_home(&fs, a) && at_path(&fs, &[b"d", b"a"], a));
    assert_clean(&fs, "second name removed");
    // Three names: one removed keeps it at home, the second returns it to the last.
    let b = file(&fs, d, b"b", &data(9000, 3));
    fs.link(b, e, b"b2").unwrap();
    fs.link(b, ROOT_INO, b"b3").unwrap();
    fs.unlink(d, b"b").unwrap();
    assert!(at_home(&fs, b));
    assert_clean(&fs, "one of three removed");
    fs.unlink(ROOT_INO, b"b3").unwrap();
    assert!(!at_home(&fs, b) && at_path(&fs, &[b"e", b"b2"], b));
    assert_eq!(fs.read(b, 0, 1 << 16).unwrap(), data(9000, 3));
    assert_clean(&fs, "two of three removed");
    // Linked again: homed again, and back once more.
    fs.link(b, d, b"b4").unwrap();
    assert!(at_home(&fs, b));
    fs.unlink(e, b"b2").unwrap();
    assert!(at_path(&fs, &[b"d", b"b4"], b));
    assert_clean(&fs, "relinked and unlinked");
    close(fs);
}

#[test]
fn renames_of_names_and_renames_over_them() {
    let dev = new_image();
    let fs = open(&dev);
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, CTX).unwrap().ino;
    let e = fs.mkdir(ROOT_INO, b"e", 0o755, CTX).unwrap().ino;
    // The second name renamed, then the first removed: the file lands at the renamed name.
    let a = file(&fs, d, b"a", &data(7000, 4));
    fs.link(a, d, b"a2").unwrap();
    fs.rename(d, b"a2", e, b"moved", 0).unwrap();
    assert_clean(&fs, "a name renamed");
    fs.unlink(d, b"a").unwrap();
    assert!(!at_home(&fs, a) && at_path(&fs, &[b"e", b"moved"], a));
    assert_clean(&fs, "renamed name left");
    // A name replaced by a rename (its link count returns to one through the rename).
    let b = file(&fs, d, b"b", &data(3000, 5));
    fs.link(b, e, b"b2").unwrap();
    let other = file(&fs, ROOT_INO, b"other", b"other data");
    fs.rename(ROOT_INO, b"other", e, b"b2", 0).unwrap();
    assert!(!at_home(&fs, b) && at_path(&fs, &[b"d", b"b"], b));
    assert!(at_path(&fs, &[b"e", b"b2"], other));
    assert_eq!(fs.read(b, 0, 1 << 16).unwrap(), data(3000, 5));
    assert_clean(&fs, "renamed over a name");
    // A directory holding a name renamed: the index keeps the directory's number.
    let c = file(&fs, d, b"c", &data(2000, 6));
    let sub = fs.mkdir(e, b"sub", 0o755, CTX).unwrap().ino;
    fs.link(c, sub, b"c2").unwrap();
    fs.rename(e, b"sub", ROOT_INO, b"sub2", 0).unwrap();
    fs.unlink(d, b"c").unwrap();
    assert!(at_path(&fs, &[b"sub2", b"c2"], c));
    assert_clean(&fs, "directory renamed");
    // An exchange of a redirect and a file, then the other name removed.
    let x = file(&fs, d, b"x", &data(1000, 7));
    fs.link(x, e, b"x2").unwrap();
    let y = file(&fs, e, b"y", b"y data");
    fs.rename(e, b"x2", e, b"y", amaranth_fs::RENAME_EXCHANGE)
        .unwrap();
    assert_clean(&fs, "exchanged");
    fs.unlink(d, b"x").unwrap();
    assert!(at_path(&fs, &[b"e", b"y"], x) && at_path(&fs, &[b"e", b"x2"], y));
    assert_clean(&fs, "exchanged, then unlinked");
    close(fs);
}

#[test]
fn held_files_move_back_and_then_park_and_go() {
    let dev = new_image();
    let fs = open(&dev);
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, CTX).unwrap().ino;
    let a = file(&fs, d, b"a", &data(6000, 8));
    let fh = fs.open(a, libc::O_RDWR, CTX).unwrap();
    fs.link(a, ROOT_INO, b"a2").unwrap();
    fs.unlink(d, b"a").unwrap();
    assert!(at_path(&fs, &[b"a2"], a));
    fs.write(a, fh, 6000, b"tail", false).unwrap();
    assert_clean(&fs, "unlinked while open");
    // The last name goes while it is held: parked at that path, deleted when forgotten.
    fs.unlink(ROOT_INO, b"a2").unwrap();
    assert_eq!(&fs.read(a, 6000, 4).unwrap(), b"tail");
    let r = check::check(fs.engine(), false, |_| {});
    assert!(
        r.problems.iter().all(|p| p.class == Class::OrphanInode),
        "parked: {:?}",
        r.problems
    );
    fs.release(a, fh).unwrap();
    fs.forget(a, 2);
    assert!(!at_home(&fs, a));
    assert_clean(&fs, "forgotten");
    close(fs);
}

#[test]
fn after_a_remount_the_remaining_name_is_found_through_the_indexes() {
    let dev = new_image();
    let fs = open(&dev);
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, CTX).unwrap().ino;
    let deep = fs.mkdir(d, b"deep", 0o755, CTX).unwrap().ino;
    let a = file(&fs, deep, b"a", &data(4000, 9));
    fs.link(a, ROOT_INO, b"top").unwrap();
    close(fs);
    // The new session knows neither `d` nor `deep`: the path comes from the inode index.
    let fs = open(&dev);
    fs.lookup(ROOT_INO, b"top").unwrap();
    fs.unlink(ROOT_INO, b"top").unwrap();
    assert!(at_path(&fs, &[b"d", b"deep", b"a"], a));
    // The kernel still holds the inode: the table keeps it at its path (its directories entered).
    assert_eq!(fs.read(a, 0, 1 << 16).unwrap(), data(4000, 9));
    fs.write(a, 0, 4000, b"end", false).unwrap();
    assert_eq!(fs.getattr(a).unwrap().size, 4003);
    assert_clean(&fs, "after remount");
    close(fs);
    let fs = open(&dev);
    let dd = fs.lookup(ROOT_INO, b"d").unwrap().ino;
    let de = fs.lookup(dd, b"deep").unwrap().ino;
    assert_eq!(fs.lookup(de, b"a").unwrap().ino, a);
    assert_eq!(fs.read(a, 0, 1 << 16).unwrap()[..4000], data(4000, 9));
    assert_eq!(fs.read(a, 4000, 3).unwrap(), b"end");
    close(fs);
}

#[test]
fn large_files_move_back_and_keys_that_would_not_fit_stay_at_home() {
    let dev = new_image();
    let fs = open(&dev);
    // Past the 1024 blocks that used to keep a file at its home (the move copied them): moved
    // back by tree surgery, whatever its size.
    let big = data(1025 * 4096, 10);
    let a = file(&fs, ROOT_INO, b"big", &big);
    fs.link(a, ROOT_INO, b"big2").unwrap();
    fs.unlink(ROOT_INO, b"big").unwrap();
    assert!(!at_home(&fs, a));
    assert_eq!(fs.read(a, 0, 1 << 20).unwrap(), big[..1 << 20]);
    assert_clean(&fs, "large file");
    // An extended attribute whose key would be too long under the remaining (long) path.
    let mut dir = ROOT_INO;
    let mut path: Vec<Vec<u8>> = Vec::new();
    for i in 0..4u8 {
        let name = vec![b'a' + i; 200];
        dir = fs.mkdir(dir, &name, 0o755, CTX).unwrap().ino;
        path.push(name);
    }
    let b = file(&fs, ROOT_INO, b"x", b"x data");
    let xname = [b"user.".as_slice(), &[b'n'; 40]].concat();
    fs.setxattr(b, &xname, b"v", 0).unwrap();
    let last = vec![b'z'; 150];
    fs.link(b, dir, &last).unwrap();
    fs.unlink(ROOT_INO, b"x").unwrap();
    assert!(at_home(&fs, b), "moved although a key would not fit");
    assert_eq!(fs.read(b, 0, 100).unwrap(), b"x data");
    assert_clean(&fs, "long keys");
    close(fs);
}

#[test]
fn the_names_index_is_checked_repaired_and_built_for_older_images() {
    let dev = new_image();
    let fs = open(&dev);
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, CTX).unwrap().ino;
    let a = file(&fs, d, b"a", &data(3000, 11));
    fs.link(a, ROOT_INO, b"a2").unwrap();
    let engine = fs.engine().clone();
    // A lost entry is found and rewritten by fsck --repair.
    let mut batch = Batch::new();
    batch.range_delete(vec![keys::NAMES], vec![keys::NAMES + 1]);
    engine.write(&batch).unwrap();
    let r = check::check(&engine, false, |_| {});
    assert!(r.problems.iter().any(|p| p.class == Class::InodeIndex));
    check::repair(&engine, |_| {});
    assert_clean(&fs, "repaired");
    // An entry of no redirect (`d/zz` does not exist) is found and deleted.
    let mut stray = keys::names_prefix(a);
    stray.extend_from_slice(&d.to_be_bytes());
    stray.extend_from_slice(b"zz");
    let mut batch = Batch::new();
    batch.put(stray, vec![1]);
    engine.write(&batch).unwrap();
    let r = check::check(&engine, false, |_| {});
    assert!(r.problems.iter().any(|p| p.class == Class::InodeIndex));
    check::repair(&engine, |_| {});
    assert_clean(&fs, "stray entry repaired");
    // What an older version left after an unlink of one of two names: a home with one name.
    let c = file(&fs, d, b"c", &data(2500, 12));
    fs.link(c, d, b"c2").unwrap();
    let home = keys::meta_key(&keys::home_key(c));
    let Meta::Inode(mut inode) = Meta::decode(&engine.get(&home).unwrap().unwrap()).unwrap() else {
        panic!("no inode at the home of {c}");
    };
    inode.nlink = 1;
    let mut batch = Batch::new();
    batch.put(home, inode.encode());
    batch.delete(keys::meta_key(&keys::path_key(&[b"d", b"c2"])));
    engine.write(&batch).unwrap();
    // Back to schema 5 (no names index): the first writable mount builds it, and moves the file
    // with one name back to it.
    let mut batch = Batch::new();
    batch.range_delete(vec![keys::NAMES], vec![keys::NAMES + 1]);
    batch.put(keys::system_key("format"), 5u32.to_le_bytes().to_vec());
    engine.write(&batch).unwrap();
    drop(engine);
    close(fs);
    let fs = open(&dev);
    assert_clean(&fs, "upgraded");
    assert!(!at_home(&fs, c) && at_path(&fs, &[b"d", b"c"], c));
    fs.lookup(ROOT_INO, b"a2").unwrap();
    fs.unlink(ROOT_INO, b"a2").unwrap();
    assert!(at_path(&fs, &[b"d", b"a"], a));
    assert_clean(&fs, "unlinked after the upgrade");
    close(fs);
}
