//! File data: read, write, truncate, fallocate, lseek and copy_file_range, and the batch builders
//! (`write_ops`, `zero_ops`) that turn byte ranges into block operations.

use std::ops::Bound;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::Mutex;

use amaranth_engine::{Batch, BlockRead, BlockRef, Op, Patch, StoredValue};

use super::rename_shared::MOVE_RETRIES;

/// Times [`Fs::read_bytes`] reads again when what it found was let go of before it was read
/// (each time an overwrite, a checkpoint and a reuse of the block must have come between its
/// scan and its read).
const RACED_READ_RETRIES: usize = 8;
use super::{
    Fs, COPY_MAX, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE, MAX_FILE_SIZE,
};
use crate::error::{Errno, Result};
use crate::inode::{Inode, Kind, Time};
use crate::keys::{self, BLOCK};
use crate::space::{self, RESERVED_BLOCK_COST};

/// A read's file key, the end of its bytes (at most the file's size) and the file's inode.
/// What a read covers: the file's key, the end of the bytes to read, the file, and the move
/// count when the key was taken (`fs/rename_shared.rs`).
struct ReadSpan {
    fk: Vec<u8>,
    end: u64,
    shared: Arc<Mutex<Inode>>,
    moves: u64,
}

impl Fs {
    pub(super) fn truncate_ops(&self, b: &mut Batch, fk: &[u8], size: u64) {
        let keep = size.div_ceil(BLOCK);
        let d = keys::data_prefix(fk);
        b.range_delete(
            keys::data_key(fk, keep),
            amaranth_engine::prefix_end(&d, self.max_key()),
        );
        if !size.is_multiple_of(BLOCK) {
            b.upsert(
                keys::data_key(fk, size / BLOCK),
                Patch::Truncate {
                    len: (size % BLOCK) as u32,
                },
            );
        }
    }

    // ----- open files ---------------------------------------------------------------------

    /// Reads up to `size` bytes at `offset` (holes read as zeros).
    pub fn read(&self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        let mut buf = Vec::new();
        self.read_into(ino, offset, size, &mut buf)?;
        Ok(buf)
    }

    /// [`Fs::read`] appending to `out` (a reply being built): block values copied once, straight
    /// from the engine's partitions (out-of-line blocks read from the device) into `out`. Returns
    /// the number of bytes appended; on error `out` is left as it was.
    pub fn read_into(&self, ino: u64, offset: u64, size: u32, out: &mut Vec<u8>) -> Result<usize> {
        let _ns = self.ns.read();
        let start = out.len();
        for attempt in 0..=MOVE_RETRIES {
            let Some(s) = self.read_span(ino, offset, size as u64)? else {
                return Ok(0);
            };
            let r = if attempt < MOVE_RETRIES {
                self.read_bytes_into(&s.fk, offset, s.end, out)
            } else {
                let _i = s.shared.lock();
                self.read_bytes_into(&self.file_key(ino)?, offset, s.end, out)
                    .and_then(|found| settled(found).map(|()| true))
            };
            let found = match r {
                Ok(found) => found,
                Err(e) => {
                    out.truncate(start);
                    return Err(e);
                }
            };
            if attempt < MOVE_RETRIES && (!found || self.moved_since(s.moves)) {
                // A rename moved keys meanwhile (perhaps this file's), or a block found was let
                // go of before it was read: read again.
                out.truncate(start);
                continue;
            }
            return Ok(self.read_done(ino, &s.shared, offset, s.end));
        }
        unreachable!("the last attempt reads under the file's lock")
    }

    /// [`Fs::read`] into `out` (up to its length; a transport's own reply buffer, so that nothing
    /// is copied again): block values straight from the partitions, out-of-line blocks read from
    /// the device straight into `out` where it is aligned, holes zero-filled. Returns the number
    /// of bytes written at the start of `out`.
    pub fn read_to_slice(&self, ino: u64, offset: u64, out: &mut [u8]) -> Result<usize> {
        let _ns = self.ns.read();
        for attempt in 0..=MOVE_RETRIES {
            let Some(s) = self.read_span(ino, offset, out.len() as u64)? else {
                return Ok(0);
            };
            let n = (s.end - offset) as usize;
            if attempt < MOVE_RETRIES {
                let found = self.fill(&s.fk, offset, s.end, &mut out[..n])?;
                if !found || self.moved_since(s.moves) {
                    // A rename moved keys meanwhile (perhaps this file's), or a block found was
                    // let go of before it was read: read again.
                    continue;
                }
            } else {
                let _i = s.shared.lock();
                settled(self.fill(&self.file_key(ino)?, offset, s.end, &mut out[..n])?)?;
            }
            return Ok(self.read_done(ino, &s.shared, offset, s.end));
        }
        unreachable!("the last attempt reads under the file's lock")
    }

    /// What a read of `size` bytes at `offset` covers: the file's key and the end of the bytes to
    /// read (at most the file's size), or `None` when there is nothing to read.
    fn read_span(&self, ino: u64, offset: u64, size: u64) -> Result<Option<ReadSpan>> {
        let shared = self.node_inode(ino)?;
        let (fk, file_size, kind, moves) = {
            let i = shared.lock();
            let moves = self.moves.load(Ordering::SeqCst);
            (self.file_key(ino)?, i.size, i.kind, moves)
        };
        if kind == Kind::Dir {
            return Err(Errno::EISDIR);
        }
        if offset >= file_size || size == 0 {
            return Ok(None);
        }
        Ok(Some(ReadSpan {
            fk,
            end: file_size.min(offset + size),
            shared,
            moves,
        }))
    }

    /// Counts a read of `[offset, end)` and updates the access time; returns its length.
    fn read_done(&self, ino: u64, shared: &Arc<Mutex<Inode>>, offset: u64, end: u64) -> usize {
        let n = (end - offset) as usize;
        self.counters
            .bytes_read
            .fetch_add(n as u64, Ordering::Relaxed);
        self.touch_atime(ino, shared);
        n
    }

    /// The bytes `[offset, end)` of the file at `fk` (holes and missing tails read as zeros).
    /// The caller need not hold the file's lock (`copy_file_range` holds the target's): a read
    /// that raced an overwrite of the file is done again, a few times.
    pub(super) fn read_bytes(&self, fk: &[u8], offset: u64, end: u64) -> Result<Vec<u8>> {
        for _ in 0..RACED_READ_RETRIES {
            let mut buf = Vec::new();
            if self.read_bytes_into(fk, offset, end, &mut buf)? {
                return Ok(buf);
            }
        }
        // Changed every time: an error.
        settled(false).map(|()| Vec::new())
    }

    /// Appends the bytes `[offset, end)` of the file at `fk` to `out` (holes and missing tails
    /// read as zeros); on error `out` is truncated back to its length at the call. `Ok(false)`
    /// as [`Fs::fill`].
    fn read_bytes_into(&self, fk: &[u8], offset: u64, end: u64, out: &mut Vec<u8>) -> Result<bool> {
        let base = out.len();
        if end <= offset {
            return Ok(true);
        }
        out.resize(base + (end - offset) as usize, 0);
        let r = self.fill(fk, offset, end, &mut out[base..]);
        if r.is_err() {
            out.truncate(base);
        }
        r
    }

    /// Fills `out` (`end - offset` bytes) with the bytes `[offset, end)` of the file at `fk`:
    /// values the tree holds copied from its partitions, out-of-line blocks read from the device
    /// once the scan is done (one request per run of consecutive blocks, straight into `out`
    /// where a whole block lands on an aligned place), holes and missing tails zero-filled.
    /// `Ok(false)`: a block the scan found was let go of before it was read (an overwrite or a
    /// truncation of the file, then a checkpoint, freed it and a write may have reused it:
    /// `Engine::read_found_blocks`); `out` holds nothing to trust, read again. Never while the
    /// caller holds the file's lock: every change that lets go of a file's blocks holds it.
    fn fill(&self, fk: &[u8], offset: u64, end: u64, out: &mut [u8]) -> Result<bool> {
        assert_eq!(out.len() as u64, end - offset, "a read's buffer");
        if end <= offset {
            return Ok(true);
        }
        let prefix_len = keys::data_prefix(fk).len();
        let lo = keys::data_key(fk, offset / BLOCK);
        let hi = keys::data_key(fk, (end - 1) / BLOCK + 1);
        let mut filled = 0usize;
        // (where its key is in `key_bytes`, reference, first byte wanted, where it goes, length): the
        // keys of a READ's 256 blocks in one buffer, not an allocation each (with the copies of
        // each reference, about a tenth of the daemon's CPU in a cold sequential read).
        let mut blocks: Vec<(std::ops::Range<usize>, BlockRef, usize, usize, usize)> = Vec::new();
        let mut key_bytes = Vec::new();
        self.engine
            .scan_stored(Bound::Included(&lo), Bound::Excluded(&hi), |k, v| {
                let Some(blk) = keys::block_of(k, prefix_len) else {
                    return true;
                };
                let start = blk * BLOCK;
                let len = match v {
                    StoredValue::Bytes(b) => b.len() as u64,
                    StoredValue::Block(_) => BLOCK,
                };
                let (a, z) = (start.max(offset), (start + len).min(end));
                if a >= z {
                    return true;
                }
                let at = (a - offset) as usize;
                assert!(at >= filled, "file blocks out of order");
                out[filled..at].fill(0);
                let from = (a - start) as usize;
                let n = (z - a) as usize;
                match v {
                    StoredValue::Bytes(b) => out[at..at + n].copy_from_slice(&b[from..from + n]),
                    StoredValue::Block(r) => {
                        key_bytes.extend_from_slice(k);
                        let key = key_bytes.len() - k.len()..key_bytes.len();
                        blocks.push((key, r.clone(), from, at, n));
                    }
                }
                filled = at + n;
                true
            })?;
        out[filled..].fill(0);
        if !blocks.is_empty() {
            let reads: Vec<BlockRead<'_>> = blocks
                .iter()
                .map(|(key, block, from, at, len)| BlockRead {
                    block,
                    key: &key_bytes[key.clone()],
                    from: *from,
                    at: *at,
                    len: *len,
                })
                .collect();
            return Ok(self.engine.read_found_blocks(&reads, out)?);
        }
        Ok(true)
    }

    /// Writes `data` at `offset` (at the end for `O_APPEND` handles). `kill_suidgid`: the writer
    /// is not privileged, so set-id bits are cleared. Returns the bytes written.
    pub fn write(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        data: &[u8],
        kill_suidgid: bool,
    ) -> Result<usize> {
        let append = self
            .files
            .lock()
            .get(&fh)
            .is_some_and(|h| h.append && h.ino == ino);
        self.write_at(ino, offset, data, append, kill_suidgid)
    }

    /// Writes `data` at `offset`, or at the end of the file with `append` (the file's open flags
    /// say `O_APPEND`). `kill_suidgid`: the writer is not privileged, so set-id bits are cleared.
    /// Returns the bytes written.
    pub fn write_at(
        &self,
        ino: u64,
        offset: u64,
        data: &[u8],
        append: bool,
        kill_suidgid: bool,
    ) -> Result<usize> {
        let _ns = self.ns.read();
        let shared = self.node_inode(ino)?;
        let mut inode = shared.lock();
        let (fk, meta) = self.locate(ino)?;
        if inode.kind != Kind::File {
            return Err(Errno::EINVAL);
        }
        let offset = if append { inode.size } else { offset };
        let end = offset.checked_add(data.len() as u64).ok_or(Errno::EFBIG)?;
        if end > MAX_FILE_SIZE {
            return Err(Errno::EFBIG);
        }
        if data.is_empty() {
            return Ok(0);
        }
        let (first, last) = space::touched(offset, end);
        // Space `fallocate` reserved is this write's: it needs no more.
        if !inode.reservation_covers(first, last) {
            self.check_space(data.len() as u64)?;
        }
        let mut next = inode.clone();
        let now = Time::now();
        next.mtime = now;
        next.ctime = now;
        if kill_suidgid {
            Self::kill_suidgid(&mut next);
        }
        // One request, one batch: all of it or nothing after a crash.
        let mut b = Batch::new();
        let n = self.write_batch(&mut b, &fk, &meta, offset, data, &next)?;
        let filled = space::account_write(&self.engine, &fk, &mut next, offset, offset + n as u64)?;
        self.count_reserved(&mut b, -(filled as i64));
        next.size = inode.size.max(offset + n as u64);
        b.put(meta, next.encode());
        self.commit(&mut b)?;
        *inode = next;
        self.counters
            .bytes_written
            .fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }

    /// Adds to `b` the operations writing as much of `data` at `offset` as one batch can hold
    /// together with the inode `next`, and returns how many bytes that is: all of them, unless the
    /// batch would be larger than the largest log record (a small log, or a file key long enough
    /// that a request's block keys outweigh its data); then as many whole blocks as fit, at least
    /// one, and the caller returns a short count (the application writes the rest in its next
    /// call). `EFBIG` when not even one block fits.
    fn write_batch(
        &self,
        b: &mut Batch,
        fk: &[u8],
        meta: &[u8],
        offset: u64,
        data: &[u8],
        next: &Inode,
    ) -> Result<usize> {
        write_ops(b, fk, offset, data, self.opts.out_of_line_min);
        let mut inode_op = Batch::new();
        inode_op.put(meta.to_vec(), next.encode());
        // The counter of reserved holes may go with it.
        inode_op.put(keys::system_key("reserved"), 0u64.to_le_bytes().to_vec());
        let room = self
            .engine
            .max_batch_bytes()
            .saturating_sub(inode_op.log_bytes());
        if b.log_bytes() <= room {
            return Ok(data.len());
        }
        // The ops are in block order (one per block, or one for a run of whole blocks stored out
        // of line): keep the longest prefix that fits, cutting a run of blocks where it stops.
        let mut used = Batch::new().log_bytes();
        let mut written = 0usize;
        let mut keep = 0;
        let mut cut: Option<Op> = None;
        for op in b.ops() {
            if used + op.log_bytes() > room {
                if let Op::PutBlocks { keys, data } = op {
                    // A run's record holds its keys: as many as fit.
                    let head = op.log_bytes() - keys.iter().map(|k| k.len()).sum::<usize>();
                    let per_key = (head - 16) / keys.len();
                    let mut n = 0;
                    let mut bytes = used + 16;
                    while n < keys.len() && bytes + keys[n].len() + per_key <= room {
                        bytes += keys[n].len() + per_key;
                        n += 1;
                    }
                    if n > 0 {
                        let bytes = &data.bytes().expect("blocks not written yet")[..n * 4096];
                        cut = Some(Op::PutBlocks {
                            keys: keys[..n].to_vec(),
                            data: amaranth_engine::BlockData::copy_from(bytes),
                        });
                        written += bytes.len();
                    }
                }
                break;
            }
            used += op.log_bytes();
            written += match op {
                Op::Put { value, .. } => value.len(),
                Op::PutBlocks { data, .. } => data.len(),
                Op::Upsert {
                    patch: Patch::Write { data, .. },
                    ..
                } => data.len(),
                _ => unreachable!("a write is puts and writing upserts"),
            };
            keep += 1;
        }
        if keep == 0 && cut.is_none() {
            return Err(Errno::EFBIG);
        }
        b.keep_first(keep);
        if let Some(op) = cut {
            b.push(op);
        }
        Ok(written)
    }

    // ----- space management ---------------------------------------------------------------

    /// `fallocate`: mode 0 and `KEEP_SIZE` reserve the space of the range's holes (writes inside
    /// it never fail for lack of space; `ENOSPC` and nothing changed if the space is not there);
    /// mode 0 also extends the size. `PUNCH_HOLE` makes the range's whole blocks holes and gives
    /// up its reservation; `ZERO_RANGE` does the same but keeps the range reserved.
    pub fn fallocate(&self, ino: u64, offset: u64, length: u64, mode: i32) -> Result<()> {
        if length == 0 {
            return Err(Errno::EINVAL);
        }
        let supported = FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE;
        if mode & !supported != 0
            || (mode & FALLOC_FL_PUNCH_HOLE != 0 && mode & FALLOC_FL_KEEP_SIZE == 0)
        {
            return Err(Errno::EOPNOTSUPP);
        }
        let end = offset.checked_add(length).ok_or(Errno::EFBIG)?;
        if end > MAX_FILE_SIZE {
            return Err(Errno::EFBIG);
        }
        let _ns = self.ns.read();
        let shared = self.node_inode(ino)?;
        let mut inode = shared.lock();
        let (fk, meta) = self.locate(ino)?;
        if inode.kind != Kind::File {
            return Err(if inode.kind == Kind::Dir {
                Errno::EISDIR
            } else {
                Errno::ENODEV
            });
        }
        let mut next = inode.clone();
        let mut b = Batch::new();
        let zeroing = mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE) != 0;
        let zend = end.min(next.size);
        let punch = if zeroing && offset < zend {
            let p = space::plan_punch(&self.engine, &fk, &next, offset, zend)?;
            zero_ops(&mut b, &fk, offset, zend, |blk| p.edges.contains(&blk));
            Some(p)
        } else {
            None
        };
        let want = space::touched(offset, end);
        if mode & FALLOC_FL_PUNCH_HOLE != 0 {
            let removed = punch.as_ref().map_or(0, |p| p.removed);
            let released = space::account_punch(&self.engine, &fk, &mut next, removed, want)?;
            self.count_reserved(&mut b, -(released as i64));
        } else {
            let added = space::account_reserve(&self.engine, &fk, &mut next, want, punch.as_ref())?;
            if let Some(p) = &punch {
                next.blocks -= p.removed;
            }
            if added > 0 {
                self.check_space(added * RESERVED_BLOCK_COST)?;
            }
            self.count_reserved(&mut b, added as i64);
            if mode & FALLOC_FL_KEEP_SIZE == 0 && end > next.size {
                next.size = end;
            }
        }
        let now = Time::now();
        if mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE) != 0 || next.size != inode.size {
            next.mtime = now;
            next.ctime = now;
        }
        b.put(meta, next.encode());
        self.commit(&mut b)?;
        *inode = next;
        Ok(())
    }

    /// `lseek` with `SEEK_DATA` or `SEEK_HOLE` (others are the kernel's business).
    pub fn lseek(&self, ino: u64, offset: u64, whence: i32) -> Result<u64> {
        let _ns = self.ns.read();
        // No rename moves the file's keys while it scans them (`fs/rename_shared.rs`).
        let _moving = self.moving.write();
        let shared = self.node_inode(ino)?;
        let size = shared.lock().size;
        let fk = self.file_key(ino)?;
        if whence != libc::SEEK_DATA && whence != libc::SEEK_HOLE {
            return Err(Errno::EINVAL);
        }
        if offset >= size {
            return Err(Errno::ENXIO);
        }
        let prefix_len = keys::data_prefix(&fk).len();
        let lo = keys::data_key(&fk, offset / BLOCK);
        let hi = keys::data_key(&fk, (size - 1) / BLOCK + 1);
        if whence == libc::SEEK_DATA {
            let mut first = None;
            self.engine
                .scan_stored(Bound::Included(&lo), Bound::Excluded(&hi), |k, _| {
                    first = keys::block_of(k, prefix_len);
                    false
                })?;
            match first {
                Some(b) => Ok((b * BLOCK).max(offset)),
                None => Err(Errno::ENXIO),
            }
        } else {
            let mut expect = offset / BLOCK;
            let mut hole = None;
            self.engine
                .scan_stored(
                    Bound::Included(&lo),
                    Bound::Excluded(&hi),
                    |k, _| match keys::block_of(k, prefix_len) {
                        Some(b) if b == expect => {
                            expect += 1;
                            true
                        }
                        _ => {
                            hole = Some(expect);
                            false
                        }
                    },
                )?;
            let at = hole.unwrap_or(expect) * BLOCK;
            Ok(at.max(offset).min(size))
        }
    }

    /// A whole file copied into an empty one (no data, no reservation, either side): a clone
    /// of its data keys (docs/SURGERY.md §5.3), one record, by tree surgery when the data holds
    /// more than [`FsOptions::rename_copy_max`] bytes: the copy shares the source's subtrees
    /// until either is written, at a cost proportional to the tree's height, not the file's
    /// size. `None` when the destination is not empty (the caller copies).
    ///
    /// [`FsOptions::rename_copy_max`]: super::FsOptions::rename_copy_max
    fn clone_file(
        &self,
        ino_in: u64,
        src: &[u8],
        shared: &Arc<Mutex<Inode>>,
        dst: &[u8],
        dst_meta: &[u8],
    ) -> Result<Option<u64>> {
        let source = self.node_inode(ino_in)?.lock().clone();
        let mut inode = shared.lock();
        let empty = |i: &Inode| i.size == 0 && i.blocks == 0;
        if !empty(&inode) || !inode.reserved.is_empty() || !source.reserved.is_empty() {
            return Ok(None);
        }
        let (from, to) = (keys::data_prefix(src), keys::data_prefix(dst));
        let mut b = Batch::new();
        // No key may lie in a clone's destination: whatever an empty file left there goes.
        b.range_delete(to.clone(), amaranth_engine::prefix_end(&to, self.max_key()));
        b.range_clone(from, to, self.opts.rename_copy_max);
        let mut next = inode.clone();
        next.size = source.size;
        next.blocks = source.blocks;
        let now = Time::now();
        next.mtime = now;
        next.ctime = now;
        b.put(dst_meta.to_vec(), next.encode());
        self.commit(&mut b)?;
        *inode = next;
        Ok(Some(source.size))
    }

    /// Copies up to `len` bytes between files inside the daemon (no data crosses to the kernel)
    /// as one batch: after a crash, all of what the call reports copied or none of it. One call
    /// copies at most [`COPY_MAX`] bytes (less if a batch that large would not fit in one log
    /// record) and returns the count, short when `len` was larger: the caller (the kernel hands
    /// the count to the application, `cp` loops) asks again for the rest. Block-aligned copies
    /// move whole blocks and keep holes. A whole file into an empty file is cloned instead
    /// (`Fs::clone_file`): the copy shares the source's data until either is written.
    pub fn copy_file_range(
        &self,
        ino_in: u64,
        off_in: u64,
        ino_out: u64,
        off_out: u64,
        len: u64,
    ) -> Result<u64> {
        let _ns = self.ns.read();
        // No rename moves either file's keys meanwhile (`fs/rename_shared.rs`).
        let _moving = self.moving.write();
        let size_in = self.node_inode(ino_in)?.lock().size;
        let shared = self.node_inode(ino_out)?;
        if shared.lock().kind != Kind::File {
            return Err(Errno::EINVAL);
        }
        if off_in >= size_in || len == 0 {
            return Ok(0);
        }
        let src = self.file_key(ino_in)?;
        let dst = self.file_key(ino_out)?;
        let dst_meta = self.meta_of(ino_out)?;
        let len = len.min(size_in - off_in);
        if ino_in == ino_out && off_in < off_out.saturating_add(len) && off_out < off_in + len {
            return Err(Errno::EINVAL);
        }
        if off_in == 0 && off_out == 0 && len == size_in && ino_in != ino_out {
            if let Some(n) = self.clone_file(ino_in, &src, &shared, &dst, &dst_meta)? {
                return Ok(n);
            }
        }
        let len = len.min(self.copy_limit(&dst));
        let end = off_out.checked_add(len).ok_or(Errno::EFBIG)?;
        if end > MAX_FILE_SIZE {
            return Err(Errno::EFBIG);
        }
        self.check_space(len)?;
        let mut inode = shared.lock();
        let mut b = Batch::new();
        let mut done = 0;
        // The block copy and the write of the rest touch different blocks: count each against
        // the file as it is, then add up.
        let (mut by_copy, mut by_write) = (inode.clone(), inode.clone());
        let mut reserved_change = 0i64;
        if off_in.is_multiple_of(BLOCK) && off_out.is_multiple_of(BLOCK) {
            done = len / BLOCK * BLOCK;
            let (b_out, count) = (off_out / BLOCK, len / BLOCK);
            let put = self.copy_block_ops(&mut b, &src, off_in / BLOCK, &dst, b_out, count)?;
            let mut copied_in = vec![0u64; inode.reserved.len()];
            for to in &put {
                if let Some(i) = inode.reserved.iter().position(|r| r.covers(*to, to + 1)) {
                    copied_in[i] += 1;
                }
            }
            reserved_change += space::account_copy(
                &self.engine,
                &dst,
                &mut by_copy,
                (b_out, b_out + count),
                put.len() as u64,
                &copied_in,
            )?;
        }
        if done < len {
            let bytes = self.read_bytes(&src, off_in + done, off_in + len)?;
            write_ops(
                &mut b,
                &dst,
                off_out + done,
                &bytes,
                self.opts.out_of_line_min,
            );
            let filled =
                space::account_write(&self.engine, &dst, &mut by_write, off_out + done, end)?;
            reserved_change -= filled as i64;
        }
        self.count_reserved(&mut b, reserved_change);
        let mut next = inode.clone();
        space::add_counts(&mut next, &by_copy, &by_write);
        next.size = next.size.max(end);
        let now = Time::now();
        next.mtime = now;
        next.ctime = now;
        b.put(dst_meta, next.encode());
        self.commit(&mut b)?;
        *inode = next;
        Ok(len)
    }

    /// The most bytes one `copy_file_range` call copies into the file at `fk`: [`COPY_MAX`], or
    /// fewer when that many block writes (each a data key and up to a block) with the inode
    /// would not fit in one log record.
    fn copy_limit(&self, fk: &[u8]) -> u64 {
        let key = keys::data_key(fk, 0);
        let mut fixed = Batch::new();
        fixed.range_delete(key.clone(), key.clone());
        fixed.put(keys::meta_key(fk), vec![0; 256]);
        let mut one = Batch::new();
        one.upsert(
            key,
            Patch::Write {
                offset: 0,
                data: vec![0; BLOCK as usize],
            },
        );
        let per_block = (one.log_bytes() - Batch::new().log_bytes()) as u64;
        let room = self
            .engine
            .max_batch_bytes()
            .saturating_sub(fixed.log_bytes()) as u64;
        // An unaligned range touches up to two blocks more than its length in blocks.
        let blocks = (room / per_block).saturating_sub(2).max(1);
        (blocks * BLOCK).min(COPY_MAX)
    }

    /// Operations copying `count` whole blocks from block `b_in` of `src` to block `b_out` of
    /// `dst`: the destination's blocks are dropped and the source's existing ones put (holes stay
    /// holes). Returns the destination blocks put.
    fn copy_block_ops(
        &self,
        b: &mut Batch,
        src: &[u8],
        b_in: u64,
        dst: &[u8],
        b_out: u64,
        count: u64,
    ) -> Result<Vec<u64>> {
        let mut put = Vec::new();
        if count == 0 {
            return Ok(put);
        }
        let prefix_len = keys::data_prefix(src).len();
        b.range_delete(
            keys::data_key(dst, b_out),
            keys::data_key(dst, b_out + count),
        );
        let lo = keys::data_key(src, b_in);
        let hi = keys::data_key(src, b_in + count);
        // Runs of consecutive whole blocks go out of line as a write's would; the rest is put.
        let min = self.opts.out_of_line_min;
        let mut run: Vec<u8> = Vec::new();
        let mut run_at = 0u64;
        let flush = |b: &mut Batch, run: &mut Vec<u8>, at: u64| {
            let n = (run.len() / BLOCK as usize) as u64;
            if min > 0 && run.len() >= min {
                let keys = (at..at + n).map(|k| keys::data_key(dst, k)).collect();
                b.put_blocks(keys, run);
            } else {
                for (i, v) in run.chunks_exact(BLOCK as usize).enumerate() {
                    b.put(keys::data_key(dst, at + i as u64), v.to_vec());
                }
            }
            run.clear();
        };
        self.engine
            .scan(Bound::Included(&lo), Bound::Excluded(&hi), |k, v| {
                if let Some(blk) = keys::block_of(k, prefix_len) {
                    let to = blk - b_in + b_out;
                    let follows = run_at + (run.len() / BLOCK as usize) as u64 == to;
                    if !run.is_empty() && (!follows || v.len() != BLOCK as usize) {
                        flush(b, &mut run, run_at);
                    }
                    if v.len() == BLOCK as usize {
                        if run.is_empty() {
                            run_at = to;
                        }
                        run.extend_from_slice(v);
                    } else {
                        b.put(keys::data_key(dst, to), v.to_vec());
                    }
                    put.push(to);
                }
                true
            })?;
        if !run.is_empty() {
            flush(b, &mut run, run_at);
        }
        Ok(put)
    }
}

/// Operations writing `data` at `offset`: whole blocks as puts, partial blocks as upserts (no
/// read). The whole blocks go out of line, written once (docs/WRITEONCE.md), as one
/// [`Op::PutBlocks`], when they are at least `out_of_line_min` bytes (0: never).
pub fn write_ops(b: &mut Batch, fk: &[u8], offset: u64, data: &[u8], out_of_line_min: usize) {
    let (first_full, end_full) = (offset.div_ceil(BLOCK), (offset + data.len() as u64) / BLOCK);
    let run = (out_of_line_min > 0
        && end_full > first_full
        && ((end_full - first_full) * BLOCK) as usize >= out_of_line_min)
        .then_some((first_full, end_full));
    let mut pos = 0usize;
    while pos < data.len() {
        let abs = offset + pos as u64;
        let blk = abs / BLOCK;
        if let Some((a, z)) = run.filter(|&(a, _)| a == blk && abs.is_multiple_of(BLOCK)) {
            let end = (z * BLOCK - offset) as usize;
            let keys = (a..z).map(|k| keys::data_key(fk, k)).collect();
            b.put_blocks(keys, &data[pos..end]);
            pos = end;
            continue;
        }
        let in_blk = (abs % BLOCK) as usize;
        let n = (BLOCK as usize - in_blk).min(data.len() - pos);
        let key = keys::data_key(fk, blk);
        if in_blk == 0 && n == BLOCK as usize {
            b.put(key, data[pos..pos + n].to_vec());
        } else {
            b.upsert(
                key,
                Patch::Write {
                    offset: in_blk as u32,
                    data: data[pos..pos + n].to_vec(),
                },
            );
        }
        pos += n;
    }
}

/// Operations zeroing `[start, end)`: whole blocks become holes, partial blocks get zeros (those
/// `exists` says are there: a hole needs none, and zeros would make it a block).
pub fn zero_ops(b: &mut Batch, fk: &[u8], start: u64, end: u64, exists: impl Fn(u64) -> bool) {
    let first_full = start.div_ceil(BLOCK);
    let last_full = end / BLOCK; // exclusive
    if first_full < last_full {
        b.range_delete(
            keys::data_key(fk, first_full),
            keys::data_key(fk, last_full),
        );
    }
    let mut zero_range = |a: u64, z: u64| {
        if a < z && exists(a / BLOCK) {
            b.upsert(
                keys::data_key(fk, a / BLOCK),
                Patch::Write {
                    offset: (a % BLOCK) as u32,
                    data: vec![0; (z - a) as usize],
                },
            );
        }
    };
    if first_full > last_full {
        // Inside one block.
        zero_range(start, end);
    } else {
        zero_range(start, (first_full * BLOCK).min(end));
        zero_range((last_full * BLOCK).max(start), end);
    }
}

/// The end of a read that must not race (made under the file's lock, where every change that
/// lets go of a file's blocks waits, or read again too often): a block found changed before it
/// was read is an error.
fn settled(found: bool) -> Result<()> {
    if found {
        Ok(())
    } else {
        log::error!("amaranth: the blocks of a read kept changing before they were read");
        Err(Errno::EIO)
    }
}
