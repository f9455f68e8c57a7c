//! Operations under the shared namespace lock that remove a name of a file the kernel knows (an
//! unlink, a rename over it) against the kernel's last FORGET of that file, in the two
//! interleavings that lost it before, forced through test points (`fs/test_points.rs`): the
//! FORGET runs to its end before the operation takes the inode's lock, or takes the inode out of
//! the table while the operation holds that lock. Either way the file is deleted exactly once,
//! the used-inode counter returns to where it was, nothing stays parked, and the checker finds
//! nothing. (`tests/concurrent_counts.rs` found these by chance: 7–9 of 300 runs failed; before
//! the fix both interleavings here panicked the daemon's unlink: "an unlink under the shared lock
//! parks the file".)

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use amaranth_device::MemDevice;
use amaranth_engine::{Engine, Format, Options};

use super::test_points::Point;
use super::{Ctx, Fs, FsOptions};
use crate::check;
use crate::error::Errno;
use crate::table::ROOT_INO;

fn new_fs() -> (Arc<Fs>, Arc<MemDevice>) {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let options = Options {
        cache_size: 256 << 10,
        background_threads: false,
        check_invariants: true,
        ..Options::default()
    };
    let format = Format {
        max_key_len: 1024,
        max_value_len: 4096 + 64,
        partition_size: 8 << 10,
        node_size: 32 << 10,
        ..Format::small_for_tests()
    };
    let engine = Engine::create(dev.clone(), format, options).unwrap();
    Fs::mkfs(&engine, 0, 0).unwrap();
    let fs = Arc::new(Fs::new(Arc::new(engine), FsOptions::default()).unwrap());
    (fs, dev)
}

/// A file `name` the kernel knows (the lookup of its creation), holding `fill`, not open; its
/// inode.
fn known_file(fs: &Fs, name: &[u8], fill: u8) -> u64 {
    let (i, fh) = fs
        .create(ROOT_INO, name, 0o644, libc::O_RDWR, Ctx::default())
        .unwrap();
    fs.write(i.ino, fh, 0, &[fill; 10_000], false).unwrap();
    fs.release(i.ino, fh).unwrap();
    i.ino
}

/// Runs `op` with the kernel's last FORGET of `ino` forced in at `point`: run to its end there
/// (`finish`), or started there and left waiting for the inode's lock once it has taken the last
/// lookup off the entry.
fn race(fs: &Arc<Fs>, ino: u64, point: Point, finish: bool, op: impl FnOnce(&Fs)) {
    let weak: Weak<Fs> = Arc::downgrade(fs);
    let forget = Arc::new(parking_lot::Mutex::new(None));
    let slot = forget.clone();
    fs.test_points.set(move |p| {
        if p != point || slot.lock().is_some() {
            return;
        }
        let fs = weak.upgrade().unwrap();
        let f = fs.clone();
        let h = std::thread::spawn(move || f.forget(ino, 1));
        if finish {
            h.join().unwrap();
            *slot.lock() = Some(None);
        } else {
            // The FORGET has taken the kernel's last lookup off the entry: it now waits for the
            // inode's lock, which the operation holds.
            while fs.table.lock().get(ino).is_some_and(|e| e.lookups > 0) {
                std::thread::yield_now();
            }
            *slot.lock() = Some(Some(h));
        }
    });
    op(fs);
    fs.test_points.set(|_| {});
    let h = forget.lock().take().expect("the point was reached");
    if let Some(h) = h {
        h.join().unwrap();
    }
}

/// After the race: `ino` gone (not in the table, not parked), the counter at `used`, and the
/// checker finds nothing once the image is closed.
fn assert_gone(fs: Arc<Fs>, dev: Arc<MemDevice>, ino: u64, used: u64, what: &str) {
    assert_eq!(
        fs.inodes_used.load(Ordering::Relaxed),
        used,
        "{what}: inode {ino} is still counted"
    );
    assert_eq!(
        fs.parked_count.load(Ordering::Relaxed),
        0,
        "{what}: inode {ino} is still parked"
    );
    assert!(
        fs.table.lock().get(ino).is_none(),
        "{what}: still in the table"
    );
    let options = Options {
        background_threads: false,
        ..Options::default()
    };
    let report = check::close_and_check(fs, dev, options);
    assert_eq!(report.exit_code(), 0, "{what}: checker: {report:?}");
}

#[test]
fn an_unlink_racing_the_last_forget() {
    for (point, finish) in [
        (Point::UnlinkBeforeInodeLock, true),
        (Point::UnlinkHoldingInodeLock, false),
    ] {
        let what = format!("unlink, forget at {point:?}");
        let (fs, dev) = new_fs();
        let used = fs.inodes_used.load(Ordering::Relaxed);
        let ino = known_file(&fs, b"f", 7);
        race(&fs, ino, point, finish, |fs| {
            fs.unlink(ROOT_INO, b"f").unwrap();
        });
        assert_eq!(fs.lookup(ROOT_INO, b"f").err(), Some(Errno::ENOENT));
        assert_gone(fs, dev, ino, used, &what);
    }
}

#[test]
fn a_rename_over_a_file_racing_its_last_forget() {
    for (point, finish) in [
        (Point::RenameBeforeLocks, true),
        (Point::RenameHoldingVictimLock, false),
    ] {
        let what = format!("rename, forget at {point:?}");
        let (fs, dev) = new_fs();
        let used = fs.inodes_used.load(Ordering::Relaxed);
        let kept = known_file(&fs, b"a", 1);
        let ino = known_file(&fs, b"f", 2);
        race(&fs, ino, point, finish, |fs| {
            fs.rename(ROOT_INO, b"a", ROOT_INO, b"f", 0).unwrap();
        });
        let at = fs.lookup(ROOT_INO, b"f").unwrap();
        assert_eq!(at.ino, kept);
        assert_eq!(fs.read(kept, 0, 20_000).unwrap(), vec![1u8; 10_000]);
        assert_gone(fs, dev, ino, used + 1, &what);
    }
}

#[test]
fn a_lookup_between_the_last_forget_and_an_unlink_holding_the_inode_lock() {
    // The FORGET waits for the inode's lock, which the unlink holds; a LOOKUP of the name comes
    // in between (the name is still on disk: the unlink has not committed), and waits for the
    // inode's lock too. It must find the name gone, and the FORGET delete the file once. Before,
    // the FORGET had taken the entry out of the table, the lookup made a second one from the name
    // on disk, and the unlink changed only the first: the kernel was given a file that the
    // FORGET then deleted, or that nothing would delete (`concurrent_counts`: "inode counter 16,
    // 17 inodes found", 2 of 1,500 runs); with the entry kept, the lookup returned the unlinked
    // file under its removed name.
    let (fs, dev) = new_fs();
    let used = fs.inodes_used.load(Ordering::Relaxed);
    let ino = known_file(&fs, b"f", 7);
    let weak: Weak<Fs> = Arc::downgrade(&fs);
    let threads = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let slot = threads.clone();
    fs.test_points.set(move |p| {
        if p != Point::UnlinkHoldingInodeLock || !slot.lock().is_empty() {
            return;
        }
        let fs = weak.upgrade().unwrap();
        let f = fs.clone();
        slot.lock()
            .push(std::thread::spawn(move || f.forget(ino, 1)));
        while fs.table.lock().get(ino).is_some_and(|e| e.lookups > 0) {
            std::thread::yield_now();
        }
        let l = fs.clone();
        slot.lock().push(std::thread::spawn(move || {
            assert_eq!(
                l.lookup(ROOT_INO, b"f").err(),
                Some(Errno::ENOENT),
                "a lookup racing the unlink returned the file under its removed name"
            );
        }));
        // Time for the lookup to reach the inode's lock (nothing to wait on: it blocks there).
        std::thread::sleep(std::time::Duration::from_millis(100));
    });
    fs.unlink(ROOT_INO, b"f").unwrap();
    fs.test_points.set(|_| {});
    for h in std::mem::take(&mut *threads.lock()) {
        h.join().unwrap();
    }
    assert_gone(fs, dev, ino, used, "lookup between forget and unlink");
}
