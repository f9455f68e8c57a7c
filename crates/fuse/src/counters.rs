//! Requests served, by FUSE opcode: the daemon's side of "how many round trips does a system call
//! cost", and the time the daemon spent handling them (from the request in hand to the reply
//! built, transport excluded). Read by `amaranth stat` (live), by the request tables in
//! docs/DESIGN.md and by `bench/tools/floor.py` (the FUSE floor against our handler time).

use std::sync::atomic::{AtomicU64, Ordering};

/// FUSE opcodes and their names (include/uapi/linux/fuse.h), indexed by opcode.
const NAMES: [&str; 54] = [
    "", // 0 is not an opcode
    "LOOKUP",
    "FORGET",
    "GETATTR",
    "SETATTR",
    "READLINK",
    "SYMLINK",
    "", // 7 unused
    "MKNOD",
    "MKDIR",
    "UNLINK",
    "RMDIR",
    "RENAME",
    "LINK",
    "OPEN",
    "READ",
    "WRITE",
    "STATFS",
    "RELEASE",
    "", // 19 unused
    "FSYNC",
    "SETXATTR",
    "GETXATTR",
    "LISTXATTR",
    "REMOVEXATTR",
    "FLUSH",
    "INIT",
    "OPENDIR",
    "READDIR",
    "RELEASEDIR",
    "FSYNCDIR",
    "GETLK",
    "SETLK",
    "SETLKW",
    "ACCESS",
    "CREATE",
    "INTERRUPT",
    "BMAP",
    "DESTROY",
    "IOCTL",
    "POLL",
    "NOTIFY_REPLY",
    "BATCH_FORGET",
    "FALLOCATE",
    "READDIRPLUS",
    "RENAME2",
    "LSEEK",
    "COPY_FILE_RANGE",
    "SETUPMAPPING",
    "REMOVEMAPPING",
    "SYNCFS",
    "TMPFILE",
    "STATX",
    "COPY_FILE_RANGE_64",
];

/// One counter and one time sum per opcode (anything unknown counts as opcode 0).
pub struct RequestCounts {
    counts: [AtomicU64; NAMES.len()],
    nanos: [AtomicU64; NAMES.len()],
    /// Requests the io_uring transport served with the thread's affinity widened beyond its
    /// queue's CPU (more than `uring::PINNED_PER_QUEUE` of the queue busy at once).
    pub(crate) ring_spread: std::sync::Arc<AtomicU64>,
}

impl Default for RequestCounts {
    fn default() -> RequestCounts {
        RequestCounts {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            nanos: std::array::from_fn(|_| AtomicU64::new(0)),
            ring_spread: Default::default(),
        }
    }
}

fn index(opcode: u32) -> usize {
    if (opcode as usize) < NAMES.len() {
        opcode as usize
    } else {
        0
    }
}

impl RequestCounts {
    /// Counts one request with `opcode`.
    pub fn count(&self, opcode: u32) {
        self.counts[index(opcode)].fetch_add(1, Ordering::Relaxed);
    }

    /// Adds `nanos` of handling time to `opcode`'s sum.
    pub fn add_time(&self, opcode: u32, nanos: u64) {
        self.nanos[index(opcode)].fetch_add(nanos, Ordering::Relaxed);
    }

    /// Handling time so far by opcode name, in nanoseconds (the opcodes of [`Self::snapshot`]).
    pub fn time_snapshot(&self) -> Vec<(&'static str, u64)> {
        let mut out = Vec::new();
        for (i, c) in self.counts.iter().enumerate() {
            if c.load(Ordering::Relaxed) > 0 {
                let name = if i == 0 { "UNKNOWN" } else { NAMES[i] };
                out.push((name, self.nanos[i].load(Ordering::Relaxed)));
            }
        }
        out
    }

    /// Every opcode seen so far with its count, by name (unknown opcodes as `UNKNOWN`).
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let mut out = Vec::new();
        for (i, c) in self.counts.iter().enumerate() {
            let n = c.load(Ordering::Relaxed);
            if n > 0 {
                out.push((if i == 0 { "UNKNOWN" } else { NAMES[i] }, n));
            }
        }
        out
    }

    /// Requests served by a ring thread allowed off its queue's CPU (see `uring::QueueLoad`).
    pub fn ring_spread(&self) -> u64 {
        self.ring_spread.load(Ordering::Relaxed)
    }

    /// All requests served.
    pub fn total(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::op;

    #[test]
    fn counts_by_name() {
        let c = RequestCounts::default();
        c.count(op::LOOKUP);
        c.count(op::LOOKUP);
        c.count(op::CREATE);
        c.count(9999);
        assert_eq!(
            c.snapshot(),
            vec![("UNKNOWN", 1), ("LOOKUP", 2), ("CREATE", 1)]
        );
        assert_eq!(c.total(), 4);
        c.add_time(op::LOOKUP, 700);
        c.add_time(op::LOOKUP, 300);
        c.add_time(9999, 5);
        assert_eq!(
            c.time_snapshot(),
            vec![("UNKNOWN", 5), ("LOOKUP", 1000), ("CREATE", 0)]
        );
        assert_eq!(NAMES[op::READDIRPLUS as usize], "READDIRPLUS");
        assert_eq!(NAMES[op::COPY_FILE_RANGE as usize], "COPY_FILE_RANGE");
        assert_eq!(NAMES[op::FSYNCDIR as usize], "FSYNCDIR");
    }
}
