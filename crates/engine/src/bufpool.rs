//! Recycled memory for decoded leaf partitions.
//!
//! A partition read from the device is copied out of the node image into a buffer of its own
//! (~100 KiB). The daemon's allocator maps every block of 64 KiB or more afresh and unmaps it when
//! freed (`cli/src/memlimit.rs`), so each decoded partition took a page fault, a zeroed page and a
//! memory-cgroup charge per 4 KiB, and an unmap when evicted: in a cold sequential read through
//! the mount that was about a fifth of the daemon's CPU time. Here the buffers of evicted
//! partitions are kept (up to [`POOL_BYTES`] in all) and handed to the next partitions decoded,
//! whose pages are then already mapped. The pool is memory outside the cache's bound, counted in
//! the daemon's fixed overhead (`DAEMON_OVERHEAD`), and never larger than [`POOL_BYTES`].

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;

/// The most bytes (buffer capacities) the pool keeps.
pub(crate) const POOL_BYTES: usize = 16 << 20;

/// Buffers smaller than this are not kept (the heap serves them without mapping pages).
pub(crate) const MIN_BUFFER: usize = 64 << 10;

/// A bounded pool of empty byte buffers.
pub(crate) struct BufPool {
    /// Free buffers, most recently returned last (reused first: its pages are the warmest).
    free: Mutex<Vec<Vec<u8>>>,
    /// Sum of the capacities in `free`.
    held: AtomicUsize,
    /// The most bytes `free` may hold.
    limit: usize,
    /// Buffers handed out again.
    reused: AtomicU64,
}

/// The pool of the process (partitions decode into it and return their buffers to it).
pub(crate) static POOL: BufPool = BufPool::new(POOL_BYTES);

impl BufPool {
    /// An empty pool that keeps at most `limit` bytes.
    pub(crate) const fn new(limit: usize) -> BufPool {
        BufPool {
            free: Mutex::new(Vec::new()),
            held: AtomicUsize::new(0),
            limit,
            reused: AtomicU64::new(0),
        }
    }

    /// An empty buffer with room for `len` bytes: a kept one whose capacity is at most a quarter
    /// above `len` (the cache counts capacities, so it is charged little more than the bytes), or
    /// a new one.
    pub(crate) fn take(&self, len: usize) -> Vec<u8> {
        if len >= MIN_BUFFER {
            let mut free = self.free.lock();
            let fits = |c: usize| c >= len && c <= len + len / 4;
            if let Some(i) = free.iter().rposition(|b| fits(b.capacity())) {
                let b = free.swap_remove(i);
                self.held.fetch_sub(b.capacity(), Ordering::Relaxed);
                assert!(b.is_empty() && b.capacity() >= len, "pooled buffer unfit");
                self.reused.fetch_add(1, Ordering::Relaxed);
                return b;
            }
        }
        Vec::with_capacity(len)
    }

    /// Keeps `buf` for a later [`BufPool::take`] if it is large enough, freeing the oldest kept
    /// buffers to make room (buffers of sizes nobody asks for do not stay).
    pub(crate) fn give(&self, mut buf: Vec<u8>) {
        let cap = buf.capacity();
        if !(MIN_BUFFER..=self.limit).contains(&cap) {
            return;
        }
        let mut free = self.free.lock();
        let mut held = self.held.load(Ordering::Relaxed);
        let mut oldest = 0;
        while held + cap > self.limit {
            held -= free[oldest].capacity();
            oldest += 1;
        }
        let freed: Vec<Vec<u8>> = free.drain(..oldest).collect();
        buf.clear();
        free.push(buf);
        self.held.store(held + cap, Ordering::Relaxed);
        assert!(held + cap <= self.limit, "buffer pool over its bound");
        drop(free);
        drop(freed);
    }

    /// Buffers handed out again so far.
    pub(crate) fn reused(&self) -> u64 {
        self.reused.load(Ordering::Relaxed)
    }

    /// Bytes the pool holds now.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_given_buffer_is_taken_again_with_its_memory() {
        let pool = BufPool::new(POOL_BYTES);
        let mut b = Vec::with_capacity(100 << 10);
        b.extend_from_slice(&[7u8; 1000]);
        let ptr = b.as_ptr();
        pool.give(b);
        // A close size gets the same memory back, empty.
        let t = pool.take(90 << 10);
        assert_eq!(t.as_ptr(), ptr);
        assert!(t.is_empty());
        assert_eq!(pool.held(), 0);
        assert_eq!(pool.reused(), 1);
        // Far smaller or larger asks do not take it.
        pool.give(t);
        let (larger, smaller) = (pool.take(200 << 10), pool.take(70 << 10));
        assert_eq!(pool.held(), 100 << 10);
        assert!(larger.capacity() >= 200 << 10 && smaller.capacity() >= 70 << 10);
        let again = pool.take(100 << 10);
        assert_eq!(again.as_ptr(), ptr);
        assert_eq!(pool.reused(), 2);
    }

    #[test]
    fn the_pool_never_holds_more_than_its_bound() {
        let pool = BufPool::new(1 << 20);
        // The oldest buffer, told apart by its capacity.
        pool.give(Vec::with_capacity(100 << 10));
        assert_eq!(pool.held(), 100 << 10);
        for _ in 0..16 {
            pool.give(Vec::with_capacity(128 << 10));
            assert!(pool.held() <= 1 << 20, "pool holds {} bytes", pool.held());
        }
        assert_eq!(pool.held(), 1 << 20);
        // The oldest buffer made room for the newer ones.
        let _ = pool.take(100 << 10);
        assert_eq!(pool.held(), 1 << 20);
        for _ in 0..8 {
            let _ = pool.take(128 << 10);
        }
        assert_eq!(pool.held(), 0);
        // Small buffers are never kept.
        let mut small = BufPool::new(1 << 20);
        small.give(Vec::with_capacity(4 << 10));
        assert_eq!(small.held(), 0);
        small = BufPool::new(0);
        small.give(Vec::with_capacity(128 << 10));
        assert_eq!(small.held(), 0);
    }
}
