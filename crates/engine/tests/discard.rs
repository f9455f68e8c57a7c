//! Discard: the space checkpoints free goes back to the device. On an image file (made with its
//! whole size reserved) the host space follows what the engine holds: it falls at the first
//! checkpoint, grows with the data and falls again when the data is deleted; with
//! `Options::discard` off it stays. What the engine holds reads back the same either way.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use amaranth_device::{BlockDevice, FileDevice};
use amaranth_engine::{prefix_end, Engine, Format, Options};

const MIB: u64 = 1 << 20;

fn options(discard: bool) -> Options {
    Options {
        cache_size: 64 << 20,
        background_threads: false,
        discard,
        ..Options::default()
    }
}

fn format() -> Format {
    Format {
        log_size: Some(8 << 20),
        ..Format::default()
    }
}

/// Host bytes the image file takes.
fn host(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().blocks() * 512
}

fn key(i: u32) -> Vec<u8> {
    format!("f{:02}/{i:08}", i % 7).into_bytes()
}

fn value(i: u32) -> Vec<u8> {
    let mut v = vec![(i % 251) as u8; 8192];
    v[..4].copy_from_slice(&i.to_le_bytes());
    v
}

struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Host bytes (after create, after 48 MiB written, after it was deleted) and the device's
/// discard count.
fn run(discard: bool) -> (u64, u64, u64, u64) {
    let dir = Dir(
        std::env::temp_dir().join(format!("amaranth-discard-{}-{discard}", std::process::id()))
    );
    std::fs::create_dir_all(&dir.0).unwrap();
    let path = dir.0.join("img");
    let dev = Arc::new(FileDevice::create_image(&path, 192 * MIB).unwrap());
    assert!(
        host(&path) >= 192 * MIB,
        "made with its whole size reserved"
    );
    let e = Engine::create(dev.clone(), format(), options(discard)).unwrap();
    e.checkpoint().unwrap();
    let made = host(&path);
    let n = (48 * MIB / 8192) as u32;
    for i in 0..n {
        e.put(&key(i), &value(i)).unwrap();
    }
    e.checkpoint().unwrap();
    let full = host(&path);
    e.range_delete(b"f", &prefix_end(b"f", 256)).unwrap();
    e.flush_buffers(0, usize::MAX).unwrap();
    e.collect_garbage(usize::MAX).unwrap();
    // The delete taken down to the leaves and the subtrees it covers collected (what the
    // cleaner does in the background), then the
    // first checkpoint writes the emptied tree; its completion frees the images the one before
    // referenced, and each pass discards what was freed since the last one.
    e.checkpoint().unwrap();
    e.checkpoint().unwrap();
    let emptied = host(&path);
    let discards = dev.io_stats().discards;
    e.verify().unwrap();
    e.close().unwrap();
    drop(dev);
    // Reopened, nothing of the deleted data is there and the rest verifies.
    let dev = Arc::new(FileDevice::open(&path).unwrap());
    let e = Engine::open(dev, options(discard)).unwrap();
    assert!(e.get(&key(1)).unwrap().is_none());
    e.put(b"after", b"reopen").unwrap();
    e.verify().unwrap();
    e.close().unwrap();
    (made, full, emptied, discards)
}

#[test]
fn the_host_space_of_an_image_follows_what_the_engine_holds() {
    let (made, full, emptied, discards) = run(true);
    eprintln!(
        "discard on: host MiB after mkfs {}, after 48 MiB written {}, after their delete {}; {} \
         discards",
        made / MIB,
        full / MIB,
        emptied / MIB,
        discards
    );
    if discards == 0 {
        // A host file system without hole punching (tmpfs before 6.x, some others): nothing to
        // see; the run above still checked that the engine works with the option on.
        eprintln!("the host file system does not punch holes: skipped");
        return;
    }
    // The log (8 MiB), superblocks and a few nodes; the reserved 192 MiB came back.
    assert!(
        made < 32 * MIB,
        "after mkfs and a checkpoint: {} MiB",
        made / MIB
    );
    assert!(
        full >= made + 40 * MIB,
        "{} -> {} MiB",
        made / MIB,
        full / MIB
    );
    assert!(
        emptied + 40 * MIB <= full,
        "the deleted data's space did not come back: {} -> {} MiB",
        full / MIB,
        emptied / MIB
    );
}

#[test]
fn without_discard_the_image_keeps_its_host_space() {
    let (made, full, emptied, discards) = run(false);
    assert_eq!(discards, 0);
    assert!(made >= 192 * MIB && full >= 192 * MIB && emptied >= 192 * MIB);
}

/// A new image's log is written at creation (so that the log's first pass allocates nothing on
/// the host, and an `fsync` does not wait for the host's journal), and nothing else is: on a
/// sparse image file the log's range is data from its first block to its last, and the host
/// holds little more than the log.
#[test]
fn a_new_image_s_log_is_written_and_the_rest_stays_sparse() {
    use std::os::unix::io::AsRawFd;
    let dir = Dir(std::env::temp_dir().join(format!("amaranth-provision-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let path = dir.0.join("img");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(192 * MIB)
        .unwrap();
    assert!(host(&path) < MIB, "the test image starts sparse");
    let dev = Arc::new(FileDevice::open(&path).unwrap());
    let e = Engine::create(dev.clone(), format(), options(true)).unwrap();
    e.put(b"k", b"v").unwrap();
    e.sync().unwrap();
    let log = format().log_size.unwrap();
    let log_start = 2 * 4096;
    let f = std::fs::File::open(&path).unwrap();
    // SAFETY: plain syscall on a valid fd.
    let hole = unsafe { libc::lseek(f.as_raw_fd(), log_start as libc::off_t, libc::SEEK_HOLE) };
    assert!(
        hole >= (log_start + log) as libc::off_t,
        "a hole at {hole} inside the log [{log_start}, {})",
        log_start + log
    );
    let held = host(&path);
    assert!(
        held >= log && held < log + 16 * MIB,
        "host holds {} KiB for an {} KiB log",
        held >> 10,
        log >> 10
    );
    e.close().unwrap();
}
