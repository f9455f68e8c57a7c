//! Block devices under the Amaranth engine.
//!
//! Everything above this crate reads and writes whole 4 KiB blocks at 4 KiB-aligned offsets from
//! 4 KiB-aligned buffers ([`AlignedBuf`]), which is what `O_DIRECT` needs. Three devices implement
//! [`BlockDevice`]:
//! - [`FileDevice`]: an image file or a block device opened with `O_DIRECT`, locked against a second
//!   opener;
//! - [`MemDevice`]: a byte vector, for tests and tools;
//! - [`FaultDevice`]: a memory device that records every write and flush and can simulate a power cut
//!   (keep what was flushed plus any chosen subset of later writes, torn at 4 KiB boundaries) or
//!   return `EIO` on demand.
//!
//! The layer has no knowledge of what is stored: it moves blocks and counts them.

#![deny(missing_docs)]

mod aligned;
pub mod counting;
mod fault;
mod file;
mod memory;

pub use aligned::{advised_huge_for_tests, aligned_bytes, round_up, AlignedBuf};
pub use fault::{CrashPlan, FaultDevice, FaultRule, IoKind, PendingWrite};
pub use file::FileDevice;
pub use memory::MemDevice;

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

/// The unit of every read and write, and the alignment of offsets and buffers.
pub const BLOCK_SIZE: usize = 4096;

/// A device made of 4 KiB blocks.
///
/// Offsets and lengths passed to [`read_at`](BlockDevice::read_at) and
/// [`write_at`](BlockDevice::write_at) must be multiples of [`BLOCK_SIZE`]; buffers must be
/// 4 KiB-aligned (use [`AlignedBuf`]). A write is durable only after a later [`flush`](BlockDevice::flush)
/// returns. Implementations are safe to share between threads; concurrent I/O to disjoint ranges
/// is allowed.
pub trait BlockDevice: Send + Sync {
    /// Size of the device in bytes (a multiple of [`BLOCK_SIZE`]).
    fn len(&self) -> u64;
    /// Whether the device has no blocks at all.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Reads `buf.len()` bytes starting at `offset`.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Writes `buf` at `offset`. Not durable until [`flush`](BlockDevice::flush).
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()>;
    /// Makes every completed write durable (fdatasync / a cache flush).
    fn flush(&self) -> io::Result<()>;
    /// A human-readable name for messages ("image file /x/y.img", "memory device").
    fn describe(&self) -> String;
    /// Counters of the I/O this device has done.
    fn io_stats(&self) -> IoStats;
    /// Whether writes are possible at all (false for a device opened read-only).
    fn writable(&self) -> bool {
        true
    }
    /// Tells the device that the `len` bytes at `offset` (block-aligned) hold nothing anyone
    /// needs: an image file gives their host space back (a hole is punched), a block device is
    /// sent a discard. Their contents afterwards are unspecified (zeros for an image file, the
    /// memory devices write zeros), exactly as if any other write had reused them; ordering with
    /// other requests is as for a write. A device that cannot discard does nothing (the default).
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let _ = (offset, len);
        Ok(())
    }
    /// Backs the `len` bytes at `offset` (block-aligned) with written storage now, so that later
    /// writes into them allocate nothing in the layers below: an image file or a block device
    /// (a loop device over a sparse file, a thin volume) gets zeros written over the range. A
    /// write into a hole or an `fallocate`d (unwritten) extent of a host file system changes the
    /// host's metadata, and the next flush then waits for the host's journal as well (measured:
    /// 4 KiB write + flush 194-309 µs into a hole or a reserved extent of an ext4 file, 101-121 µs
    /// into written blocks). Contents afterwards are unspecified (zeros where it wrote); devices
    /// kept in memory do nothing (the default). Not durable until a flush.
    fn provision(&self, offset: u64, len: u64) -> io::Result<()> {
        let _ = (offset, len);
        Ok(())
    }
}

/// Counters of device I/O.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoStats {
    /// Number of read requests.
    pub reads: u64,
    /// Bytes read.
    pub bytes_read: u64,
    /// Number of write requests.
    pub writes: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// Number of flushes.
    pub flushes: u64,
    /// Number of discard requests (holes punched) the device carried out.
    pub discards: u64,
    /// Bytes discarded.
    pub bytes_discarded: u64,
}

/// Lock-free I/O counters shared by the device implementations.
#[derive(Default, Debug)]
pub(crate) struct IoCounters {
    reads: AtomicU64,
    bytes_read: AtomicU64,
    writes: AtomicU64,
    bytes_written: AtomicU64,
    flushes: AtomicU64,
    discards: AtomicU64,
    bytes_discarded: AtomicU64,
}

impl IoCounters {
    pub(crate) fn read(&self, n: usize) {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.bytes_read.fetch_add(n as u64, Ordering::Relaxed);
    }
    pub(crate) fn write(&self, n: usize) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.bytes_written.fetch_add(n as u64, Ordering::Relaxed);
    }
    pub(crate) fn flush(&self) {
        self.flushes.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn discard(&self, n: u64) {
        self.discards.fetch_add(1, Ordering::Relaxed);
        self.bytes_discarded.fetch_add(n, Ordering::Relaxed);
    }
    pub(crate) fn snapshot(&self) -> IoStats {
        IoStats {
            reads: self.reads.load(Ordering::Relaxed),
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            bytes_written: self.bytes_written.load(Ordering::Relaxed),
            flushes: self.flushes.load(Ordering::Relaxed),
            discards: self.discards.load(Ordering::Relaxed),
            bytes_discarded: self.bytes_discarded.load(Ordering::Relaxed),
        }
    }
}

/// Checks that an I/O request is block-aligned and inside a device of `dev_len` bytes.
pub(crate) fn check_request(dev_len: u64, offset: u64, len: usize) -> io::Result<()> {
    if !offset.is_multiple_of(BLOCK_SIZE as u64) || !len.is_multiple_of(BLOCK_SIZE) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("unaligned device request: offset {offset}, length {len} (must be multiples of {BLOCK_SIZE})"),
        ));
    }
    let end = offset.checked_add(len as u64);
    match end {
        Some(end) if end <= dev_len => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!(
                "device request [{offset}, +{len}) beyond the end of the device ({dev_len} bytes)"
            ),
        )),
    }
}

impl<T: BlockDevice + ?Sized> BlockDevice for std::sync::Arc<T> {
    fn len(&self) -> u64 {
        (**self).len()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        (**self).read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        (**self).write_at(offset, buf)
    }
    fn flush(&self) -> io::Result<()> {
        (**self).flush()
    }
    fn describe(&self) -> String {
        (**self).describe()
    }
    fn io_stats(&self) -> IoStats {
        (**self).io_stats()
    }
    fn writable(&self) -> bool {
        (**self).writable()
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        (**self).discard(offset, len)
    }
    fn provision(&self, offset: u64, len: u64) -> io::Result<()> {
        (**self).provision(offset, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A device behind an `Arc` (how the engine holds it) does what the device itself does for
    /// every method, not the trait's defaults: a discard reaches the device and a read-only
    /// device stays read-only.
    #[test]
    fn an_arc_forwards_every_method() {
        let mem = Arc::new(MemDevice::new(1 << 20));
        let dev: Arc<dyn BlockDevice> = mem.clone();
        let outer: Arc<Arc<dyn BlockDevice>> = Arc::new(dev.clone());
        outer.discard(0, BLOCK_SIZE as u64).unwrap();
        dev.discard(0, BLOCK_SIZE as u64).unwrap();
        assert_eq!(mem.io_stats().discards, 2);
        assert!(outer.provision(0, BLOCK_SIZE as u64).is_ok());

        let dir = std::env::temp_dir().join(format!("amaranth-dev-arc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("img");
        drop(FileDevice::create_image(&path, 1 << 20).unwrap());
        let ro: Arc<dyn BlockDevice> = Arc::new(FileDevice::open_read_only(&path).unwrap());
        assert!(!ro.writable());
        assert!(!Arc::new(ro).writable());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
