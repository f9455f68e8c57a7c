//! The mount options the file system itself honours: `noatime`, relatime rules, `strictatime`,
//! `lazytime`, `sync`, and read-only (a remount) that refuses changes and updates no access time.

mod common;

use std::sync::Arc;

use amaranth_device::MemDevice;
use amaranth_engine::Engine;
use amaranth_fs::{Ctx, Errno, Fs, FsOptions, Time, ROOT_INO};
use common::{engine_options, format};

const CTX: Ctx = Ctx {
    uid: 0,
    gid: 0,
    pid: 1,
};

struct Img {
    dev: Arc<MemDevice>,
}

impl Img {
    fn new() -> Img {
        let dev = Arc::new(MemDevice::new(64 << 20));
        let engine = Engine::create(dev.clone(), format(), engine_options()).unwrap();
        Fs::mkfs(&engine, 0, 0).unwrap();
        engine.close().unwrap();
        Img { dev }
    }
    fn open(&self, opts: FsOptions) -> Fs {
        let engine = Engine::open(self.dev.clone(), engine_options()).unwrap();
        Fs::new(Arc::new(engine), opts).unwrap()
    }
}

/// Drops the file system (it writes what it keeps in memory) and closes its engine.
fn close(fs: Fs) {
    common::close_engine(fs);
}

/// A file `f` with some data; returns its inode number.
fn make_file(fs: &Fs) -> u64 {
    let (i, fh) = fs.create(ROOT_INO, b"f", 0o644, libc::O_RDWR, CTX).unwrap();
    fs.write(i.ino, fh, 0, b"hello", false).unwrap();
    fs.release(i.ino, fh).unwrap();
    i.ino
}

fn atime(fs: &Fs, ino: u64) -> Time {
    fs.getattr(ino).unwrap().atime
}

fn engine_writes(fs: &Fs) -> u64 {
    fs.engine().stats().writes
}

fn pause() {
    std::thread::sleep(std::time::Duration::from_millis(5));
}

fn opts(relatime: bool, strictatime: bool, lazytime: bool) -> FsOptions {
    FsOptions {
        reserve_bytes: 0,
        relatime,
        strictatime,
        lazytime,
        ..FsOptions::default()
    }
}

#[test]
fn noatime_relatime_and_strictatime() {
    let img = Img::new();
    // noatime: reads never change the access time.
    let fs = img.open(opts(false, false, false));
    let ino = make_file(&fs);
    let t0 = atime(&fs, ino);
    pause();
    fs.read(ino, 0, 5).unwrap();
    assert_eq!(atime(&fs, ino), t0, "noatime updated the access time");
    close(fs);
    // relatime: the first read after a change updates it, the next one does not.
    let fs = img.open(opts(true, false, false));
    let ino = fs.lookup(ROOT_INO, b"f").unwrap().ino;
    pause();
    fs.read(ino, 0, 5).unwrap();
    let t1 = atime(&fs, ino);
    assert!(
        t1 > t0,
        "relatime: the first read after a write sets the access time"
    );
    pause();
    fs.read(ino, 0, 5).unwrap();
    assert_eq!(atime(&fs, ino), t1, "relatime: a second read left it alone");
    close(fs);
    // strictatime: every read.
    let fs = img.open(opts(true, true, false));
    let ino = fs.lookup(ROOT_INO, b"f").unwrap().ino;
    pause();
    let before = engine_writes(&fs);
    fs.read(ino, 0, 5).unwrap();
    let t2 = atime(&fs, ino);
    assert!(t2 > t1, "strictatime: the read set the access time");
    assert_eq!(
        engine_writes(&fs),
        before + 1,
        "strictatime writes the inode at once"
    );
    close(fs);
    // It was written: a new session sees it.
    let fs = img.open(opts(false, false, false));
    let ino = fs.lookup(ROOT_INO, b"f").unwrap().ino;
    assert_eq!(atime(&fs, ino), t2);
    close(fs);
}

#[test]
fn lazytime_keeps_access_times_in_memory_until_synced_forgotten_or_unmounted() {
    let img = Img::new();
    let fs = img.open(opts(true, true, true));
    let ino = make_file(&fs);
    pause();
    let before = engine_writes(&fs);
    fs.read(ino, 0, 5).unwrap();
    let t1 = atime(&fs, ino);
    assert_eq!(
        engine_writes(&fs),
        before,
        "lazytime wrote an access time at once"
    );
    // fsync writes it.
    fs.fsync().unwrap();
    assert_eq!(engine_writes(&fs), before + 1);
    // Forgetting the inode writes it.
    pause();
    fs.read(ino, 0, 5).unwrap();
    let t2 = atime(&fs, ino);
    assert!(t2 > t1);
    let w = engine_writes(&fs);
    fs.forget(ino, 1);
    assert_eq!(engine_writes(&fs), w + 1, "forget wrote the access time");
    // Unmounting writes it.
    let ino = fs.lookup(ROOT_INO, b"f").unwrap().ino;
    assert_eq!(atime(&fs, ino), t2);
    pause();
    fs.read(ino, 0, 5).unwrap();
    let t3 = atime(&fs, ino);
    close(fs);
    let fs = img.open(opts(false, false, false));
    let ino = fs.lookup(ROOT_INO, b"f").unwrap().ino;
    assert_eq!(
        atime(&fs, ino),
        t3,
        "the access time was written at unmount"
    );
    // An unlinked file's access time is never written back (it would bring the name back).
    close(fs);
    let fs = img.open(opts(true, true, true));
    let ino = fs.lookup(ROOT_INO, b"f").unwrap().ino;
    fs.read(ino, 0, 5).unwrap();
    fs.unlink(ROOT_INO, b"f").unwrap();
    close(fs);
    let fs = img.open(opts(false, false, false));
    assert_eq!(fs.lookup(ROOT_INO, b"f").unwrap_err(), Errno::ENOENT);
    close(fs);
}

#[test]
fn sync_makes_every_change_durable_before_it_returns() {
    let img = Img::new();
    for sync in [false, true] {
        let fs = img.open(FsOptions {
            sync,
            ..FsOptions::default()
        });
        let name = format!("file-{sync}");
        let (i, fh) = fs
            .create(ROOT_INO, name.as_bytes(), 0o644, libc::O_RDWR, CTX)
            .unwrap();
        fs.write(i.ino, fh, 0, b"data", false).unwrap();
        let log = fs.engine().stats().log;
        assert_eq!(
            log.durable_lsn == log.next_lsn,
            sync,
            "sync={sync}: durable {} of next {}",
            log.durable_lsn,
            log.next_lsn
        );
        fs.release(i.ino, fh).unwrap();
        close(fs);
    }
}

#[test]
fn read_only_refuses_changes_and_writes_no_access_time() {
    let img = Img::new();
    let fs = img.open(opts(true, true, false));
    let ino = make_file(&fs);
    fs.set_read_only(true).unwrap();
    assert!(fs.is_read_only());
    let err = fs
        .create(ROOT_INO, b"g", 0o644, libc::O_RDWR, CTX)
        .unwrap_err();
    assert_eq!(err, Errno::EROFS);
    assert_eq!(
        fs.mkdir(ROOT_INO, b"d", 0o755, CTX).unwrap_err(),
        Errno::EROFS
    );
    let before = engine_writes(&fs);
    let t0 = atime(&fs, ino);
    pause();
    assert_eq!(fs.read(ino, 0, 5).unwrap(), b"hello");
    assert_eq!(
        atime(&fs, ino),
        t0,
        "a read-only file system set an access time"
    );
    assert_eq!(engine_writes(&fs), before);
    // Writable again.
    fs.set_read_only(false).unwrap();
    fs.mkdir(ROOT_INO, b"d", 0o755, CTX).unwrap();
    close(fs);
    let fs = img.open(opts(false, false, false));
    fs.lookup(ROOT_INO, b"d").unwrap();
    close(fs);
}

/// A remount read-write of a file system that is already writable (`mount -o remount,noatime`)
/// prepares nothing: a file unlinked while open keeps its data for the process that holds it
/// (only a file system coming back from read-only removes the ones left by an earlier session).
#[test]
fn a_writable_remount_keeps_files_unlinked_while_open() {
    let img = Img::new();
    let fs = img.open(opts(true, false, false));
    let (i, fh) = fs.create(ROOT_INO, b"f", 0o644, libc::O_RDWR, CTX).unwrap();
    fs.write(i.ino, fh, 0, b"still open", false).unwrap();
    fs.unlink(ROOT_INO, b"f").unwrap();
    fs.set_read_only(false).unwrap();
    assert_eq!(fs.read(i.ino, 0, 64).unwrap(), b"still open");
    fs.release(i.ino, fh).unwrap();
    close(fs);
}
