//! The classic transport: threads that `read(2)` requests from `/dev/fuse` and `write(2)` the
//! replies (each thread on its own clone of the session's descriptor). With FUSE-over-io_uring
//! one such thread still serves what the kernel never sends through the ring: FORGET, INTERRUPT,
//! and any request made before every ring queue was registered.
//!
//! A READ's data is read straight into a buffer of the thread's own at a huge-page boundary (as
//! into a ring entry's payload slot), and the reply goes out as two pieces, the header and that
//! buffer (`writev`): a 1 MiB run of out-of-line blocks is then one device request with no copy
//! in the daemon. Read into the request buffer's 4 KiB pages (not aligned for `O_DIRECT`, so
//! through a bounce buffer), a cold sequential read made 1.6 device requests per MiB and took
//! 4.6-4.9 s for 4 GiB against 2.9-3.0 s over io_uring (docs/BENCHMARKS.md, 2026-12-07).

use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::{Arc, Mutex};
use std::thread::Thread;

use amaranth_device::AlignedBuf;

use crate::abi::{self, op, InHeader};
use crate::adapter::{arg_size, Adapter};
use crate::reply::Reply;
use crate::session::{MAX_REQUEST, READ_BUFFER};

/// The length of a thread's READ buffer: the largest READ, rounded up to a huge page (2 MiB), so
/// that the buffer is one page the device can fill in one request.
const READ_OUT: usize = (MAX_REQUEST as usize).next_multiple_of(2 << 20);

/// Threads of a connection waiting in `read(2)` at once (the others wait in [`Gate::enter`]).
/// With every one of 16 threads reading, each request woke a sleeping thread: TokuBench's four
/// creating threads made 9,200-9,900 files/s with 16 threads against 12,200-12,900 with 2, whose
/// threads took the requests queued meanwhile without sleeping. But requests that wait for the
/// device need a thread each: a cold sequential read went 1.2-1.3 GB/s with 2 threads against
/// 1.5-1.7 with 16 (2026-12-07, BENCHMARKS.md "Calls kept on their CPU"). So two threads read,
/// and a thread that takes a request that may wait for the device wakes a parked one to read in
/// its place ([`Gate::may_block`]).
pub(crate) const READERS: usize = 2;

/// Which of a connection's `/dev/fuse` threads may wait in `read(2)`: at most `readers` at once;
/// the others are parked, the most recently parked woken first.
pub(crate) struct Gate {
    state: Mutex<GateState>,
    readers: usize,
}

#[derive(Default)]
struct GateState {
    /// Threads in (or about to enter) `read(2)`.
    reading: usize,
    /// Threads waiting for a turn to read, most recently parked last.
    parked: Vec<Thread>,
    /// The connection ended: every thread returns.
    closing: bool,
}

impl Gate {
    /// A gate letting `readers` threads (at least one) read at once.
    pub(crate) fn new(readers: usize) -> Gate {
        Gate {
            state: Mutex::new(GateState::default()),
            readers: readers.max(1),
        }
    }

    /// Waits for a turn to read. Returns `false` once the connection has ended.
    fn enter(&self) -> bool {
        let mut st = self.state.lock().expect("gate lock");
        loop {
            if st.closing {
                return false;
            }
            if st.reading < self.readers {
                st.reading += 1;
                return true;
            }
            st.parked.push(std::thread::current());
            drop(st);
            std::thread::park();
            st = self.state.lock().expect("gate lock");
            let me = std::thread::current().id();
            st.parked.retain(|t| t.id() != me);
        }
    }

    /// Ends a turn to read (a request was read, or the read failed).
    fn leave(&self) {
        let mut st = self.state.lock().expect("gate lock");
        assert!(st.reading > 0, "a reader left that never entered");
        st.reading -= 1;
    }

    /// This thread is about to serve a request that may wait for the device (a READ, an fsync)
    /// or for another request (an fsync waiting for an atomic group's commit): a parked thread
    /// is woken to read in its place, so that requests arriving meanwhile (a reader's other
    /// READs, the group owner's commit) find a reader.
    /// Other requests wake nobody: they are short, and the queue they leave in the kernel is
    /// taken by the readers as they come back, without a wake-up.
    fn may_block(&self) {
        let mut st = self.state.lock().expect("gate lock");
        if st.reading < self.readers {
            if let Some(t) = st.parked.pop() {
                t.unpark();
            }
        }
    }

    /// The connection ended: wakes every parked thread to return.
    fn close(&self) {
        let mut st = self.state.lock().expect("gate lock");
        st.closing = true;
        for t in st.parked.drain(..) {
            t.unpark();
        }
    }
}

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

/// Serves requests from `fd` until the connection ends (unmount or abort), reading when `gate`
/// gives a turn.
pub(crate) fn serve(fd: Arc<OwnedFd>, adapter: Arc<Adapter>, gate: Arc<Gate>) -> io::Result<()> {
    let r = serve_turns(&fd, &adapter, &gate);
    gate.close();
    r
}

fn serve_turns(fd: &OwnedFd, adapter: &Adapter, gate: &Gate) -> io::Result<()> {
    let mut buf = vec![0u8; READ_BUFFER];
    let mut reply = Reply::with_capacity(READ_BUFFER);
    let mut out = AlignedBuf::zeroed(READ_OUT);
    let header = std::mem::size_of::<InHeader>();
    loop {
        if !gate.enter() {
            return Ok(());
        }
        // SAFETY: reads into our own buffer of the given length.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        gate.leave();
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
        // Requests that may wait for the device, or for another request: an fsync (and, on a
        // `sync` mount, every change) waits for an open atomic group's commit, which its owner
        // sends as an IOCTL that a reader must be there to take.
        if matches!(
            h.opcode,
            op::READ | op::FSYNC | op::FSYNCDIR | op::SYNCFS | op::COPY_FILE_RANGE | op::IOCTL
        ) || adapter.fs.modes().sync
        {
            gate.may_block();
        }
        if h.opcode == op::READ {
            adapter.handle_into(&h, a, p, Some(&mut out), &mut reply);
        } else {
            adapter.handle(&h, a, p, &mut reply);
        }
        if reply.wanted() {
            reply.finish();
            let external = reply.external();
            assert!(external <= out.len(), "a READ reply larger than its buffer");
            let head = reply.header();
            let payload = if external > 0 {
                &out[..external]
            } else {
                reply.payload()
            };
            let iov = [head, payload].map(|b| libc::iovec {
                iov_base: b.as_ptr() as *mut libc::c_void,
                iov_len: b.len(),
            });
            // SAFETY: writes two valid buffers to our own descriptor.
            let w = unsafe { libc::writev(fd.as_raw_fd(), iov.as_ptr(), 2) };
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
