//! Buffers for out-of-line data on its way to the device (`blockdata.rs`, `datawriter.rs`): 1 MiB
//! slots cut from a bounded pool of huge pages, reused.
//!
//! Why huge pages: a direct write from 4 KiB pages is cut into device requests of at most
//! `max_segments` pages (128 on a loop device), so a 1 MiB run of blocks went out as two requests
//! of 512 KiB; from physically contiguous memory it is one request of a few segments, as for the
//! reads into the ring's payload slots (docs/BENCHMARKS.md, "Where reads of out-of-line data
//! wait" and "Large writes from huge pages"). Why a pool: a fresh 1 MiB mapping per write request
//! cost a page fault and a page clear per 4 KiB, a fifth of the daemon's CPU in a sequential
//! write; a slab is faulted in (one huge page) once and reused.
//!
//! The bound: at most [`MAX_SLABS`] slabs are mapped at once, and when writes stop, wholly free
//! slabs beyond [`IDLE_SLABS`] are unmapped by the engine's background thread
//! ([`SlabPool::trim`], once a second, those unused for [`TRIM_AFTER`]). Not as their last slot
//! comes back: a sequential write's buffers in flight rise and fall by more than the idle slabs
//! many times a second, and mapping a slab again cost a huge page's fault and clear each time (9%
//! of the daemon's CPU in a 4,000 MiB `dd`). A buffer asked for when every slab is in use, or
//! larger than a slot, is an ordinary [`AlignedBuf`] of its own (4 KiB pages, freed when
//! dropped): the data writers' own bound ([`crate::datawriter::MAX_IN_FLIGHT`]) is what limits
//! the memory in flight, the pool only decides which memory it is.

use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use amaranth_device::AlignedBuf;
use parking_lot::Mutex;

/// A slab: one huge page (a buffer of this size starts at a huge-page boundary and is advised for
/// transparent huge pages, `AlignedBuf`).
pub(crate) const SLAB: usize = 2 << 20;
/// A slot, the largest buffer the pool hands out (a FUSE write request is at most 1 MiB): two per
/// slab.
pub(crate) const SLOT: usize = 1 << 20;
const SLOTS_PER_SLAB: usize = SLAB / SLOT;
/// Slabs mapped at most (48 MiB): the data in flight ([`crate::datawriter::MAX_IN_FLIGHT`], 32
/// MiB) plus the requests being copied in and the batches waiting for the writers' room.
pub(crate) const MAX_SLABS: usize = 24;
/// Wholly free slabs kept for the next writes at most (16 MiB, what the pool of 1 MiB buffers it
/// replaces kept).
pub(crate) const IDLE_SLABS: usize = 8;
/// How long a wholly free slab beyond [`IDLE_SLABS`] stays mapped unused.
pub(crate) const TRIM_AFTER: Duration = Duration::from_secs(1);

/// A mapped slab and which of its slots are handed out.
struct Slab {
    buf: AlignedBuf,
    /// Bit `i`: slot `i` is in use.
    used: u8,
    /// When its last slot in use came back (when it was mapped, before).
    freed_at: Instant,
}

impl Slab {
    fn is_free(&self) -> bool {
        self.used == 0
    }
}

/// A bounded pool of huge-page slabs cut into slots.
pub(crate) struct SlabPool {
    /// Slabs by index (`None`: unmapped; the index of a slot's slab stays valid while it is used).
    slabs: Mutex<Vec<Option<Slab>>>,
    max_slabs: usize,
    idle_slabs: usize,
    pooled: AtomicU64,
    unpooled: AtomicU64,
    mapped: AtomicU64,
}

/// The pool of the process (every engine's writes take their buffers from it).
pub(crate) static POOL: SlabPool = SlabPool::new(MAX_SLABS, IDLE_SLABS);

/// Where a buffer's memory belongs.
enum Home {
    /// Slot `slot` of slab `slab` of the pool.
    Slot {
        pool: &'static SlabPool,
        slab: usize,
        slot: usize,
    },
    /// Its own allocation (freed with the buffer).
    Own { _buf: AlignedBuf },
}

/// A buffer for data to be written: a slot of the pool, given back when dropped, or an
/// [`AlignedBuf`] of its own. Its address and length are multiples of 4 KiB.
pub(crate) struct PooledBuf {
    ptr: NonNull<u8>,
    len: usize,
    home: Home,
}

// SAFETY: the buffer owns its slot (or allocation) exclusively until dropped, like a Vec<u8>.
unsafe impl Send for PooledBuf {}
// SAFETY: shared references only allow reads of plain bytes.
unsafe impl Sync for PooledBuf {}

impl SlabPool {
    /// An empty pool of at most `max_slabs` slabs, keeping at most `idle_slabs` wholly free.
    pub(crate) const fn new(max_slabs: usize, idle_slabs: usize) -> SlabPool {
        SlabPool {
            slabs: Mutex::new(Vec::new()),
            max_slabs,
            idle_slabs,
            pooled: AtomicU64::new(0),
            unpooled: AtomicU64::new(0),
            mapped: AtomicU64::new(0),
        }
    }

    /// A buffer of at least `len` bytes: a slot of a slab in use when one is free (so that
    /// wholly free slabs stay whole, to be given back), else of a free or new slab, else (every
    /// slab in use, or `len` larger than a slot) a buffer of its own.
    pub(crate) fn get(&'static self, len: usize) -> PooledBuf {
        if len <= SLOT {
            let mut slabs = self.slabs.lock();
            let free_slot = |s: &Slab| (0..SLOTS_PER_SLAB).find(|i| s.used & (1 << i) == 0);
            // A slab in use with a free slot; else the wholly free slab freed last (the others
            // stay unused, for `trim`).
            let half = slabs
                .iter()
                .enumerate()
                .filter_map(|(i, s)| Some((i, s.as_ref()?)))
                .find_map(|(i, s)| Some((i, free_slot(s)?)).filter(|_| !s.is_free()));
            let whole = || {
                slabs
                    .iter()
                    .enumerate()
                    .filter_map(|(i, s)| Some((i, s.as_ref()?)))
                    .filter(|(_, s)| s.is_free())
                    .max_by_key(|(_, s)| s.freed_at)
                    .map(|(i, _)| (i, 0))
            };
            let mut pick = half.or_else(whole);
            let mapped = slabs.iter().flatten().count();
            if pick.is_none() && mapped < self.max_slabs {
                let slab = Slab {
                    buf: AlignedBuf::zeroed(SLAB),
                    used: 0,
                    freed_at: Instant::now(),
                };
                let i = match slabs.iter().position(Option::is_none) {
                    Some(i) => {
                        slabs[i] = Some(slab);
                        i
                    }
                    None => {
                        slabs.push(Some(slab));
                        slabs.len() - 1
                    }
                };
                pick = Some((i, 0));
                self.mapped.fetch_add(1, Ordering::Relaxed);
            }
            if let Some((i, slot)) = pick {
                let s = slabs[i].as_mut().expect("a picked slab is mapped");
                s.used |= 1 << slot;
                // SAFETY: the slot lies inside the slab's mapping, which stays mapped while a
                // slot of it is used.
                let ptr =
                    unsafe { NonNull::new_unchecked(s.buf.as_ptr().add(slot * SLOT).cast_mut()) };
                drop(slabs);
                self.pooled.fetch_add(1, Ordering::Relaxed);
                return PooledBuf {
                    ptr,
                    len: SLOT,
                    home: Home::Slot {
                        pool: self,
                        slab: i,
                        slot,
                    },
                };
            }
        }
        self.unpooled.fetch_add(1, Ordering::Relaxed);
        let mut own = AlignedBuf::zeroed(len);
        PooledBuf {
            ptr: NonNull::new(own.as_mut_ptr()).expect("an allocation is not null"),
            len: own.len(),
            home: Home::Own { _buf: own },
        }
    }

    /// Gives slot `slot` of slab `slab` back (the slab stays mapped: [`SlabPool::trim`]).
    fn put(&self, slab: usize, slot: usize) {
        let mut slabs = self.slabs.lock();
        let s = slabs[slab].as_mut().expect("a slot of a mapped slab");
        assert!(s.used & (1 << slot) != 0, "a slot given back twice");
        s.used &= !(1 << slot);
        if s.is_free() {
            s.freed_at = Instant::now();
        }
    }

    /// Unmaps the wholly free slabs beyond `idle_slabs` that have not been used for `after`,
    /// least recently used first.
    pub(crate) fn trim(&self, after: Duration) {
        let mut slabs = self.slabs.lock();
        let mut free: Vec<(Instant, usize)> = slabs
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().filter(|s| s.is_free()).map(|s| (s.freed_at, i)))
            .collect();
        let surplus = free.len().saturating_sub(self.idle_slabs);
        free.sort_unstable();
        let gone: Vec<Slab> = free[..surplus]
            .iter()
            .filter(|(at, _)| at.elapsed() >= after)
            .filter_map(|&(_, i)| slabs[i].take())
            .collect();
        drop(slabs);
        drop(gone);
    }

    /// Buffers handed out from slabs so far.
    pub(crate) fn pooled(&self) -> u64 {
        self.pooled.load(Ordering::Relaxed)
    }

    /// Buffers of their own handed out so far (every slab in use, or larger than a slot).
    pub(crate) fn unpooled(&self) -> u64 {
        self.unpooled.load(Ordering::Relaxed)
    }

    /// Slabs mapped so far (each costs a huge page's fault and clear when first written).
    pub(crate) fn slabs_mapped(&self) -> u64 {
        self.mapped.load(Ordering::Relaxed)
    }

    /// Slabs mapped now, and how many of them are wholly free.
    #[cfg(test)]
    fn slabs(&self) -> (usize, usize) {
        let slabs = self.slabs.lock();
        let mapped = slabs.iter().flatten().count();
        (
            mapped,
            slabs.iter().flatten().filter(|s| s.is_free()).count(),
        )
    }
}

impl PooledBuf {
    /// A buffer of at least `len` bytes from the process's pool.
    pub(crate) fn get(len: usize) -> PooledBuf {
        POOL.get(len)
    }

    /// The buffer, to fill.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: the buffer owns `len` initialised bytes at `ptr` and is uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Whether the buffer is a slot of the pool (in a huge page where the kernel has them).
    #[cfg(test)]
    fn is_pooled(&self) -> bool {
        matches!(self.home, Home::Slot { .. })
    }
}

impl Deref for PooledBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the buffer owns `len` initialised bytes at `ptr` for its lifetime (slabs and
        // own buffers are zeroed when mapped).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for PooledBuf {
    fn drop(&mut self) {
        if let Home::Slot { pool, slab, slot } = self.home {
            pool.put(slab, slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use amaranth_device::advised_huge_for_tests;

    fn pool(max: usize, idle: usize) -> &'static SlabPool {
        Box::leak(Box::new(SlabPool::new(max, idle)))
    }

    #[test]
    fn slots_are_halves_of_huge_pages_advised_huge() {
        let p = pool(4, 4);
        let mut a = p.get(SLOT);
        let b = p.get(256 << 10);
        assert!(a.is_pooled() && b.is_pooled());
        let (x, y) = (a.as_ptr() as usize, b.as_ptr() as usize);
        // Two slots of one slab: one huge page, advised for huge pages.
        let base = x & !(SLAB - 1);
        assert_eq!(y & !(SLAB - 1), base, "the second slot is in another slab");
        assert_ne!(x, y);
        assert!(x.is_multiple_of(SLOT) && y.is_multiple_of(SLOT));
        assert!(advised_huge_for_tests(base), "a slab not advised huge");
        assert_eq!((a.len(), b.len()), (SLOT, SLOT));
        a.as_mut_slice().fill(7);
        assert!(b.iter().all(|&v| v == 0), "slots overlap");
        assert_eq!(p.slabs(), (1, 0));
    }

    #[test]
    fn buffers_come_back_and_the_pool_stays_bounded() {
        let p = pool(3, 1);
        let held: Vec<PooledBuf> = (0..8).map(|_| p.get(SLOT)).collect();
        // Three slabs of two slots, then buffers of their own.
        assert_eq!(held.iter().filter(|b| b.is_pooled()).count(), 6);
        assert_eq!((p.pooled(), p.unpooled()), (6, 2));
        assert_eq!(p.slabs(), (3, 0));
        let addrs: Vec<usize> = held
            .iter()
            .filter(|b| b.is_pooled())
            .map(|b| b.as_ptr() as usize)
            .collect();
        drop(held);
        // Every slab came back and stays mapped for the next writes (mapping one again costs a
        // huge page's fault and clear), until it has not been used for a while.
        assert_eq!(p.slabs(), (3, 3));
        p.trim(Duration::from_secs(3600));
        assert_eq!(p.slabs(), (3, 3));
        // Then the slabs beyond the idle bound are unmapped.
        p.trim(Duration::ZERO);
        assert_eq!(p.slabs(), (1, 1));
        // The kept slab's slots are handed out again, with their memory.
        let again = p.get(SLOT);
        assert!(addrs.contains(&(again.as_ptr() as usize)));
        assert_eq!(p.slabs(), (1, 0));
        // Larger than a slot: a buffer of its own.
        let big = p.get(SLOT + 4096);
        assert!(!big.is_pooled() && big.len() == SLOT + 4096);
    }

    #[test]
    fn a_slot_of_a_slab_in_use_goes_before_a_free_slab() {
        let p = pool(4, 4);
        let held: Vec<PooledBuf> = (0..4).map(|_| p.get(SLOT)).collect();
        assert_eq!(p.slabs(), (2, 0));
        // Free one slot of each slab: the next buffer goes into the first half-used slab, and
        // wholly free slabs stay whole.
        let mut held = held.into_iter();
        let (a, _b, c, _d) = (
            held.next().unwrap(),
            held.next().unwrap(),
            held.next().unwrap(),
            held.next().unwrap(),
        );
        let (pa, pc) = (a.as_ptr() as usize, c.as_ptr() as usize);
        drop((a, c));
        let e = p.get(SLOT);
        assert!([pa, pc].contains(&(e.as_ptr() as usize)));
        assert_eq!(p.slabs(), (2, 0));
        // Of wholly free slabs, the one freed last is used again (the others age, for `trim`).
        let slab_of = |b: &PooledBuf| b.as_ptr() as usize & !(SLAB - 1);
        let newest = slab_of(&e);
        drop((_b, _d));
        std::thread::sleep(Duration::from_millis(2));
        drop(e);
        let last = p.get(SLOT);
        assert_eq!(slab_of(&last), newest);
        assert_eq!(p.slabs(), (2, 1));
    }
}
