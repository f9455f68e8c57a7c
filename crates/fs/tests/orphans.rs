//! Files whose last name is removed while the kernel still holds them (its lookup count is not
//! zero: an open file, a working directory): they stay readable and writable through their inode
//! until the kernel forgets them, then they are deleted. Their data stays at their last path
//! ("parked") until then, and moves to their home only when something else needs that path.

mod common;

use std::sync::Arc;

use amaranth_device::MemDevice;
use amaranth_engine::Engine;
use amaranth_fs::check::{self, Class};
use amaranth_fs::{Ctx, Errno, Fs, ROOT_INO};
use common::{
    engine_options, format, fs_options, held_file as file, new_mem_fs as new_fs,
    problem_classes as problems, set_size,
};

fn used_inodes(fs: &Fs) -> u64 {
    let s = fs.statfs();
    s.files - s.ffree
}

/// Reopens the image on `dev` as a mount after a crash would (no end of session).
fn reopen(dev: Arc<MemDevice>) -> Fs {
    let engine = Engine::open(dev, engine_options()).unwrap();
    Fs::new(Arc::new(engine), fs_options()).unwrap()
}

#[test]
fn an_unlinked_file_lives_until_the_kernel_forgets_it() {
    let (_dev, fs) = new_fs();
    let data = vec![7u8; 10_000];
    let ino = file(&fs, ROOT_INO, "f", &data);
    let before = used_inodes(&fs);
    fs.unlink(ROOT_INO, b"f").unwrap();
    assert_eq!(fs.lookup(ROOT_INO, b"f").unwrap_err(), Errno::ENOENT);
    assert_eq!(fs.getattr(ino).unwrap().nlink, 0);
    // Still readable and writable through the inode.
    assert_eq!(fs.read(ino, 0, 20_000).unwrap(), data);
    fs.write_at(ino, 10_000, b"more", false, false).unwrap();
    assert_eq!(fs.read(ino, 9_998, 10).unwrap(), b"\x07\x07more");
    fs.setxattr(ino, b"user.k", b"v", 0).unwrap();
    assert_eq!(fs.getxattr(ino, b"user.k").unwrap(), b"v");
    // fsck sees a file unlinked while in use, and no data without an owner.
    let p = problems(&fs);
    assert!(p.contains(&Class::OrphanInode), "{p:?}");
    // It still counts as a used inode until it is deleted.
    assert!(!p.contains(&Class::InodeCount), "{p:?}");
    assert!(!p.contains(&Class::DataWithoutInode), "{p:?}");
    assert!(!p.contains(&Class::XattrWithoutInode), "{p:?}");
    // The kernel lets go: everything is deleted.
    fs.forget(ino, 1);
    assert_eq!(fs.getattr(ino).unwrap_err(), Errno::ENOENT);
    assert_eq!(used_inodes(&fs), before - 1);
    assert_eq!(problems(&fs), vec![], "after the forget");
}

#[test]
fn a_new_file_at_a_parked_path_starts_empty_and_the_parked_one_keeps_its_data() {
    let (_dev, fs) = new_fs();
    let old = file(&fs, ROOT_INO, "f", &[1u8; 9000]);
    fs.unlink(ROOT_INO, b"f").unwrap();
    // The same name again: the parked file's data moves to its home first.
    let new = file(&fs, ROOT_INO, "f", b"");
    set_size(&fs, new, 9000);
    assert_eq!(fs.read(new, 0, 9000).unwrap(), vec![0u8; 9000]);
    assert_eq!(fs.read(old, 0, 9000).unwrap(), vec![1u8; 9000]);
    fs.write_at(old, 0, b"old", false, false).unwrap();
    assert_eq!(fs.read(new, 0, 3).unwrap(), vec![0u8; 3]);
    fs.forget(old, 1);
    assert_eq!(fs.read(new, 0, 9000).unwrap(), vec![0u8; 9000]);
    fs.forget(new, 1);
    assert_eq!(problems(&fs), vec![]);
}

#[test]
fn parked_files_move_home_when_a_name_or_a_directory_lands_on_them() {
    let (_dev, fs) = new_fs();
    let ctx = Ctx::default();
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, ctx).unwrap().ino;
    let e = fs.mkdir(d, b"e", 0o755, ctx).unwrap().ino;
    let a = file(&fs, e, "a", &[2u8; 5000]);
    let b = file(&fs, d, "b", &[3u8; 5000]);
    fs.unlink(e, b"a").unwrap();
    fs.unlink(d, b"b").unwrap();
    // A directory above a parked file is renamed, then one is removed and made again.
    fs.rename(ROOT_INO, b"d", ROOT_INO, b"d2", 0).unwrap();
    // A file parked in a directory that is removed stays parked (nothing moves at an rmdir)...
    let c = file(&fs, e, "c", &[9u8; 5000]);
    fs.unlink(e, b"c").unwrap();
    fs.rmdir(d, b"e").unwrap();
    assert_eq!(fs.read(c, 0, 5000).unwrap(), vec![9u8; 5000]);
    // ...until a directory renamed to where the removed one was brings a file to its path.
    let x = fs.mkdir(ROOT_INO, b"x", 0o755, ctx).unwrap().ino;
    let xc = file(&fs, x, "c", &[7u8; 3000]);
    fs.rename(ROOT_INO, b"x", d, b"e", 0).unwrap();
    assert_eq!(fs.read(xc, 0, 5000).unwrap(), vec![7u8; 3000]);
    assert_eq!(fs.read(c, 0, 5000).unwrap(), vec![9u8; 5000]);
    // Its file is unlinked (parked where `c` was) and it goes; a new one is made there.
    fs.unlink(x, b"c").unwrap();
    fs.rmdir(d, b"e").unwrap();
    let e2 = fs.mkdir(d, b"e", 0o755, ctx).unwrap().ino;
    let a2 = file(&fs, e2, "a", b"");
    let c2 = file(&fs, e2, "c", b"");
    assert_eq!(fs.read(a2, 0, 5000).unwrap(), b"");
    assert_eq!(fs.read(c2, 0, 5000).unwrap(), b"");
    assert_eq!(fs.read(a, 0, 5000).unwrap(), vec![2u8; 5000]);
    assert_eq!(fs.read(c, 0, 5000).unwrap(), vec![9u8; 5000]);
    assert_eq!(fs.read(xc, 0, 5000).unwrap(), vec![7u8; 3000]);
    assert_eq!(fs.read(b, 0, 5000).unwrap(), vec![3u8; 5000]);
    let p = problems(&fs);
    assert!(p.iter().all(|c| *c == Class::OrphanInode), "{p:?}");
    for i in [a, b, a2, c2, e2, e, d, c, xc, x] {
        fs.forget(i, 1);
    }
    assert_eq!(problems(&fs), vec![]);
}

#[test]
fn after_a_crash_the_mount_deletes_parked_files_and_their_data() {
    let (dev, fs) = new_fs();
    let keep = file(&fs, ROOT_INO, "keep", &[4u8; 3000]);
    let gone = file(&fs, ROOT_INO, "gone", &[5u8; 20_000]);
    fs.setxattr(gone, b"user.x", b"y", 0).unwrap();
    fs.unlink(ROOT_INO, b"gone").unwrap();
    fs.forget(keep, 1);
    fs.fsync().unwrap();
    let used = used_inodes(&fs);
    // A crash: the engine is dropped without a checkpoint, the kernel never forgot `gone`.
    drop(fs);
    let fs = reopen(dev);
    assert_eq!(used_inodes(&fs), used - 1);
    assert_eq!(
        problems(&fs),
        vec![],
        "the mount left something of the parked file"
    );
    assert_eq!(fs.lookup(ROOT_INO, b"gone").unwrap_err(), Errno::ENOENT);
    let k = fs.lookup(ROOT_INO, b"keep").unwrap();
    assert_eq!(fs.read(k.ino, 0, 3000).unwrap(), vec![4u8; 3000]);
    // A new file at the old name sees none of the old data.
    let n = file(&fs, ROOT_INO, "gone", b"");
    set_size(&fs, n, 20_000);
    assert_eq!(fs.read(n, 0, 20_000).unwrap(), vec![0u8; 20_000]);
    assert_eq!(fs.listxattr(n).unwrap(), b"");
}

/// The crash soak's seed 1795599933 cut power between an unlink and the FORGET: fsck called the
/// parked file's place in the inode counter wrong. A repair deletes the file and takes it off
/// the counter in one go.
#[test]
fn fsck_counts_a_parked_file_until_a_repair_deletes_it() {
    let (dev, fs) = new_fs();
    let keep = file(&fs, ROOT_INO, "keep", &[1u8; 100]);
    fs.forget(keep, 1);
    let before = used_inodes(&fs);
    let _gone = file(&fs, ROOT_INO, "gone", &[2u8; 5000]);
    fs.unlink(ROOT_INO, b"gone").unwrap();
    fs.fsync().unwrap();
    // A crash before the kernel's FORGET.
    drop(fs);
    let engine = Engine::open(dev.clone(), engine_options()).unwrap();
    let found: Vec<Class> = check::check(&engine, false, |_| {})
        .problems
        .into_iter()
        .map(|p| p.class)
        .collect();
    assert_eq!(found, vec![Class::OrphanInode]);
    let rounds = check::repair(&engine, |_| {});
    assert!(rounds.last().unwrap().problems.is_empty(), "{rounds:?}");
    drop(engine);
    let fs = reopen(dev);
    assert_eq!(problems(&fs), vec![]);
    assert_eq!(used_inodes(&fs), before);
}

#[test]
fn the_end_of_a_session_deletes_what_the_kernel_still_held() {
    let (_dev, fs) = new_fs();
    let _f = file(&fs, ROOT_INO, "f", &[6u8; 4096]);
    fs.unlink(ROOT_INO, b"f").unwrap();
    assert!(problems(&fs).contains(&Class::OrphanInode));
    fs.end_session().unwrap();
    // fsck clean: no home left for it, and no data at its old path.
    assert_eq!(problems(&fs), vec![]);
}

#[test]
fn a_schema_4_image_opens_and_is_upgraded() {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let engine = Engine::create(dev, format(), engine_options()).unwrap();
    Fs::mkfs(&engine, 0, 0).unwrap();
    let key = b"sformat".to_vec();
    let mut b = amaranth_engine::Batch::new();
    b.put(key.clone(), 4u32.to_le_bytes().to_vec());
    engine.write(&b).unwrap();
    let engine = Arc::new(engine);
    let fs = Fs::new(engine.clone(), fs_options()).unwrap();
    assert_eq!(
        engine.get(&key).unwrap(),
        Some(amaranth_fs::SCHEMA_VERSION.to_le_bytes().to_vec())
    );
    assert_eq!(amaranth_fs::SCHEMA_VERSION, 6);
    assert_eq!(problems(&fs), vec![]);
    // Version 1 stays refused.
    let mut b = amaranth_engine::Batch::new();
    b.put(key, 1u32.to_le_bytes().to_vec());
    engine.write(&b).unwrap();
    drop(fs);
    assert!(Fs::new(engine, fs_options()).is_err());
}
