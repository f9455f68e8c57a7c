//! A global allocator for tests that check a memory estimate against the allocator: it forwards
//! to the system allocator and counts, per thread, the bytes glibc's malloc takes for each
//! allocation (usable size plus the chunk header). A test binary installs it with
//! `#[global_allocator] static A: Counting = Counting;` and reads [`held`] before and after.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The counting allocator (see the module).
pub struct Counting;

thread_local! {
    static HELD: Cell<isize> = const { Cell::new(0) };
}

fn chunk(p: *mut u8) -> isize {
    // SAFETY: `p` was returned by the system allocator (malloc family) and is live.
    unsafe { libc::malloc_usable_size(p.cast()) as isize + 8 }
}

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = System.alloc(l);
        if !p.is_null() {
            let n = chunk(p);
            let _ = HELD.try_with(|c| c.set(c.get() + n));
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        let n = chunk(p);
        let _ = HELD.try_with(|c| c.set(c.get() - n));
        System.dealloc(p, l)
    }
}

/// Bytes the calling thread holds through [`Counting`] (allocated less freed; what it frees of
/// another thread's allocations counts against it).
pub fn held() -> isize {
    HELD.with(|c| c.get())
}
