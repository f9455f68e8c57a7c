//! Out-of-line data on the device (docs/WRITEONCE.md): writing a batch's blocks to a fresh extent
//! before its record is logged, settling the extent once the record is (or is not), and reading
//! referenced blocks back, one device request per run of consecutive blocks, each block checked
//! against its reference's crc32c.

use std::sync::atomic::Ordering;

use std::sync::Arc;

use amaranth_device::{AlignedBuf, BLOCK_SIZE};

use crate::dataref::DataRef;
use crate::engine::BlockRead;
use crate::error::{Error, Result};
use crate::store::Store;
use crate::superblock::Extent;
use crate::writebuf::PooledBuf;

/// When the free extent at the data cursor cannot take a write, the next data extent starts the
/// smallest free extent that holds this many blocks (64 MiB), so that the writes after it follow
/// contiguously.
const DATA_RUN_WANT: u64 = 16384;

/// Blocks read with one device request at most.
const MAX_READ_RUN: usize = 256;

/// Writes the value window of `r` into `window` (one block): the block's bytes with the
/// reference's patches applied, zeros past the value's end (as a file's missing tail reads).
fn resolve_window(r: &DataRef, window: &mut [u8]) {
    if r.patches.is_empty() {
        return;
    }
    let v = r.resolve(window);
    let n = v.len().min(BLOCK_SIZE);
    window[..n].copy_from_slice(&v[..n]);
    window[n..].fill(0);
}

impl Store {
    /// Writes `len` bytes of `buf` (whole blocks) to a freshly allocated extent, placed after the
    /// previous data extent when that space is free: handed to the data writers
    /// (`datawriter.rs`), or written here when none runs. The extent counts as being written until
    /// [`Store::settle_data`].
    pub(crate) fn write_data(&self, buf: Arc<PooledBuf>, len: usize) -> Result<Extent> {
        assert!(
            len > 0 && len.is_multiple_of(BLOCK_SIZE),
            "out-of-line data is whole blocks"
        );
        let blocks = (len / BLOCK_SIZE) as u64;
        let ext = {
            let mut d = self.data.lock();
            let mut b = self.btt.lock();
            let e = b
                .alloc
                .alloc_next(blocks, d.cursor, blocks.max(DATA_RUN_WANT))
                .ok_or_else(|| Error::NoSpace(format!("no free extent of {len} bytes for data")))?;
            d.cursor = Some(e.block + e.blocks);
            d.writing += e.blocks;
            e
        };
        if let Err(err) = self.writer.write(&*self.dev, ext, buf, len) {
            self.settle_data(ext, false);
            self.write_failure.lock().get_or_insert_with(|| err.clone());
            return Err(err);
        }
        self.counters.data_writes.fetch_add(1, Ordering::Relaxed);
        self.counters
            .data_bytes_written
            .fetch_add(len as u64, Ordering::Relaxed);
        Ok(ext)
    }

    /// Ends the write of the data extent `ext`: its blocks get their first reference (the record
    /// naming them was logged), or go back to the free space once a write in flight over them is
    /// done (it was not).
    pub(crate) fn settle_data(&self, ext: Extent, referenced: bool) {
        if !referenced {
            // A failed write is as good as done: the blocks hold nothing anyone names.
            let _ = self.writer.wait_range(ext.block, ext.blocks);
        }
        let mut d = self.data.lock();
        assert!(d.writing >= ext.blocks, "more data settled than written");
        d.writing -= ext.blocks;
        if referenced {
            d.refs.add(ext.block, ext.blocks);
        } else {
            self.btt.lock().alloc.free(ext);
        }
    }

    /// Reads the blocks `places` name into `dest`, checking each against its crc32c and (with
    /// `patch`) applying its patches: one request per run of consecutive blocks (read straight
    /// into `dest` when the run fills a 4 KiB-aligned span of it). A mismatch is a checksum error
    /// naming the key.
    pub(crate) fn read_data(
        &self,
        places: &[BlockRead<'_>],
        dest: &mut [u8],
        patch: bool,
    ) -> Result<()> {
        let mut i = 0;
        while i < places.len() {
            let first = &places[i];
            let mut j = i + 1;
            while j < places.len()
                && j - i < MAX_READ_RUN
                && places[j].block.block() == places[j - 1].block.block() + 1
            {
                j += 1;
            }
            let run = &places[i..j];
            let offset = first.block.block() * BLOCK_SIZE as u64;
            let len = run.len() * BLOCK_SIZE;
            let direct = run.iter().enumerate().all(|(x, p)| {
                p.from == 0 && p.len == BLOCK_SIZE && p.at == first.at + x * BLOCK_SIZE
            }) && (dest[first.at..].as_ptr() as usize).is_multiple_of(BLOCK_SIZE);
            if direct {
                let span = &mut dest[first.at..first.at + len];
                self.read_data_span(offset, span)?;
                for (p, window) in run.iter().zip(span.chunks_exact_mut(BLOCK_SIZE)) {
                    p.block.0.check(window, || key_name(p.key))?;
                    if patch {
                        resolve_window(&p.block.0, window);
                    }
                }
            } else {
                let mut buf = AlignedBuf::zeroed(len);
                self.read_data_span(offset, &mut buf)?;
                for (p, window) in run.iter().zip(buf.chunks_exact_mut(BLOCK_SIZE)) {
                    p.block.0.check(window, || key_name(p.key))?;
                    if patch {
                        resolve_window(&p.block.0, window);
                    }
                    dest[p.at..p.at + p.len].copy_from_slice(&window[p.from..p.from + p.len]);
                }
            }
            i = j;
        }
        Ok(())
    }

    fn read_data_span(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let block = offset / BLOCK_SIZE as u64;
        self.writer
            .wait_range(block, (buf.len() / BLOCK_SIZE) as u64)?;
        self.dev
            .read_at(offset, buf)
            .map_err(|e| Error::io("reading data blocks", e))?;
        self.counters.data_reads.fetch_add(1, Ordering::Relaxed);
        self.counters
            .data_bytes_read
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// The value `r` names (the block read and checked, its patches applied).
    pub(crate) fn read_value(&self, r: &DataRef, key: &[u8]) -> Result<Vec<u8>> {
        let mut buf = AlignedBuf::zeroed(BLOCK_SIZE);
        self.read_data_span(r.block * BLOCK_SIZE as u64, &mut buf)?;
        r.check(&buf, || key_name(key))?;
        Ok(r.resolve(&buf))
    }
}

/// A key as an error message shows it.
pub(crate) fn key_name(key: &[u8]) -> String {
    format!("key {:?}", String::from_utf8_lossy(key))
}
