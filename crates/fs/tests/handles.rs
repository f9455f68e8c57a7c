//! Inodes found by number alone, as a file handle presented after the kernel forgot the inode
//! needs (NFS export, `open_by_handle_at`): through the inode index, after creates, renames of
//! files and whole directories, hard links, unlinks while open, exchanges, and a remount; stale
//! numbers give `ESTALE`; an image from before the index gets it at its first writable mount.

mod common;

use std::sync::Arc;

use amaranth_device::MemDevice;
use amaranth_engine::Engine;
use amaranth_fs::check::Class;
use amaranth_fs::{keys, Ctx, Errno, Fs, FsOptions, Kind, RENAME_EXCHANGE, ROOT_INO};
use common::{engine_options, format};

const CTX: Ctx = Ctx {
    uid: 0,
    gid: 0,
    pid: 1,
};

fn open(dev: &Arc<MemDevice>) -> Fs {
    let engine = Engine::open(dev.clone(), engine_options()).unwrap();
    Fs::new(Arc::new(engine), FsOptions::default()).unwrap()
}

fn close(fs: Fs) {
    common::close_engine(fs);
}

fn new_image() -> Arc<MemDevice> {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let engine = Engine::create(dev.clone(), format(), engine_options()).unwrap();
    Fs::mkfs(&engine, 0, 0).unwrap();
    engine.close().unwrap();
    dev
}

fn file(fs: &Fs, parent: u64, name: &[u8], data: &[u8]) -> u64 {
    let (i, fh) = fs.create(parent, name, 0o644, libc::O_RDWR, CTX).unwrap();
    fs.write(i.ino, fh, 0, data, false).unwrap();
    fs.release(i.ino, fh).unwrap();
    i.ino
}

/// What a handle's holder does: look the number up as `.` in a session that never saw it.
fn by_number(dev: &Arc<MemDevice>, ino: u64) -> Result<(Kind, Vec<u8>), Errno> {
    let fs = open(dev);
    let r = fs.lookup(ino, b".").map(|i| {
        let data = if i.kind == Kind::File {
            fs.read(i.ino, 0, 1 << 16).unwrap()
        } else {
            Vec::new()
        };
        assert_eq!(i.ino, ino);
        (i.kind, data)
    });
    close(fs);
    r
}

#[test]
fn inodes_are_found_by_number_after_every_kind_of_change() {
    let dev = new_image();
    let fs = open(&dev);
    let a = fs.mkdir(ROOT_INO, b"a", 0o755, CTX).unwrap().ino;
    let b = fs.mkdir(a, b"b", 0o755, CTX).unwrap().ino;
    let deep = file(&fs, b, b"deep", b"deep data");
    let moved = file(&fs, a, b"moved", b"moved data");
    let linked = file(&fs, b, b"linked", b"linked data");
    let gone = file(&fs, a, b"gone", b"gone data");
    let x = file(&fs, ROOT_INO, b"x", b"x data");
    let y = fs.mkdir(ROOT_INO, b"y", 0o755, CTX).unwrap().ino;
    let open_unlinked = file(&fs, a, b"held", b"held data");
    // A directory renamed (its subtree moves), a file renamed across directories, a hard link
    // whose first name then goes, an unlink, an exchange of a file and a directory.
    fs.rename(a, b"b", ROOT_INO, b"b2", 0).unwrap();
    fs.rename(a, b"moved", b, b"moved2", 0).unwrap();
    fs.link(linked, ROOT_INO, b"second").unwrap();
    fs.unlink(b, b"linked").unwrap();
    fs.unlink(a, b"gone").unwrap();
    fs.rename(ROOT_INO, b"x", ROOT_INO, b"y", RENAME_EXCHANGE)
        .unwrap();
    let fh = fs.open(open_unlinked, libc::O_RDONLY, CTX).unwrap();
    fs.unlink(a, b"held").unwrap();
    fs.release(open_unlinked, fh).unwrap();
    close(fs);
    assert_eq!(
        by_number(&dev, deep).unwrap(),
        (Kind::File, b"deep data".to_vec())
    );
    assert_eq!(
        by_number(&dev, moved).unwrap(),
        (Kind::File, b"moved data".to_vec())
    );
    assert_eq!(
        by_number(&dev, linked).unwrap(),
        (Kind::File, b"linked data".to_vec())
    );
    assert_eq!(
        by_number(&dev, x).unwrap(),
        (Kind::File, b"x data".to_vec())
    );
    assert_eq!(by_number(&dev, y).unwrap().0, Kind::Dir);
    assert_eq!(by_number(&dev, b).unwrap().0, Kind::Dir);
    assert_eq!(by_number(&dev, gone), Err(Errno::ESTALE));
    assert_eq!(by_number(&dev, open_unlinked), Err(Errno::ESTALE));
    assert_eq!(by_number(&dev, 999_999), Err(Errno::ESTALE));
    // The found inode is usable like any other: its parent (`..`) and a path under it.
    let fs = open(&dev);
    let i = fs.lookup(deep, b".").unwrap();
    assert_eq!(i.ino, deep);
    let parent = fs.lookup(b, b"..").unwrap();
    assert_eq!(parent.ino, ROOT_INO);
    assert_eq!(fs.lookup(b, b"moved2").unwrap().ino, moved);
    close(fs);
    let engine = Engine::open(dev.clone(), engine_options()).unwrap();
    let r = amaranth_fs::check::check(&engine, false, |_| {});
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    // The checker sees a missing entry, an entry of no inode and one at the wrong place (`moved`
    // said to be in the root under another name), and the repair rewrites them from the names.
    engine.delete(&keys::ino_key(deep)).unwrap();
    engine.put(&keys::ino_key(gone), &[1, b'H']).unwrap();
    let mut wrong = vec![1, b'P'];
    wrong.extend_from_slice(&ROOT_INO.to_le_bytes());
    wrong.extend_from_slice(b"elsewhere");
    engine.put(&keys::ino_key(moved), &wrong).unwrap();
    let r = amaranth_fs::check::check(&engine, false, |_| {});
    let details: Vec<&str> = r.problems.iter().map(|p| p.detail.as_str()).collect();
    assert!(
        r.problems.iter().all(|p| p.class == Class::InodeIndex) && r.exit_code() == 4,
        "{details:?}"
    );
    for want in [
        format!("1 inodes are missing (the first: inode {deep}"),
        format!("name no inode (the first: inode {gone})"),
        format!("1 inodes say the wrong place (the first: inode {moved}"),
    ] {
        assert!(
            details.iter().any(|d| d.contains(&want)),
            "{want} in {details:?}"
        );
    }
    let rounds = amaranth_fs::check::repair(&engine, |_| {});
    assert_eq!(rounds[0].problems.len(), 3, "{:?}", rounds[0].problems);
    assert!(rounds[0].problems.iter().all(|p| p.repaired));
    let r = amaranth_fs::check::check(&engine, false, |_| {});
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    engine.close().unwrap();
    assert_eq!(by_number(&dev, deep).unwrap().0, Kind::File);
    assert_eq!(by_number(&dev, moved).unwrap().0, Kind::File);
    assert_eq!(by_number(&dev, gone), Err(Errno::ESTALE));
}

#[test]
fn an_image_without_the_index_gets_it_at_its_first_writable_mount() {
    let dev = new_image();
    let fs = open(&dev);
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, CTX).unwrap().ino;
    let f = file(&fs, d, b"f", b"f data");
    let l = file(&fs, d, b"l", b"l data");
    fs.link(l, ROOT_INO, b"l2").unwrap();
    let engine = fs.engine().clone();
    // Back to schema 2: no index.
    let mut batch = amaranth_engine::Batch::new();
    batch.range_delete(vec![keys::INDEX], vec![keys::INDEX + 1]);
    batch.put(keys::system_key("format"), 2u32.to_le_bytes().to_vec());
    engine.write(&batch).unwrap();
    drop(engine);
    close(fs);
    assert_eq!(by_number(&dev, f).unwrap().1, b"f data");
    assert_eq!(by_number(&dev, l).unwrap().1, b"l data");
    let engine = Engine::open(dev.clone(), engine_options()).unwrap();
    let v = engine.get(&keys::system_key("format")).unwrap().unwrap();
    assert_eq!(v, amaranth_fs::SCHEMA_VERSION.to_le_bytes());
    engine.close().unwrap();
}
