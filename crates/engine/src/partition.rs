//! A leaf partition: a sorted run of key/value entries packed in one byte vector.
//!
//! The in-memory form is the on-disk form (before compression): `[klen u16][vlen u32][key][value]`
//! repeated, plus an offset table built on load. Lookups are binary searches; updates build a new
//! partition by merging (flushes bring many messages at once, so a merge is the natural unit).
//! The top bit of `vlen` marks an entry whose value is a reference to an out-of-line data block
//! (`dataref.rs`) rather than the value's bytes.

use crate::codec::Dec;
use crate::dataref::{DataRef, Stored, REF_BYTES, REF_MAX};
use crate::error::Result;
use crate::subbytes::{SharedImage, SubBytes};

const ENTRY_HEADER: usize = 6;

/// The bit of an entry's value length that marks a reference.
const REF_FLAG: u32 = 1 << 31;

/// A sorted, immutable run of entries.
#[derive(Clone, Debug, Default)]
pub struct Partition {
    /// The entries: a buffer of its own, or their range of the node image read from the device
    /// (`subbytes.rs`), copied out before a change in place.
    data: SubBytes,
    offs: Vec<u32>,
    /// Entries that are references.
    refs: usize,
    /// The longest encoding of a reference among the entries, 0 when there is none: an upper
    /// bound (not lowered when a reference is replaced or removed in place).
    ref_max: usize,
}

/// Partitions are equal when their entries are ([`Partition::ref_max`] is only a bound).
impl PartialEq for Partition {
    fn eq(&self, other: &Partition) -> bool {
        *self.data == *other.data && self.offs == other.offs && self.refs == other.refs
    }
}

impl Eq for Partition {}

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

    /// Estimated memory footprint, without the node image its entries may lie in (the leaf
    /// charges each image it uses once, [`Partition::part_bytes`]).
    pub fn mem(&self) -> usize {
        self.data.own_capacity() + self.offs.capacity() * 4 + 64
    }

    /// The same entries, in a buffer of their own.
    pub(crate) fn unshared(&self) -> Partition {
        let mut p = self.clone();
        p.data.to_mut();
        p
    }

    /// The entries' bytes, to be charged with [`crate::subbytes::shared_images_mem`].
    pub(crate) fn part_bytes(&self) -> &SubBytes {
        &self.data
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

    /// Byte offset of entry `i` in [`Partition::raw`].
    pub(crate) fn entry_offset(&self, i: usize) -> usize {
        self.offs[i] as usize
    }

    /// The value of `key` in `run`, a run of whole entries cut out of a partition's encoding
    /// (`node/runs.rs`), checking every entry it passes as decoding does (lengths within the
    /// limits and the run, keys in order). `Ok(None)` when the run does not hold `key`.
    pub(crate) fn find_in_run<'a>(
        run: &'a [u8],
        key: &[u8],
        max_key: usize,
        max_value: usize,
    ) -> Result<Option<Stored<'a>>> {
        let mut d = Dec::new(run, "leaf partition run");
        let mut prev: Option<&[u8]> = None;
        while d.remaining() > 0 {
            let (k, v) = next_entry(&mut d, &mut prev, max_key, max_value)?;
            match k.cmp(key) {
                std::cmp::Ordering::Less => {}
                std::cmp::Ordering::Equal => return Ok(Some(v)),
                std::cmp::Ordering::Greater => return Ok(None),
            }
        }
        Ok(None)
    }

    /// Value of entry `i`.
    pub fn value(&self, i: usize) -> Stored<'_> {
        let o = self.offs[i] as usize;
        let kl = u16::from_le_bytes([self.data[o], self.data[o + 1]]) as usize;
        let vl = u32::from_le_bytes(self.data[o + 2..o + 6].try_into().expect("4 bytes"));
        let s = o + ENTRY_HEADER + kl;
        let bytes = &self.data[s..s + (vl & !REF_FLAG) as usize];
        if vl & REF_FLAG != 0 {
            Stored::Ref(bytes)
        } else {
            Stored::Bytes(bytes)
        }
    }

    /// Entries that are references.
    #[cfg(test)]
    pub fn ref_count(&self) -> usize {
        self.refs
    }

    /// At least the longest encoding of a reference among the entries (0: there is none), so
    /// that a flush can tell without a lookup that upserts cannot make a reference here pass its
    /// patch limit (`Tree::inline_heavy_refs`).
    pub fn ref_max(&self) -> usize {
        self.ref_max
    }

    /// The blocks the entries `[a, b)` reference (one per reference).
    pub fn ref_blocks(&self, a: usize, b: usize) -> Vec<u64> {
        if self.refs == 0 {
            return Vec::new();
        }
        (a..b).filter_map(|i| self.value(i).block()).collect()
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
    pub fn get(&self, key: &[u8]) -> Option<Stored<'_>> {
        self.search(key).ok().map(|i| self.value(i))
    }

    /// First index whose key is `>= key`.
    pub fn lower_bound(&self, key: &[u8]) -> usize {
        match self.search(key) {
            Ok(i) | Err(i) => i,
        }
    }

    /// Sets (`Some`) or removes (`None`) the entry for `key` in place (the caller accounts for a
    /// reference it replaces).
    pub fn set(&mut self, key: &[u8], value: Option<Stored<'_>>) {
        let found = self.search(key);
        if let Ok(i) = found {
            self.refs -= usize::from(self.value(i).is_ref());
        }
        self.refs += usize::from(value.is_some_and(|v| v.is_ref()));
        if let Some(Stored::Ref(r)) = value {
            self.ref_max = self.ref_max.max(r.len());
        }
        match (found, value) {
            (Ok(i), Some(v)) => {
                let (start, end) = self.entry_range(i);
                let mut e = Vec::with_capacity(entry_size(key, v));
                encode_entry(&mut e, key, v);
                let delta = e.len() as isize - (end - start) as isize;
                replace_bytes(self.data.to_mut(), start, end, &e);
                self.shift_offsets(i + 1, delta);
            }
            (Ok(i), None) => {
                let (start, end) = self.entry_range(i);
                self.data.to_mut().drain(start..end);
                self.offs.remove(i);
                self.shift_offsets(i, -((end - start) as isize));
            }
            (Err(i), Some(v)) => {
                let start = if i < self.offs.len() {
                    self.offs[i] as usize
                } else {
                    self.data.len()
                };
                let mut e = Vec::with_capacity(entry_size(key, v));
                encode_entry(&mut e, key, v);
                let len = e.len();
                replace_bytes(self.data.to_mut(), start, start, &e);
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

    /// Removes the entries `[a, b)` in place (one memmove; the caller accounts for the
    /// references among them).
    pub fn remove_run(&mut self, a: usize, b: usize) {
        let len = self.run_bytes(a, b);
        if len == 0 {
            return;
        }
        self.refs -= (a..b).filter(|&i| self.value(i).is_ref()).count();
        let start = self.offs[a] as usize;
        self.data.to_mut().drain(start..start + len);
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

    /// Parses a raw payload (a buffer of its own, or a range of a node image used in place),
    /// checking that keys are strictly increasing and lengths in bounds.
    pub fn decode(
        data: impl Into<SubBytes>,
        max_key: usize,
        max_value: usize,
    ) -> Result<Partition> {
        let data = data.into();
        let mut offs = Vec::new();
        let mut refs = 0;
        let mut ref_max = 0;
        {
            let mut d = Dec::new(&data, "leaf partition");
            let mut prev: Option<&[u8]> = None;
            while d.remaining() > 0 {
                offs.push(d.pos() as u32);
                let (_, v) = next_entry(&mut d, &mut prev, max_key, max_value)?;
                if v.is_ref() {
                    refs += 1;
                    ref_max = ref_max.max(v.raw().len());
                }
            }
        }
        Ok(Partition {
            data,
            offs,
            refs,
            ref_max,
        })
    }
}

/// The next entry of a partition's encoding at `d`: its key and value, checked as decoding
/// checks every entry (lengths within the limits and the bytes, a reference well formed, the key
/// above `prev`, which becomes this key).
fn next_entry<'a>(
    d: &mut Dec<'a>,
    prev: &mut Option<&'a [u8]>,
    max_key: usize,
    max_value: usize,
) -> Result<(&'a [u8], Stored<'a>)> {
    let kl = d.u16()? as usize;
    let raw_vl = d.u32()?;
    let is_ref = raw_vl & REF_FLAG != 0;
    let vl = (raw_vl & !REF_FLAG) as usize;
    let max = if is_ref { REF_MAX } else { max_value };
    if kl > max_key || vl > max || (is_ref && vl < REF_BYTES) {
        return Err(d.corrupt(format!("entry lengths {kl}/{vl} out of bounds")));
    }
    let k = d.raw(kl)?;
    let v = d.raw(vl)?;
    if prev.is_some_and(|p| p >= k) {
        return Err(d.corrupt("keys out of order"));
    }
    *prev = Some(k);
    if is_ref {
        DataRef::decode(v, max_value)?;
        return Ok((k, Stored::Ref(v)));
    }
    Ok((k, Stored::Bytes(v)))
}

impl Drop for Partition {
    /// The entries' buffer goes back to the pool for the next partition decoded (`bufpool.rs`).
    fn drop(&mut self) {
        if let Some(own) = self.data.take_own() {
            crate::bufpool::POOL.give(own);
        }
    }
}

/// Builds partitions from entries given in increasing key order.
#[derive(Debug, Default)]
pub struct PartitionBuilder {
    data: Vec<u8>,
    offs: Vec<u32>,
    refs: usize,
    ref_max: usize,
}

impl PartitionBuilder {
    /// A builder with room for `bytes` of entries, in recycled memory where the pool has a buffer
    /// of about that size (`bufpool.rs`): a flush rebuilds partitions all the time, and a fresh
    /// buffer of that size is a new mapping whose every page faults and is zeroed.
    pub fn with_capacity(bytes: usize) -> PartitionBuilder {
        PartitionBuilder {
            data: crate::bufpool::POOL.take(bytes),
            offs: Vec::new(),
            refs: 0,
            ref_max: 0,
        }
    }

    /// Appends an entry; keys must be strictly increasing.
    pub fn push(&mut self, key: &[u8], value: Stored<'_>) {
        assert!(
            self.last_key().is_none_or(|l| l < key),
            "partition keys out of order"
        );
        self.refs += usize::from(value.is_ref());
        if let Stored::Ref(r) = value {
            self.ref_max = self.ref_max.max(r.len());
        }
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

    /// Copies the entries pushed so far into `arena` at `start` (a buffer to be shared by the
    /// partitions placed in it, `subbytes.rs`) and empties the builder for the next partition,
    /// keeping its buffer.
    pub(crate) fn place(&mut self, arena: &mut [u8], start: usize) -> Placed {
        let len = self.data.len();
        arena[start..start + len].copy_from_slice(&self.data);
        self.data.clear();
        Placed {
            start,
            len,
            offs: std::mem::take(&mut self.offs),
            refs: std::mem::replace(&mut self.refs, 0),
            ref_max: std::mem::replace(&mut self.ref_max, 0),
        }
    }

    /// The finished partition.
    pub fn finish(mut self) -> Partition {
        // Give back a large unused tail only (a reallocation copies the whole partition).
        if self.data.capacity() > self.data.len() + self.data.len() / 4 + 4096 {
            self.data.shrink_to_fit();
        }
        self.offs.shrink_to_fit();
        Partition {
            data: SubBytes::Own(self.data),
            offs: self.offs,
            refs: self.refs,
            ref_max: self.ref_max,
        }
    }
}

/// A partition's entries copied into a buffer not yet shared ([`PartitionBuilder::place`]): where
/// they are, and their index.
pub(crate) struct Placed {
    start: usize,
    len: usize,
    offs: Vec<u32>,
    refs: usize,
    ref_max: usize,
}

impl Placed {
    /// Bytes placed.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The partition, once the buffer it was placed in is shared as `image`.
    pub(crate) fn into_partition(self, image: &SharedImage) -> Partition {
        assert!(
            self.offs.last().is_none_or(|&o| (o as usize) < self.len),
            "a placed partition's index past its bytes"
        );
        Partition {
            data: SubBytes::in_image(image, self.start, self.len),
            offs: self.offs,
            refs: self.refs,
            ref_max: self.ref_max,
        }
    }
}

fn encode_entry(out: &mut Vec<u8>, key: &[u8], value: Stored<'_>) {
    assert!(
        key.len() <= u16::MAX as usize,
        "key length exceeds the format"
    );
    let raw = value.raw();
    assert!(
        raw.len() < REF_FLAG as usize,
        "value length exceeds the format"
    );
    let flag = match value {
        Stored::Ref(r) => {
            assert!(
                (REF_BYTES..=REF_MAX).contains(&r.len()),
                "a reference of {} bytes in a partition",
                r.len()
            );
            REF_FLAG
        }
        Stored::Bytes(_) => 0,
    };
    out.extend_from_slice(&(key.len() as u16).to_le_bytes());
    out.extend_from_slice(&(raw.len() as u32 | flag).to_le_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(raw);
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
pub fn entry_size(key: &[u8], value: Stored<'_>) -> usize {
    ENTRY_HEADER + key.len() + value.raw().len()
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
            b.push(
                format!("k{i:04}").as_bytes(),
                Stored::Bytes(&i.to_le_bytes()),
            );
        }
        let p = b.finish();
        assert_eq!(p.len(), 100);
        assert_eq!(p.get(b"k0042"), Some(Stored::Bytes(&42u32.to_le_bytes())));
        assert_eq!(p.get(b"k0042x"), None);
        assert_eq!(p.lower_bound(b"k0042x"), 43);
        let q = Partition::decode(p.raw().to_vec(), 100, 100).unwrap();
        assert_eq!(p, q);
        // In-place edits keep the encoding valid and sorted.
        let mut r = q.clone();
        r.set(b"k0042", Some(Stored::Bytes(b"changed value")));
        r.set(b"k0042a", Some(Stored::Bytes(b"new")));
        r.set(b"k0000", None);
        r.set(b"zzz", Some(Stored::Bytes(b"")));
        assert_eq!(r.get(b"k0042"), Some(Stored::Bytes(b"changed value")));
        assert_eq!(r.get(b"k0042a"), Some(Stored::Bytes(b"new")));
        assert_eq!(r.get(b"k0000"), None);
        assert_eq!(r.len(), 101);
        assert_eq!(Partition::decode(r.raw().to_vec(), 100, 100).unwrap(), r);
        // References: flagged, counted, found again after a decode, and checked when decoded.
        let reference = DataRef::new(9, 3).to_bytes();
        r.set(b"k0001", Some(Stored::Ref(&reference)));
        r.set(b"k0002", Some(Stored::Ref(&reference)));
        assert_eq!(r.ref_count(), 2);
        r.set(b"k0002", Some(Stored::Bytes(b"x")));
        assert_eq!(r.ref_count(), 1);
        assert_eq!(r.get(b"k0001"), Some(Stored::Ref(&reference)));
        assert_eq!(r.ref_blocks(0, r.len()), vec![9]);
        let back = Partition::decode(r.raw().to_vec(), 100, 100).unwrap();
        assert_eq!((back.ref_count(), &back), (1, &r));
        // The longest reference is known without a lookup, built, set or decoded; an upper bound
        // once a longer one is replaced in place.
        let mut patched = DataRef::new(9, 3);
        patched.push(crate::msg::Patch::Write {
            offset: 0,
            data: vec![1; 20],
        });
        let long = patched.to_bytes();
        assert_eq!((p.ref_max(), back.ref_max()), (0, REF_BYTES));
        r.set(b"k0003", Some(Stored::Ref(&long)));
        assert_eq!(r.ref_max(), long.len());
        let mut built = PartitionBuilder::default();
        built.push(b"a", Stored::Ref(&reference));
        built.push(b"b", Stored::Ref(&long));
        assert_eq!(built.finish().ref_max(), long.len());
        r.set(b"k0003", Some(Stored::Ref(&reference)));
        assert_eq!(r.ref_max(), long.len(), "a bound, not lowered in place");
        let back = Partition::decode(r.raw().to_vec(), 100, 100).unwrap();
        assert_eq!((back.ref_max(), &back), (REF_BYTES, &r));
        r.remove_run(0, 3);
        assert_eq!(r.ref_count(), 0);
        let mut short = PartitionBuilder::default();
        short.push(b"a", Stored::Bytes(&reference[..11]));
        let mut raw = short.finish().raw().to_vec();
        raw[5] |= 0x80; // an 11-byte value flagged as a reference
        assert!(Partition::decode(raw, 100, 100).is_err());
        let mut bad = p.raw().to_vec();
        bad.truncate(bad.len() - 1);
        assert!(Partition::decode(bad, 100, 100).is_err());
    }
}
