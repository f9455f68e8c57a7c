//! Deterministic keys, values and a memory-free random permutation of the key indexes.

/// Key length in bytes (fixed: the first byte names the key set, the next seven are the index in
/// big-endian order so that key order is index order, the rest is filler derived from the index).
pub const KEY_LEN: usize = 24;
/// First byte of the keys of the main (small-value) set.
pub const MAIN_SET: u8 = b'k';
/// First byte of the keys of the upsert (4 KiB value) set; sorts after the main set.
pub const UPSERT_SET: u8 = b'u';

pub fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

pub fn key(set: u8, i: u64) -> [u8; KEY_LEN] {
    let mut k = [0u8; KEY_LEN];
    k[0] = set;
    k[1..8].copy_from_slice(&i.to_be_bytes()[1..8]);
    let h1 = splitmix(i ^ ((set as u64) << 56));
    let h2 = splitmix(h1);
    k[8..16].copy_from_slice(&h1.to_le_bytes());
    k[16..24].copy_from_slice(&h2.to_le_bytes());
    k
}

/// The key bounding index `i` from below in key order (for ranges: `[bound(a), bound(b))` holds
/// exactly the indexes `a..b`).
pub fn bound(set: u8, i: u64) -> Vec<u8> {
    let mut k = vec![0u8; 8];
    k[0] = set;
    k[1..8].copy_from_slice(&i.to_be_bytes()[1..8]);
    k
}

/// A value of `len` bytes, about half compressible (like db_bench's default compression ratio
/// 0.5): `len/2` pseudo-random bytes followed by a repeat of them.
pub fn value(i: u64, version: u64, len: usize, out: &mut Vec<u8>) {
    out.clear();
    let half = len.div_ceil(2);
    let mut s = splitmix(i.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ version);
    while out.len() < half {
        s = splitmix(s);
        let b = s.to_le_bytes();
        let n = (half - out.len()).min(8);
        out.extend_from_slice(&b[..n]);
    }
    let mut j = 0;
    while out.len() < len {
        out.push(out[j]);
        j += 1;
    }
}

/// A bijection of `0..n` (a 4-round Feistel network on the next power of two, with cycle
/// walking): random order without a table in memory.
pub struct Perm {
    n: u64,
    half_bits: u32,
    keys: [u64; 4],
}

impl Perm {
    pub fn new(n: u64, seed: u64) -> Perm {
        let bits = 64 - n.max(2).saturating_sub(1).leading_zeros();
        let bits = bits + (bits & 1);
        let mut keys = [0u64; 4];
        let mut s = seed;
        for k in keys.iter_mut() {
            s = splitmix(s);
            *k = s;
        }
        Perm {
            n,
            half_bits: bits / 2,
            keys,
        }
    }

    fn round(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let mut l = x >> self.half_bits;
        let mut r = x & mask;
        for k in self.keys {
            let f = splitmix(r ^ k) & mask;
            let nl = r;
            r = l ^ f;
            l = nl;
        }
        (l << self.half_bits) | r
    }

    fn unround(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let mut l = x >> self.half_bits;
        let mut r = x & mask;
        for k in self.keys.iter().rev() {
            let pl = r ^ (splitmix(l ^ k) & mask);
            r = l;
            l = pl;
        }
        (l << self.half_bits) | r
    }

    /// The position of `x` in the permutation (`inverse(get(i)) == i`).
    pub fn inverse(&self, x: u64) -> u64 {
        let mut i = self.unround(x);
        while i >= self.n {
            i = self.unround(i);
        }
        i
    }

    pub fn get(&self, i: u64) -> u64 {
        let mut x = self.round(i);
        while x >= self.n {
            x = self.round(x);
        }
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn perm_is_bijection() {
        for n in [1u64, 2, 3, 10, 1000, 4097] {
            let p = Perm::new(n, 7);
            let mut seen = vec![false; n as usize];
            for i in 0..n {
                let x = p.get(i) as usize;
                assert!(!seen[x]);
                seen[x] = true;
                assert_eq!(p.inverse(x as u64), i);
            }
        }
    }
    #[test]
    fn key_order_is_index_order() {
        assert!(key(MAIN_SET, 5) < key(MAIN_SET, 6));
        assert!(key(MAIN_SET, 255) < key(MAIN_SET, 256));
        assert!(key(MAIN_SET, u32::MAX as u64) < key(UPSERT_SET, 0));
        assert!(bound(MAIN_SET, 5).as_slice() < &key(MAIN_SET, 5)[..]);
        assert!(&key(MAIN_SET, 4)[..] < bound(MAIN_SET, 5).as_slice());
    }
    #[test]
    fn values_have_length() {
        let mut v = Vec::new();
        value(3, 0, 100, &mut v);
        assert_eq!(v.len(), 100);
        assert_eq!(v[..50], v[50..]);
        value(3, 0, 4096, &mut v);
        assert_eq!(v.len(), 4096);
    }
}
