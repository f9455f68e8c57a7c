//! A decoded buffer's memory estimate ([`Buffer::mem`], what the cache counts for it) against
//! what the allocator really holds for it, for the message shapes a file system sends: deletes,
//! small puts (metadata), and puts of data up to a block. Before, the per-entry overhead was
//! counted as 96 bytes: the estimate was 0.76-0.82 of the allocator's bytes for deletes and small
//! puts (55-64 bytes short per entry: the key's and the value's chunk headers and rounding, the
//! messages' vector), so a cache full of decoded buffers held more than its bound.

use amaranth_device::counting::{held, Counting};

use crate::buffer::Buffer;
use crate::msg::PointOp;

#[global_allocator]
static ALLOC: Counting = Counting;

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
