//! An image file or a block device, read and written with `O_DIRECT`.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::{check_request, AlignedBuf, BlockDevice, IoCounters, IoStats, BLOCK_SIZE};

/// An image file or a block device opened with `O_DIRECT` (bypassing the kernel page cache, so the
/// engine's cache is the only one) and locked with `flock` so that a second process cannot open it
/// for writing at the same time.
#[derive(Debug)]
pub struct FileDevice {
    file: File,
    path: PathBuf,
    len: u64,
    direct: bool,
    block_device: bool,
    writable: bool,
    /// Set once the host refuses a discard (a file system without hole punching, a device
    /// without discard): later ones are not tried.
    no_discard: AtomicBool,
    counters: IoCounters,
}

/// How the device should be locked and opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Access {
    ReadWrite,
    ReadOnly,
}

impl FileDevice {
    /// Creates (or truncates) an image file of `len` bytes, rounded down to whole blocks, and opens it.
    /// The space is reserved with `fallocate` where the host file system supports it.
    pub fn create_image(path: &Path, len: u64) -> io::Result<FileDevice> {
        let len = len / BLOCK_SIZE as u64 * BLOCK_SIZE as u64;
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "image size must be at least one block",
            ));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        lock(&file, Access::ReadWrite, path)?;
        if file.metadata()?.file_type().is_block_device() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} is a block device; open it with FileDevice::open",
                    path.display()
                ),
            ));
        }
        file.set_len(0)?;
        file.set_len(len)?;
        // SAFETY: plain syscall on a valid fd; failure is tolerated (sparse image instead).
        let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) };
        if rc == libc::ENOSPC {
            return Err(io::Error::from_raw_os_error(rc));
        }
        drop(file);
        FileDevice::open(path)
    }

    /// Opens an existing image file or block device for reading and writing, exclusively.
    pub fn open(path: &Path) -> io::Result<FileDevice> {
        FileDevice::open_with(path, Access::ReadWrite)
    }

    /// Opens an existing image file or block device read-only (shared lock: fails while a writer has
    /// it open).
    pub fn open_read_only(path: &Path) -> io::Result<FileDevice> {
        FileDevice::open_with(path, Access::ReadOnly)
    }

    fn open_with(path: &Path, access: Access) -> io::Result<FileDevice> {
        let meta = std::fs::metadata(path)?;
        let block_device = meta.file_type().is_block_device();
        if !block_device && !meta.file_type().is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} is neither a regular file nor a block device",
                    path.display()
                ),
            ));
        }
        let open = |direct: bool| {
            let mut o = OpenOptions::new();
            o.read(true).write(access == Access::ReadWrite);
            let mut flags = libc::O_CLOEXEC;
            if direct {
                flags |= libc::O_DIRECT;
            }
            if block_device && access == Access::ReadWrite {
                // The kernel's exclusive open: fails if the device is mounted or claimed.
                flags |= libc::O_EXCL;
            }
            o.custom_flags(flags).open(path)
        };
        let (file, direct) = match open(true) {
            Ok(f) => (f, true),
            // tmpfs and a few others refuse O_DIRECT; fall back to buffered I/O with fdatasync.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => (open(false)?, false),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                return Err(io::Error::new(
                    io::ErrorKind::ResourceBusy,
                    format!(
                        "{} is in use (mounted or opened exclusively by another process)",
                        path.display()
                    ),
                ))
            }
            Err(e) => return Err(e),
        };
        lock(&file, access, path)?;
        let len = if block_device {
            block_device_len(&file)?
        } else {
            meta.len()
        };
        let len = len / BLOCK_SIZE as u64 * BLOCK_SIZE as u64;
        Ok(FileDevice {
            file,
            path: path.to_path_buf(),
            len,
            direct,
            block_device,
            writable: access == Access::ReadWrite,
            no_discard: AtomicBool::new(false),
            counters: IoCounters::default(),
        })
    }

    /// The path the device was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether I/O bypasses the page cache (`O_DIRECT`); false only on file systems that refuse it.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Whether the path is a block device rather than an image file.
    pub fn is_block_device(&self) -> bool {
        self.block_device
    }
}

fn lock(file: &File, access: Access, path: &Path) -> io::Result<()> {
    let op = match access {
        Access::ReadWrite => libc::LOCK_EX,
        Access::ReadOnly => libc::LOCK_SH,
    } | libc::LOCK_NB;
    // A lock belongs to the open file description, and a child forked by another thread of this
    // process shares the descriptions it inherits until it execs (closing them, as they are
    // close-on-exec). So a description this process has just closed can stay locked for that
    // moment: a busy lock is tried again for a short while before it counts as another holder.
    let deadline = std::time::Instant::now() + LOCK_PATIENCE;
    loop {
        // SAFETY: flock on a valid fd.
        let rc = unsafe { libc::flock(file.as_raw_fd(), op) };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EWOULDBLOCK) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
            continue;
        }
        if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(io::Error::new(
                io::ErrorKind::ResourceBusy,
                format!(
                    "{} is already open in another process (is it mounted?)",
                    path.display()
                ),
            ));
        }
        return Err(err);
    }
}

/// How long a busy image lock is retried (see `lock`): far longer than a fork-to-exec window,
/// short enough that a second mount of a mounted image fails at once to a person.
/// The largest write [`BlockDevice::provision`] makes at a time (a loop device takes up to
/// 1,280 KiB in one request).
const PROVISION_PIECE: u64 = 1 << 20;

const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_millis(500);

fn block_device_len(file: &File) -> io::Result<u64> {
    const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut size as *mut u64) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(size)
}

impl BlockDevice for FileDevice {
    fn len(&self) -> u64 {
        self.len
    }

    fn writable(&self) -> bool {
        self.writable
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_request(self.len, offset, buf.len())?;
        debug_assert_eq!(
            buf.as_ptr() as usize % BLOCK_SIZE,
            0,
            "O_DIRECT buffers must be aligned"
        );
        self.file.read_exact_at(buf, offset)?;
        self.counters.read(buf.len());
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        check_request(self.len, offset, buf.len())?;
        debug_assert_eq!(
            buf.as_ptr() as usize % BLOCK_SIZE,
            0,
            "O_DIRECT buffers must be aligned"
        );
        self.file.write_all_at(buf, offset)?;
        self.counters.write(buf.len());
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()?;
        self.counters.flush();
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        check_request(self.len, offset, len as usize)?;
        if len == 0 || !self.writable || self.no_discard.load(Ordering::Relaxed) {
            return Ok(());
        }
        let fd = self.file.as_raw_fd();
        let rc = if self.block_device {
            // BLKDISCARD, _IO(0x12, 119): the range as two u64s.
            const BLKDISCARD: libc::c_ulong = 0x1277;
            let range: [u64; 2] = [offset, len];
            // SAFETY: BLKDISCARD reads two u64s through the pointer.
            unsafe { libc::ioctl(fd, BLKDISCARD, range.as_ptr()) }
        } else {
            // SAFETY: plain syscall on a valid fd.
            unsafe {
                libc::fallocate(
                    fd,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    offset as libc::off_t,
                    len as libc::off_t,
                )
            }
        };
        if rc != 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EOPNOTSUPP | libc::ENOTTY | libc::EINVAL | libc::ENOSYS) => {
                    self.no_discard.store(true, Ordering::Relaxed);
                    Ok(())
                }
                _ => Err(e),
            };
        }
        self.counters.discard(len);
        Ok(())
    }

    fn provision(&self, offset: u64, len: u64) -> io::Result<()> {
        check_request(self.len, offset, len as usize)?;
        if len == 0 || !self.writable {
            return Ok(());
        }
        let zeros = AlignedBuf::zeroed(len.min(PROVISION_PIECE) as usize);
        let end = offset + len;
        let mut at = offset;
        while at < end {
            let n = (end - at).min(zeros.len() as u64) as usize;
            self.write_at(at, &zeros[..n])?;
            at += n as u64;
        }
        Ok(())
    }

    fn describe(&self) -> String {
        let kind = if self.block_device {
            "block device"
        } else {
            "image file"
        };
        let direct = if self.direct {
            ""
        } else {
            " (buffered: O_DIRECT refused)"
        };
        format!("{kind} {}{direct}", self.path.display())
    }

    fn io_stats(&self) -> IoStats {
        self.counters.snapshot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AlignedBuf;

    #[test]
    fn create_write_read_and_lock() {
        let dir = std::env::temp_dir().join(format!("amaranth-dev-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("img");
        let dev = FileDevice::create_image(&path, 1 << 20).unwrap();
        assert_eq!(dev.len(), 1 << 20);
        let mut buf = AlignedBuf::zeroed(8192);
        buf[..5].copy_from_slice(b"hello");
        dev.write_at(4096, &buf).unwrap();
        dev.flush().unwrap();
        let mut back = AlignedBuf::zeroed(8192);
        dev.read_at(4096, &mut back).unwrap();
        assert_eq!(&back[..5], b"hello");
        // A second writer is refused while the first holds the lock.
        let err = FileDevice::open(&path).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ResourceBusy);
        // Out-of-range and unaligned requests are errors, not panics.
        assert!(dev.read_at(1 << 20, &mut back).is_err());
        assert!(dev.read_at(100, &mut back).is_err());
        drop(dev);
        assert!(FileDevice::open(&path).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Provisioning a range of a sparse image writes it: the host holds its blocks afterwards,
    /// they read as zeros, the blocks around it keep their contents, and the writes are counted.
    #[test]
    fn provisioning_writes_zeros_over_a_sparse_range() {
        use std::os::unix::fs::MetadataExt;
        let dir = std::env::temp_dir().join(format!("amaranth-dev-prov-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("img");
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(8 << 20).unwrap();
        drop(f);
        let host = |p: &Path| std::fs::metadata(p).unwrap().blocks() * 512;
        assert!(host(&path) < 64 << 10, "the test image is sparse");
        let dev = FileDevice::open(&path).unwrap();
        let mut ones = AlignedBuf::zeroed(8 << 20);
        ones.fill(1);
        dev.write_at(0, &ones[..BLOCK_SIZE]).unwrap();
        dev.write_at(BLOCK_SIZE as u64, &ones[..BLOCK_SIZE])
            .unwrap();
        let len = (2 << 20) + (1 << 19); // more than one piece, not a whole number of them
        dev.write_at(BLOCK_SIZE as u64 + len, &ones[..BLOCK_SIZE])
            .unwrap();
        let writes = dev.io_stats().bytes_written;
        dev.provision(BLOCK_SIZE as u64, len).unwrap();
        dev.flush().unwrap();
        assert_eq!(dev.io_stats().bytes_written - writes, len);
        assert!(
            host(&path) >= len + 2 * BLOCK_SIZE as u64,
            "{}",
            host(&path)
        );
        let mut back = AlignedBuf::zeroed(len as usize + 2 * BLOCK_SIZE);
        dev.read_at(0, &mut back).unwrap();
        assert!(back[..BLOCK_SIZE].iter().all(|&b| b == 1));
        assert!(back[BLOCK_SIZE..BLOCK_SIZE + len as usize]
            .iter()
            .all(|&b| b == 0));
        assert!(back[BLOCK_SIZE + len as usize..].iter().all(|&b| b == 1));
        assert!(
            dev.provision(8 << 20, BLOCK_SIZE as u64).is_err(),
            "past the end"
        );
        assert!(dev.provision(100, BLOCK_SIZE as u64).is_err(), "unaligned");
        drop(dev);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A discard on an image file punches a hole: the host space comes back and the blocks
    /// read as zeros; the blocks around it keep their contents.
    #[test]
    fn a_discard_gives_an_image_file_s_space_back() {
        let dir = std::env::temp_dir().join(format!("amaranth-dev-discard-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("img");
        let dev = FileDevice::create_image(&path, 8 << 20).unwrap();
        let mut buf = AlignedBuf::zeroed(8 << 20);
        buf.fill(7);
        dev.write_at(0, &buf).unwrap();
        dev.flush().unwrap();
        let host = |p: &Path| {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(p).unwrap().blocks() * 512
        };
        let before = host(&path);
        assert!(before >= 8 << 20, "{before}");
        dev.discard(1 << 20, 4 << 20).unwrap();
        dev.flush().unwrap();
        let after = host(&path);
        if dev.io_stats().discards == 0 {
            // The host file system cannot punch holes (the device said so once): nothing changed.
            assert_eq!(after, before);
        } else {
            assert!(after <= before - (4 << 20), "{before} -> {after}");
            let mut back = AlignedBuf::zeroed(6 << 20);
            dev.read_at(0, &mut back).unwrap();
            assert!(back[..1 << 20].iter().all(|&b| b == 7));
            assert!(back[1 << 20..5 << 20].iter().all(|&b| b == 0));
            assert!(back[5 << 20..].iter().all(|&b| b == 7));
            assert_eq!(dev.io_stats().bytes_discarded, 4 << 20);
        }
        // Unaligned or out-of-range discards are refused.
        assert!(dev.discard(100, 4096).is_err());
        assert!(dev.discard(8 << 20, 4096).is_err());
        drop(dev);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
