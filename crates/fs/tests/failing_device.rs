//! The file system on a failing device: EIO on writes, flushes and reads, and a full device.
//! Errors reach the application, the image stays consistent, and nothing acknowledged by a completed
//! sync is lost.

mod common;

use std::sync::Arc;

use amaranth_device::{CrashPlan, FaultDevice, FaultRule, IoKind, MemDevice};
use amaranth_engine::{Engine, Options};
use amaranth_fs::check;
use amaranth_fs::{Ctx, Errno, Fs, FsOptions, ROOT_INO};
use common::*;

fn mkfs(dev: Arc<FaultDevice>) -> Fs {
    let engine = Engine::create(dev, format(), engine_options()).unwrap();
    Fs::mkfs(&engine, 0, 0).unwrap();
    Fs::new(Arc::new(engine), fs_options()).unwrap()
}

/// Writes numbered files until an operation fails; returns the names synced before the failure and
/// the error seen.
fn write_until_failure(fs: &Fs) -> (Vec<String>, Errno) {
    let ctx = Ctx::default();
    let mut synced = Vec::new();
    let mut pending = Vec::new();
    for i in 0..20_000 {
        let name = format!("f{i:05}");
        let r = (|| -> Result<(), Errno> {
            let (a, fh) = fs.create(ROOT_INO, name.as_bytes(), 0o644, libc::O_RDWR, ctx)?;
            let data = vec![(i % 251) as u8; 3000 + i % 5000];
            let w = fs.write(a.ino, fh, 0, &data, false);
            fs.release(a.ino, fh)?;
            w?;
            Ok(())
        })();
        if let Err(e) = r {
            return (synced, e);
        }
        pending.push(name);
        if i % 20 == 19 {
            if let Err(e) = fs.fsync() {
                return (synced, e);
            }
            synced.append(&mut pending);
        }
    }
    panic!("the device never failed");
}

fn remount_and_check(dev: &FaultDevice, synced: &[String]) {
    // The machine restarts: whatever reached the device is what the next mount sees.
    let img = dev.crash_image(dev.trace_len(), &CrashPlan::DropAll);
    let engine =
        Engine::open(Arc::new(MemDevice::from_bytes(img)), engine_options()).expect("recovery");
    let rep = check::check(&engine, false, |_| {});
    assert_eq!(
        rep.unrepaired(check::Severity::Corruption),
        0,
        "fsck: {:?}",
        rep.problems
    );
    let fs = Fs::new(Arc::new(engine), fs_options()).unwrap();
    for (i, name) in synced.iter().enumerate() {
        let n: usize = name[1..].parse().unwrap();
        let a = fs
            .lookup(ROOT_INO, name.as_bytes())
            .unwrap_or_else(|e| panic!("synced file {name} lost: {e}"));
        let data = fs.read(a.ino, 0, 1 << 20).unwrap();
        assert_eq!(
            data,
            vec![(n % 251) as u8; 3000 + n % 5000],
            "synced file {name} (#{i}) damaged"
        );
    }
}

#[test]
fn write_errors_reach_the_application_and_lose_nothing_synced() {
    for after in [30, 200, 800] {
        let dev = Arc::new(FaultDevice::new(64 << 20));
        let fs = mkfs(dev.clone());
        dev.add_rule(FaultRule::always_after(IoKind::Write, after));
        let (synced, err) = write_until_failure(&fs);
        assert!(
            [Errno::EIO, Errno::EROFS].contains(&err),
            "write failure after {after}: {err:?}"
        );
        // Once failed, the file system refuses changes instead of half-applying them.
        let e = fs
            .mkdir(ROOT_INO, b"after-failure", 0o755, Ctx::default())
            .unwrap_err();
        assert!([Errno::EIO, Errno::EROFS].contains(&e), "{e:?}");
        drop(fs);
        dev.clear_rules();
        remount_and_check(&dev, &synced);
    }
}

#[test]
fn flush_errors_fail_fsync_and_lose_nothing_synced_before() {
    for after in [3, 20] {
        let dev = Arc::new(FaultDevice::new(64 << 20));
        let fs = mkfs(dev.clone());
        dev.add_rule(FaultRule::always_after(IoKind::Flush, after));
        let (synced, err) = write_until_failure(&fs);
        assert!(
            [Errno::EIO, Errno::EROFS].contains(&err),
            "flush failure after {after}: {err:?}"
        );
        assert!(
            fs.fsync().is_err(),
            "fsync after a failed flush must keep failing"
        );
        drop(fs);
        dev.clear_rules();
        remount_and_check(&dev, &synced);
    }
}

#[test]
fn read_errors_are_eio_never_wrong_data() {
    let dev = Arc::new(FaultDevice::new(64 << 20));
    let fs = mkfs(dev.clone());
    let ctx = Ctx::default();
    let (a, fh) = fs
        .create(ROOT_INO, b"big", 0o644, libc::O_RDWR, ctx)
        .unwrap();
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
    write_all(&fs, a.ino, fh, 0, &data).unwrap();
    fs.release(a.ino, fh).unwrap();
    let engine = fs.engine().clone();
    drop(fs);
    Arc::try_unwrap(engine).ok().unwrap().close().unwrap();
    // Reopen cold, then fail every read.
    let engine = Engine::open(dev.clone(), engine_options()).unwrap();
    let fs = Fs::new(Arc::new(engine), fs_options()).unwrap();
    let a = fs.lookup(ROOT_INO, b"big").unwrap();
    dev.add_rule(FaultRule::always_after(IoKind::Read, 0));
    let mut eio = 0;
    for off in (0..3_000_000u64).step_by(400_000) {
        match fs.read(a.ino, off, 65536) {
            Ok(got) => assert_eq!(
                got,
                &data[off as usize..off as usize + 65536],
                "wrong data at {off}"
            ),
            Err(e) => {
                assert_eq!(e, Errno::EIO);
                eio += 1;
            }
        }
    }
    assert!(eio > 0, "cold reads must have failed");
    dev.clear_rules();
    let got = fs.read(a.ino, 0, 3_000_000).unwrap();
    assert!(got == data, "data after the device recovered");
}

#[test]
fn a_full_device_gives_enospc_without_corruption_and_space_comes_back() {
    let dev = Arc::new(MemDevice::new(48 << 20));
    let engine = Engine::create(
        dev.clone(),
        format(),
        Options {
            cache_size: 1 << 20,
            ..engine_options()
        },
    )
    .unwrap();
    Fs::mkfs(&engine, 0, 0).unwrap();
    let fs = Fs::new(
        Arc::new(engine),
        FsOptions {
            // Files of one directory sit at random places of its key range (name-hash order), so
            // one write can dirty more nodes between checkpoints than appending did: 4 MiB of
            // reserve was not always enough for the copy-on-write space of one write.
            reserve_bytes: 8 << 20,
            relatime: false,
            ..FsOptions::default()
        },
    )
    .unwrap();
    let ctx = Ctx::default();
    let chunk = vec![0xabu8; 256 << 10];
    let mut written = Vec::new();
    let mut full = false;
    for i in 0..1000 {
        let name = format!("fill{i}");
        let (a, fh) = match fs.create(ROOT_INO, name.as_bytes(), 0o644, libc::O_RDWR, ctx) {
            Ok(x) => x,
            Err(e) => {
                assert_eq!(e, Errno::ENOSPC);
                full = true;
                break;
            }
        };
        let r = write_all(&fs, a.ino, fh, 0, &chunk);
        fs.release(a.ino, fh).unwrap();
        // The kernel lets go of the file (an unlinked file it still held would stay).
        fs.forget(a.ino, 1);
        match r {
            Ok(_) => written.push(name),
            Err(e) => {
                assert_eq!(e, Errno::ENOSPC, "a full device must say ENOSPC");
                full = true;
                break;
            }
        }
    }
    assert!(full, "48 MiB must fill up");
    fs.fsync().unwrap();
    let rep = check::check(fs.engine(), false, |_| {});
    assert!(
        rep.problems.is_empty(),
        "fsck on a full device: {:?}",
        rep.problems
    );
    // Delete half; the space comes back and writing works again.
    for name in written.iter().step_by(2) {
        fs.unlink(ROOT_INO, name.as_bytes()).unwrap();
    }
    let (a, fh) = fs
        .create(ROOT_INO, b"after", 0o644, libc::O_RDWR, ctx)
        .expect("create after deletes");
    write_all(&fs, a.ino, fh, 0, &chunk).expect("space must come back after deletes");
    fs.release(a.ino, fh).unwrap();
    for name in written.iter().skip(1).step_by(2) {
        let a = fs.lookup(ROOT_INO, name.as_bytes()).unwrap();
        assert!(
            fs.read(a.ino, 0, chunk.len() as u32).unwrap() == chunk,
            "{name} damaged"
        );
    }
    let engine = fs.engine().clone();
    drop(fs);
    Arc::try_unwrap(engine).ok().unwrap().close().unwrap();
    let engine = Engine::open(dev, engine_options()).unwrap();
    let rep = check::check(&engine, false, |_| {});
    assert!(
        rep.problems.is_empty(),
        "fsck after remount: {:?}",
        rep.problems
    );
}
