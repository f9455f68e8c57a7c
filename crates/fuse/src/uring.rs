//! FUSE-over-io_uring (Linux 6.14+, `fuse.enable_uring`): one ring queue per possible CPU,
//! served by threads that wait pinned to that CPU, so a request is answered on the CPU that made
//! it without a cross-CPU wake-up (see [`QueueLoad`] for when they leave it). Each thread owns one io_uring (single issuer) and registers one entry with
//! the kernel for its CPU's queue (`FUSE_IO_URING_CMD_REGISTER`); an entry is a 288-byte header
//! area (`fuse_in_header` or `fuse_out_header`, the operation's fixed argument, and the entry's
//! commit id and payload size) plus a payload buffer as large as the largest request (1 MiB; a
//! slot of its queue's [`Arena`], in huge pages where the kernel has them). A
//! request arrives as a completion of the entry's command; the reply goes back in the same entry
//! with `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`, which also re-arms it for the next request. The
//! kernel switches to the ring only once every queue has an entry.
//!
//! Why one entry per thread: the kernel hands a new request to the entry that became available
//! last (LIFO), and the completion is delivered as task work of the thread that owns the entry's
//! ring. A thread holding several entries would get requests on its idle entries while it is busy
//! with a slow one (an fsync waiting for the log's flush, a read from the device), and they would
//! wait for it. With one entry per thread a busy thread has no entry available, so the next
//! request on that CPU goes to another thread of the queue; in the common case (one request at a
//! time per CPU) the same, warm, thread serves them all (LIFO), and the others sleep.
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use amaranth_device::AlignedBuf;
use io_uring::{cqueue, opcode, squeue, types, IoUring};

use crate::abi::{self, op, InHeader, OutHeader};
use crate::adapter::{arg_size, Adapter};
use crate::reply::Reply;
use crate::wake::ReplyWake;

const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;

/// `struct fuse_uring_req_header`.
#[repr(C, align(8))]
struct EntryHeader {
    in_out: [u8; 128],
    op_in: [u8; 128],
    flags: u64,
    commit_id: u64,
    payload_sz: u32,
    padding: u32,
    reserved: u64,
}

/// `struct fuse_uring_cmd_req`, carried in the SQE's 80-byte command area.
fn cmd_req(commit_id: u64, qid: u16) -> [u8; 80] {
    let mut c = [0u8; 80];
    c[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    c[16..18].copy_from_slice(&qid.to_ne_bytes());
    c
}

/// The payload buffers of one queue's entries: one [`AlignedBuf`] (an anonymous mapping, touched
/// only when used, at a huge-page boundary and advised for transparent huge pages when it is 2 MiB
/// or more), cut into one slot per entry. A READ's out-of-line blocks are read with `O_DIRECT`
/// straight into its slot, and a buffer of physically contiguous memory is one device request of
/// a few segments: into 4 KiB pages a 1 MiB direct read is two requests of up to 128 one-page
/// segments each (the loop device's limit), and reading the loop device that way went 0.7–1.0
/// GB/s against 1.6–1.9 GB/s into huge pages (four threads; docs/BENCHMARKS.md, 2026-11-27).
/// Slots of 1 MiB share huge pages two by two, so the memory the slots can take is what separate
/// buffers took.
struct Arena {
    /// The start of the buffer, taken once while it was borrowed mutably (slots are written
    /// through it by their threads; the buffer itself is not touched again).
    ptr: *mut u8,
    len: usize,
    /// Bytes per slot (a multiple of 4 KiB).
    slot: usize,
    _buf: AlignedBuf,
}

// SAFETY: plain memory; each slot is used by the one thread that owns its entry.
unsafe impl Send for Arena {}
// SAFETY: as above: threads share the mapping, never a slot.
unsafe impl Sync for Arena {}

impl Arena {
    fn new(slots: usize, slot_len: usize) -> Arena {
        let slot = slot_len.next_multiple_of(4096);
        let mut buf = AlignedBuf::zeroed(slot * slots);
        Arena {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
            slot,
            _buf: buf,
        }
    }

    /// The start of slot `i`.
    fn slot(&self, i: usize) -> *mut u8 {
        assert!((i + 1) * self.slot <= self.len, "slot outside the arena");
        // SAFETY: inside the buffer (checked above).
        unsafe { self.ptr.add(i * self.slot) }
    }
}

/// An entry's payload buffer: a slot of its queue's arena.
struct Payload {
    ptr: *mut u8,
    len: usize,
    /// Keeps the mapping while the slot is in use.
    _arena: Arc<Arena>,
}

// SAFETY: the slot is used by one queue thread at a time.
unsafe impl Send for Payload {}

/// One registered entry: its header area, payload buffer, and the iovecs naming them.
struct Entry {
    header: Box<EntryHeader>,
    payload: Payload,
    iov: Box<[libc::iovec; 2]>,
}

impl Entry {
    fn new(arena: Arc<Arena>, slot: usize, payload_len: usize) -> Entry {
        let mut header = Box::new(EntryHeader {
            in_out: [0; 128],
            op_in: [0; 128],
            flags: 0,
            commit_id: 0,
            payload_sz: 0,
            padding: 0,
            reserved: 0,
        });
        assert!(payload_len <= arena.slot, "a payload larger than its slot");
        let payload = Payload {
            ptr: arena.slot(slot),
            len: payload_len,
            _arena: arena,
        };
        let iov = Box::new([
            libc::iovec {
                iov_base: (&mut *header as *mut EntryHeader).cast(),
                iov_len: std::mem::size_of::<EntryHeader>(),
            },
            libc::iovec {
                iov_base: payload.ptr.cast(),
                iov_len: payload.len,
            },
        ]);
        Entry {
            header,
            payload,
            iov,
        }
    }
}

/// The possible CPUs (the kernel makes one queue for each).
pub(crate) fn possible_cpus() -> usize {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap_or_default();
    let mut max = None;
    for part in text.trim().split(',') {
        let last = part.rsplit('-').next().unwrap_or("");
        if let Ok(n) = last.parse::<usize>() {
            max = Some(max.map_or(n, |m: usize| m.max(n)));
        }
    }
    max.map(|m| m + 1).unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    })
}

fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t with one bit set, applied to this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            log::warn!(
                "amaranth: cannot pin ring queue {cpu}: {}",
                io::Error::last_os_error()
            );
        }
    }
}

/// An SQE for `cmd` on entry `idx`; registration also passes the entry's two iovecs.
fn sqe(
    fd: i32,
    cmd: u32,
    qid: u16,
    commit_id: u64,
    iov: Option<&[libc::iovec; 2]>,
    idx: usize,
) -> squeue::Entry128 {
    let mut b = opcode::UringCmd80::new(types::Fd(fd), cmd).cmd(cmd_req(commit_id, qid));
    if let Some(iov) = iov {
        b = b.addr(Some(iov.as_ptr() as u64));
    }
    let mut e = b.build().user_data(idx as u64);
    if iov.is_some() {
        const _: () = assert!(std::mem::size_of::<squeue::Entry128>() == 128);
        // The io-uring crate has no setter for `len` on this opcode; it is the u32 at byte 24
        // of `struct io_uring_sqe` (the number of iovecs: header and payload).
        // SAFETY: Entry128 is repr(C) and starts with the 64-byte io_uring_sqe.
        unsafe {
            let p = (&mut e as *mut squeue::Entry128)
                .cast::<u8>()
                .add(24)
                .cast::<u32>();
            p.write_unaligned(2);
        }
    }
    e
}

/// Entries each queue thread registers (see the module documentation: one, so that a busy thread
/// is never handed another request).
const ENTRIES_PER_THREAD: usize = 1;

/// Threads of a queue that may be busy before the next one to take a request may leave the
/// queue's CPU. Every thread waits pinned to its queue's CPU (unless `-o ring_affinity=any`), so
/// whichever entry the kernel picks, its thread wakes where the request was made: in a trace of an
/// IMAP copy, 11–15 µs a round trip against 36–49 µs for requests woken on the other CPU (the
/// trade-off for a lone caller on an idle machine is in docs/BENCHMARKS.md, "Ring threads that
/// wait on their CPU"). A thread that takes a request while this many others of its queue are
/// busy (a sequential reader's read-ahead keeps up to 32 READs in flight) may run anywhere while
/// that lasts ([`QueueLoad`]): the extra requests' checksums and copies then run on another CPU
/// instead of queueing behind the first ones (2 GiB cold reads: 1,445–1,790 MiB/s in three runs
/// against 1,187–1,549 in six with every thread kept on its CPU; docs/BENCHMARKS.md).
pub(crate) const PINNED_PER_QUEUE: usize = 8;

/// A wide thread pins itself again on a request taken with at most this many of its queue busy
/// (itself included): the queue has gone back to one request at a time, where serving on the
/// caller's CPU is what counts. Between this and [`PINNED_PER_QUEUE`] a thread keeps what it has,
/// so a stream of requests whose number in flight swings around the limit does not move threads
/// back and forth (measured: 520-560 affinity changes in a 2 GiB cold read without this margin).
const NARROW_AT: usize = 2;

/// The CPUs this process may run on (read before any thread pins itself).
fn allowed_cpus() -> Option<libc::cpu_set_t> {
    // SAFETY: a zeroed cpu_set_t filled in by the kernel for this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        (libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0)
            .then_some(set)
    }
}

fn set_affinity(set: &libc::cpu_set_t) -> io::Result<()> {
    // SAFETY: a valid cpu_set_t applied to the calling thread.
    match unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// How busy one queue's threads are, and where they may run. A thread waits pinned to the
/// queue's CPU; one that takes a request while more than [`PINNED_PER_QUEUE`] of the queue's
/// threads are busy widens its affinity to every allowed CPU and stays wide while the queue stays
/// that busy (a stream of READs: no affinity calls per request); the first request it takes with
/// the queue less busy pins it again (that one request may have been woken on another CPU).
pub(crate) struct QueueLoad {
    /// The queue's CPU, or `None` for a queue of a CPU that is not online (never pinned).
    cpu: Option<usize>,
    /// What a busy thread may widen to (the CPUs the process may run on).
    all_cpus: Option<libc::cpu_set_t>,
    busy: std::sync::atomic::AtomicUsize,
    /// Affinity widenings (`amaranth stat`: `fuse.ring_spread`).
    spread: Arc<std::sync::atomic::AtomicU64>,
}

impl QueueLoad {
    fn new(
        cpu: Option<usize>,
        all_cpus: Option<libc::cpu_set_t>,
        spread: Arc<std::sync::atomic::AtomicU64>,
    ) -> QueueLoad {
        QueueLoad {
            cpu,
            all_cpus,
            busy: std::sync::atomic::AtomicUsize::new(0),
            spread,
        }
    }

    /// Pins the calling thread to the queue's CPU (at start).
    fn pin(&self) {
        if let Some(cpu) = self.cpu {
            pin_to(cpu);
        }
    }

    /// A request taken by a thread that is `*wide` (allowed off the queue's CPU) or not: widens
    /// or pins it again as the queue's load asks, and updates `*wide`.
    fn enter(&self, wide: &mut bool) {
        use std::sync::atomic::Ordering;
        let busy = self.busy.fetch_add(1, Ordering::AcqRel) + 1;
        let Some(cpu) = self.cpu else {
            return;
        };
        match (busy > PINNED_PER_QUEUE, *wide, &self.all_cpus) {
            (true, false, Some(all)) if set_affinity(all).is_ok() => {
                *wide = true;
                self.spread.fetch_add(1, Ordering::Relaxed);
            }
            _ if busy > NARROW_AT => {}
            (false, true, _) => {
                pin_to(cpu);
                *wide = false;
            }
            _ => {}
        }
    }

    /// The request's reply is ready.
    fn leave(&self) {
        let before = self.busy.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        assert!(before >= 1, "a queue left more often than entered");
    }
}

/// Starts `per_queue` threads per possible CPU (pinned to it while they wait if `pinned`, see
/// [`QueueLoad`]), each registering its entries with payload
/// buffers of `payload_len` bytes and committing replies as `wake` says. Returns once every
/// thread has registered (or the first error: then the threads that started wind down when the
/// connection ends).
pub(crate) fn start(
    fd: Arc<OwnedFd>,
    adapter: Arc<Adapter>,
    per_queue: usize,
    pinned: bool,
    wake: ReplyWake,
    payload_len: usize,
) -> io::Result<Vec<JoinHandle<io::Result<()>>>> {
    assert!(per_queue >= 1);
    let queues = possible_cpus();
    let online = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let (tx, rx) = mpsc::channel();
    let mut threads = Vec::new();
    let all_cpus = allowed_cpus();
    for qid in 0..queues {
        let arena = Arc::new(Arena::new(per_queue * ENTRIES_PER_THREAD, payload_len));
        let cpu = (pinned && qid < online).then_some(qid);
        let load = Arc::new(QueueLoad::new(
            cpu,
            all_cpus,
            adapter.counts.ring_spread.clone(),
        ));
        for k in 0..per_queue {
            let (fd, adapter, tx) = (fd.clone(), adapter.clone(), tx.clone());
            let (arena, load) = (arena.clone(), load.clone());
            let t = std::thread::Builder::new()
                .name(format!("amaranth-q{qid}-{k}"))
                .spawn(move || {
                    load.pin();
                    let slots = (k * ENTRIES_PER_THREAD, arena);
                    let q = (qid as u16, &*load, wake);
                    serve_queue(&fd, &adapter, q, slots, payload_len, &tx)
                })?;
            threads.push(t);
        }
    }
    drop(tx);
    for _ in 0..queues * per_queue {
        match rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(io::Error::other("a ring queue thread ended during setup")),
        }
    }
    Ok(threads)
}

/// Serves one thread's entries of queue `qid`: their payloads are the arena's slots from
/// `slots.0` on.
fn serve_queue(
    fd: &OwnedFd,
    adapter: &Adapter,
    (qid, load, mut wake): (u16, &QueueLoad, ReplyWake),
    slots: (usize, Arc<Arena>),
    payload_len: usize,
    ready: &mpsc::Sender<io::Result<()>>,
) -> io::Result<()> {
    let depth = ENTRIES_PER_THREAD;
    let setup = || -> io::Result<(IoUring<squeue::Entry128, cqueue::Entry>, Vec<Entry>)> {
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .build((depth * 2) as u32)?;
        let entries = (0..depth)
            .map(|i| Entry::new(slots.1.clone(), slots.0 + i, payload_len))
            .collect();
        Ok((ring, entries))
    };
    let (mut ring, mut entries) = match setup() {
        Ok(x) => x,
        Err(e) => {
            let _ = ready.send(Err(io::Error::new(e.kind(), format!("ring setup: {e}"))));
            return Ok(());
        }
    };
    let raw = fd.as_raw_fd();
    for (idx, ent) in entries.iter().enumerate() {
        let e = sqe(raw, CMD_REGISTER, qid, 0, Some(&ent.iov), idx);
        // SAFETY: the entry's buffers live in `entries` until this function returns, after
        // every command has completed.
        unsafe { ring.submission().push(&e) }.map_err(|_| io::Error::other("ring full"))?;
    }
    if let Err(e) = ring.submit() {
        let _ = ready.send(Err(e));
        return Ok(());
    }
    // A failed registration completes at once; a good one completes only with a request.
    let mut pending: Vec<(u64, i32)> = ring
        .completion()
        .map(|c| (c.user_data(), c.result()))
        .collect();
    if let Some((_, res)) = pending.iter().find(|(_, r)| *r < 0) {
        let e = io::Error::from_raw_os_error(-res);
        let _ = ready.send(Err(io::Error::new(e.kind(), format!("ring register: {e}"))));
        return Ok(());
    }
    let _ = ready.send(Ok(()));
    let mut live = depth;
    let mut wide = false;
    let mut reply = Reply::with_capacity(payload_len);
    let header = std::mem::size_of::<InHeader>();
    while live > 0 {
        // Whether this round's replies include one other than a READ's (`wake.rs`: READ replies
        // are committed plainly).
        let mut not_reads = false;
        for (idx, res) in pending.drain(..) {
            if res < 0 {
                live -= 1;
                if res != -libc::ENOTCONN && res != -libc::ECONNABORTED && res != -libc::ECANCELED {
                    log::warn!(
                        "amaranth: ring queue {qid} entry {idx}: {}",
                        io::Error::from_raw_os_error(-res)
                    );
                }
                continue;
            }
            let ent = &mut entries[idx as usize];
            load.enter(&mut wide);
            let (commit_id, read) = serve_entry(adapter, ent, header, &mut reply);
            load.leave();
            not_reads |= !read;
            let e = sqe(
                raw,
                CMD_COMMIT_AND_FETCH,
                qid,
                commit_id,
                None,
                idx as usize,
            );
            // SAFETY: as above.
            unsafe { ring.submission().push(&e) }.map_err(|_| io::Error::other("ring full"))?;
        }
        if live == 0 {
            break;
        }
        if not_reads && !ring.submission().is_empty() && wake.wanted() {
            // The commits first, at SCHED_IDLE (their callers wake on this CPU), then the wait
            // at the thread's own policy (`wake.rs`).
            match wake.commit_idle(|| ring.submit()) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => return Err(e),
            }
        }
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            Err(e) => return Err(e),
        }
        pending.extend(ring.completion().map(|c| (c.user_data(), c.result())));
    }
    Ok(())
}

/// Serves the request in `ent` and writes the reply into it; returns the commit id and whether
/// the request was a READ.
fn serve_entry(
    adapter: &Adapter,
    ent: &mut Entry,
    header: usize,
    reply: &mut Reply,
) -> (u64, bool) {
    let commit_id = ent.header.commit_id;
    let len = (ent.header.payload_sz as usize).min(ent.payload.len);
    let request = abi::read::<InHeader>(&ent.header.in_out[..header]);
    let read = request.as_ref().is_some_and(|h| h.opcode == op::READ);
    match request {
        // A READ carries no payload in: its data is written straight into the payload mapping,
        // which the kernel copies from (no copy out of the reply buffer; 1 MiB per READ).
        Some(h) if h.opcode == op::READ => {
            let a = &ent.header.op_in[..arg_size(h.opcode).min(128)];
            // SAFETY: the mapping is this entry's, owned by this thread until the commit; the
            // kernel does not touch it meanwhile, and nothing else refers to it here.
            let out = unsafe { std::slice::from_raw_parts_mut(ent.payload.ptr, ent.payload.len) };
            adapter.handle_into(&h, a, &[], Some(out), reply);
        }
        Some(h) => {
            // SAFETY: the kernel wrote `len` bytes into our payload mapping before completing.
            let payload = unsafe { std::slice::from_raw_parts(ent.payload.ptr, len) };
            let a = &ent.header.op_in[..arg_size(h.opcode).min(128)];
            adapter.handle(&h, a, payload, reply);
        }
        None => {
            reply.start(commit_id);
            reply.error(libc::EIO);
        }
    }
    reply.finish();
    let n = if reply.external() > 0 {
        reply.external()
    } else {
        let out = reply.payload();
        let n = out.len().min(ent.payload.len);
        // SAFETY: copies at most the mapping's length into it.
        unsafe { std::ptr::copy_nonoverlapping(out.as_ptr(), ent.payload.ptr, n) };
        n
    };
    assert!(
        n <= ent.payload.len,
        "reply larger than the entry's payload"
    );
    let hb = reply.header();
    ent.header.in_out[..hb.len()].copy_from_slice(hb);
    debug_assert_eq!(hb.len(), std::mem::size_of::<OutHeader>());
    ent.header.payload_sz = n as u32;
    (commit_id, read)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn affinity() -> Vec<usize> {
        let set = allowed_cpus().expect("sched_getaffinity");
        (0..libc::CPU_SETSIZE as usize)
            // SAFETY: reads a bit of a cpu_set_t the kernel filled in.
            .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
            .collect()
    }

    /// A thread widens when it takes a request with more than `PINNED_PER_QUEUE` of its queue
    /// busy, keeps what it has between `NARROW_AT` and that, and pins itself again on a request
    /// taken with the queue quiet; every widening is counted.
    #[test]
    fn a_queue_thread_widens_when_busy_and_pins_again_when_quiet() {
        let all = affinity();
        if all.len() < 2 {
            eprintln!("SKIPPED: one CPU");
            return;
        }
        std::thread::spawn(move || {
            let spread = Arc::new(std::sync::atomic::AtomicU64::new(0));
            let load = QueueLoad::new(Some(all[0]), allowed_cpus(), spread.clone());
            load.pin();
            assert_eq!(affinity(), vec![all[0]]);
            // Eight requests in hand (other threads' in life; this thread's flags here).
            let mut others = [false; PINNED_PER_QUEUE];
            for w in &mut others {
                load.enter(w);
            }
            assert!(others.iter().all(|w| !w), "the first eight stay pinned");
            assert_eq!(affinity(), vec![all[0]]);
            let mut wide = false;
            load.enter(&mut wide);
            assert!(wide, "the ninth widens");
            assert_eq!(affinity(), all);
            assert_eq!(spread.load(std::sync::atomic::Ordering::Relaxed), 1);
            load.leave();
            // Busy between NARROW_AT and the limit: a wide thread stays wide.
            for _ in 0..PINNED_PER_QUEUE - NARROW_AT {
                load.leave();
            }
            load.enter(&mut wide);
            assert!(wide, "kept wide with {} busy", NARROW_AT + 1);
            assert_eq!(affinity(), all);
            load.leave();
            for _ in 0..NARROW_AT {
                load.leave();
            }
            // Quiet: the next request pins it again, and nothing is counted.
            load.enter(&mut wide);
            assert!(!wide, "pinned again with the queue quiet");
            assert_eq!(affinity(), vec![all[0]]);
            load.leave();
            assert_eq!(spread.load(std::sync::atomic::Ordering::Relaxed), 1);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn payload_slots_are_one_huge_page_aligned_mapping_advised_huge() {
        let arena = Arena::new(8, 1 << 20);
        assert_eq!(
            arena.ptr as usize % (2 << 20),
            0,
            "arena not huge-page aligned"
        );
        // Eight 1 MiB slots take 8 MiB: two slots per huge page, no more than separate buffers.
        assert_eq!(arena.len, 8 << 20);
        assert_eq!(arena.slot(3) as usize - arena.ptr as usize, 3 << 20);
        assert!(
            amaranth_device::advised_huge_for_tests(arena.ptr as usize),
            "arena not advised for huge pages"
        );
        // An odd payload size is rounded to whole pages.
        let odd = Arena::new(3, (1 << 20) + 100);
        assert_eq!(odd.slot, (1 << 20) + 4096);
        assert_eq!(odd.len, 3 * ((1 << 20) + 4096));
    }
}
