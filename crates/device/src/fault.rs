//! A fault-injecting device for crash and error tests.
//!
//! [`FaultDevice`] keeps its contents in memory and records every write and flush in a trace. From the
//! trace it can rebuild the image that a power cut at any point would have left: everything written
//! before the last completed flush, plus a chosen subset of the later writes, each possibly torn at
//! 4 KiB boundaries (a volatile disk cache may persist any of them, in any order, block by block).
//! It can also fail reads, writes or flushes with `EIO`, and "die" (refuse all I/O) to stop a
//! running engine at an exact point.

use std::io;
use std::sync::Arc;

use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::{check_request, BlockDevice, IoCounters, IoStats, BLOCK_SIZE};

/// The kind of a device operation, for fault rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoKind {
    /// A read request.
    Read,
    /// A write request.
    Write,
    /// A flush.
    Flush,
}

/// A rule that makes operations of one kind fail with `EIO`.
#[derive(Clone, Debug)]
pub struct FaultRule {
    /// Which operations the rule applies to.
    pub kind: IoKind,
    /// How many matching operations succeed before the first failure.
    pub after: u64,
    /// How many operations fail once the rule triggers (`None`: every one from then on).
    pub times: Option<u64>,
    /// Only requests touching this byte range `[start, end)` match (`None`: all).
    pub range: Option<(u64, u64)>,
}

impl FaultRule {
    /// Fails every operation of `kind` after `after` successful ones.
    pub fn always_after(kind: IoKind, after: u64) -> FaultRule {
        FaultRule {
            kind,
            after,
            times: None,
            range: None,
        }
    }
    /// Fails exactly one operation of `kind`, after `after` successful ones.
    pub fn once_after(kind: IoKind, after: u64) -> FaultRule {
        FaultRule {
            kind,
            after,
            times: Some(1),
            range: None,
        }
    }
}

#[derive(Clone, Debug)]
struct RuleState {
    rule: FaultRule,
    seen: u64,
    failed: u64,
}

/// One recorded write.
#[derive(Clone, Debug)]
pub struct PendingWrite {
    /// Byte offset on the device.
    pub offset: u64,
    /// The bytes written.
    pub data: Arc<[u8]>,
}

#[derive(Clone, Debug)]
enum Event {
    Write(PendingWrite),
    /// A discard, `(offset, len)`: like a write of zeros (any of its blocks may persist or not
    /// at a power cut), kept without its bytes.
    Discard(u64, u64),
    Flush,
}

/// An unflushed write or discard, as a power cut sees it.
enum Unflushed<'a> {
    Write(&'a PendingWrite),
    Discard(u64, u64),
}

impl Unflushed<'_> {
    fn offset(&self) -> u64 {
        match self {
            Unflushed::Write(w) => w.offset,
            Unflushed::Discard(o, _) => *o,
        }
    }
    fn len(&self) -> usize {
        match self {
            Unflushed::Write(w) => w.data.len(),
            Unflushed::Discard(_, l) => *l as usize,
        }
    }
}

fn zero(image: &mut [u8], offset: u64, len: u64) {
    let off = offset as usize;
    image[off..off + len as usize].fill(0);
}

/// Which of the writes after the last flush survive a simulated power cut.
#[derive(Clone, Debug)]
pub enum CrashPlan {
    /// Every write reached the medium (the cut came just before the next flush would have).
    KeepAll,
    /// No write after the last flush reached the medium.
    DropAll,
    /// Each unflushed write survives whole, not at all, or torn: half the time a prefix of its
    /// 4 KiB blocks (cut anywhere, as when the device wrote them in order), half the time a
    /// random subset of them (every block chosen on its own, however long the write).
    Random {
        /// Seed for the choices (print it to replay a failure).
        seed: u64,
        /// Probability that a write survives (whole or torn).
        keep: f64,
        /// Probability that a surviving multi-block write is torn.
        tear: f64,
    },
    /// For each unflushed write, in order, the bitmask of its 4 KiB blocks that survive
    /// (bit i = block i; writes beyond the vector's length are dropped).
    Exact(Vec<u64>),
}

struct State {
    current: Vec<u8>,
    base: Vec<u8>,
    trace: Vec<Event>,
    recording: bool,
    rules: Vec<RuleState>,
    dead: bool,
}

/// A memory device that records writes and flushes, simulates power cuts and injects `EIO`.
pub struct FaultDevice {
    state: Mutex<State>,
    counters: IoCounters,
}

impl FaultDevice {
    /// A zero-filled device of `len` bytes, recording from the start.
    pub fn new(len: u64) -> FaultDevice {
        let len = (len / BLOCK_SIZE as u64 * BLOCK_SIZE as u64) as usize;
        FaultDevice::from_bytes(vec![0; len])
    }

    /// A device holding `bytes`, recording from now on.
    pub fn from_bytes(bytes: Vec<u8>) -> FaultDevice {
        FaultDevice {
            state: Mutex::new(State {
                base: bytes.clone(),
                current: bytes,
                trace: Vec::new(),
                recording: true,
                rules: Vec::new(),
                dead: false,
            }),
            counters: IoCounters::default(),
        }
    }

    /// Stops recording writes (saves memory for long runs); the trace is cleared and the current
    /// contents become the new base.
    pub fn stop_recording(&self) {
        let mut s = self.state.lock();
        s.recording = false;
        s.trace.clear();
        s.base = Vec::new();
    }

    /// Restarts recording with the current contents as the base image.
    pub fn restart_recording(&self) {
        let mut s = self.state.lock();
        s.recording = true;
        s.trace.clear();
        s.base = s.current.clone();
    }

    /// Adds a rule that fails matching operations with `EIO`.
    pub fn add_rule(&self, rule: FaultRule) {
        self.state.lock().rules.push(RuleState {
            rule,
            seen: 0,
            failed: 0,
        });
    }

    /// Removes every fault rule.
    pub fn clear_rules(&self) {
        self.state.lock().rules.clear();
    }

    /// Makes the device refuse all further I/O with `EIO`, as if the machine lost power now.
    pub fn kill(&self) {
        self.state.lock().dead = true;
    }

    /// Whether [`kill`](FaultDevice::kill) was called.
    pub fn is_dead(&self) -> bool {
        self.state.lock().dead
    }

    /// Number of events (writes and flushes) recorded so far.
    pub fn trace_len(&self) -> usize {
        self.state.lock().trace.len()
    }

    /// Positions in the trace just after each flush (crash points where nothing is in flight).
    pub fn flush_points(&self) -> Vec<usize> {
        let s = self.state.lock();
        s.trace
            .iter()
            .enumerate()
            .filter(|(_, e)| matches!(e, Event::Flush))
            .map(|(i, _)| i + 1)
            .collect()
    }

    /// Number of writes (and discards) recorded after the last flush before trace position `pos`.
    pub fn unflushed_writes_at(&self, pos: usize) -> usize {
        let s = self.state.lock();
        let pos = pos.min(s.trace.len());
        s.trace[..pos]
            .iter()
            .rev()
            .take_while(|e| !matches!(e, Event::Flush))
            .count()
    }

    /// The current contents (every write applied).
    pub fn current_bytes(&self) -> Vec<u8> {
        self.state.lock().current.clone()
    }

    /// The image a power cut at trace position `pos` would leave under `plan`: the base image, every
    /// write before the last flush preceding `pos`, and the plan's choice of the writes in between.
    pub fn crash_image(&self, pos: usize, plan: &CrashPlan) -> Vec<u8> {
        let s = self.state.lock();
        assert!(s.recording, "crash_image needs a recorded trace");
        let pos = pos.min(s.trace.len());
        let last_flush = s.trace[..pos]
            .iter()
            .rposition(|e| matches!(e, Event::Flush))
            .map_or(0, |i| i + 1);
        let mut image = s.base.clone();
        for e in &s.trace[..last_flush] {
            match e {
                Event::Write(w) => apply(&mut image, w.offset, &w.data),
                Event::Discard(o, l) => zero(&mut image, *o, *l),
                Event::Flush => {}
            }
        }
        let unflushed: Vec<Unflushed> = s.trace[last_flush..pos]
            .iter()
            .filter_map(|e| match e {
                Event::Write(w) => Some(Unflushed::Write(w)),
                Event::Discard(o, l) => Some(Unflushed::Discard(*o, *l)),
                Event::Flush => None,
            })
            .collect();
        let mut rng = match plan {
            CrashPlan::Random { seed, .. } => Some(SmallRng::seed_from_u64(*seed)),
            _ => None,
        };
        for (i, w) in unflushed.iter().enumerate() {
            let blocks = w.len() / BLOCK_SIZE;
            let survive: Vec<bool> = match plan {
                CrashPlan::KeepAll => vec![true; blocks],
                CrashPlan::DropAll => vec![false; blocks],
                CrashPlan::Exact(masks) => {
                    // Blocks past the 64th follow the last bit of the mask.
                    let mask = masks.get(i).copied().unwrap_or(0);
                    (0..blocks).map(|b| (mask >> b.min(63)) & 1 == 1).collect()
                }
                CrashPlan::Random { keep, tear, .. } => {
                    let rng = rng.as_mut().expect("rng for random plan");
                    if !rng.gen_bool(keep.clamp(0.0, 1.0)) {
                        vec![false; blocks]
                    } else if blocks > 1 && rng.gen_bool(tear.clamp(0.0, 1.0)) {
                        if rng.gen_bool(0.5) {
                            let cut = rng.gen_range(0..blocks);
                            (0..blocks).map(|b| b < cut).collect()
                        } else {
                            (0..blocks).map(|_| rng.gen_bool(0.5)).collect()
                        }
                    } else {
                        vec![true; blocks]
                    }
                }
            };
            for (b, &keep) in survive.iter().enumerate() {
                if keep {
                    let off = b * BLOCK_SIZE;
                    let at = w.offset() + off as u64;
                    match w {
                        Unflushed::Write(w) => {
                            apply(&mut image, at, &w.data[off..off + BLOCK_SIZE])
                        }
                        Unflushed::Discard(..) => zero(&mut image, at, BLOCK_SIZE as u64),
                    }
                }
            }
        }
        image
    }

    fn check_rules(s: &mut State, kind: IoKind, offset: u64, len: usize) -> io::Result<()> {
        if s.dead {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        for r in &mut s.rules {
            if r.rule.kind != kind {
                continue;
            }
            if let Some((start, end)) = r.rule.range {
                if kind == IoKind::Flush || offset >= end || offset + len as u64 <= start {
                    continue;
                }
            }
            r.seen += 1;
            if r.seen > r.rule.after && r.rule.times.is_none_or(|t| r.failed < t) {
                r.failed += 1;
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
        }
        Ok(())
    }
}

fn apply(image: &mut [u8], offset: u64, data: &[u8]) {
    let off = offset as usize;
    image[off..off + data.len()].copy_from_slice(data);
}

impl BlockDevice for FaultDevice {
    fn len(&self) -> u64 {
        self.state.lock().current.len() as u64
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let mut s = self.state.lock();
        check_request(s.current.len() as u64, offset, buf.len())?;
        FaultDevice::check_rules(&mut s, IoKind::Read, offset, buf.len())?;
        let off = offset as usize;
        buf.copy_from_slice(&s.current[off..off + buf.len()]);
        self.counters.read(buf.len());
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        let mut s = self.state.lock();
        check_request(s.current.len() as u64, offset, buf.len())?;
        FaultDevice::check_rules(&mut s, IoKind::Write, offset, buf.len())?;
        apply(&mut s.current, offset, buf);
        if s.recording {
            s.trace.push(Event::Write(PendingWrite {
                offset,
                data: Arc::from(buf),
            }));
        }
        self.counters.write(buf.len());
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let mut s = self.state.lock();
        check_request(s.current.len() as u64, offset, len as usize)?;
        // Not counted by the write rules (a test counting the engine's writes sees the same
        // numbers); a dead device refuses it.
        if s.dead {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        zero(&mut s.current, offset, len);
        if s.recording {
            s.trace.push(Event::Discard(offset, len));
        }
        self.counters.discard(len);
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        let mut s = self.state.lock();
        FaultDevice::check_rules(&mut s, IoKind::Flush, 0, 0)?;
        if s.recording {
            s.trace.push(Event::Flush);
        }
        self.counters.flush();
        Ok(())
    }

    fn describe(&self) -> String {
        "fault-injecting memory device".to_string()
    }

    fn io_stats(&self) -> IoStats {
        self.counters.snapshot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AlignedBuf;

    fn block(fill: u8, blocks: usize) -> AlignedBuf {
        let mut b = AlignedBuf::zeroed(blocks * BLOCK_SIZE);
        b.fill(fill);
        b
    }

    #[test]
    fn crash_keeps_flushed_and_chosen_writes() {
        let d = FaultDevice::new(16 * BLOCK_SIZE as u64);
        d.write_at(0, &block(1, 1)).unwrap();
        d.flush().unwrap();
        d.write_at(4096, &block(2, 2)).unwrap();
        d.write_at(0, &block(3, 1)).unwrap();
        let pos = d.trace_len();
        let none = d.crash_image(pos, &CrashPlan::DropAll);
        assert_eq!(none[0], 1);
        assert_eq!(none[4096], 0);
        let all = d.crash_image(pos, &CrashPlan::KeepAll);
        assert_eq!(all[0], 3);
        assert_eq!(all[8192], 2);
        // Torn: only the second block of the two-block write, and not the overwrite.
        let torn = d.crash_image(pos, &CrashPlan::Exact(vec![0b10, 0]));
        assert_eq!(torn[0], 1);
        assert_eq!(torn[4096], 0);
        assert_eq!(torn[8192], 2);
        assert_eq!(d.flush_points(), vec![2]);
        assert_eq!(d.unflushed_writes_at(pos), 2);
    }

    #[test]
    fn a_discard_is_a_write_of_zeros_a_power_cut_may_keep_in_part() {
        let d = FaultDevice::new(8 * BLOCK_SIZE as u64);
        d.write_at(0, &block(1, 4)).unwrap();
        d.flush().unwrap();
        d.discard(0, 2 * BLOCK_SIZE as u64).unwrap();
        let mut b = block(9, 1);
        d.read_at(0, &mut b).unwrap();
        assert_eq!(b[0], 0, "a discarded block reads as zeros");
        d.write_at(3 * 4096, &block(5, 1)).unwrap();
        let pos = d.trace_len();
        assert_eq!(d.unflushed_writes_at(pos), 2);
        let none = d.crash_image(pos, &CrashPlan::DropAll);
        assert_eq!((none[0], none[4096]), (1, 1));
        let all = d.crash_image(pos, &CrashPlan::KeepAll);
        assert_eq!((all[0], all[4096], all[8192], all[3 * 4096]), (0, 0, 1, 5));
        // Its blocks persist one by one, as a write's do.
        let torn = d.crash_image(pos, &CrashPlan::Exact(vec![0b10, 0]));
        assert_eq!((torn[0], torn[4096], torn[3 * 4096]), (1, 0, 1));
        d.flush().unwrap();
        let flushed = d.crash_image(d.trace_len(), &CrashPlan::DropAll);
        assert_eq!((flushed[0], flushed[3 * 4096]), (0, 5));
        assert_eq!(d.io_stats().discards, 1);
        assert_eq!(d.io_stats().bytes_discarded, 8192);
    }

    #[test]
    fn rules_fail_with_eio() {
        let d = FaultDevice::new(4 * BLOCK_SIZE as u64);
        d.add_rule(FaultRule::once_after(IoKind::Write, 1));
        d.write_at(0, &block(1, 1)).unwrap();
        let e = d.write_at(0, &block(1, 1)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO));
        d.write_at(0, &block(1, 1)).unwrap();
        d.kill();
        assert!(d.flush().is_err());
    }
}
