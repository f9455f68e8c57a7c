//! The data of an [`crate::Op::PutBlocks`]: whole 4 KiB blocks in a buffer the device writes as it
//! is (a slot of the pool of huge pages in `writebuf.rs`, so that a 1 MiB run is one device
//! request); once written, where they went and their checksums.

use std::sync::Arc;

use amaranth_device::BLOCK_SIZE;

use crate::writebuf::PooledBuf;

/// The data of a [`crate::Op::PutBlocks`]: whole 4 KiB blocks, one per key. Built from bytes
/// ([`BlockData::copy_from`]); once the engine has written them out of line, or when a log record
/// is read back, it holds where they went and their checksums instead.
#[derive(Clone)]
pub struct BlockData(BlockState);

#[derive(Clone)]
enum BlockState {
    /// The bytes (the first `usize` of the buffer), aligned for the device.
    Bytes(Arc<PooledBuf>, usize),
    /// Written at consecutive blocks from `start`, with each block's crc32c.
    Placed { start: u64, crcs: Vec<u32> },
}

impl BlockData {
    /// Copies `bytes` (a whole number of 4 KiB blocks) into a buffer the device can write as it is.
    pub fn copy_from(bytes: &[u8]) -> BlockData {
        let mut buf = PooledBuf::get(bytes.len());
        buf.as_mut_slice()[..bytes.len()].copy_from_slice(bytes);
        BlockData(BlockState::Bytes(Arc::new(buf), bytes.len()))
    }

    /// Blocks written at `start` with these checksums (a log record read back).
    pub(crate) fn placed_at(start: u64, crcs: Vec<u32>) -> BlockData {
        BlockData(BlockState::Placed { start, crcs })
    }

    /// The bytes, before the engine writes them (`None` once placed).
    pub fn bytes(&self) -> Option<&[u8]> {
        match &self.0 {
            BlockState::Bytes(b, len) => Some(&b[..*len]),
            BlockState::Placed { .. } => None,
        }
    }

    /// The buffer holding the bytes and their length, shared (for a write that outlives the
    /// call that submitted it).
    pub(crate) fn shared(&self) -> Option<(Arc<PooledBuf>, usize)> {
        match &self.0 {
            BlockState::Bytes(b, len) => Some((b.clone(), *len)),
            BlockState::Placed { .. } => None,
        }
    }

    /// Bytes of data (4 KiB per block).
    pub fn len(&self) -> usize {
        match &self.0 {
            BlockState::Bytes(_, len) => *len,
            BlockState::Placed { crcs, .. } => crcs.len() * BLOCK_SIZE,
        }
    }

    /// Whether there is no block.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where the blocks went: the first block and each block's crc32c (`None` before).
    pub(crate) fn placed(&self) -> Option<(u64, &[u32])> {
        match &self.0 {
            BlockState::Placed { start, crcs } => Some((*start, crcs)),
            BlockState::Bytes(..) => None,
        }
    }

    /// Records that the blocks were written from block `start` on.
    pub(crate) fn place(&mut self, start: u64) {
        let crcs = self
            .bytes()
            .expect("placed once")
            .chunks_exact(BLOCK_SIZE)
            .map(crate::codec::crc)
            .collect();
        self.0 = BlockState::Placed { start, crcs };
    }
}

impl PartialEq for BlockData {
    fn eq(&self, other: &BlockData) -> bool {
        match (&self.0, &other.0) {
            (BlockState::Bytes(..), BlockState::Bytes(..)) => self.bytes() == other.bytes(),
            (
                BlockState::Placed { start: a, crcs: x },
                BlockState::Placed { start: b, crcs: y },
            ) => a == b && x == y,
            _ => false,
        }
    }
}

impl Eq for BlockData {}

impl std::fmt::Debug for BlockData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            BlockState::Bytes(_, len) => write!(f, "BlockData({} blocks)", len / BLOCK_SIZE),
            BlockState::Placed { start, crcs } => {
                write!(f, "BlockData({} blocks at {start})", crcs.len())
            }
        }
    }
}
