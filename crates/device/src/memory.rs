//! A device held in memory.

use std::io;

use parking_lot::RwLock;

use crate::{check_request, BlockDevice, IoCounters, IoStats, BLOCK_SIZE};

/// A device backed by a byte vector. Writes are durable immediately; `flush` only counts.
#[derive(Debug)]
pub struct MemDevice {
    data: RwLock<Vec<u8>>,
    counters: IoCounters,
}

impl MemDevice {
    /// A zero-filled device of `len` bytes (rounded down to whole blocks).
    pub fn new(len: u64) -> MemDevice {
        let len = (len / BLOCK_SIZE as u64 * BLOCK_SIZE as u64) as usize;
        MemDevice::from_bytes(vec![0; len])
    }

    /// A device holding exactly `bytes` (truncated to whole blocks).
    pub fn from_bytes(mut bytes: Vec<u8>) -> MemDevice {
        bytes.truncate(bytes.len() / BLOCK_SIZE * BLOCK_SIZE);
        MemDevice {
            data: RwLock::new(bytes),
            counters: IoCounters::default(),
        }
    }

    /// A copy of the whole device contents.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.data.read().clone()
    }

    /// Runs `f` on the contents (for tests that damage an image on purpose).
    pub fn with_bytes_mut<R>(&self, f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
        f(&mut self.data.write())
    }
}

impl BlockDevice for MemDevice {
    fn len(&self) -> u64 {
        self.data.read().len() as u64
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let data = self.data.read();
        check_request(data.len() as u64, offset, buf.len())?;
        let off = offset as usize;
        buf.copy_from_slice(&data[off..off + buf.len()]);
        self.counters.read(buf.len());
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        let mut data = self.data.write();
        check_request(data.len() as u64, offset, buf.len())?;
        let off = offset as usize;
        data[off..off + buf.len()].copy_from_slice(buf);
        self.counters.write(buf.len());
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        self.counters.flush();
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let mut data = self.data.write();
        check_request(data.len() as u64, offset, len as usize)?;
        let off = offset as usize;
        data[off..off + len as usize].fill(0);
        self.counters.discard(len);
        Ok(())
    }

    fn describe(&self) -> String {
        format!("memory device ({} bytes)", self.len())
    }

    fn io_stats(&self) -> IoStats {
        self.counters.snapshot()
    }
}
