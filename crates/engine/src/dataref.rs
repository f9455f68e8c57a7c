//! References to out-of-line data blocks (docs/WRITEONCE.md), and the two forms a stored value
//! takes: bytes ([`Val::Bytes`]), or a reference ([`Val::Ref`]) to one 4 KiB block written once by
//! [`crate::Batch::put_blocks`], with its crc32c and the patches (upserts) applied to it since,
//! which are applied when the block is read. A blind upsert onto a reference stays blind: it is
//! appended to the reference. Once a reference's patches pass [`REF_PATCH_LIMIT`] bytes, the
//! leaf that receives it reads the block and keeps the patched value inline instead
//! (`tree/materialize.rs`).
//!
//! Encoding (in leaf partitions and buffer messages): `block u64, crc32c u32`, then the patches
//! in order, each as [`Patch`] encodes it; a reference is 12 bytes without patches.

use amaranth_device::BLOCK_SIZE;

use crate::codec::{Dec, Enc};
use crate::error::{Error, Result};
use crate::msg::Patch;

/// Bytes of a reference without patches.
pub const REF_BYTES: usize = 12;

/// The most bytes of patches a reference stored in a leaf carries (past it, the leaf keeps the
/// patched value inline).
pub const REF_PATCH_LIMIT: usize = 1024;

/// The longest encoding of a reference a leaf stores.
pub const REF_MAX: usize = REF_BYTES + REF_PATCH_LIMIT;

/// A reference to one out-of-line data block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataRef {
    /// The device block holding the data.
    pub block: u64,
    /// crc32c of the block's 4 KiB.
    pub crc: u32,
    /// Patches applied, in order, to the block's bytes.
    pub patches: Vec<Patch>,
}

impl DataRef {
    /// A reference to `block` with crc32c `crc`, not patched.
    pub fn new(block: u64, crc: u32) -> DataRef {
        DataRef {
            block,
            crc,
            patches: Vec::new(),
        }
    }

    /// Bytes of the encoding.
    pub fn encoded_len(&self) -> usize {
        REF_BYTES + self.patch_bytes()
    }

    /// Bytes of the patches' encoding.
    pub fn patch_bytes(&self) -> usize {
        self.patches.iter().map(Patch::size).sum()
    }

    /// Appends the encoding.
    pub fn encode(&self, e: &mut Enc) {
        e.u64(self.block);
        e.u32(self.crc);
        for p in &self.patches {
            p.encode(e);
        }
    }

    /// The encoding.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut e = Enc::with_capacity(self.encoded_len());
        self.encode(&mut e);
        e.buf
    }

    /// Parses an encoding (every byte of `bytes`), checking each patch against `max_value`.
    pub fn decode(bytes: &[u8], max_value: usize) -> Result<DataRef> {
        let mut d = Dec::new(bytes, "data reference");
        let block = d.u64()?;
        let crc = d.u32()?;
        let mut patches = Vec::new();
        while d.remaining() > 0 {
            patches.push(Patch::decode(&mut d, max_value)?);
        }
        Ok(DataRef {
            block,
            crc,
            patches,
        })
    }

    /// Parses an encoding the engine wrote and checked when it was read (a partition or a
    /// chunk's overlay).
    pub fn decode_checked(bytes: &[u8]) -> DataRef {
        DataRef::decode(bytes, usize::MAX).expect("a checked data reference")
    }

    /// Adds a patch applied after the others (folded into the last one where the result is the
    /// same).
    pub fn push(&mut self, p: Patch) {
        if let Some(last) = self.patches.last_mut() {
            if last.absorb(&p) {
                return;
            }
        }
        self.patches.push(p);
    }

    /// The value: the block's bytes `data` with the patches applied.
    pub fn resolve(&self, data: &[u8]) -> Vec<u8> {
        assert_eq!(data.len(), BLOCK_SIZE, "a data block is one block");
        self.patches
            .iter()
            .try_fold(data.to_vec(), |v, p| p.apply(Some(v)))
            .expect("a patched block is present")
    }

    /// The length of the value (the block's 4 KiB with the patches applied), without the data.
    pub fn value_len(&self) -> usize {
        self.patches.iter().fold(BLOCK_SIZE, |len, p| match p {
            Patch::Write { offset, data } => len.max(*offset as usize + data.len()),
            Patch::Truncate { len: t } => len.min(*t as usize),
        })
    }

    /// Checks a block's bytes against the reference's crc32c: a mismatch is damage, named by
    /// `what` (the key) and the block's device offset.
    pub fn check(&self, data: &[u8], what: impl FnOnce() -> String) -> Result<()> {
        if crate::codec::crc(data) != self.crc {
            return Err(Error::Checksum {
                what: format!("data block {} of {}", self.block, what()),
                offset: self.block * BLOCK_SIZE as u64,
            });
        }
        Ok(())
    }
}

/// A value as the tree holds it after pending messages are applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Val {
    /// The bytes themselves.
    Bytes(Vec<u8>),
    /// An out-of-line block (read when the value is wanted).
    Ref(DataRef),
}

impl Val {
    /// This value with `p` applied after it (`None`: no value).
    pub fn patched(old: Option<Val>, p: &Patch) -> Option<Val> {
        match old {
            Some(Val::Ref(mut r)) => {
                r.push(p.clone());
                Some(Val::Ref(r))
            }
            Some(Val::Bytes(v)) => p.apply(Some(v)).map(Val::Bytes),
            None => p.apply(None).map(Val::Bytes),
        }
    }

    /// The value as a partition stores it (a reference encoded).
    pub fn encoded(&self) -> StoredBuf {
        match self {
            Val::Bytes(b) => StoredBuf::Bytes(b.clone()),
            Val::Ref(r) => StoredBuf::Ref(r.to_bytes()),
        }
    }
}

/// A stored value borrowed from a partition or a chunk: bytes, or an encoded reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored<'a> {
    /// The bytes themselves.
    Bytes(&'a [u8]),
    /// An encoded [`DataRef`].
    Ref(&'a [u8]),
}

impl<'a> Stored<'a> {
    /// The stored bytes (a reference's encoding for a reference).
    pub fn raw(&self) -> &'a [u8] {
        match self {
            Stored::Bytes(b) | Stored::Ref(b) => b,
        }
    }

    /// Whether this is a reference.
    pub fn is_ref(&self) -> bool {
        matches!(self, Stored::Ref(_))
    }

    /// The referenced block, for a reference.
    pub fn block(&self) -> Option<u64> {
        match self {
            Stored::Ref(r) => Some(u64::from_le_bytes(
                r[..8].try_into().expect("a reference holds a block"),
            )),
            Stored::Bytes(_) => None,
        }
    }

    /// An owned value.
    pub fn to_val(self) -> Val {
        match self {
            Stored::Bytes(b) => Val::Bytes(b.to_vec()),
            Stored::Ref(r) => Val::Ref(DataRef::decode_checked(r)),
        }
    }
}

/// An owned stored value: bytes, or an encoded reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoredBuf {
    /// The bytes themselves.
    Bytes(Vec<u8>),
    /// An encoded [`DataRef`].
    Ref(Vec<u8>),
}

impl StoredBuf {
    /// Borrowed.
    pub fn as_stored(&self) -> Stored<'_> {
        match self {
            StoredBuf::Bytes(b) => Stored::Bytes(b),
            StoredBuf::Ref(r) => Stored::Ref(r),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::tests::w;

    #[test]
    fn a_reference_round_trips_and_applies_its_patches_in_order() {
        let mut r = DataRef::new(77, 0xdead_beef);
        assert_eq!(r.to_bytes().len(), REF_BYTES);
        r.push(w(10, b"ab"));
        r.push(w(12, b"cd")); // folded into the first
        r.push(Patch::Truncate { len: 100 });
        r.push(w(200, b"z"));
        assert_eq!(r.patches.len(), 3);
        let enc = r.to_bytes();
        assert_eq!(enc.len(), r.encoded_len());
        assert_eq!(DataRef::decode(&enc, 4096).unwrap(), r);
        assert!(DataRef::decode(&enc[..enc.len() - 1], 4096).is_err());
        let data = vec![7u8; BLOCK_SIZE];
        let v = r.resolve(&data);
        assert_eq!(v.len(), r.value_len());
        assert_eq!(v.len(), 201);
        assert_eq!(&v[8..15], &[7, 7, b'a', b'b', b'c', b'd', 7]);
        assert!(v[100..200].iter().all(|&b| b == 0));
        assert_eq!(v[200], b'z');
        // A patched reference and the same patches on the bytes give the same value.
        let mut bytes = Some(Val::Bytes(data.clone()));
        let mut refd = Some(Val::Ref(DataRef::new(77, 0)));
        for p in [w(4090, b"0123456789"), Patch::Truncate { len: 4095 }] {
            bytes = Val::patched(bytes, &p);
            refd = Val::patched(refd, &p);
        }
        let Some(Val::Ref(r)) = refd else {
            panic!("still a reference")
        };
        assert_eq!(Some(Val::Bytes(r.resolve(&data))), bytes);
    }
}
