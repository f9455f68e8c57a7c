//! The FUSE handshake (INIT) on `/dev/fuse`: which protocol version and capabilities the mount
//! uses, including whether requests may go through FUSE-over-io_uring afterwards.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use crate::abi::{self, init, op, InHeader, InitIn, InitOut, OutHeader};

/// Largest request we negotiate (the kernel's `max_pages_limit` caps it at 1 MiB anyway).
pub(crate) const MAX_REQUEST: u32 = 1 << 20;
/// Requests that go to the kernel in the background (read-ahead).
const MAX_BACKGROUND: u16 = 64;
/// Size of a buffer that holds any request read from `/dev/fuse`.
pub(crate) const READ_BUFFER: usize = MAX_REQUEST as usize + 4096;

/// What INIT settled.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Negotiated {
    /// Protocol minor version in use.
    pub(crate) minor: u32,
    /// Capabilities in use (`flags | flags2 << 32`).
    pub(crate) flags: u64,
    /// Capabilities the kernel offered.
    pub(crate) offered: u64,
    /// Largest WRITE payload.
    pub(crate) max_write: u32,
}

impl Negotiated {
    /// Whether FUSE-over-io_uring was agreed on.
    pub(crate) fn uring(&self) -> bool {
        self.flags & init::OVER_IO_URING != 0
    }
}

/// Capabilities we ask for. Not wanted: FUSE_WRITEBACK_CACHE (operations must reach us in
/// application order and small writes must stay small), FUSE_AUTO_INVAL_DATA (would drop the page
/// cache after our own writes), FUSE_POSIX_LOCKS/FLOCK_LOCKS (the kernel handles locks locally),
/// FUSE_SETXATTR_EXT and the extension headers (not parsed here), FUSE_ATOMIC_O_TRUNC (it truncates
/// in OPEN, which we do not serve: the kernel sends a SETATTR instead). FUSE_EXPORT_SUPPORT: the
/// kernel may look up `.` in an inode it forgot (a file handle: NFS, `open_by_handle_at`), which
/// the file system answers from its inode index.
fn wanted(uring: bool) -> u64 {
    let mut w = init::ASYNC_READ
        | init::BIG_WRITES
        | init::MAX_PAGES
        | init::HANDLE_KILLPRIV_V2
        | init::DO_READDIRPLUS
        | init::READDIRPLUS_AUTO
        | init::PARALLEL_DIROPS
        | init::CACHE_SYMLINKS
        | init::EXPORT_SUPPORT
        | init::INIT_EXT;
    if uring {
        w |= init::OVER_IO_URING;
    }
    w
}

/// Reads the kernel's INIT from `fd` and answers it. `uring`: ask for FUSE-over-io_uring.
pub(crate) fn handshake(fd: &OwnedFd, uring: bool) -> io::Result<Negotiated> {
    let mut buf = vec![0u8; READ_BUFFER];
    let n = loop {
        // SAFETY: reads into our own buffer of the given length.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(io::Error::new(e.kind(), format!("reading FUSE INIT: {e}")));
        }
    };
    let h: InHeader = abi::read(&buf[..n]).ok_or_else(|| io::Error::other("short FUSE request"))?;
    if h.opcode != op::INIT {
        return Err(io::Error::other(format!(
            "expected FUSE INIT, got opcode {}",
            h.opcode
        )));
    }
    let body = &buf[std::mem::size_of::<InHeader>()..n];
    let mut padded = [0u8; std::mem::size_of::<InitIn>()];
    let k = body.len().min(padded.len());
    padded[..k].copy_from_slice(&body[..k]);
    let i: InitIn = abi::read(&padded).expect("sized");
    if i.major != abi::KERNEL_VERSION || i.minor < 31 {
        reply(fd, h.unique, -libc::EPROTO, &[])?;
        return Err(io::Error::other(format!(
            "unsupported FUSE protocol {}.{} (7.31 or newer needed)",
            i.major, i.minor
        )));
    }
    let mut offered = u64::from(i.flags);
    if offered & init::INIT_EXT != 0 {
        offered |= u64::from(i.flags2) << 32;
    }
    let flags = wanted(uring) & offered;
    let minor = i.minor.min(abi::KERNEL_MINOR);
    let out = InitOut {
        major: abi::KERNEL_VERSION,
        minor,
        max_readahead: i.max_readahead,
        flags: flags as u32,
        flags2: (flags >> 32) as u32,
        max_background: MAX_BACKGROUND,
        congestion_threshold: MAX_BACKGROUND * 3 / 4,
        max_write: MAX_REQUEST,
        time_gran: 1,
        max_pages: (MAX_REQUEST / 4096) as u16,
        ..InitOut::default()
    };
    reply(fd, h.unique, 0, abi::bytes(&out))?;
    Ok(Negotiated {
        minor,
        flags,
        offered,
        max_write: MAX_REQUEST,
    })
}

/// Writes one reply to `fd`.
pub(crate) fn reply(fd: &OwnedFd, unique: u64, error: i32, payload: &[u8]) -> io::Result<()> {
    let h = OutHeader {
        len: (std::mem::size_of::<OutHeader>() + payload.len()) as u32,
        error,
        unique,
    };
    let mut msg = abi::bytes(&h).to_vec();
    msg.extend_from_slice(payload);
    // SAFETY: writes a valid buffer to our own descriptor.
    let n = unsafe { libc::write(fd.as_raw_fd(), msg.as_ptr().cast(), msg.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
