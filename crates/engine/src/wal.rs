//! The redo log: an ordered, checksummed record of every operation, with group commit.
//!
//! The log lives in a fixed region of the image used as a ring. Records are appended to an
//! in-memory buffer (under the root latch, so log order is the order operations were applied) and
//! written in *chunks*: a 64-byte header (epoch, virtual offset, first LSN, length, crc) followed by
//! records, padded to 4 KiB. A chunk never straddles the end of the region and a written block is
//! never rewritten, so a torn write cannot damage a record that was already durable.
//!
//! Positions are *virtual offsets* that grow forever; the physical position is `voff % region`.
//! Recovery starts at the checkpoint's tail and accepts a chunk only if its epoch, virtual offset and
//! first LSN are the expected ones and its header checksum holds; inside a chunk it stops at the first
//! record whose checksum or LSN is wrong. What remains is the longest valid prefix.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use amaranth_device::{round_up, AlignedBuf, BlockDevice, BLOCK_SIZE};
use parking_lot::{Condvar, Mutex};

use crate::codec::{crc_with_hole, Dec, Enc};
use crate::error::{Error, Result};

/// Log sequence number: one per record (operation or batch).
pub type Lsn = u64;

const CHUNK_MAGIC: [u8; 4] = *b"AMLG";
const CHUNK_VERSION: u16 = 1;
const CHUNK_HEADER: usize = 64;
const CHUNK_CRC_AT: usize = 60;
const RECORD_HEADER: usize = 16;
const RECORD_CRC_AT: usize = 4;

/// How full the log is, for admission control.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Space {
    /// Plenty of room.
    Ok,
    /// Past the checkpoint threshold: a checkpoint should start.
    CheckpointSoon,
    /// Nearly full: writers must wait for a checkpoint.
    Full,
}

#[derive(Debug)]
struct State {
    epoch: u64,
    buf: Vec<u8>,
    /// The buffer of the last write, emptied, kept for the next one (so appends after a write do
    /// not grow a new buffer from nothing, copying it at each doubling).
    spare: Vec<u8>,
    /// The aligned buffer of the last chunk written, kept for the next one (a fresh one is a
    /// mapping whose pages fault in one by one as the chunk is copied into it).
    chunk_spare: Option<AlignedBuf>,
    buf_first_lsn: Lsn,
    buf_records: u32,
    next_lsn: Lsn,
    head_voff: u64,
    tail_voff: u64,
    inflight: Option<(u64, Lsn)>,
    written_lsn: Lsn,
    durable_lsn: Lsn,
    leader: bool,
    /// With deferred end markers: where the end marker after the last durable chunk goes, and
    /// the LSN it names, until it is written or a later chunk takes its place.
    marker_due: Option<(u64, Lsn)>,
    failed: Option<Error>,
    bytes_written: u64,
    chunks_written: u64,
    device_flushes: u64,
}

/// The largest emptied buffer kept for reuse.
const SPARE_MAX: usize = 4 << 20;

/// Counters of log activity.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogStats {
    /// Bytes of chunks written (including padding).
    pub bytes_written: u64,
    /// Chunks written.
    pub chunks_written: u64,
    /// Device flushes issued for durability.
    pub device_flushes: u64,
    /// Bytes of the region in use (from the tail to the head, plus the buffer).
    pub used: u64,
    /// Size of the region.
    pub capacity: u64,
    /// Next LSN to be assigned.
    pub next_lsn: Lsn,
    /// Every record below this LSN is durable.
    pub durable_lsn: Lsn,
}

/// What a durable flush of the log waits for first (see [`Log::set_flush_barrier`]).
type FlushBarrier = Box<dyn Fn() -> Result<()> + Send + Sync>;

/// The redo log.
pub struct Log {
    dev: Arc<dyn BlockDevice>,
    /// Waited for before every device flush: the writes of out-of-line data the records name.
    flush_barrier: std::sync::OnceLock<FlushBarrier>,
    /// Whether the end marker after a durable chunk is left to [`Log::write_due_marker`] (the
    /// engine's log thread) instead of being written before the flush returns.
    defer_markers: AtomicBool,
    region_start: u64,
    region_len: u64,
    checkpoint_fraction: f64,
    state: Mutex<State>,
    cond: Condvar,
}

/// Where a new or recovered log continues.
#[derive(Clone, Copy, Debug)]
pub struct LogPosition {
    /// Epoch of the chunks to write.
    pub epoch: u64,
    /// Virtual offset of the next chunk (and the tail: nothing before it is needed).
    pub voff: u64,
    /// Next LSN.
    pub next_lsn: Lsn,
}

impl Log {
    /// A log over `[region_start, region_start + region_len)` continuing at `pos`.
    pub fn new(
        dev: Arc<dyn BlockDevice>,
        region_start: u64,
        region_len: u64,
        checkpoint_fraction: f64,
        pos: LogPosition,
    ) -> Log {
        assert!(
            region_len >= 16 * BLOCK_SIZE as u64 && region_len.is_multiple_of(BLOCK_SIZE as u64),
            "log region too small"
        );
        assert_eq!(
            pos.voff % BLOCK_SIZE as u64,
            0,
            "log position must be block-aligned"
        );
        Log {
            dev,
            flush_barrier: std::sync::OnceLock::new(),
            defer_markers: AtomicBool::new(false),
            region_start,
            region_len,
            checkpoint_fraction,
            state: Mutex::new(State {
                epoch: pos.epoch,
                buf: Vec::new(),
                spare: Vec::new(),
                chunk_spare: None,
                buf_first_lsn: pos.next_lsn,
                buf_records: 0,
                next_lsn: pos.next_lsn,
                head_voff: pos.voff,
                tail_voff: pos.voff,
                inflight: None,
                written_lsn: pos.next_lsn,
                durable_lsn: pos.next_lsn,
                leader: false,
                marker_due: None,
                failed: None,
                bytes_written: 0,
                chunks_written: 0,
                device_flushes: 0,
            }),
            cond: Condvar::new(),
        }
    }

    /// Leaves the end marker that follows a durable chunk to [`Log::write_due_marker`], so that a
    /// durable flush returns after its chunk's write and the device flush, without a third
    /// request. The marker only lets recovery tell damage to that chunk from a torn tail, and it
    /// was never flushed, so writing it a moment later changes no guarantee.
    pub fn defer_end_markers(&self) {
        self.defer_markers.store(true, Ordering::Relaxed);
    }

    /// Whether an end marker is waiting for [`Log::write_due_marker`].
    pub fn marker_due(&self) -> bool {
        self.state.lock().marker_due.is_some()
    }

    /// Writes the end marker a deferred durable flush left, if no chunk has taken its place
    /// since and no record waits for one (which would). Takes the leader's turn, so no chunk is
    /// written at its place meanwhile.
    pub fn write_due_marker(&self) {
        let mut s = self.state.lock();
        while s.leader {
            self.cond.wait(&mut s);
        }
        let Some((at, lsn)) = s.marker_due.take() else {
            return;
        };
        if s.failed.is_some() || s.buf_records > 0 {
            // Records are waiting: their chunk goes where the marker would.
            return;
        }
        assert_eq!(at, s.head_voff, "a due end marker behind the head");
        s.leader = true;
        self.write_marker(s, at, lsn);
    }

    /// Writes an end marker at `at` naming `lsn`, as the leader (`s` its state, let go during the
    /// write), then gives the leader's turn back.
    fn write_marker<'a>(&'a self, mut s: parking_lot::MutexGuard<'a, State>, at: u64, lsn: Lsn) {
        debug_assert!(s.leader, "an end marker is written by the leader");
        if at + BLOCK_SIZE as u64 - s.tail_voff <= self.region_len {
            let marker = encode_chunk(s.epoch, at, lsn, 0, lsn, &[]);
            drop(s);
            let phys = self.region_start + at % self.region_len;
            if let Err(e) = self.dev.write_at(phys, &marker) {
                log::warn!("amaranth: writing the log end marker failed: {e}");
            }
            s = self.state.lock();
        }
        s.leader = false;
        self.cond.notify_all();
    }

    /// Has every device flush of the log first call `barrier` (the engine waits there for the
    /// writes of the out-of-line data its records name, so that no flush makes a record durable
    /// before its data). Set once.
    pub fn set_flush_barrier(&self, barrier: FlushBarrier) {
        assert!(
            self.flush_barrier.set(barrier).is_ok(),
            "the log's flush barrier is set once"
        );
    }

    /// The largest record the log accepts.
    pub fn max_record(&self) -> usize {
        (self.region_len / 8) as usize
    }

    fn used(s: &State) -> u64 {
        s.head_voff - s.tail_voff + round_up(CHUNK_HEADER + s.buf.len()) as u64
    }

    /// How full the log would be after appending `extra` bytes.
    pub fn space(&self, extra: usize) -> Space {
        let s = self.state.lock();
        let used = Log::used(&s) + extra as u64;
        if used as f64 > self.region_len as f64 * 0.75 {
            Space::Full
        } else if used as f64 > self.region_len as f64 * self.checkpoint_fraction {
            Space::CheckpointSoon
        } else {
            Space::Ok
        }
    }

    /// Blocks until the space is no longer [`Space::Full`] or `timeout` passes; returns the space then.
    pub fn wait_space(&self, extra: usize, timeout: std::time::Duration) -> Space {
        let deadline = std::time::Instant::now() + timeout;
        let mut s = self.state.lock();
        loop {
            let used = Log::used(&s) + extra as u64;
            if (used as f64) <= self.region_len as f64 * 0.75 || s.failed.is_some() {
                return Space::Ok;
            }
            if self.cond.wait_until(&mut s, deadline).timed_out() {
                return Space::Full;
            }
        }
    }

    /// Appends a record (its payload) and returns its LSN. Not yet written or durable.
    pub fn append(&self, payload: &[u8]) -> Result<Lsn> {
        let mut s = self.state.lock();
        if let Some(e) = &s.failed {
            return Err(Error::ReadOnly(format!("the log failed earlier: {e}")));
        }
        let lsn = s.next_lsn;
        s.next_lsn += 1;
        if s.buf_records == 0 {
            s.buf_first_lsn = lsn;
        }
        s.buf_records += 1;
        let start = s.buf.len();
        let len = RECORD_HEADER + payload.len();
        s.buf.extend_from_slice(&(len as u32).to_le_bytes());
        s.buf.extend_from_slice(&[0u8; 4]);
        s.buf.extend_from_slice(&lsn.to_le_bytes());
        s.buf.extend_from_slice(payload);
        let c = crc_with_hole(&s.buf[start..], RECORD_CRC_AT);
        s.buf[start + RECORD_CRC_AT..start + RECORD_CRC_AT + 4].copy_from_slice(&c.to_le_bytes());
        Ok(lsn)
    }

    /// The next LSN to be assigned (every record below it has been appended).
    pub fn next_lsn(&self) -> Lsn {
        self.state.lock().next_lsn
    }

    /// Bytes waiting in the buffer.
    pub fn buffered(&self) -> usize {
        self.state.lock().buf.len()
    }

    /// Where replay must start to find every record not yet written: the virtual offset of the first
    /// unwritten chunk and the LSN of its first record.
    pub fn replay_start(&self) -> (u64, Lsn) {
        let s = self.state.lock();
        match s.inflight {
            Some(pos) => pos,
            None => (
                s.head_voff,
                if s.buf_records > 0 {
                    s.buf_first_lsn
                } else {
                    s.next_lsn
                },
            ),
        }
    }

    /// The epoch chunks are written with.
    pub fn epoch(&self) -> u64 {
        self.state.lock().epoch
    }

    /// Writes later chunks with `epoch` (a read-only engine becoming writable: chunks of the
    /// epoch it recovered from are never replayed once a checkpoint records the new one). Nothing
    /// may be buffered or being written.
    pub fn start_epoch(&self, epoch: u64) {
        let mut s = self.state.lock();
        assert!(
            s.buf.is_empty() && s.inflight.is_none(),
            "a new log epoch with records pending"
        );
        s.epoch = epoch;
    }

    /// Releases the space before `voff` (a checkpoint no longer needs it).
    pub fn set_tail(&self, voff: u64) {
        let mut s = self.state.lock();
        assert!(
            voff >= s.tail_voff && voff <= s.head_voff,
            "log tail moved backwards or past the head"
        );
        s.tail_voff = voff;
        self.cond.notify_all();
    }

    /// Writes every record appended so far; with `durable`, also flushes the device. Concurrent
    /// callers share one write (group commit).
    pub fn flush(&self, durable: bool) -> Result<()> {
        let target = self.next_lsn();
        self.flush_to(target, durable)
    }

    /// Makes every record below `target` written (and durable if asked).
    pub fn flush_to(&self, target: Lsn, durable: bool) -> Result<()> {
        let mut s = self.state.lock();
        loop {
            if let Some(e) = &s.failed {
                return Err(e.clone());
            }
            let done = if durable {
                s.durable_lsn >= target
            } else {
                s.written_lsn >= target
            };
            if done {
                return Ok(());
            }
            if s.leader {
                self.cond.wait(&mut s);
                continue;
            }
            s.leader = true;
            let spare = std::mem::take(&mut s.spare);
            let mut records = std::mem::replace(&mut s.buf, spare);
            let first = s.buf_first_lsn;
            let n = std::mem::replace(&mut s.buf_records, 0);
            let end_lsn = s.next_lsn;
            s.buf_first_lsn = end_lsn;
            // What the chunk says, taken under the lock; it is encoded after the lock is let go
            // (copying a megabyte of records must not hold up the writers appending meanwhile).
            let mut chunk: Option<(u64, ChunkHead)> = None;
            if n > 0 {
                let len = round_up(CHUNK_HEADER + records.len()) as u64;
                let mut voff = s.head_voff;
                if voff % self.region_len + len > self.region_len {
                    voff = voff.div_ceil(self.region_len) * self.region_len;
                }
                if voff + len - s.tail_voff > self.region_len {
                    let e = Error::NoSpace(format!(
                        "the redo log is full ({} bytes used of {}); a checkpoint could not free space in time",
                        s.head_voff - s.tail_voff,
                        self.region_len
                    ));
                    s.failed = Some(e.clone());
                    s.leader = false;
                    self.cond.notify_all();
                    return Err(e);
                }
                s.inflight = Some((voff, first));
                s.head_voff = voff + len;
                // This chunk goes where a due end marker would have: it takes the marker's place.
                s.marker_due = None;
                let head = ChunkHead {
                    epoch: s.epoch,
                    voff,
                    first,
                    n,
                    durable: s.durable_lsn,
                };
                chunk = Some((voff, head));
            }
            let mut spare_buf = if chunk.is_some() {
                s.chunk_spare.take()
            } else {
                None
            };
            drop(s);
            let mut result = Ok(());
            let mut wrote = 0u64;
            if let Some((voff, head)) = &chunk {
                let need = round_up(CHUNK_HEADER + records.len());
                let mut buf = match spare_buf.take() {
                    Some(b) if b.len() >= need => b,
                    _ => AlignedBuf::zeroed(need),
                };
                let len = encode_chunk_into(&mut buf, head, &records);
                assert_eq!(len, need, "log chunk length");
                let phys = self.region_start + voff % self.region_len;
                wrote = len as u64;
                result = self
                    .dev
                    .write_at(phys, &buf[..len])
                    .map_err(|e| Error::io("writing the redo log", e));
                spare_buf = Some(buf);
            }
            if result.is_ok() && durable {
                if let Some(barrier) = self.flush_barrier.get() {
                    result = barrier();
                }
            }
            if result.is_ok() && durable {
                result = self
                    .dev
                    .flush()
                    .map_err(|e| Error::io("flushing the redo log", e));
            }
            s = self.state.lock();
            s.inflight = None;
            if let Some(b) = spare_buf {
                if b.len() <= SPARE_MAX + CHUNK_HEADER + BLOCK_SIZE {
                    s.chunk_spare = Some(b);
                }
            }
            records.clear();
            if records.capacity() <= SPARE_MAX {
                s.spare = records;
            }
            let mut marker = false;
            match result {
                Ok(()) => {
                    s.written_lsn = end_lsn;
                    s.bytes_written += wrote;
                    if chunk.is_some() {
                        s.chunks_written += 1;
                    }
                    if durable {
                        s.durable_lsn = end_lsn;
                        s.device_flushes += 1;
                        // An end marker after the chunk says "everything before me was durable",
                        // so damage to this chunk is detected instead of looking like a torn
                        // tail. It is not flushed: losing it only loses that detection. The next
                        // chunk overwrites it.
                        marker = chunk.is_some();
                    }
                }
                Err(e) => {
                    s.failed = Some(e);
                }
            }
            if marker && self.defer_markers.load(Ordering::Relaxed) {
                s.marker_due = Some((s.head_voff, end_lsn));
                marker = false;
            }
            if marker {
                // Written now, still as the leader: the waiters go on after it.
                let at = s.head_voff;
                self.write_marker(s, at, end_lsn);
                s = self.state.lock();
                continue;
            }
            s.leader = false;
            self.cond.notify_all();
        }
    }

    /// Counters.
    pub fn stats(&self) -> LogStats {
        let s = self.state.lock();
        LogStats {
            bytes_written: s.bytes_written,
            chunks_written: s.chunks_written,
            device_flushes: s.device_flushes,
            used: Log::used(&s),
            capacity: self.region_len,
            next_lsn: s.next_lsn,
            durable_lsn: s.durable_lsn,
        }
    }
}

/// Encodes a chunk. `durable` is the LSN below which every record was already on stable storage
/// when this chunk was written: recovery uses it to tell a torn write (harmless, the tail of the
/// log) from damage to records that had been acknowledged as durable (an error). A chunk with no
/// records is an end marker, written after a device flush.
fn encode_chunk(
    epoch: u64,
    voff: u64,
    first: Lsn,
    n: u32,
    durable: Lsn,
    records: &[u8],
) -> AlignedBuf {
    let mut buf = AlignedBuf::zeroed(CHUNK_HEADER + records.len());
    let head = ChunkHead {
        epoch,
        voff,
        first,
        n,
        durable,
    };
    let len = encode_chunk_into(&mut buf, &head, records);
    assert_eq!(len, buf.len(), "log chunk length");
    buf
}

/// What a chunk's header says besides its records (see [`encode_chunk`]).
#[derive(Debug)]
struct ChunkHead {
    epoch: u64,
    voff: u64,
    first: Lsn,
    n: u32,
    durable: Lsn,
}

/// Encodes a chunk into the start of `out` (at least as long as the chunk, rounded up to whole
/// blocks; the padding after the records is zeroed) and returns its rounded length.
fn encode_chunk_into(out: &mut [u8], c: &ChunkHead, records: &[u8]) -> usize {
    assert_chunk_records(c.first, c.n, records);
    let mut h = Enc::with_capacity(CHUNK_HEADER);
    h.raw(&CHUNK_MAGIC);
    h.u16(CHUNK_VERSION);
    h.u16(0);
    h.u64(c.epoch);
    h.u64(c.voff);
    h.u64(c.first);
    h.u32(c.n);
    h.u32(records.len() as u32);
    h.u64(c.durable);
    h.raw(&[0u8; 12]);
    h.u32(0);
    assert_eq!(h.len(), CHUNK_HEADER);
    let crc = crc_with_hole(&h.buf, CHUNK_CRC_AT);
    h.put_u32_at(CHUNK_CRC_AT, crc);
    let end = CHUNK_HEADER + records.len();
    let len = round_up(end);
    assert!(out.len() >= len, "log chunk buffer too short");
    out[..CHUNK_HEADER].copy_from_slice(&h.buf);
    out[CHUNK_HEADER..end].copy_from_slice(records);
    out[end..len].fill(0);
    len
}

/// Asserts, before a chunk is written, what recovery checks when it reads the chunk back: `n`
/// records exactly filling `records`, each at least a header long, numbered from `first` on
/// (record checksums are computed when records are appended and checked by recovery).
fn assert_chunk_records(first: Lsn, n: u32, records: &[u8]) {
    assert!(records.len() <= u32::MAX as usize, "log chunk too long");
    let mut pos = 0;
    for i in 0..u64::from(n) {
        assert!(
            pos + RECORD_HEADER <= records.len(),
            "log record header past its chunk"
        );
        let rlen = u32::from_le_bytes(records[pos..pos + 4].try_into().expect("4 bytes")) as usize;
        assert!(
            rlen >= RECORD_HEADER && pos + rlen <= records.len(),
            "log record past its chunk"
        );
        let lsn = u64::from_le_bytes(records[pos + 8..pos + 16].try_into().expect("8 bytes"));
        assert_eq!(lsn, first + i, "log record numbered out of order");
        pos += rlen;
    }
    assert_eq!(
        pos,
        records.len(),
        "log chunk holds bytes after its records"
    );
}

/// What recovery found in the log.
#[derive(Debug)]
pub struct Recovered {
    /// Where writing may continue (after the last chunk examined).
    pub resume_voff: u64,
    /// The LSN after the last valid record.
    pub next_lsn: Lsn,
    /// Valid records replayed.
    pub records: u64,
    /// Why the scan stopped.
    pub stop_reason: String,
    /// Durable records that could not be read (a later chunk proves they were written): damage,
    /// which an open refuses and a repair reports. The records before them were replayed.
    pub damage: Option<Error>,
    /// The highest durable LSN a chunk examined records: every record below it was on stable
    /// storage (with the out-of-line data it names) before the crash.
    pub max_durable: Lsn,
}

/// A parsed, verified chunk header.
struct ChunkHeader {
    first: Lsn,
    n: u32,
    len: usize,
    durable: Lsn,
}

/// Parses the chunk header in `blk` if it is valid for virtual offset `at` in `epoch`.
fn parse_chunk_header(blk: &[u8], at: u64, epoch: u64, region_len: u64) -> Option<ChunkHeader> {
    let mut d = Dec::new(&blk[..CHUNK_HEADER], "log chunk");
    if d.raw(4).ok()? != CHUNK_MAGIC || d.u16().ok()? != CHUNK_VERSION {
        return None;
    }
    d.u16().ok()?;
    let (e, v, first) = (d.u64().ok()?, d.u64().ok()?, d.u64().ok()?);
    let n = d.u32().ok()?;
    let len = d.u32().ok()? as usize;
    let durable = d.u64().ok()?;
    d.raw(12).ok()?;
    let stored = d.u32().ok()?;
    let ok = crc_with_hole(&blk[..CHUNK_HEADER], CHUNK_CRC_AT) == stored
        && e == epoch
        && v == at
        && (n > 0) == (len > 0)
        && (CHUNK_HEADER + len) as u64 <= region_len - at % region_len;
    ok.then_some(ChunkHeader {
        first,
        n,
        len,
        durable,
    })
}

/// Scans the log from `tail_voff` (whose first record is `tail_lsn`), calling `apply(lsn, payload)`
/// for each valid record in order, and stops at the end marker or the first invalid or missing
/// record, or before a record `apply` refuses (`Some(why)`: the caller found it incomplete, its
/// out-of-line data not on the device). With `check_damage`, it then looks at the rest of the
/// region: a later chunk that says the missing records had been made durable proves damage rather
/// than a torn write, and is an error.
#[allow(clippy::too_many_arguments)]
pub fn recover(
    dev: &dyn BlockDevice,
    region_start: u64,
    region_len: u64,
    epoch: u64,
    tail_voff: u64,
    tail_lsn: Lsn,
    check_damage: bool,
    mut apply: impl FnMut(Lsn, &[u8]) -> Result<Option<String>>,
) -> Result<Recovered> {
    let mut voff = tail_voff;
    let mut expect = tail_lsn;
    let mut records = 0u64;
    let mut resume = tail_voff;
    let mut max_durable = 0;
    let read = |off: u64, len: usize| -> Result<AlignedBuf> {
        let mut b = AlignedBuf::zeroed(len);
        dev.read_at(region_start + off % region_len, &mut b)
            .map_err(|e| Error::io("reading the redo log", e))?;
        Ok(b)
    };
    let mut at_marker = false;
    let stop_reason = loop {
        if voff - tail_voff >= region_len {
            break "the log wrapped all the way around".to_string();
        }
        // A chunk that did not fit before the end of the region was written at the next lap.
        let next_lap = voff.div_ceil(region_len) * region_len;
        let mut candidates = vec![voff];
        if next_lap != voff {
            candidates.push(next_lap);
        }
        let mut found = None;
        for at in candidates {
            if at - tail_voff >= region_len {
                continue;
            }
            let blk = read(at, BLOCK_SIZE)?;
            if let Some(h) = parse_chunk_header(&blk, at, epoch, region_len) {
                if h.first == expect {
                    let marker = h.n == 0;
                    found = Some((at, h, blk));
                    if !marker {
                        break;
                    }
                    // An end marker may be stale: it was written where the next chunk would go,
                    // and when that chunk did not fit before the end of the region it went to the
                    // next lap, leaving the marker behind. A chunk there with the expected LSN
                    // (its header names its lap) wins over the marker.
                }
            }
        }
        let Some((at, h, first_block)) = found else {
            break format!("no valid chunk at log offset {voff}");
        };
        max_durable = max_durable.max(h.durable);
        if h.n == 0 {
            resume = at;
            at_marker = true;
            break "end marker".to_string();
        }
        let total = round_up(CHUNK_HEADER + h.len);
        let chunk = if total > BLOCK_SIZE {
            let rest = read(at + BLOCK_SIZE as u64, total - BLOCK_SIZE)?;
            let mut all = Vec::with_capacity(total);
            all.extend_from_slice(&first_block);
            all.extend_from_slice(&rest);
            all
        } else {
            first_block.to_vec()
        };
        resume = at + total as u64;
        let body = &chunk[CHUNK_HEADER..CHUNK_HEADER + h.len];
        let mut pos = 0usize;
        let mut bad = None;
        for _ in 0..h.n {
            if pos + RECORD_HEADER > body.len() {
                bad = Some("a record header runs past its chunk".to_string());
                break;
            }
            let rlen = u32::from_le_bytes(body[pos..pos + 4].try_into().expect("4 bytes")) as usize;
            if rlen < RECORD_HEADER || pos + rlen > body.len() {
                bad = Some("a record runs past its chunk".to_string());
                break;
            }
            let rec = &body[pos..pos + rlen];
            let stored = u32::from_le_bytes(
                rec[RECORD_CRC_AT..RECORD_CRC_AT + 4]
                    .try_into()
                    .expect("4 bytes"),
            );
            if crc_with_hole(rec, RECORD_CRC_AT) != stored {
                bad = Some(format!("record checksum mismatch at LSN {expect}"));
                break;
            }
            let lsn = u64::from_le_bytes(rec[8..16].try_into().expect("8 bytes"));
            if lsn != expect {
                bad = Some(format!("record LSN {lsn} where {expect} was expected"));
                break;
            }
            if let Some(why) = apply(lsn, &rec[RECORD_HEADER..])? {
                bad = Some(why);
                break;
            }
            expect += 1;
            records += 1;
            pos += rlen;
        }
        if let Some(b) = bad {
            break b;
        }
        voff = resume;
    };
    let mut damage = None;
    if check_damage && !at_marker {
        // Look for any later chunk of this epoch that was written after record `expect` was durable.
        let limit = tail_voff + region_len;
        let mut at = voff.max(tail_voff) + BLOCK_SIZE as u64;
        const SPAN: u64 = 1 << 20;
        while at < limit {
            let n = SPAN.min(limit - at).min(region_len - at % region_len);
            let buf = read(at, n as usize)?;
            for b in 0..(n as usize / BLOCK_SIZE) {
                let blk = &buf[b * BLOCK_SIZE..(b + 1) * BLOCK_SIZE];
                if blk[..4] != CHUNK_MAGIC {
                    continue;
                }
                let here = at + (b * BLOCK_SIZE) as u64;
                if let Some(h) = parse_chunk_header(blk, here, epoch, region_len) {
                    if h.durable > expect && damage.is_none() {
                        damage = Some(Error::Corrupt(format!(
                            "the redo log is damaged: record {expect} was durable (the chunk at log offset {here} \
                             says records below {} were), but it cannot be read ({stop_reason})",
                            h.durable
                        )));
                    }
                }
            }
            at += n;
        }
    }
    Ok(Recovered {
        resume_voff: resume,
        next_lsn: expect,
        records,
        stop_reason,
        damage,
        max_durable,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use amaranth_device::{CrashPlan, FaultDevice};

    const REGION: u64 = 64 * 4096;

    /// A log over `dev` (region after its first block), starting at offset 0 with `epoch` and
    /// `next_lsn`.
    fn test_log(dev: Arc<FaultDevice>, epoch: u64, next_lsn: Lsn) -> Log {
        Log::new(
            dev,
            4096,
            REGION,
            0.5,
            LogPosition {
                epoch,
                voff: 0,
                next_lsn,
            },
        )
    }

    fn replay(dev: &dyn BlockDevice, epoch: u64, tail: u64, lsn: Lsn) -> Vec<(Lsn, Vec<u8>)> {
        let mut out = Vec::new();
        let r = recover(dev, 4096, REGION, epoch, tail, lsn, true, |l, p| {
            out.push((l, p.to_vec()));
            Ok(None)
        })
        .unwrap();
        assert!(r.damage.is_none(), "{:?}", r.damage);
        out
    }

    /// A chunk encoded into a reused buffer (the log thread keeps the last chunk's) is the same
    /// bytes as one in a fresh buffer: the padding after its records is zeroed, not left over.
    #[test]
    fn a_chunk_in_a_reused_buffer_is_the_same_bytes() {
        let log = test_log(Arc::new(FaultDevice::new(4096 + REGION)), 2, 5);
        log.append(&[7u8; 1000]).unwrap();
        let records = log.state.lock().buf.clone();
        let fresh = encode_chunk(2, 8192, 5, 1, 3, &records);
        let mut used = AlignedBuf::zeroed(3 * BLOCK_SIZE);
        used.fill(0xa5);
        let head = ChunkHead {
            epoch: 2,
            voff: 8192,
            first: 5,
            n: 1,
            durable: 3,
        };
        let len = encode_chunk_into(&mut used, &head, &records);
        assert_eq!(len, fresh.len());
        assert!(
            used[..len] == fresh[..],
            "reused buffer encodes other bytes"
        );
    }

    #[test]
    fn append_flush_recover_and_wrap() {
        let dev = Arc::new(FaultDevice::new(4096 + REGION));
        let log = test_log(dev.clone(), 3, 10);
        for i in 0..50u32 {
            log.append(&vec![i as u8; 3000]).unwrap();
            if i % 7 == 0 {
                log.flush(i % 2 == 0).unwrap();
            }
        }
        log.flush(true).unwrap();
        let got = replay(&*dev, 3, 0, 10);
        assert_eq!(got.len(), 50);
        assert_eq!(got[49], (59, vec![49u8; 3000]));
        // Another epoch sees nothing.
        assert!(replay(&*dev, 4, 0, 10).is_empty());
        // Move the tail and keep writing until the ring wraps.
        let (v, l) = log.replay_start();
        log.set_tail(v);
        for i in 0..60u32 {
            log.append(&vec![i as u8; 5000]).unwrap();
            log.flush(true).unwrap();
            let (v2, _) = log.replay_start();
            if v2 - v > REGION / 2 {
                break;
            }
        }
        let got = replay(&*dev, 3, v, l);
        assert!(!got.is_empty());
        assert_eq!(got[0].0, l);
        for w in got.windows(2) {
            assert_eq!(w[1].0, w[0].0 + 1);
        }
    }

    /// With deferred end markers, a durable flush leaves its marker due; the marker is written by
    /// `write_due_marker` (one write, where recovery then stops at it), and a chunk written before
    /// that takes its place (nothing left to write).
    #[test]
    fn a_deferred_end_marker_is_written_later_or_superseded() {
        let dev = Arc::new(FaultDevice::new(4096 + REGION));
        let log = test_log(dev.clone(), 1, 1);
        log.defer_end_markers();
        log.append(b"a").unwrap();
        log.flush(true).unwrap();
        assert!(log.marker_due(), "a durable flush leaves its marker due");
        let stop = |dev: &dyn BlockDevice| {
            recover(dev, 4096, REGION, 1, 0, 1, true, |_, _| Ok(None))
                .unwrap()
                .stop_reason
        };
        assert_ne!(stop(&*dev), "end marker", "the marker is not written yet");
        let before = dev.trace_len();
        log.write_due_marker();
        assert!(!log.marker_due());
        assert_eq!(dev.trace_len(), before + 1, "one write: the marker");
        assert_eq!(stop(&*dev), "end marker");
        // A chunk written while a marker is due takes its place.
        log.append(b"b").unwrap();
        log.flush(true).unwrap();
        assert!(log.marker_due());
        log.append(b"c").unwrap();
        log.flush(false).unwrap();
        assert!(!log.marker_due(), "the next chunk took the marker's place");
        let before = dev.trace_len();
        log.write_due_marker();
        assert_eq!(dev.trace_len(), before, "nothing left to write");
        assert_eq!(replay(&*dev, 1, 0, 1).len(), 3);
    }

    #[test]
    fn torn_and_lost_chunks_give_a_prefix() {
        let dev = Arc::new(FaultDevice::new(4096 + REGION));
        let log = test_log(dev.clone(), 1, 1);
        log.append(b"a").unwrap();
        log.flush(true).unwrap();
        for i in 0..5 {
            log.append(&vec![i; 6000]).unwrap();
            log.flush(false).unwrap();
        }
        let pos = dev.trace_len();
        for seed in 0..50 {
            let img = dev.crash_image(
                pos,
                &CrashPlan::Random {
                    seed,
                    keep: 0.6,
                    tear: 0.5,
                },
            );
            let crashed = FaultDevice::from_bytes(img);
            let got = replay(&crashed, 1, 0, 1);
            assert!(!got.is_empty(), "the synced record must survive");
            for (i, (l, _)) in got.iter().enumerate() {
                assert_eq!(*l, i as u64 + 1, "records form a prefix");
            }
        }
    }
}
