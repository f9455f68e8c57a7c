//! Shared pieces of the engine tests: a random operation generator and a `BTreeMap` model.

#![allow(dead_code)]

pub mod crashsim;
pub mod snaps;

use std::collections::BTreeMap;
use std::ops::Bound;

use amaranth_engine::{Batch, BlockData, Engine, Format, Op, Options, Patch};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

pub type Model = BTreeMap<Vec<u8>, Vec<u8>>;

/// The test format: tiny nodes so that splits, merges and flushes happen constantly.
pub fn small_format() -> Format {
    Format::small_for_tests()
}

/// A small format whose values reach 4 KiB, so that out-of-line blocks (`put_blocks`) are allowed.
pub fn blocks_format() -> Format {
    Format {
        node_size: 32 << 10,
        partition_size: 8 << 10,
        max_value_len: 4096,
        log_size: Some(2 << 20),
        ..Format::small_for_tests()
    }
}

/// Options with a small cache and no background threads (deterministic), checking every node's
/// invariants whenever it changes.
pub fn small_options() -> Options {
    Options {
        cache_size: 256 << 10,
        background_threads: false,
        check_invariants: true,
        ..Options::default()
    }
}

/// [`small_options`] with a cache that holds the whole tree of a test (64 MiB).
pub fn roomy_options() -> Options {
    Options {
        cache_size: 64 << 20,
        ..small_options()
    }
}

/// Puts `n` keys `{prefix}{i:07}` of `len`-byte values, in batches of 100, in the engine and the
/// model.
/// A new engine of the small format on a memory device of `bytes`, with roomy options.
pub fn roomy_engine(bytes: u64) -> Engine {
    let dev = std::sync::Arc::new(amaranth_device::MemDevice::new(bytes));
    Engine::create(dev, small_format(), roomy_options()).expect("create")
}

pub fn fill_family(e: &Engine, m: &mut Model, prefix: &str, n: u32, len: usize) {
    for chunk in (0..n).collect::<Vec<_>>().chunks(100) {
        let mut b = Batch::new();
        for &i in chunk {
            let k = format!("{prefix}{i:07}").into_bytes();
            let v = vec![(i % 251) as u8; len];
            m.insert(k.clone(), v.clone());
            b.put(k, v);
        }
        e.write(&b).unwrap();
    }
}

/// Applies one operation to the model.
pub fn apply_model(m: &mut Model, op: &Op) {
    match op {
        Op::Put { key, value } => {
            m.insert(key.clone(), value.clone());
        }
        Op::Delete { key } => {
            m.remove(key);
        }
        Op::Upsert { key, patch } => {
            let old = m.remove(key);
            if let Some(v) = patch.apply(old) {
                m.insert(key.clone(), v);
            }
        }
        Op::RangeDelete { lo, hi } => {
            if lo < hi {
                let keys: Vec<Vec<u8>> = m
                    .range::<[u8], _>((Bound::Included(&lo[..]), Bound::Excluded(&hi[..])))
                    .map(|(k, _)| k.clone())
                    .collect();
                for k in keys {
                    m.remove(&k);
                }
            }
        }
        Op::PutBlocks { keys, data } => {
            let bytes = data.bytes().expect("blocks before they are written");
            for (k, b) in keys.iter().zip(bytes.chunks_exact(4096)) {
                m.insert(k.clone(), b.to_vec());
            }
        }
        Op::MovePrefix { from, to }
        | Op::CopyPrefix { from, to }
        | Op::RangeMove { from, to, .. }
        | Op::RangeClone { from, to, .. } => {
            let moved: Vec<(Vec<u8>, Vec<u8>)> = m
                .iter()
                .filter(|(k, _)| k.starts_with(from))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if !matches!(op, Op::CopyPrefix { .. } | Op::RangeClone { .. }) {
                for (k, _) in &moved {
                    m.remove(k);
                }
            }
            for (k, v) in moved {
                let mut nk = to.clone();
                nk.extend_from_slice(&k[from.len()..]);
                m.insert(nk, v);
            }
        }
        // The live tree is as it was (the snapshot is kept by the test beside the model).
        Op::SnapshotCreate { .. } | Op::SnapshotDelete { .. } => {}
    }
}

/// The longest key [`Gen::key`] makes.
pub const GEN_KEY_MAX: usize = 44;

/// Generates random operations over a bounded key space.
pub struct Gen {
    pub rng: SmallRng,
    pub keys: u32,
    pub max_value: usize,
    /// The share of [`Gen::range_move`]'s operations that are range clones (0: none).
    pub clones: f64,
}

impl Gen {
    pub fn new(seed: u64, keys: u32, max_value: usize) -> Gen {
        Gen {
            rng: SmallRng::seed_from_u64(seed),
            keys,
            max_value,
            clones: 0.0,
        }
    }

    pub fn key(&mut self) -> Vec<u8> {
        let n = self.rng.gen_range(0..self.keys);
        // Variable lengths and shared prefixes: "k0042", "k0042/x", "k0042/xyz..."
        let mut k = format!("k{n:04}").into_bytes();
        match self.rng.gen_range(0..4) {
            0 => {}
            1 => k.extend_from_slice(b"/x"),
            2 => k.extend_from_slice(&vec![b'y'; self.rng.gen_range(1..GEN_KEY_MAX - 4)]),
            _ => {
                k.push(b'/');
                k.push(self.rng.gen_range(b'a'..=b'e'));
            }
        }
        k
    }

    pub fn value(&mut self) -> Vec<u8> {
        let len = if self.rng.gen_bool(0.1) {
            0
        } else {
            self.rng.gen_range(1..=self.max_value)
        };
        let b: u8 = self.rng.gen();
        (0..len).map(|i| b.wrapping_add(i as u8)).collect()
    }

    /// A non-empty key range: a key family (`k0042/`…), all keys from one prefix of a key on,
    /// a span between two keys, or a range holding no key at all.
    pub fn range(&mut self) -> (Vec<u8>, Vec<u8>) {
        let k = self.key();
        match self.rng.gen_range(0..4) {
            0 => {
                let p = k[..5].iter().chain(b"/").copied().collect::<Vec<u8>>();
                let end = amaranth_engine::prefix_end(&p, 256);
                (p, end)
            }
            1 => {
                let p = k[..self.rng.gen_range(1..=k.len())].to_vec();
                let end = amaranth_engine::prefix_end(&p, 256);
                (p, end)
            }
            2 => {
                let other = self.key();
                match k.cmp(&other) {
                    std::cmp::Ordering::Less => (k, other),
                    std::cmp::Ordering::Greater => (other, k),
                    std::cmp::Ordering::Equal => {
                        let mut hi = k.clone();
                        hi.push(0);
                        (k, hi)
                    }
                }
            }
            _ => {
                // Between "k0042/x" and "k0042/y" or so: nothing is ever written there.
                let mut lo = k[..5].to_vec();
                lo.extend_from_slice(b"/q");
                let mut hi = lo.clone();
                hi.push(0xff);
                (lo, hi)
            }
        }
    }

    /// A prefix a range move takes keys from or to: a key family (`k0042/`) or a range nested
    /// in one (`k0042/c/`, which holds keys only once a family was moved there).
    pub fn move_prefix(&mut self) -> Vec<u8> {
        let n = self.rng.gen_range(0..self.keys);
        let mut p = format!("k{n:04}/").into_bytes();
        if self.rng.gen_bool(0.3) {
            p.push(self.rng.gen_range(b'a'..=b'e'));
            p.push(b'/');
        }
        p
    }

    /// A range move between two prefixes of [`Gen::move_prefix`] (`None` when one holds the
    /// other), copying ranges of at most 0 bytes (surgery always) or a few thousand.
    pub fn range_move(&mut self) -> Option<Op> {
        let (from, to) = (self.move_prefix(), self.move_prefix());
        if from.starts_with(&to) || to.starts_with(&from) {
            return None;
        }
        let copy_max = if self.rng.gen_bool(0.5) {
            0
        } else {
            self.rng.gen_range(0..4000)
        };
        Some(if self.clones > 0.0 && self.rng.gen_bool(self.clones) {
            Op::RangeClone { from, to, copy_max }
        } else {
            Op::RangeMove { from, to, copy_max }
        })
    }

    pub fn simple_op(&mut self) -> Op {
        match self.rng.gen_range(0..100) {
            0..=44 => Op::Put {
                key: self.key(),
                value: self.value(),
            },
            45..=59 => Op::Delete { key: self.key() },
            60..=84 => {
                let key = self.key();
                let patch = if self.rng.gen_bool(0.85) {
                    let len = self.rng.gen_range(0..=64usize.min(self.max_value));
                    let offset = self.rng.gen_range(0..=(self.max_value - len)) as u32;
                    Patch::Write {
                        offset,
                        data: (0..len).map(|_| self.rng.gen()).collect(),
                    }
                } else {
                    Patch::Truncate {
                        len: self.rng.gen_range(0..=self.max_value as u32),
                    }
                };
                Op::Upsert { key, patch }
            }
            _ => {
                // Mostly narrow ranges (one key family), sometimes a span of a few dozen keys.
                let a = self.key();
                let b = if self.rng.gen_bool(0.6) {
                    let mut b = a.clone();
                    b.push(0xff);
                    b
                } else {
                    let n: u32 = std::str::from_utf8(&a[1..5]).unwrap().parse().unwrap();
                    format!("k{:04}", (n + self.rng.gen_range(1..40)).min(9999)).into_bytes()
                };
                Op::RangeDelete { lo: a, hi: b }
            }
        }
    }
}

impl Gen {
    /// A move or copy (half the time each) of one key family under another family's prefix
    /// (`None` when the two are the same).
    pub fn prefix_op(&mut self) -> Option<Op> {
        let a = format!("k{:04}/", self.rng.gen_range(0..self.keys)).into_bytes();
        let b = format!("k{:04}/", self.rng.gen_range(0..self.keys)).into_bytes();
        if a == b {
            return None;
        }
        Some(if self.rng.gen_bool(0.5) {
            Op::MovePrefix { from: a, to: b }
        } else {
            Op::CopyPrefix { from: a, to: b }
        })
    }

    /// The key of block `b` of key family `n` ("k0042/b07": under the family's prefix, so that
    /// prefix moves and range deletes reach it).
    pub fn block_key(n: u32, b: u32) -> Vec<u8> {
        format!("k{n:04}/b{b:02}").into_bytes()
    }

    /// A put of 1 to 6 consecutive out-of-line blocks of one key family, each block's bytes
    /// different.
    pub fn blocks_op(&mut self) -> Op {
        let n = self.rng.gen_range(0..self.keys);
        let first = self.rng.gen_range(0..16u32);
        let count = self.rng.gen_range(1..=6u32);
        let keys: Vec<Vec<u8>> = (first..first + count)
            .map(|b| Gen::block_key(n, b))
            .collect();
        let mut data = vec![0u8; keys.len() * 4096];
        for block in data.chunks_exact_mut(4096) {
            let (a, b): (u64, u64) = (self.rng.gen(), self.rng.gen());
            for (i, x) in block.iter_mut().enumerate() {
                *x = (a.rotate_left(i as u32 % 64) ^ b.wrapping_mul(i as u64 + 1)) as u8;
            }
        }
        Op::PutBlocks {
            keys,
            data: BlockData::copy_from(&data),
        }
    }

    /// An upsert of a block key: mostly a few bytes (kept as a patch on a reference), sometimes
    /// a large write or a truncate (which a leaf turns into an inline value).
    pub fn block_upsert(&mut self) -> Op {
        let key = Gen::block_key(self.rng.gen_range(0..self.keys), self.rng.gen_range(0..16));
        let patch = match self.rng.gen_range(0..10) {
            0 => Patch::Truncate {
                len: self.rng.gen_range(0..4096),
            },
            1 => {
                let len = self.rng.gen_range(600..2000usize);
                Patch::Write {
                    offset: self.rng.gen_range(0..(4096 - len)) as u32,
                    data: (0..len).map(|_| self.rng.gen()).collect(),
                }
            }
            _ => {
                let len = self.rng.gen_range(1..40usize);
                Patch::Write {
                    offset: self.rng.gen_range(0..(4096 - len)) as u32,
                    data: (0..len).map(|_| self.rng.gen()).collect(),
                }
            }
        };
        Op::Upsert { key, patch }
    }
}

/// Every entry of the engine, in order, through the iterator.
pub fn dump(e: &Engine) -> Model {
    e.range(Bound::Unbounded, Bound::Unbounded)
        .map(|r| r.expect("scan"))
        .collect()
}

/// Compares a random range scan (forward or reverse) with the model.
pub fn check_range(e: &Engine, m: &Model, g: &mut Gen, seed: u64, step: usize) {
    let (mut a, mut b) = (g.key(), g.key());
    if a > b {
        std::mem::swap(&mut a, &mut b);
    }
    if a == b {
        b.push(b'~');
    }
    let lo = if g.rng.gen_bool(0.2) {
        Bound::Unbounded
    } else if g.rng.gen_bool(0.5) {
        Bound::Included(&a[..])
    } else {
        Bound::Excluded(&a[..])
    };
    let hi = if g.rng.gen_bool(0.2) {
        Bound::Unbounded
    } else if g.rng.gen_bool(0.5) {
        Bound::Included(&b[..])
    } else {
        Bound::Excluded(&b[..])
    };
    let expect: Vec<(Vec<u8>, Vec<u8>)> = m
        .range::<[u8], _>((lo, hi))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if g.rng.gen_bool(0.5) {
        let got: Vec<(Vec<u8>, Vec<u8>)> = e.range(lo, hi).map(|r| r.expect("scan")).collect();
        assert_eq!(
            got.len(),
            expect.len(),
            "seed {seed} step {step}: forward scan {lo:?}..{hi:?} length"
        );
        assert!(
            got == expect,
            "seed {seed} step {step}: forward scan {lo:?}..{hi:?} differs"
        );
    } else {
        let mut got: Vec<(Vec<u8>, Vec<u8>)> =
            e.range_rev(lo, hi).map(|r| r.expect("scan")).collect();
        got.reverse();

        assert_eq!(
            got.len(),
            expect.len(),
            "seed {seed} step {step}: reverse scan {lo:?}..{hi:?} length"
        );
        assert!(
            got == expect,
            "seed {seed} step {step}: reverse scan {lo:?}..{hi:?} differs"
        );
    }
}
