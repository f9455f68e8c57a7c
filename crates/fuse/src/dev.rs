//! The classic transport: threads that `read(2)` requests from `/dev/fuse` and `write(2)` the
//! replies (each thread on its own clone of the session's descriptor). With FUSE-over-io_uring
//! one such thread still serves what the kernel never sends through the ring: FORGET, INTERRUPT,
//! and any request made before every ring queue was registered.

use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::Arc;

use crate::abi::{self, InHeader};
use crate::adapter::{arg_size, Adapter};
use crate::reply::Reply;
use crate::session::READ_BUFFER;

/// `FUSE_DEV_IOC_CLONE` (`_IOR(229, 0, uint32_t)`): attach a new `/dev/fuse` fd to a session.
const FUSE_DEV_IOC_CLONE: libc::c_ulong = 0x8004_e500;

/// A new descriptor on the same FUSE connection as `fd`, with its own request queue reader.
pub(crate) fn clone_fd(fd: &OwnedFd) -> io::Result<OwnedFd> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/fuse")?;
    let src: u32 = fd.as_raw_fd() as u32;
    // SAFETY: the ioctl reads one u32 from a valid pointer.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), FUSE_DEV_IOC_CLONE as _, &src) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(f.into())
}

/// Serves requests from `fd` until the connection ends (unmount or abort).
pub(crate) fn serve(fd: Arc<OwnedFd>, adapter: Arc<Adapter>) -> io::Result<()> {
    let mut buf = vec![0u8; READ_BUFFER];
    let mut reply = Reply::with_capacity(READ_BUFFER);
    let header = std::mem::size_of::<InHeader>();
    loop {
        // SAFETY: reads into our own buffer of the given length.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                // ENOENT: the request was interrupted before we read it.
                Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::ENOENT) => continue,
                // ENODEV: unmounted; ECONNABORTED: aborted.
                Some(libc::ENODEV) | Some(libc::ECONNABORTED) => return Ok(()),
                _ => return Err(e),
            }
        }
        let msg = &buf[..n as usize];
        let Some(h) = abi::read::<InHeader>(msg) else {
            log::error!("amaranth: short FUSE request ({} bytes)", msg.len());
            continue;
        };
        let body = &msg[header..];
        let split = arg_size(h.opcode).min(body.len());
        let (a, p) = body.split_at(split);
        adapter.handle(&h, a, p, &mut reply);
        if reply.wanted() {
            assert_eq!(reply.external(), 0, "no transport buffer was given");
            let out = reply.finish();
            // SAFETY: writes a valid buffer to our own descriptor.
            let w = unsafe { libc::write(fd.as_raw_fd(), out.as_ptr().cast(), out.len()) };
            if w < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    // The request was interrupted meanwhile: the kernel no longer wants a reply.
                    Some(libc::ENOENT) => {}
                    Some(libc::ENODEV) | Some(libc::ECONNABORTED) => return Ok(()),
                    _ => log::warn!("amaranth: writing a FUSE reply: {e}"),
                }
            }
        }
    }
}
