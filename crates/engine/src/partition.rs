//! A leaf partition: a sorted run of key/value entries packed in one byte vector.
//!
//! The in-memory form is the on-disk form (before compression): `[klen u16][vlen u32][key][value]`
//! repeated, plus an offset table built on load. Lookups are binary searches; updates build a new
//! partition by merging (flushes bring many messages at once, so a merge is the natural unit).

use crate::codec::Dec;
use crate::error::Result;

const ENTRY_HEADER: usize = 6;

/// A sorted, immutable run of entries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Partition {
    data: Vec<u8>,
    offs: Vec<u32>,
}

impl Partition {
    /// An empty partition.
    pub fn empty() -> Partition {
        Partition::default()
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.offs.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.offs.is_empty()
    }

    /// Encoded size in bytes.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Estimated memory footprint.
    pub fn mem(&self) -> usize {
        self.data.capacity() + self.offs.capacity() * 4 + 64
    }

    /// The raw encoded entries (the partition's on-disk payload).
    pub fn raw(&self) -> &[u8] {
        &self.data
    }

    /// Key of entry `i`.
    pub fn key(&self, i: usize) -> &[u8] {
        let o = self.offs[i] as usize;
        let kl = u16::from_le_bytes([self.data[o], self.data[o + 1]]) as usize;
        &self.data[o + ENTRY_HEADER..o + ENTRY_HEADER + kl]
    }

    /// Value of entry `i`.
    pub fn value(&self, i: usize) -> &[u8] {
        let o = self.offs[i] as usize;
        let kl = u16::from_le_bytes([self.data[o], self.data[o + 1]]) as usize;
        let vl = u32::from_le_bytes(self.data[o + 2..o + 6].try_into().expect("4 bytes")) as usize;
        let s = o + ENTRY_HEADER + kl;
        &self.data[s..s + vl]
    }

    /// Binary search for `key`: `Ok(index)` if present, `Err(insertion point)` otherwise.
    pub fn search(&self, key: &[u8]) -> Result<usize, usize> {
        let (mut lo, mut hi) = (0usize, self.offs.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            match self.key(mid).cmp(key) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Ok(mid),
            }
        }
        Err(lo)
    }

    /// The value stored for `key`.
    pub fn get(&self, key: &[u8]) -> Option<&[u8]> {
        self.search(key).ok().map(|i| self.value(i))
    }

    /// First index whose key is `>= key`.
    pub fn lower_bound(&self, key: &[u8]) -> usize {
        match self.search(key) {
            Ok(i) | Err(i) => i,
        }
    }

    /// Sets (`Some`) or removes (`None`) the entry for `key` in place.
    pub fn set(&mut self, key: &[u8], value: Option<&[u8]>) {
        match (self.search(key), value) {
            (Ok(i), Some(v)) => {
                let (start, end) = self.entry_range(i);
                let mut e = Vec::with_capacity(ENTRY_HEADER + key.len() + v.len());
                encode_entry(&mut e, key, v);
                let delta = e.len() as isize - (end - start) as isize;
                replace_bytes(&mut self.data, start, end, &e);
                self.shift_offsets(i + 1, delta);
            }
            (Ok(i), None) => {
                let (start, end) = self.entry_range(i);
                self.data.drain(start..end);
                self.offs.remove(i);
                self.shift_offsets(i, -((end - start) as isize));
            }
            (Err(i), Some(v)) => {
                let start = if i < self.offs.len() {
                    self.offs[i] as usize
                } else {
                    self.data.len()
                };
                let mut e = Vec::with_capacity(ENTRY_HEADER + key.len() + v.len());
                encode_entry(&mut e, key, v);
                let len = e.len();
                replace_bytes(&mut self.data, start, start, &e);
                self.offs.insert(i, start as u32);
                self.shift_offsets(i + 1, len as isize);
            }
            (Err(_), None) => {}
        }
    }

    /// The entries `[a, b)` by index (as for a range delete: from `lower_bound(lo)` to
    /// `lower_bound(hi)`), and their encoded bytes.
    pub fn run_bytes(&self, a: usize, b: usize) -> usize {
        assert!(
            a <= b && b <= self.offs.len(),
            "entry run {a}..{b} of {}",
            self.offs.len()
        );
        if a == b {
            return 0;
        }
        let end = if b < self.offs.len() {
            self.offs[b] as usize
        } else {
            self.data.len()
        };
        end - self.offs[a] as usize
    }

    /// Removes the entries `[a, b)` in place (one memmove).
    pub fn remove_run(&mut self, a: usize, b: usize) {
        let len = self.run_bytes(a, b);
        if len == 0 {
            return;
        }
        let start = self.offs[a] as usize;
        self.data.drain(start..start + len);
        self.offs.drain(a..b);
        self.shift_offsets(a, -(len as isize));
    }

    fn entry_range(&self, i: usize) -> (usize, usize) {
        let start = self.offs[i] as usize;
        let end = if i + 1 < self.offs.len() {
            self.offs[i + 1] as usize
        } else {
            self.data.len()
        };
        (start, end)
    }

    fn shift_offsets(&mut self, from: usize, delta: isize) {
        for o in &mut self.offs[from..] {
            *o = (*o as isize + delta) as u32;
        }
    }

    /// Parses a raw payload, checking that keys are strictly increasing and lengths in bounds.
    pub fn decode(data: Vec<u8>, max_key: usize, max_value: usize) -> Result<Partition> {
        let mut offs = Vec::new();
        {
            let mut d = Dec::new(&data, "leaf partition");
            let mut prev: Option<&[u8]> = None;
            while d.remaining() > 0 {
                offs.push(d.pos() as u32);
                let kl = d.u16()? as usize;
                let vl = d.u32()? as usize;
                if kl > max_key || vl > max_value {
                    return Err(d.corrupt(format!("entry lengths {kl}/{vl} out of bounds")));
                }
                let k = d.raw(kl)?;
                d.raw(vl)?;
                if prev.is_some_and(|p| p >= k) {
                    return Err(d.corrupt("keys out of order"));
                }
                prev = Some(k);
            }
        }
        Ok(Partition { data, offs })
    }
}

impl Drop for Partition {
    /// The entries' buffer goes back to the pool for the next partition decoded (`bufpool.rs`).
    fn drop(&mut self) {
        crate::bufpool::POOL.give(std::mem::take(&mut self.data));
    }
}

/// Builds partitions from entries given in increasing key order.
#[derive(Debug, Default)]
pub struct PartitionBuilder {
    data: Vec<u8>,
    offs: Vec<u32>,
}

impl PartitionBuilder {
    /// A builder with room for `bytes` of entries.
    pub fn with_capacity(bytes: usize) -> PartitionBuilder {
        PartitionBuilder {
            data: Vec::with_capacity(bytes),
            offs: Vec::new(),
        }
    }

    /// Appends an entry; keys must be strictly increasing.
    pub fn push(&mut self, key: &[u8], value: &[u8]) {
        assert!(
            self.last_key().is_none_or(|l| l < key),
            "partition keys out of order"
        );
        self.offs.push(self.data.len() as u32);
        encode_entry(&mut self.data, key, value);
    }

    /// The key of the last entry pushed.
    pub fn last_key(&self) -> Option<&[u8]> {
        let o = *self.offs.last()? as usize;
        let kl = u16::from_le_bytes([self.data[o], self.data[o + 1]]) as usize;
        Some(&self.data[o + ENTRY_HEADER..o + ENTRY_HEADER + kl])
    }

    /// Bytes pushed so far.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Whether nothing was pushed.
    pub fn is_empty(&self) -> bool {
        self.offs.is_empty()
    }

    /// The finished partition.
    pub fn finish(mut self) -> Partition {
        // Give back a large unused tail only (a reallocation copies the whole partition).
        if self.data.capacity() > self.data.len() + self.data.len() / 4 + 4096 {
            self.data.shrink_to_fit();
        }
        self.offs.shrink_to_fit();
        Partition {
            data: self.data,
            offs: self.offs,
        }
    }
}

fn encode_entry(out: &mut Vec<u8>, key: &[u8], value: &[u8]) {
    assert!(
        key.len() <= u16::MAX as usize,
        "key length exceeds the format"
    );
    out.extend_from_slice(&(key.len() as u16).to_le_bytes());
    out.extend_from_slice(&(value.len() as u32).to_le_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(value);
}

/// Replaces `data[start..end]` with `new`, moving the tail with one `memmove` (`Vec::splice`
/// copies the replacement byte by byte: 15 % of the daemon's CPU on 4 KiB overwrites).
fn replace_bytes(data: &mut Vec<u8>, start: usize, end: usize, new: &[u8]) {
    assert!(
        start <= end && end <= data.len(),
        "range {start}..{end} of {}",
        data.len()
    );
    let (old, len) = (end - start, data.len());
    if new.len() > old {
        let grow = new.len() - old;
        data.resize(len + grow, 0);
        data.copy_within(end..len, end + grow);
    } else if new.len() < old {
        data.copy_within(end..len, start + new.len());
        data.truncate(len - (old - new.len()));
    }
    data[start..start + new.len()].copy_from_slice(new);
}

/// Encoded size of an entry.
pub fn entry_size(key: &[u8], value: &[u8]) -> usize {
    ENTRY_HEADER + key.len() + value.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replace_bytes_grows_shrinks_and_keeps_the_tail() {
        for (start, end, new) in [
            (1, 3, &b"XYZW"[..]),
            (1, 3, b"X"),
            (2, 2, b"QQ"),
            (0, 5, b""),
        ] {
            let mut v = b"abcde".to_vec();
            let mut want = v.clone();
            want.splice(start..end, new.iter().copied());
            replace_bytes(&mut v, start, end, new);
            assert_eq!(v, want, "{start}..{end} <- {new:?}");
        }
    }

    #[test]
    fn build_search_decode() {
        let mut b = PartitionBuilder::default();
        for i in 0..100u32 {
            b.push(format!("k{i:04}").as_bytes(), &i.to_le_bytes());
        }
        let p = b.finish();
        assert_eq!(p.len(), 100);
        assert_eq!(p.get(b"k0042"), Some(&42u32.to_le_bytes()[..]));
        assert_eq!(p.get(b"k0042x"), None);
        assert_eq!(p.lower_bound(b"k0042x"), 43);
        let q = Partition::decode(p.raw().to_vec(), 100, 100).unwrap();
        assert_eq!(p, q);
        // In-place edits keep the encoding valid and sorted.
        let mut r = q.clone();
        r.set(b"k0042", Some(b"changed value"));
        r.set(b"k0042a", Some(b"new"));
        r.set(b"k0000", None);
        r.set(b"zzz", Some(b""));
        assert_eq!(r.get(b"k0042"), Some(&b"changed value"[..]));
        assert_eq!(r.get(b"k0042a"), Some(&b"new"[..]));
        assert_eq!(r.get(b"k0000"), None);
        assert_eq!(r.len(), 101);
        assert_eq!(Partition::decode(r.raw().to_vec(), 100, 100).unwrap(), r);
        let mut bad = p.raw().to_vec();
        bad.truncate(bad.len() - 1);
        assert!(Partition::decode(bad, 100, 100).is_err());
    }
}
