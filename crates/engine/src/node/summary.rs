//! What an internal node keeps of a child's buffer it has shed for room: enough for a point query
//! to know, without reading the buffer back, that the buffer holds nothing for its key.
//!
//! A Bε-tree's internal levels hold the buffered messages, a sizable part of the data (at 10 M
//! keys in 4 MiB nodes, 53 internal nodes held 215 MB of messages after the load, nearly all of a
//! 256 MiB cache; docs/benchmarks/engine.md). When they do not all fit, a cold point query found
//! the buffer of its child shed and read it back whole (hundreds of KiB) although, most of the
//! time, the buffer held no message for the key. The summary answers that: a Bloom filter of the
//! buffer's point keys (no false negatives; about 1% false positives at 10 bits per key) and the
//! buffer's range deletes themselves (a few, usually none). It is built when the buffer is shed
//! (`BufSlot::drop_if_written`), lives only in memory, and only while the buffer is not: a load
//! replaces it (checking first that it described the loaded messages), and nothing changes a
//! buffer that is not in memory (a node being changed is fully resident).

use crate::msg::Msn;

/// Bits of the filter per point key.
const BITS_PER_KEY: usize = 10;
/// Probes per key (about ln 2 × bits per key).
const PROBES: u32 = 7;
/// A buffer with more range deletes than this gets no summary (they are kept whole).
const MAX_RANGES: usize = 32;

/// The point keys (as a filter) and range deletes of a buffer not in memory.
#[derive(Debug)]
pub(crate) struct ShedSummary {
    /// The filter's bits (a multiple of 64, at least 64).
    bits: Vec<u64>,
    /// Range deletes: (MSN, lo, hi), in `lo` order, disjoint.
    ranges: Vec<(Msn, Vec<u8>, Vec<u8>)>,
}

/// Two independent 32-bit hashes of `key` (hardware CRC-32C with two seeds), combined by double
/// hashing into the probes.
fn hashes(key: &[u8]) -> (u32, u32) {
    let h1 = crc32c::crc32c(key);
    let h2 = crc32c::crc32c_append(0x9e37_79b9, key) | 1;
    (h1, h2)
}

impl ShedSummary {
    /// The summary of a buffer with these point keys (`points` of them) and range deletes;
    /// `None` when it has too many range deletes to keep.
    pub(crate) fn build<'a>(
        points: usize,
        keys: impl Iterator<Item = &'a [u8]>,
        ranges: impl Iterator<Item = (Msn, &'a [u8], &'a [u8])>,
    ) -> Option<ShedSummary> {
        let ranges: Vec<(Msn, Vec<u8>, Vec<u8>)> = ranges
            .take(MAX_RANGES + 1)
            .map(|(m, lo, hi)| (m, lo.to_vec(), hi.to_vec()))
            .collect();
        if ranges.len() > MAX_RANGES {
            return None;
        }
        assert!(
            ranges.windows(2).all(|w| w[0].2 <= w[1].1) && ranges.iter().all(|r| r.1 < r.2),
            "a summary's range deletes are sorted and disjoint"
        );
        let words = (points * BITS_PER_KEY).div_ceil(64).max(1);
        let mut s = ShedSummary {
            bits: vec![0; words],
            ranges,
        };
        let mut n = 0;
        for k in keys {
            s.insert(k);
            n += 1;
        }
        assert_eq!(n, points, "a summary's key count");
        Some(s)
    }

    fn probes(&self, key: &[u8]) -> impl Iterator<Item = usize> + '_ {
        let m = (self.bits.len() * 64) as u64;
        let (h1, h2) = hashes(key);
        (0..PROBES).map(move |i| ((h1 as u64 + i as u64 * h2 as u64) % m) as usize)
    }

    fn insert(&mut self, key: &[u8]) {
        let probes: Vec<usize> = self.probes(key).collect();
        for b in probes {
            self.bits[b / 64] |= 1 << (b % 64);
        }
    }

    /// Whether the buffer may hold point messages for `key` (false: it certainly holds none).
    pub(crate) fn may_hold(&self, key: &[u8]) -> bool {
        self.probes(key)
            .all(|b| self.bits[b / 64] & (1 << (b % 64)) != 0)
    }

    /// The MSN of the buffer's range delete covering `key`, if any.
    pub(crate) fn range_covering(&self, key: &[u8]) -> Option<Msn> {
        let i = self.ranges.partition_point(|r| r.1.as_slice() <= key);
        let r = self.ranges.get(i.checked_sub(1)?)?;
        (key < r.2.as_slice()).then_some(r.0)
    }

    /// Whether this summary describes a buffer with these point keys and range deletes: every key
    /// passes the filter, and the range deletes are the same. Checked when the buffer is read back.
    pub(crate) fn describes<'a>(
        &self,
        mut keys: impl Iterator<Item = &'a [u8]>,
        ranges: impl Iterator<Item = (Msn, &'a [u8], &'a [u8])>,
    ) -> bool {
        let mut mine = self.ranges.iter();
        for (m, lo, hi) in ranges {
            match mine.next() {
                Some(r) if r.0 == m && r.1 == lo && r.2 == hi => {}
                _ => return false,
            }
        }
        mine.next().is_none() && keys.all(|k| self.may_hold(k))
    }

    /// Memory held.
    pub(crate) fn mem(&self) -> usize {
        self.bits.len() * 8
            + self
                .ranges
                .iter()
                .map(|r| r.1.len() + r.2.len() + 64)
                .sum::<usize>()
            + 64
    }
}

#[cfg(test)]
mod tests {
    use super::ShedSummary;

    fn keys(n: usize, salt: &str) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| format!("{salt}/{i:08}").into_bytes())
            .collect()
    }

    #[test]
    fn no_false_negatives_and_few_false_positives() {
        let ks = keys(5000, "in");
        let s = ShedSummary::build(
            ks.len(),
            ks.iter().map(|k| k.as_slice()),
            std::iter::empty(),
        )
        .unwrap();
        assert!(
            ks.iter().all(|k| s.may_hold(k)),
            "a key it holds is never denied"
        );
        let others = keys(20_000, "out");
        let fp = others.iter().filter(|k| s.may_hold(k)).count();
        assert!(
            fp < 20_000 / 50,
            "{fp} false positives in 20,000 (more than 2%)"
        );
        assert!(
            s.mem() < 5000 * 2 + 200,
            "about 10 bits per key: {}",
            s.mem()
        );
    }

    #[test]
    fn range_deletes_are_answered_exactly_and_checked_on_reload() {
        let ranges: Vec<(u64, &[u8], &[u8])> = vec![(5, b"b", b"d"), (9, b"f", b"h")];
        let ks = [b"a".as_slice(), b"c", b"x"];
        let s = ShedSummary::build(3, ks.iter().copied(), ranges.iter().copied()).unwrap();
        assert_eq!(s.range_covering(b"a"), None);
        assert_eq!(s.range_covering(b"b"), Some(5));
        assert_eq!(s.range_covering(b"c\xff"), Some(5));
        assert_eq!(s.range_covering(b"d"), None);
        assert_eq!(s.range_covering(b"g"), Some(9));
        assert_eq!(s.range_covering(b"h"), None);
        assert!(s.describes(ks.iter().copied(), ranges.iter().copied()));
        assert!(!s.describes(ks.iter().copied(), ranges[..1].iter().copied()));
        let other: Vec<(u64, &[u8], &[u8])> = vec![(5, b"b", b"d"), (10, b"f", b"h")];
        assert!(!s.describes(ks.iter().copied(), other.iter().copied()));
        // An empty buffer's summary denies every key.
        let empty = ShedSummary::build(0, std::iter::empty(), std::iter::empty()).unwrap();
        assert!(!empty.may_hold(b"anything"));
        assert!(!empty.describes([b"k".as_slice()].into_iter(), std::iter::empty()));
    }

    #[test]
    fn too_many_range_deletes_get_no_summary() {
        let bounds: Vec<(Vec<u8>, Vec<u8>)> = (0..40)
            .map(|i| {
                (
                    format!("{i:03}a").into_bytes(),
                    format!("{i:03}b").into_bytes(),
                )
            })
            .collect();
        let ranges = bounds
            .iter()
            .map(|(lo, hi)| (1u64, lo.as_slice(), hi.as_slice()));
        assert!(ShedSummary::build(0, std::iter::empty(), ranges).is_none());
    }
}
