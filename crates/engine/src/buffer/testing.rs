//! What the buffer tests share: a seed that can be replayed, random messages, encodings.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::Buffer;
use crate::codec::Enc;
use crate::dataref::DataRef;
use crate::msg::{Patch, PointOp};

/// A random generator from `AMARANTH_SEED`, or from a random seed; the seed is printed.
pub(crate) fn seeded_rng() -> SmallRng {
    let s = std::env::var("AMARANTH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("seed {s} (AMARANTH_SEED={s} repeats it)");
    SmallRng::seed_from_u64(s)
}

/// Key `i` of the random messages (`k00000`, `k00001`, ...).
pub(crate) fn key(i: u32) -> Vec<u8> {
    format!("k{i:05}").into_bytes()
}

/// `n` random messages over keys `0..keys` ([`key`]) numbered from `msn` on, as a buffer holds
/// them (range deletes having removed the older points they cover): puts, deletes, references,
/// upserts and a few range deletes (some reaching past the last key).
pub(crate) fn random_messages(rng: &mut SmallRng, msn: &mut u64, n: usize, keys: u32) -> Buffer {
    let mut b = Buffer::new();
    for _ in 0..n {
        *msn += 1;
        let k = key(rng.gen_range(0..keys));
        if rng.gen_bool(0.07) {
            let hi = key(rng.gen_range(0..keys + keys / 20));
            if k < hi {
                let _ = b.add_range(*msn, &k, &hi);
            }
            continue;
        }
        let op = match rng.gen_range(0..5) {
            0 => PointOp::Put(vec![7; rng.gen_range(0..20)]),
            1 => PointOp::Delete,
            2 => PointOp::PutRef(DataRef::new(rng.gen_range(1..1000), 40)),
            3 => PointOp::Upsert(Patch::Truncate {
                len: rng.gen_range(0..50),
            }),
            _ => PointOp::Upsert(Patch::Write {
                offset: rng.gen_range(0..40),
                data: b"abc".to_vec(),
            }),
        };
        let _ = b.add_point(k, *msn, op);
    }
    b
}

/// The encoding of `b`.
pub(crate) fn encoding(b: &Buffer) -> Vec<u8> {
    let mut e = Enc::default();
    b.encode(&mut e);
    e.buf
}
