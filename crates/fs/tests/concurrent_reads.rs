//! Reads of a file stored out of line (docs/WRITEONCE.md) while other threads overwrite and
//! truncate it and checkpoints free the blocks they let go of: every read returns, for each
//! block, the bytes of one write that covered it (or zeros past a truncation), never an error and
//! never bytes of another file or of a later reuse of the block. A read finds the references of
//! its blocks first and reads the blocks after; in between, an overwrite can release a block, a
//! checkpoint free it and a new write reuse it. The device here delays reads, so that window is
//! milliseconds wide, and the image is small, so freed blocks are reused at once.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use amaranth_device::{BlockDevice, IoStats, MemDevice};
use amaranth_engine::{Engine, Options};
use amaranth_fs::{Ctx, Errno, Fs, FsOptions, SetAttr, ROOT_INO};
use common::format;

mod common;

const CTX: Ctx = Ctx {
    uid: 0,
    gid: 0,
    pid: 0,
};
const BLOCK: usize = 4096;
/// Blocks per file: one write of them goes out of line (at least 64 KiB).
const BLOCKS: usize = 48;

/// A device whose reads wait `delay_us` microseconds before they read (writes are not delayed).
struct SlowReads {
    inner: MemDevice,
    delay_us: AtomicU64,
}

impl BlockDevice for SlowReads {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let us = self.delay_us.load(Ordering::Relaxed);
        if us > 0 {
            std::thread::sleep(Duration::from_micros(us));
        }
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        self.inner.write_at(offset, buf)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn describe(&self) -> String {
        "memory with slow reads".into()
    }
    fn io_stats(&self) -> IoStats {
        self.inner.io_stats()
    }
}

/// The bytes of block `b` of a file written as generation `g` (`g` > 0): every 8 bytes the
/// triple (file, generation, block), so that any block read can be told apart from any other.
fn block_bytes(file: u8, g: u32, b: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(BLOCK);
    while v.len() < BLOCK {
        v.push(file);
        v.extend_from_slice(&(b as u16).to_le_bytes());
        v.push(0xa5);
        v.extend_from_slice(&g.to_le_bytes());
    }
    v
}

fn file_bytes(file: u8, g: u32) -> Vec<u8> {
    (0..BLOCKS).flat_map(|b| block_bytes(file, g, b)).collect()
}

/// Whether `got` (block `b` of file `file`) is that block of some generation, or zeros.
fn valid_block(file: u8, b: usize, got: &[u8]) -> bool {
    if got.iter().all(|&x| x == 0) {
        return true;
    }
    let g = u32::from_le_bytes(got[4..8].try_into().unwrap());
    g > 0 && got == block_bytes(file, g, b).as_slice()
}

/// Two files stored out of line, each overwritten (and now and then truncated and written again)
/// by its own thread, both read by four threads (two through each read path), with checkpoints
/// all along and reads delayed by 2 ms: no read fails and every block read is a block some write
/// put there (or zeros).
#[test]
fn reads_racing_overwrites_truncates_and_checkpoints_see_old_or_new_blocks() {
    let dev = Arc::new(SlowReads {
        inner: MemDevice::new(20 << 20),
        delay_us: AtomicU64::new(0),
    });
    let opts = Options {
        cache_size: 4 << 20,
        ..Options::default()
    };
    let engine = Engine::create(dev.clone(), format(), opts).unwrap();
    Fs::mkfs(&engine, 0, 0).unwrap();
    let fs = Arc::new(Fs::new(Arc::new(engine), FsOptions::default()).unwrap());
    let mut inos = Vec::new();
    for f in 0..2u8 {
        let (a, fh) = fs
            .create(
                ROOT_INO,
                format!("f{f}").as_bytes(),
                0o644,
                libc::O_RDWR,
                CTX,
            )
            .unwrap();
        fs.release(a.ino, fh).unwrap();
        fs.write_at(a.ino, 0, &file_bytes(f, 1), false, false)
            .unwrap();
        inos.push(a.ino);
    }
    assert!(
        fs.engine().stats().data_bytes >= (2 * BLOCKS * BLOCK) as u64,
        "the files are stored out of line"
    );
    dev.delay_us.store(2000, Ordering::Relaxed);
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(4);
    std::thread::scope(|s| {
        for (f, &ino) in inos.iter().enumerate() {
            let (fs, stop) = (fs.clone(), stop.clone());
            s.spawn(move || {
                let mut g = 1u32;
                while !stop.load(Ordering::Relaxed) {
                    g += 1;
                    if g.is_multiple_of(7) {
                        let cut = SetAttr {
                            size: Some(0),
                            ..SetAttr::default()
                        };
                        fs.setattr(ino, &cut, CTX).unwrap();
                    }
                    match fs.write_at(ino, 0, &file_bytes(f as u8, g), false, false) {
                        Ok(_) => {}
                        // The image is small on purpose: space freed by the next checkpoint.
                        Err(Errno::ENOSPC) => std::thread::sleep(Duration::from_millis(2)),
                        Err(e) => panic!("a write failed: {e:?}"),
                    }
                }
            });
        }
        {
            let (fs, stop) = (fs.clone(), stop.clone());
            s.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    fs.engine().checkpoint().unwrap();
                    std::thread::sleep(Duration::from_millis(1));
                }
            });
        }
        for t in 0..4usize {
            let (fs, stop, reads, inos) = (fs.clone(), stop.clone(), reads.clone(), inos.clone());
            s.spawn(move || {
                let mut buf = vec![0u8; BLOCKS * BLOCK];
                while !stop.load(Ordering::Relaxed) {
                    let f = t % 2;
                    // Two readers read into the transport's buffer (io_uring), two into a
                    // reply being built (`/dev/fuse`).
                    let r = if t < 2 {
                        fs.read_to_slice(inos[f], 0, &mut buf)
                    } else {
                        fs.read(inos[f], 0, buf.len() as u32).map(|v| {
                            buf[..v.len()].copy_from_slice(&v);
                            v.len()
                        })
                    };
                    let n = match r {
                        Ok(n) => n,
                        Err(e) => {
                            stop.store(true, Ordering::Relaxed);
                            panic!("a read of file {f} failed: {e:?}");
                        }
                    };
                    for (b, got) in buf[..n].chunks(BLOCK).enumerate() {
                        if got.len() == BLOCK && !valid_block(f as u8, b, got) {
                            stop.store(true, Ordering::Relaxed);
                            panic!("block {b} of file {f} read as bytes no write put there");
                        }
                    }
                    if n > 0 {
                        reads.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(20));
        }
        stop.store(true, Ordering::Relaxed);
    });
    dev.delay_us.store(0, Ordering::Relaxed);
    let raced = fs.engine().stats().data_reads_raced;
    eprintln!(
        "{} reads, {raced} of them raced a release",
        reads.load(Ordering::Relaxed)
    );
    assert!(reads.load(Ordering::Relaxed) > 50, "the readers ran");
    assert!(
        raced > 0,
        "no read raced a release: the test does not test it"
    );
    let damage = fs.engine().stats().known_damage;
    assert!(damage.is_none(), "the engine noted damage: {damage:?}");
    fs.engine().check_data_table().unwrap();
}

/// A block that is damaged, not let go of, is still damage through the same path: the read
/// fails with `EIO` and the engine notes the damage (a read that looked up the block's key again
/// and found the same reference does not take it for a race).
#[test]
fn a_damaged_block_is_reported_not_read_again_as_a_race() {
    let (dev, fs, ino) = one_file();
    fs.engine().sync().unwrap();
    damage_block(&dev, &block_bytes(0, 1, 5));
    let mut out = vec![0u8; BLOCKS * BLOCK];
    assert_eq!(fs.read_to_slice(ino, 0, &mut out).unwrap_err(), Errno::EIO);
    let stats = fs.engine().stats();
    assert!(stats.known_damage.is_some(), "the damage was not noted");
    assert_eq!(stats.data_reads_raced, 0, "damage taken for a race");
}

/// Flips a byte of the device block holding `want`.
fn damage_block(dev: &SlowReads, want: &[u8]) {
    let mut buf = vec![0u8; BLOCK];
    let at = (0..dev.len() / BLOCK as u64)
        .map(|b| b * BLOCK as u64)
        .find(|&off| {
            dev.inner.read_at(off, &mut buf).unwrap();
            buf == want
        })
        .expect("the block is on the device");
    buf[100] ^= 0xff;
    dev.inner.write_at(at, &buf).unwrap();
}

/// Through a snapshot's handle (a snapshot mount), a damaged block of the snapshot's file is
/// damage even though the live file was overwritten since: the keys are looked up again in the
/// snapshot's tree, where the reference is unchanged, not in the live tree, where it is not.
#[test]
fn a_damaged_block_read_through_a_snapshot_is_damage_though_the_live_file_changed() {
    let (dev, fs, ino) = one_file();
    fs.engine().snapshot_create("s").unwrap();
    fs.write_at(ino, 0, &file_bytes(0, 2), false, false)
        .unwrap();
    fs.engine().sync().unwrap();
    let snap = Fs::new(
        Arc::new(fs.engine().snapshot_engine("s").unwrap()),
        FsOptions::default(),
    )
    .unwrap();
    let in_snap = snap.lookup(ROOT_INO, b"f").unwrap();
    damage_block(&dev, &block_bytes(0, 1, 5));
    let mut out = vec![0u8; BLOCKS * BLOCK];
    assert_eq!(
        snap.read_to_slice(in_snap.ino, 0, &mut out).unwrap_err(),
        Errno::EIO
    );
    let stats = fs.engine().stats();
    assert!(stats.known_damage.is_some(), "the damage was not noted");
    assert_eq!(stats.data_reads_raced, 0, "damage taken for a race");
    // The live file reads its own, undamaged blocks.
    let n = fs.read_to_slice(ino, 0, &mut out).unwrap();
    assert_eq!(&out[..n], file_bytes(0, 2).as_slice());
}

/// A file system on a 20 MiB memory device with one file, `f`, written out of line (generation
/// 1 of file 0); returns the device, the file system and the file's inode number.
fn one_file() -> (Arc<SlowReads>, Fs, u64) {
    let dev = Arc::new(SlowReads {
        inner: MemDevice::new(20 << 20),
        delay_us: AtomicU64::new(0),
    });
    let engine = Engine::create(dev.clone(), format(), Options::default()).unwrap();
    Fs::mkfs(&engine, 0, 0).unwrap();
    let fs = Fs::new(Arc::new(engine), FsOptions::default()).unwrap();
    let (a, fh) = fs.create(ROOT_INO, b"f", 0o644, libc::O_RDWR, CTX).unwrap();
    fs.release(a.ino, fh).unwrap();
    fs.write_at(a.ino, 0, &file_bytes(0, 1), false, false)
        .unwrap();
    (dev, fs, a.ino)
}
