//! A decoded buffer's memory estimate ([`Buffer::mem`], what the cache counts for it) against
//! what the allocator really holds for it, for the message shapes a file system sends: deletes,
//! small puts (metadata), and puts of data up to a block. Before, the per-entry overhead was
//! counted as 96 bytes: the estimate was 0.76-0.82 of the allocator's bytes for deletes and small
//! puts (55-64 bytes short per entry: the key's and the value's chunk headers and rounding, the
//! messages' vector), so a cache full of decoded buffers held more than its bound.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use crate::buffer::Buffer;
use crate::msg::PointOp;

/// Counts the heap bytes this thread holds, as glibc's malloc takes them (usable size plus the
/// chunk header).
struct Counting;

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

#[global_allocator]
static ALLOC: Counting = Counting;

fn held() -> isize {
    HELD.with(|c| c.get())
}

/// A Maildir-like key (about 70 bytes).
fn key(i: u64) -> Vec<u8> {
    format!(
        "mail/user1/box{:03}/cur/{:016}.M{}P{}.host,S=1234:2,S",
        i % 80,
        i,
        i * 7,
        i * 13
    )
    .into_bytes()
}

#[test]
fn a_decoded_buffers_estimate_matches_the_allocator() {
    for (value, n) in [
        (None, 50_000u64),
        (Some(40), 50_000),
        (Some(100), 50_000),
        (Some(1000), 20_000),
        (Some(4096), 5_000),
    ] {
        let before = held();
        let mut b = Buffer::new();
        for i in 0..n {
            let op = match value {
                None => PointOp::Delete,
                Some(len) => PointOp::Put(vec![7u8; len]),
            };
            let _ = b.add_point(key(i), i + 1, op);
        }
        let real = (held() - before) as f64;
        let est = b.mem() as f64;
        eprintln!(
            "{value:?} x {n}: estimate {:.1} MiB, allocator {:.1} MiB ({:.2})",
            est / 1048576.0,
            real / 1048576.0,
            est / real
        );
        assert!(
            (0.95..=1.1).contains(&(est / real)),
            "value {value:?}: estimated {est} bytes, the allocator holds {real}"
        );
        drop(b);
    }
}
