//! Space on the device: the extent allocator, runs of extents and node I/O; the block translation
//! table is in `btt.rs`.
//!
//! Nodes are written copy-on-write: every write of a node goes to a freshly allocated extent, and
//! the block translation table (BTT) maps node ids to extents. Three versions of the table exist:
//! `current` (where each node's newest written image is), `checkpointed` (what the last completed
//! checkpoint references, on disk) and `in_progress` (what the checkpoint being written will
//! reference). An extent is free only when no version references it, so a crash at any moment finds
//! the last checkpoint's nodes intact.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use amaranth_device::{AlignedBuf, BlockDevice, BLOCK_SIZE};
use parking_lot::Mutex;

use crate::codec::crc;
use crate::datatable::DataTable;
use crate::datawriter::DataWriter;
use crate::error::{Error, Result};
use crate::node::NodeId;
use crate::subbytes::{ImageBuf, ImagePool, SharedImage};
use crate::superblock::Extent;

pub(crate) use crate::btt::decode_btt_catalog;
pub use crate::btt::{decode_btt, encode_btt, encode_btt_with_catalog, Btt, DecodedBtt};

/// Free space as extents of blocks, best-fit.
#[derive(Debug, Default)]
pub struct Allocator {
    by_start: BTreeMap<u64, u64>,
    by_size: BTreeSet<(u64, u64)>,
    free_blocks: u64,
    total_blocks: u64,
    /// Extents freed since the last [`Allocator::discard_candidates`] (`trim.rs`), at most
    /// [`FREED_QUEUE`].
    freed: Vec<Extent>,
    /// The next pass looks at every free run: nothing was discarded since the allocator was
    /// made (an open), or the queue overflowed.
    discard_all: bool,
}

/// Freed extents remembered for the next discard pass; past it the pass looks at all free space.
const FREED_QUEUE: usize = 1 << 16;

impl Allocator {
    /// All blocks in `[start, end)` free.
    pub fn new(start: u64, end: u64) -> Allocator {
        let mut a = Allocator {
            total_blocks: end - start,
            discard_all: true,
            ..Allocator::default()
        };
        if end > start {
            a.insert(start, end - start);
        }
        a
    }

    fn insert(&mut self, start: u64, len: u64) {
        self.by_start.insert(start, len);
        self.by_size.insert((len, start));
        self.free_blocks += len;
    }

    fn remove(&mut self, start: u64, len: u64) {
        self.by_start.remove(&start);
        self.by_size.remove(&(len, start));
        self.free_blocks -= len;
    }

    /// Allocates `blocks` contiguous blocks (smallest free extent that fits, lowest address first).
    pub fn alloc(&mut self, blocks: u64) -> Option<Extent> {
        assert!(blocks > 0, "empty allocation");
        let &(len, start) = self.by_size.range((blocks, 0)..).next()?;
        Some(self.take_front(start, len, blocks))
    }

    /// Takes the first `blocks` blocks of the free extent `(start, len)`, leaving the rest free.
    fn take_front(&mut self, start: u64, len: u64, blocks: u64) -> Extent {
        assert!(len >= blocks, "extent of {len} blocks cannot give {blocks}");
        self.remove(start, len);
        if len > blocks {
            self.insert(start + blocks, len - blocks);
        }
        Extent {
            block: start,
            blocks,
        }
    }

    /// Allocates `blocks` contiguous blocks as the next extent of a run (see [`Placement`]): at
    /// `goal` (where the run's previous extent ended) when the free extent starting there holds
    /// them, else at the start of the smallest free extent that holds the `want` blocks the run
    /// still expects, so that the rest of the run can follow contiguously. When no free extent
    /// holds them (a full or fragmented device), best fit as [`Allocator::alloc`]: a run must not
    /// use up the large free extents that whole nodes need.
    pub fn alloc_next(&mut self, blocks: u64, goal: Option<u64>, want: u64) -> Option<Extent> {
        assert!(blocks > 0, "empty allocation");
        let at = goal
            .and_then(|g| self.by_start.get(&g).map(|&len| (g, len)))
            .filter(|&(_, len)| len >= blocks)
            .or_else(|| {
                let &(len, start) = self.by_size.range((want.max(blocks), 0)..).next()?;
                Some((start, len))
            });
        let Some((start, len)) = at else {
            return self.alloc(blocks);
        };
        Some(self.take_front(start, len, blocks))
    }

    /// Marks `e` allocated (when rebuilding from a table). Fails if any block is not free.
    pub fn claim(&mut self, e: Extent) -> bool {
        let Some((&start, &len)) = self.by_start.range(..=e.block).next_back() else {
            return false;
        };
        if start + len < e.block + e.blocks {
            return false;
        }
        self.remove(start, len);
        if e.block > start {
            self.insert(start, e.block - start);
        }
        let end = e.block + e.blocks;
        if start + len > end {
            self.insert(end, start + len - end);
        }
        true
    }

    /// Returns `e` to the free space, merging with neighbours; the next discard pass gives its
    /// space back to the device (`trim.rs`).
    pub fn free(&mut self, e: Extent) {
        self.give_back(e);
        if self.discard_all {
            return;
        }
        if self.freed.len() >= FREED_QUEUE {
            self.freed = Vec::new();
            self.discard_all = true;
        } else {
            self.freed.push(e);
        }
    }

    /// Returns `e` to the free space without queueing it for a discard (it was just discarded).
    pub fn give_back(&mut self, e: Extent) {
        assert!(e.blocks > 0, "freeing an empty extent");
        let (mut start, mut len) = (e.block, e.blocks);
        if let Some((&ps, &pl)) = self.by_start.range(..start).next_back() {
            assert!(
                ps + pl <= start,
                "double free of blocks {}..{}",
                e.block,
                e.block + e.blocks
            );
            if ps + pl == start {
                self.remove(ps, pl);
                start = ps;
                len += pl;
            }
        }
        if let Some((&ns, &nl)) = self.by_start.range(start..).next() {
            assert!(
                ns >= e.block + e.blocks,
                "double free of blocks {}..{}",
                e.block,
                e.block + e.blocks
            );
            if ns == start + len {
                self.remove(ns, nl);
                len += nl;
            }
        }
        self.insert(start, len);
    }

    /// Whether none of the `len` blocks from `start` is free.
    pub fn is_allocated(&self, start: u64, len: u64) -> bool {
        let before = self
            .by_start
            .range(..start)
            .next_back()
            .is_some_and(|(&s, &l)| s + l > start);
        !before && self.by_start.range(start..start + len).next().is_none()
    }

    /// Free blocks.
    pub fn free_blocks(&self) -> u64 {
        self.free_blocks
    }

    /// Blocks managed (free or used).
    pub fn total_blocks(&self) -> u64 {
        self.total_blocks
    }

    /// Number of free extents (a fragmentation measure).
    pub fn free_extents(&self) -> usize {
        self.by_start.len()
    }

    /// What the next discard pass may give back: the parts of the free runs that hold an extent
    /// freed since the last pass (every free run after an open or an overflow of the queue),
    /// cut to whole `granule`s of blocks aligned to it, in pieces of at most `piece` blocks.
    /// Empties the queue. The pieces are not taken: the caller claims each before discarding it.
    pub fn discard_candidates(&mut self, granule: u64, piece: u64) -> Vec<Extent> {
        assert!(granule > 0 && piece >= granule);
        let mut runs: Vec<(u64, u64)> = if std::mem::take(&mut self.discard_all) {
            self.freed.clear();
            self.by_start.iter().map(|(&s, &l)| (s, l)).collect()
        } else {
            let by_start = &self.by_start;
            self.freed
                .drain(..)
                .filter_map(|e| {
                    let (&s, &l) = by_start.range(..=e.block).next_back()?;
                    (s + l > e.block).then_some((s, l))
                })
                .collect()
        };
        runs.sort_unstable();
        runs.dedup();
        let mut out = Vec::new();
        for (s, l) in runs {
            let (mut at, end) = (s.div_ceil(granule) * granule, (s + l) / granule * granule);
            while at < end {
                let blocks = (end - at).min(piece);
                out.push(Extent { block: at, blocks });
                at += blocks;
            }
        }
        out
    }
}

/// Where the next extent of a run of node writes goes: the nodes a checkpoint writes, in key
/// order, are placed one after another in contiguous free space, so that a scan in key order
/// reads the device in order (docs/DESIGN.md, Placement).
#[derive(Debug, Default)]
pub struct Placement {
    /// Where the run's last extent ended.
    goal: Option<u64>,
    /// Blocks the run still expects to write (an estimate: the extent chosen for the run's next
    /// piece should hold them all).
    want: u64,
    /// Extents handed out, and how many of them continued the previous one.
    pub extents: u64,
    /// Extents that started where the previous one ended.
    pub contiguous: u64,
}

impl Placement {
    /// A run expected to write about `want` blocks.
    pub fn new(want: u64) -> Placement {
        Placement {
            want,
            ..Placement::default()
        }
    }

    /// Takes the run's next extent from `alloc`. Asserts what the run relies on: the extent was
    /// free (the allocator removed it from its free space) and, when the run's free space
    /// allowed, it continues the previous extent in device order.
    fn take(&mut self, alloc: &mut Allocator, blocks: u64) -> Option<Extent> {
        let free_before = alloc.free_blocks();
        let contiguous_room = self
            .goal
            .and_then(|g| alloc.by_start.get(&g))
            .is_some_and(|&len| len >= blocks);
        let ext = alloc.alloc_next(blocks, self.goal, self.want)?;
        assert_eq!(
            alloc.free_blocks() + blocks,
            free_before,
            "a run extent was not free"
        );
        assert!(
            !contiguous_room || Some(ext.block) == self.goal,
            "a run extent did not continue the run although the space after it was free"
        );
        self.extents += 1;
        if Some(ext.block) == self.goal {
            self.contiguous += 1;
        }
        self.goal = Some(ext.block + ext.blocks);
        self.want = self.want.saturating_sub(blocks);
        Some(ext)
    }
}

/// Counters of what the store did.
#[derive(Debug, Default)]
pub struct StoreCounters {
    /// Node images written.
    pub nodes_written: AtomicU64,
    /// Bytes of node images written.
    pub node_bytes_written: AtomicU64,
    /// Node reads (headers, whole nodes, partitions).
    pub node_reads: AtomicU64,
    /// Bytes read for nodes.
    pub node_bytes_read: AtomicU64,
    /// Extents checkpoints placed as parts of their runs (docs/DESIGN.md, Placement).
    pub run_extents: AtomicU64,
    /// Of those, extents that started where the run's previous one ended.
    pub run_contiguous: AtomicU64,
    /// Clean leaves marked dirty so that a checkpoint's run relocates them next to their key
    /// neighbours (`placement.rs`).
    pub relocated: AtomicU64,
    /// Out-of-line data extents written, and their bytes.
    pub data_writes: AtomicU64,
    /// Bytes of out-of-line data written.
    pub data_bytes_written: AtomicU64,
    /// Device reads of out-of-line data (one per run of consecutive blocks), and their bytes.
    pub data_reads: AtomicU64,
    /// Bytes of out-of-line data read.
    pub data_bytes_read: AtomicU64,
    /// Reads of blocks a scan had found that met a block let go of (and perhaps reused) since,
    /// and were done again ([`crate::Engine::read_found_blocks`]).
    pub data_reads_raced: AtomicU64,
    /// Discard passes ended by a refused discard.
    pub discard_failures: AtomicU64,
}

/// The device, its space and its table.
pub struct Store {
    /// The device.
    pub dev: Arc<dyn BlockDevice>,
    /// Table and allocator.
    pub btt: Mutex<Btt>,
    /// The data table (`datatable.rs`). Lock order: `data` before `btt`.
    pub data: Mutex<DataTable>,
    /// The writers of out-of-line data (`datawriter.rs`).
    pub writer: Arc<DataWriter>,
    /// Counters.
    pub counters: StoreCounters,
    /// The first failed write of a node image or table. Writes happen on read paths too (the
    /// cache writes dirty nodes back to make room), where the error reaches only the reader: the
    /// engine adopts this as its failure whenever it checks for one (before every write, switch of
    /// mode and checkpoint), so it refuses writes after any failed node write.
    pub write_failure: Mutex<Option<Error>>,
    /// Buffers of whole-image reads kept for the next ones (`subbytes.rs` [`ImagePool`]):
    /// given back by an image read when dropped, or by the last sub-block read in place from it.
    image_pool: Arc<ImagePool>,
    /// Buffers of single sub-block reads kept for the next ones ([`ImagePool::subblocks`]): given
    /// back by the last sub-block read in place from one when it is dropped (shed for room,
    /// changed, or decoded into memory of its own).
    sub_pool: Arc<ImagePool>,
}

/// The bytes of a whole-image read, in a buffer that goes back to the store's pool when dropped.
pub struct Image<'a> {
    buf: Option<AlignedBuf>,
    len: usize,
    pool: &'a Arc<ImagePool>,
}

impl std::ops::Deref for Image<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf.as_ref().expect("image buffer")[..self.len]
    }
}

impl Image<'_> {
    /// The buffer, kept by the caller: a node's sub-blocks are then used where they lie in it
    /// (`subbytes.rs`), and it goes back to the pool when the last of them is dropped. The whole
    /// buffer is shared (it may be longer than the image); the bytes past the image's length are
    /// zeros or a former image's and belong to no sub-block.
    pub(crate) fn into_shared(mut self) -> SharedImage {
        let buf = self.buf.take().expect("image buffer");
        Arc::new(ImageBuf::pooled(buf, self.pool.clone()))
    }
}

impl Drop for Image<'_> {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            self.pool.give(buf);
        }
    }
}

impl Store {
    /// A store on `dev` with this table and allocator, and this data table.
    pub fn new(dev: Arc<dyn BlockDevice>, btt: Btt, data: DataTable) -> Store {
        Store {
            dev,
            btt: Mutex::new(btt),
            data: Mutex::new(data),
            writer: Arc::new(DataWriter::default()),
            counters: StoreCounters::default(),
            write_failure: Mutex::new(None),
            image_pool: Arc::new(ImagePool::images()),
            sub_pool: Arc::new(ImagePool::subblocks()),
        }
    }

    /// [`Store::read`] of a whole node image into a reused buffer (large reads: scans, read-ahead,
    /// flushes). The bytes past `len` in the buffer are never exposed.
    pub fn read_image(&self, offset: u64, len: usize, what: &str) -> Result<Image<'_>> {
        let len = amaranth_device::round_up(len);
        // A pooled buffer is at most a quarter longer than the image, and a new one is sized to
        // it: the sub-blocks read in place keep the whole buffer (`subbytes.rs`), and a node
        // keeps them so only while they use most of it.
        let pooled = self.image_pool.take(len);
        let mut buf = pooled.unwrap_or_else(|| AlignedBuf::zeroed(len));
        self.read_into(offset, &mut buf[..len], what)?;
        Ok(Image {
            buf: Some(buf),
            len,
            pool: &self.image_pool,
        })
    }

    /// Image buffers handed out again by the pool.
    pub(crate) fn image_buffers_reused(&self) -> u64 {
        self.image_pool.reused()
    }

    /// [`Store::read`] of a single sub-block's blocks (`len` rounded up to blocks) into a
    /// buffer its sub-block keeps in place, taken from the store's sub-block pool when one fits
    /// and given back to it when the last range of it is dropped. A new buffer is rounded up to
    /// 8 KiB so that reads of nearby sizes can reuse it; the bytes past `len` belong to no
    /// sub-block.
    pub(crate) fn read_subblock(&self, offset: u64, len: usize, what: &str) -> Result<SharedImage> {
        let len = amaranth_device::round_up(len);
        if !self.sub_pool.keeps(len) {
            return Ok(Arc::new(ImageBuf::new(self.read(offset, len, what)?)));
        }
        let mut buf = self
            .sub_pool
            .take(len)
            .unwrap_or_else(|| AlignedBuf::zeroed(len.next_multiple_of(2 * BLOCK_SIZE)));
        assert!(buf.len() >= len);
        self.read_into(offset, &mut buf[..len], what)?;
        Ok(Arc::new(ImageBuf::pooled(buf, self.sub_pool.clone())))
    }

    /// Sub-block read buffers handed out again by the pool.
    pub(crate) fn subblock_buffers_reused(&self) -> u64 {
        self.sub_pool.reused()
    }

    /// Reads `len` bytes (rounded up to blocks) at `offset`.
    pub fn read(&self, offset: u64, len: usize, what: &str) -> Result<AlignedBuf> {
        let mut buf = AlignedBuf::zeroed(len);
        self.read_into(offset, &mut buf, what)?;
        Ok(buf)
    }

    /// Fills `buf` from the device at `offset`, counted as a node read.
    fn read_into(&self, offset: u64, buf: &mut [u8], what: &str) -> Result<()> {
        self.dev
            .read_at(offset, buf)
            .map_err(|e| Error::io(format!("reading {what}"), e))?;
        self.counters.node_reads.fetch_add(1, Ordering::Relaxed);
        self.counters
            .node_bytes_read
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Allocates an extent for `buf` and writes it there. The extent is not yet referenced by any
    /// table: the caller records it (or releases it on failure).
    pub fn write_new(&self, buf: &AlignedBuf, what: &str) -> Result<Extent> {
        let ext = self.write_placed(buf, what, None)?;
        self.btt.lock().written(ext);
        Ok(ext)
    }

    /// [`Store::write_new`], as the next extent of `run` when one is given. The extent counts
    /// in [`Btt::writing`] until the caller records the image ([`Btt::written`]).
    pub fn write_placed(
        &self,
        buf: &AlignedBuf,
        what: &str,
        run: Option<&mut Placement>,
    ) -> Result<Extent> {
        let blocks = (buf.len() / BLOCK_SIZE) as u64;
        let ext = {
            let mut btt = self.btt.lock();
            let ext = match run {
                Some(run) => run.take(&mut btt.alloc, blocks),
                None => btt.alloc.alloc(blocks),
            };
            if let Some(e) = ext {
                btt.writing += e.blocks;
            }
            ext
        }
        .ok_or_else(|| {
            Error::NoSpace(format!("no free extent of {} bytes for {what}", buf.len()))
        })?;
        if let Err(e) = self.dev.write_at(ext.offset(), buf) {
            let mut btt = self.btt.lock();
            btt.written(ext);
            btt.alloc.free(ext);
            let err = Error::io(format!("writing {what}"), e);
            self.write_failure.lock().get_or_insert_with(|| err.clone());
            return Err(err);
        }
        self.counters.nodes_written.fetch_add(1, Ordering::Relaxed);
        self.counters
            .node_bytes_written
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(ext)
    }

    /// The current extent of node `id`.
    pub fn location(&self, id: NodeId) -> Option<Extent> {
        self.btt.lock().current.get(&id).copied()
    }

    /// Flushes the device, once the out-of-line data writes submitted before are complete (the
    /// flush must not make a table or a record durable before the data they name).
    pub fn flush(&self, what: &str) -> Result<()> {
        self.writer.barrier()?;
        self.dev
            .flush()
            .map_err(|e| Error::io(format!("flushing the device ({what})"), e))
    }
}

/// crc32c of a byte slice (re-exported for the checkpoint code).
pub fn table_crc(bytes: &[u8]) -> u32 {
    crc(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocator_best_fit_and_coalescing() {
        let mut a = Allocator::new(10, 110);
        let x = a.alloc(10).unwrap();
        let y = a.alloc(20).unwrap();
        let z = a.alloc(5).unwrap();
        assert_eq!(a.free_blocks(), 65);
        a.free(y);
        // A 5-block request fits best in the 20-block hole? No: best fit picks the smallest hole.
        let w = a.alloc(20).unwrap();
        assert_eq!(w, y);
        a.free(x);
        a.free(w);
        a.free(z);
        assert_eq!(a.free_blocks(), 100);
        assert_eq!(a.free_extents(), 1);
        assert!(a.claim(Extent {
            block: 50,
            blocks: 10
        }));
        assert!(!a.claim(Extent {
            block: 55,
            blocks: 10
        }));
        assert_eq!(a.free_blocks(), 90);
        assert!(a.alloc(1000).is_none());
    }

    /// The first pass offers every free run; later ones only the runs holding extents freed
    /// since, cut to aligned granules and pieces; the queue's overflow falls back to everything.
    #[test]
    fn discard_candidates_are_the_aligned_granules_of_runs_freed_since_the_last_pass() {
        let ext = |block, blocks| Extent { block, blocks };
        let mut a = Allocator::new(10, 1000);
        // Every free run after an open: [10, 1000) is [16, 992) in granules of 16, cut in
        // pieces of at most 320.
        assert_eq!(
            a.discard_candidates(16, 320),
            vec![ext(16, 320), ext(336, 320), ext(656, 320), ext(976, 16)]
        );
        assert!(
            a.discard_candidates(16, 320).is_empty(),
            "nothing freed since"
        );
        assert!(a.claim(ext(10, 990)));
        a.free(ext(100, 40)); // alone: granules 112..128 only
        a.free(ext(500, 8)); // too small for a granule
        a.free(ext(508, 30)); // merged with it: [500, 538) holds 512..528
        assert_eq!(
            a.discard_candidates(16, 320),
            vec![ext(112, 16), ext(512, 16)]
        );
        // A freed extent reused before the pass is skipped.
        a.free(ext(700, 64));
        assert!(a.claim(ext(700, 64)));
        assert!(a.discard_candidates(16, 320).is_empty());
        // Overflow: every free run again.
        for _ in 0..=FREED_QUEUE {
            let e = a.alloc(1).unwrap();
            a.free(e);
        }
        let all = a.discard_candidates(16, 320);
        assert!(
            all.contains(&ext(112, 16)) && all.contains(&ext(512, 16)),
            "{all:?}"
        );
        // Giving back what a pass discarded queues nothing.
        a.give_back(ext(700, 64));
        assert_eq!(a.discard_candidates(16, 320), Vec::<Extent>::new());
    }

    #[test]
    fn a_run_fills_contiguous_space_in_order() {
        let mut a = Allocator::new(0, 1000);
        // Holes of 10 blocks at 100, 300 and 500, and the free space from 600 on.
        let held: Vec<Extent> = [(0, 100), (110, 190), (310, 190), (510, 90)]
            .iter()
            .map(|&(block, blocks)| Extent { block, blocks })
            .collect();
        for e in &held {
            assert!(a.claim(*e));
        }
        // First fit per node would take the holes in turn; a run of 4 x 8 blocks goes to the
        // smallest free extent that holds all of it, one extent after the other.
        let mut run = Placement::new(32);
        let got: Vec<Extent> = (0..4).map(|_| run.take(&mut a, 8).unwrap()).collect();
        for (i, e) in got.iter().enumerate() {
            assert_eq!(e.block, 600 + 8 * i as u64, "extent {i} of the run");
        }
        assert_eq!((run.extents, run.contiguous), (4, 3));
        // When the space after the run is taken, the run goes on elsewhere.
        assert!(a.claim(Extent {
            block: 632,
            blocks: 368
        }));
        let e = run.take(&mut a, 8).unwrap();
        assert_eq!(e.blocks, 8);
        assert!([100, 300, 500].contains(&e.block), "{e:?}");
        let f = run.take(&mut a, 2).unwrap();
        assert_eq!(f.block, e.block + 8, "the run continues in its new place");
        assert_eq!(a.free_blocks(), 30 - 10);
        // Nothing fits: no extent, nothing taken.
        assert!(run.take(&mut a, 50).is_none());
        assert_eq!(a.free_blocks(), 20);
    }
}
