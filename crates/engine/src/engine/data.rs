//! Reading values that are out-of-line blocks (docs/WRITEONCE.md): a point read resolves its
//! reference with one 4 KiB device read; a scan collects the references it meets and reads them
//! a batch at a time, one device request per run of consecutive blocks, before it hands the
//! values to its caller in key order; [`Engine::scan_stored`] and [`Engine::read_blocks`] let a
//! caller (the file system's reads) read the blocks straight into its own buffer.

use std::ops::Bound;

use amaranth_device::{AlignedBuf, BLOCK_SIZE};

use super::range::normalize;
use super::{Engine, Inner};
use crate::apply::{scan_tree_at, scan_tree_reading_ahead};
use crate::dataref::{DataRef, Stored, StoredBuf, Val};
use crate::error::{Error, Result};
use crate::node::{NodeId, ROOT_ID};
use crate::refcheck::{check_refs, RefCheck};

/// The most references a scan reads in one batch (1 MiB of blocks). Batches start at one block and
/// double, so that a caller who stops early wastes at most as much as it used.
const SCAN_BATCH: usize = 256;

/// A value as [`Engine::scan_stored`] finds it: the bytes, or a reference to an out-of-line block
/// to read with [`Engine::read_blocks`].
#[derive(Clone, Copy, Debug)]
pub enum StoredValue<'a> {
    /// The value's bytes.
    Bytes(&'a [u8]),
    /// A reference to an out-of-line block.
    Block(&'a BlockRef),
}

/// A reference to an out-of-line 4 KiB block holding a value (with the patches applied to it
/// since it was written).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockRef(pub(crate) DataRef);

impl BlockRef {
    /// The length of the value the block holds once its patches are applied (4 KiB unless a patch
    /// truncated or extended it).
    pub fn len(&self) -> usize {
        self.0.value_len()
    }

    /// Whether the value is empty (a patch truncated it to nothing).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The device block holding the data.
    pub fn block(&self) -> u64 {
        self.0.block
    }
}

/// One block to read with [`Engine::read_blocks`]: which bytes of its value go where.
#[derive(Clone, Copy, Debug)]
pub struct BlockRead<'a> {
    /// The reference, from [`Engine::scan_stored`].
    pub block: &'a BlockRef,
    /// The key it was found under (named if the block is damaged).
    pub key: &'a [u8],
    /// The first byte of the value wanted.
    pub from: usize,
    /// Where it goes in the destination.
    pub at: usize,
    /// How many bytes (`from + len` at most 4 KiB: bytes past the value's end read as zeros).
    pub len: usize,
}

impl Engine {
    /// Calls `f(key, value)` for every live entry of the range in key order until it returns
    /// false, as [`Engine::scan`] does, but without reading out-of-line blocks: those come as
    /// [`StoredValue::Block`] references, for [`Engine::read_blocks`].
    pub fn scan_stored(
        &self,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
        mut f: impl FnMut(&[u8], StoredValue<'_>) -> bool,
    ) -> Result<()> {
        self.inner.scan_stored_at(self.root(), lo, hi, &mut f)
    }

    /// Reads the blocks `reads` name into `dest`: each block checked against its checksum (a
    /// mismatch is a checksum error naming its key, and marks the image damaged), its patches
    /// applied, and the wanted bytes of the value copied where asked (read straight there when a
    /// whole block lands on a 4 KiB-aligned place). One device request per run of consecutive
    /// blocks, in the order given.
    pub fn read_blocks(&self, reads: &[BlockRead<'_>], dest: &mut [u8]) -> Result<()> {
        read_blocks(&self.inner, reads, dest)
    }
}

impl Engine {
    /// [`Engine::read_blocks`] for references [`Engine::scan_stored`] found (in this handle's
    /// tree: the live one or its snapshot's), which may have been let go of since: between the scan and the read, an overwrite or a
    /// truncation can release a block, a checkpoint free it and a new write reuse it. On a
    /// checksum mismatch every key of `reads` is looked up again: if one of them no longer holds
    /// the reference it was read by, the read raced such a change and this returns `Ok(false)`
    /// (nothing in `dest` is to be trusted; scan again) without noting damage; if they all still
    /// do, the block is damaged (noted, and the error returned). `Ok(true)`: `dest` holds the
    /// blocks, as [`Engine::read_blocks`] leaves it.
    pub fn read_found_blocks(&self, reads: &[BlockRead<'_>], dest: &mut [u8]) -> Result<bool> {
        check_places(reads, dest);
        let inner = &*self.inner;
        // The tree the references were found in: the live one, or a snapshot's (whose blocks
        // nothing lets go of while it is open, so a mismatch there is always damage).
        let root = self.root();
        match inner.tree.store.read_data(reads, dest, true) {
            Ok(()) => Ok(true),
            Err(e @ Error::Checksum { .. }) => {
                for r in reads {
                    match inner.seen(inner.tree.get_at(root, r.key))? {
                        Some(Val::Ref(now)) if now == r.block.0 => {}
                        _ => {
                            inner
                                .tree
                                .store
                                .counters
                                .data_reads_raced
                                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            return Ok(false);
                        }
                    }
                }
                inner.seen(Err(e))
            }
            Err(e) => inner.seen(Err(e)),
        }
    }
}

/// Asserts that every block read stays inside its block and its destination.
fn check_places(reads: &[BlockRead<'_>], dest: &[u8]) {
    for r in reads {
        assert!(
            r.from + r.len <= BLOCK_SIZE && r.at + r.len <= dest.len(),
            "a block read outside its block or its destination"
        );
    }
}

/// [`Engine::read_blocks`] (and a snapshot view's).
pub(super) fn read_blocks(inner: &Inner, reads: &[BlockRead<'_>], dest: &mut [u8]) -> Result<()> {
    check_places(reads, dest);
    let r = inner.tree.store.read_data(reads, dest, true);
    inner.seen(r)
}

impl Engine {
    /// Checks the data table against a recount of the references to out-of-line blocks the tree
    /// holds (every node read; writers held off), and fails unless they agree exactly. For tests;
    /// [`Engine::verify`] and [`Engine::check_references`] report the same.
    #[doc(hidden)]
    pub fn check_data_table(&self) -> Result<()> {
        let r = self.check_references()?;
        if !r.is_clean() {
            return Err(Error::Corrupt(r.describe()));
        }
        Ok(())
    }

    /// The out-of-line blocks the keys under `prefix` reference, in key order (for tests).
    #[doc(hidden)]
    pub fn blocks_under_for_tests(&self, prefix: &[u8]) -> Vec<u64> {
        let hi = crate::ops::prefix_end(prefix, self.format().max_key_len);
        let mut out = Vec::new();
        self.scan_stored(Bound::Included(prefix), Bound::Excluded(&hi), |_, v| {
            if let StoredValue::Block(b) = v {
                out.push(b.block());
            }
            true
        })
        .expect("scan");
        out
    }

    /// Changes the data table's count of `block` by `delta` without changing the tree, as a bug
    /// might: for tests of [`Engine::check_references`] and `fsck`. Writers are held off.
    #[doc(hidden)]
    pub fn adjust_data_refs_for_tests(&self, block: u64, delta: i32) {
        let _w = self.inner.tree.writers.write();
        let mut d = self.inner.tree.store.data.lock();
        if delta > 0 {
            for _ in 0..delta {
                d.refs.add(block, 1);
            }
        }
        for _ in delta..0 {
            d.refs.release(block);
        }
    }

    /// Compares the data table with the references to out-of-line blocks the tree holds (every
    /// node read; writers held off): blocks leaked, referenced more often than counted, referenced
    /// but free, or inside node images.
    pub fn check_references(&self) -> Result<RefCheck> {
        let tree = &self.inner.tree;
        let _w = tree.writers.write();
        let recount = self.inner.seen(tree.recount_refs())?;
        Ok(check_refs(tree, &recount, false))
    }

    /// [`Engine::check_references`], bringing the table to the references found (`fsck
    /// --repair`): leaked blocks are released (free after the next checkpoint), counts raised,
    /// referenced free blocks claimed. Returns what was found; blocks inside node images are left
    /// as they are (their references name no data of their own).
    pub fn repair_references(&self) -> Result<RefCheck> {
        self.refuse_if_snapshot()?;
        self.inner.check_writable()?;
        let tree = &self.inner.tree;
        let _w = tree.writers.write();
        let recount = self.inner.seen(tree.recount_refs())?;
        Ok(check_refs(tree, &recount, true))
    }
}

impl Inner {
    /// The value of `key` in the tree under `root` (the engine closed and keys past the limit
    /// refused), an out-of-line block read and checked.
    pub(super) fn get_checked(&self, root: NodeId, key: &[u8]) -> Result<Option<Vec<u8>>> {
        if self.closed.load(std::sync::atomic::Ordering::Acquire) {
            return Err(Error::Closed);
        }
        let max = self.tree.format.max_key_len;
        if key.len() > max {
            return Err(Error::KeyTooLong {
                len: key.len(),
                max,
            });
        }
        let r = self.get_value(root, key);
        let _ = self.tree.make_room();
        r
    }

    /// [`Engine::scan_stored`] in the tree under `root`.
    pub(super) fn scan_stored_at(
        &self,
        root: NodeId,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
        f: &mut dyn FnMut(&[u8], StoredValue<'_>) -> bool,
    ) -> Result<()> {
        self.scan_with(root, lo, hi, &mut |k, v| match v {
            Stored::Bytes(b) => f(k, StoredValue::Bytes(b)),
            Stored::Ref(r) => f(k, StoredValue::Block(&BlockRef(DataRef::decode_checked(r)))),
        })
    }

    /// The value of `key`, an out-of-line block read and checked.
    fn get_value(&self, root: NodeId, key: &[u8]) -> Result<Option<Vec<u8>>> {
        match self.seen(self.tree.get_at(root, key))? {
            None => Ok(None),
            Some(Val::Bytes(b)) => Ok(Some(b)),
            Some(Val::Ref(r)) => self.seen(self.tree.store.read_value(&r, key)).map(Some),
        }
    }

    /// A scan of stored values (references not read), with read-ahead for sequential scans.
    pub(super) fn scan_with(
        &self,
        root: NodeId,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
        f: &mut dyn FnMut(&[u8], Stored<'_>) -> bool,
    ) -> Result<()> {
        if self.closed.load(std::sync::atomic::Ordering::Acquire) {
            return Err(Error::Closed);
        }
        let (lo, hi) = normalize(lo, hi);
        let Some(lo) = lo else { return Ok(()) };
        let tree = &self.tree;
        // Read-ahead follows the live tree's leaves: not for a snapshot's.
        let sequential = root == ROOT_ID && tree.note_scan(&lo, hi.as_deref());
        // A scan of the live tree longer than two leaves reads the next ones ahead itself.
        if root == ROOT_ID {
            self.seen(scan_tree_reading_ahead(tree, &lo, hi.as_deref(), f))?;
        } else {
            self.seen(scan_tree_at(tree, root, &lo, hi.as_deref(), f))?;
        }
        if let (true, Some(h)) = (sequential, &hi) {
            tree.read_ahead_from(h);
        }
        tree.make_room()
    }

    /// A scan handing resolved values to `f` (see [`Engine::scan`]).
    pub(super) fn scan_values(
        &self,
        root: NodeId,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<()> {
        let mut batch = Resolver::default();
        let mut stopped = false;
        let mut failed = None;
        self.scan_with(root, lo, hi, &mut |k, v| {
            if batch.is_empty() && !v.is_ref() {
                return f(k, v.raw());
            }
            batch.push(k, v);
            if batch.full() {
                match batch.resolve(self, f) {
                    Ok(go) => stopped = !go,
                    Err(e) => failed = Some(e),
                }
                return !stopped && failed.is_none();
            }
            true
        })?;
        if let Some(e) = failed {
            return Err(e);
        }
        if !stopped {
            batch.resolve(self, f)?;
        }
        Ok(())
    }
}

/// Entries a resolving scan holds until their batch of references is read.
#[derive(Default)]
pub(super) struct Resolver {
    entries: Vec<(Vec<u8>, StoredBuf)>,
    refs: usize,
    /// References read in the next batch.
    want: usize,
}

impl Resolver {
    fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Keeps an entry (copied) until the batch is read.
    pub(super) fn push(&mut self, k: &[u8], v: Stored<'_>) {
        self.refs += usize::from(v.is_ref());
        let v = match v {
            Stored::Bytes(b) => StoredBuf::Bytes(b.to_vec()),
            Stored::Ref(r) => StoredBuf::Ref(r.to_vec()),
        };
        self.entries.push((k.to_vec(), v));
    }

    /// Whether the batch holds as many references as it reads at once.
    pub(super) fn full(&self) -> bool {
        self.refs >= self.want.max(1)
    }

    /// References held.
    pub(super) fn refs(&self) -> usize {
        self.refs
    }

    /// Reads the batch's blocks and hands every entry to `f` in order; returns false if `f`
    /// stopped. The next batch reads twice as many references, up to [`SCAN_BATCH`].
    pub(super) fn resolve(
        &mut self,
        inner: &Inner,
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<bool> {
        let entries = std::mem::take(&mut self.entries);
        let refs: Vec<(BlockRef, usize)> = entries
            .iter()
            .enumerate()
            .filter_map(|(i, (_, v))| match v {
                StoredBuf::Ref(r) => Some((BlockRef(DataRef::decode_checked(r)), i)),
                StoredBuf::Bytes(_) => None,
            })
            .collect();
        let places: Vec<BlockRead<'_>> = refs
            .iter()
            .enumerate()
            .map(|(j, (r, i))| BlockRead {
                block: r,
                key: &entries[*i].0,
                from: 0,
                at: j * BLOCK_SIZE,
                len: BLOCK_SIZE,
            })
            .collect();
        let mut raw = AlignedBuf::zeroed(places.len().max(1) * BLOCK_SIZE);
        inner.seen(inner.tree.store.read_data(&places, &mut raw, false))?;
        self.refs = 0;
        self.want = (self.want * 2).clamp(1, SCAN_BATCH);
        let mut j = 0;
        for (k, v) in &entries {
            let go = match v {
                StoredBuf::Bytes(b) => f(k, b),
                StoredBuf::Ref(_) => {
                    let value = (refs[j].0)
                        .0
                        .resolve(&raw[j * BLOCK_SIZE..(j + 1) * BLOCK_SIZE]);
                    j += 1;
                    f(k, &value)
                }
            };
            if !go {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The batch as owned values (blocks read), for an iterator.
    pub(super) fn resolve_owned(&mut self, inner: &Inner) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut out = Vec::with_capacity(self.entries.len());
        self.resolve(inner, &mut |k, v| {
            out.push((k.to_vec(), v.to_vec()));
            true
        })?;
        Ok(out)
    }
}
