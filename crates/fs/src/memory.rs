//! The inode table's part in the daemon's memory bound.
//!
//! The kernel decides which inodes it remembers (its lookup counts), so the table cannot drop an
//! entry on its own. Its bytes are therefore counted: the first [`TABLE_UNCHARGED`] are part of the
//! daemon's documented overhead, the rest is charged to the engine's cache bound (the nodes make
//! room for it, down to half the bound). Past that the table is over its limit, and the daemon asks
//! the kernel to forget names (least recently looked up first, never open files or directories
//! with known children); each forgotten inode leaves the table when the kernel's FORGET arrives.

use crate::fs::Fs;

/// Bytes of the inode table not charged to the cache bound: about 23,000 inodes the kernel knows.
/// Part of the daemon's documented overhead above its cache (the rest of it, ~50 MiB measured
/// with the io_uring transport, is request buffers, the program, images being written and the
/// allocator's slack).
pub const TABLE_UNCHARGED: usize = 8 << 20;

/// At most this many names are handed out per call of [`Fs::forget_candidates`].
const MAX_FORGET_BATCH: usize = 16 << 10;

impl Fs {
    /// Bytes the inode table holds now (both maps, names and cached attributes).
    pub fn table_bytes(&self) -> usize {
        self.table.lock().mem_bytes()
    }

    /// The most the inode table may hold before the kernel is asked to forget inodes: the part
    /// outside the cache bound plus what the cache can give up.
    pub fn table_limit(&self) -> usize {
        TABLE_UNCHARGED + self.engine().external_memory_allowance()
    }

    /// Names `(parent, name)` the kernel should be asked to forget (FUSE entry invalidation) to bring
    /// the table back to 7/8 of its limit; empty while it is within the limit.
    pub fn forget_candidates(&self) -> Vec<(u64, Vec<u8>)> {
        let limit = self.table_limit();
        let mut t = self.table.lock();
        let bytes = t.mem_bytes();
        if bytes <= limit {
            return Vec::new();
        }
        let excess = bytes - limit / 8 * 7;
        let n = (excess / t.entry_bytes().max(1) + 1).min(MAX_FORGET_BATCH);
        t.forget_candidates(n)
    }
}
