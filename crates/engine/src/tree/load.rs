//! Loading nodes: pinning a node (reading it on a miss), its skeleton or whole image, and the
//! partitions and buffers that load on demand, each checked against its checksum and the index.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{Need, Tree};
use crate::buffer::EncodedBuffer;
use crate::cache::CachedNode;
use crate::error::{Error, Result};
use crate::msg::Msn;
use crate::node::NodeHeader;
use crate::node::{self, Body, BufSlot, Node, NodeId};
use crate::subbytes::SharedImage;
use crate::superblock::Extent;
use amaranth_device::AlignedBuf;

impl Tree {
    /// The node, loading it if needed (pinned by the returned `Arc`). Call without holding latches.
    pub fn pin(&self, id: NodeId) -> Result<Arc<CachedNode>> {
        if let Some(cn) = self.cache.get(id) {
            return Ok(cn);
        }
        self.load(id)
    }

    pub(super) fn load(&self, id: NodeId) -> Result<Arc<CachedNode>> {
        self.load_with(id, false)
    }

    /// Loads node `id`, a child id read in a parent whose latch the caller let go of before this
    /// call (a miss is read without holding latches). `Ok(None)` when the node was merged away
    /// meanwhile: it is neither cached nor has a location, and the caller starts over from the
    /// root, where its parent no longer names it. Without this a lookup or scan racing with a
    /// merge reported the benign race as corruption ("referenced but has no location"). A node
    /// missing for good is still an error: every restart finds it again, and the callers' restart
    /// bounds end in `Corrupt`.
    pub(crate) fn load_found(&self, id: NodeId, whole: bool) -> Result<Option<Arc<CachedNode>>> {
        if let Some(cn) = self.cache.get(id) {
            return Ok(Some(cn));
        }
        match self.load_with(id, whole) {
            Err(Error::Corrupt(_))
                if self.cache.get(id).is_none() && self.store.location(id).is_none() =>
            {
                Ok(None)
            }
            r => r.map(Some),
        }
    }

    /// Loads node `id`; `whole`: read the entire image in one request (a leaf then has every
    /// partition in memory), as scans and flushes want. Otherwise a leaf is loaded as its skeleton.
    pub fn load_with(&self, id: NodeId, whole: bool) -> Result<Arc<CachedNode>> {
        if let Ok(cn) = self.cache.begin_load(id) {
            return Ok(cn);
        }
        self.readahead.reader_loads(id);
        let result = self.make_room().and_then(|_| self.read_node(id, whole));
        let out = result.map(|(node, ext)| self.cache.insert(id, node, false, ext.blocks));
        self.cache.finish_load(id);
        out
    }

    /// Reads node `id` from its current extent: the whole image when `whole`, otherwise its
    /// skeleton (header, pivots, children, sub-block locations); partitions and buffers then load
    /// on demand. Returns the node and the extent it was read from.
    pub fn read_node(&self, id: NodeId, whole: bool) -> Result<(Node, Extent)> {
        let ext = self.store.location(id).ok_or_else(|| {
            Error::Corrupt(format!("node {id} is referenced but has no location"))
        })?;
        let what = format!("node {id}");
        if whole {
            let image = self.store.read_image(ext.offset(), ext.len(), &what)?;
            // As for a skeleton: a header whose span cannot be read is refused here.
            node::header_span(&image, &what, ext.offset())?;
            let h = node::parse_header(&image, &self.format, &what, ext.offset())?;
            check_header(&h, id, Some(ext), &what)?;
            let node = if h.sublocs.iter().any(node::SubLoc::stored_raw) {
                let image = image.into_shared();
                node::build_node_in(&h, &image, &self.format, ext.offset())?
            } else {
                node::build_node(&h, Some(&image), &self.format, ext.offset())?
            };
            return Ok((node, ext));
        }
        let image = self.read_header_image(ext, &what)?;
        let h = node::parse_header(&image, &self.format, &what, ext.offset())?;
        check_header(&h, id, Some(ext), &what)?;
        Ok((node::build_node(&h, None, &self.format, ext.offset())?, ext))
    }

    /// Reads the start of the image at `ext` that holds its whole header: one block, or more
    /// when the header is longer (never past the extent).
    pub(crate) fn read_header_image(&self, ext: Extent, what: &str) -> Result<AlignedBuf> {
        let first = self
            .store
            .read(ext.offset(), amaranth_device::BLOCK_SIZE, what)?;
        let span = node::header_span(&first, what, ext.offset())?;
        if span <= first.len() {
            return Ok(first);
        }
        let len = amaranth_device::round_up(span);
        if len > ext.len() {
            return Err(Error::Corrupt(format!(
                "{what}: header larger than its extent"
            )));
        }
        self.store.read(ext.offset(), len, what)
    }

    /// Loads missing partitions of a leaf, or missing buffers of an internal node: sub-block
    /// `which`, or all of them (`None`). See [`Tree::load_subblocks`].
    pub fn load_partitions(&self, cn: &Arc<CachedNode>, which: Option<usize>) -> Result<()> {
        match which {
            Some(i) => self.load_subblocks(cn, i, i + 1),
            None => self.load_subblocks(cn, 0, usize::MAX),
        }
    }

    /// Loads the missing sub-blocks `[from, to)` (partitions of a leaf, buffers of an internal node)
    /// under the node's read latch: one read of the whole image when several are missing, otherwise
    /// one read per sub-block. Each is checked against its checksum and the node's index.
    pub fn load_subblocks(&self, cn: &Arc<CachedNode>, from: usize, to: usize) -> Result<()> {
        self.make_room()?;
        self.readahead.reader_loads(cn.id);
        let _loading = cn.subblock_load.lock();
        self.load_subblocks_locked(cn, from, to, false).map(|_| ())
    }

    /// For read-ahead: loads every missing partition of leaf `cn` unless someone (a reader) is
    /// loading sub-blocks of it now. The leaf is marked read ahead before its first partition is
    /// installed, so the first scan to use it counts a hit. Returns whether anything was read.
    pub(crate) fn read_ahead_partitions(&self, cn: &Arc<CachedNode>) -> Result<bool> {
        let Some(_loading) = cn.subblock_load.try_lock() else {
            return Ok(false);
        };
        let loaded = self.load_subblocks_locked(cn, 0, usize::MAX, true);
        if loaded.is_err() {
            // Nothing usable was read ahead (the reader reads the leaf itself and sees the error).
            cn.prefetched.store(false, Ordering::Relaxed);
        }
        loaded
    }

    /// [`Tree::load_subblocks`] with the node's `subblock_load` lock held; `read_ahead` marks the
    /// node read ahead before it installs anything. Returns whether anything was read.
    fn load_subblocks_locked(
        &self,
        cn: &Arc<CachedNode>,
        from: usize,
        to: usize,
        read_ahead: bool,
    ) -> Result<bool> {
        let g = cn.read();
        let count = match &g.body {
            Body::Leaf(l) => l.parts.len(),
            Body::Internal(n) => n.buffers.len(),
        };
        let resident = |i: usize| match &g.body {
            Body::Leaf(l) => l.parts[i].data().is_some(),
            Body::Internal(n) => n.buffers[i].is_resident(),
        };
        let mut missing: Vec<usize> = (from..to.min(count)).filter(|&i| !resident(i)).collect();
        if missing.is_empty() {
            return Ok(false);
        }
        if read_ahead {
            cn.prefetched.store(true, Ordering::Relaxed);
        }
        let ext = self.store.location(cn.id).ok_or_else(|| {
            Error::Corrupt(format!(
                "node {} has sub-blocks on disk but no location",
                cn.id
            ))
        })?;
        let loc_of = |i: usize| match &g.body {
            Body::Leaf(l) => Some(
                l.parts[i]
                    .state
                    .lock()
                    .loc
                    .expect("a sub-block not in memory has a disk location"),
            ),
            Body::Internal(n) => n.buffers[i].missing_at(),
        };
        // One read of the whole image when several are missing. A node read whole keeps every
        // sub-block it does not have yet, not only the ones asked for: a sequential read asks
        // for a leaf's range piece by piece (1 MiB FUSE reads of a 4 MiB leaf), and taking only
        // the asked part re-read the whole leaf for every piece (measured: 2.5x the file's
        // bytes read in the sequential-read benchmark); a node's buffers are kept in their
        // checked encoding, not built (building every buffer of a node read whole was two
        // fifths of a cold directory rename's time), so the next range asked for is not read
        // again either.
        let whole = if missing.len() > 2 {
            missing = (0..count).filter(|&i| !resident(i)).collect();
            Some(self.store.read_image(ext.offset(), ext.len(), "node")?)
        } else {
            None
        };
        let locs: Vec<(usize, node::SubLoc)> = missing
            .iter()
            .filter_map(|&i| loc_of(i).map(|loc| (i, loc)))
            .collect();
        // Uncompressed sub-blocks are used where they lie in what was read (`subbytes.rs`): the
        // image, or each one's own read; an image of compressed ones goes back to the pool.
        let whole = match whole {
            Some(image) if locs.iter().any(|(_, loc)| loc.stored_raw()) => {
                Some(Whole::Shared(image.into_shared()))
            }
            Some(image) => Some(Whole::Pooled(image)),
            None => None,
        };
        for (i, loc) in locs {
            let dev_off = ext.offset() + loc.offset as u64;
            let o = loc.offset as usize;
            let what = match &g.body {
                Body::Internal(_) => format!("node {} buffer {i}", cn.id),
                Body::Leaf(_) => format!("node {} partition {i}", cn.id),
            };
            let own;
            let src = match &whole {
                Some(Whole::Shared(image)) => node::SubSrc::Shared { image, offset: o },
                Some(Whole::Pooled(image)) => node::SubSrc::Slice(&image[o..]),
                None => {
                    let (off, len) = loc.aligned_range();
                    own = self.store.read_subblock(ext.offset() + off, len, &what)?;
                    node::SubSrc::Shared {
                        image: &own,
                        offset: 0,
                    }
                }
            };
            match &g.body {
                Body::Internal(n) => {
                    let slot = &n.buffers[i];
                    let bounds = node::child_bounds_of(&n.pivots, i);
                    let enc =
                        self.encoded_buffer(src, &loc, slot, &what, dev_off, g.max_msn, bounds)?;
                    slot.keep_encoding(enc);
                    self.count_buffer_load();
                }
                Body::Leaf(l) => {
                    let slot = &l.parts[i];
                    let p = node::decode_partition_in(src, &loc, &self.format, &what, dev_off)?;
                    if p.len() != slot.entries || p.bytes() != slot.bytes {
                        return Err(Error::Corrupt(format!(
                            "{what}: contents differ from the node index"
                        )));
                    }
                    let mut st = slot.state.lock();
                    if st.data.is_none() {
                        st.data = Some(Arc::new(p));
                        st.runs = None;
                        st.point_loaded = whole.is_none();
                    }
                }
            }
            self.count_subblock_load();
        }
        self.cache.remeasure(cn, &g);
        Ok(true)
    }

    fn count_buffer_load(&self) {
        self.cache
            .counters
            .buffer_loads
            .fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn count_subblock_load(&self) {
        self.cache
            .counters
            .partition_loads
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Checks and indexes a buffer sub-block's encoding (`stored` starts at the sub-block)
    /// against its slot, its node's message numbers and the child's range `bounds`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn encoded_buffer(
        &self,
        stored: node::SubSrc<'_>,
        loc: &node::SubLoc,
        slot: &BufSlot,
        what: &str,
        dev_off: u64,
        node_max_msn: Msn,
        bounds: (&[u8], Option<&[u8]>),
    ) -> Result<EncodedBuffer> {
        if loc.raw_len as usize != slot.bytes() + node::BUFFER_HEADER {
            return Err(Error::Corrupt(format!(
                "{what}: size differs from the node index"
            )));
        }
        node::index_buffer_in(
            stored,
            loc,
            &self.format,
            what,
            dev_off,
            node_max_msn,
            bounds,
        )
    }

    /// Reads the encoding of an internal node's buffer `i` for point queries (checked against its
    /// checksum and the node's index), without building the buffer.
    pub fn load_buffer_encoding(&self, cn: &Arc<CachedNode>, i: usize) -> Result<()> {
        self.make_room()?;
        let _loading = cn.subblock_load.lock();
        let g = cn.read();
        let Body::Internal(n) = &g.body else {
            // The node changed kind (a root split or merge) since the caller looked: nothing to do.
            return Ok(());
        };
        let Some(slot) = n.buffers.get(i) else {
            return Ok(());
        };
        let Some(loc) = slot.missing_at() else {
            return Ok(());
        };
        let ext = self.store.location(cn.id).ok_or_else(|| {
            Error::Corrupt(format!(
                "node {} has buffers on disk but no location",
                cn.id
            ))
        })?;
        let what = format!("node {} buffer {i}", cn.id);
        let (off, len) = loc.aligned_range();
        let stored = self.store.read_subblock(ext.offset() + off, len, &what)?;
        let dev_off = ext.offset() + loc.offset as u64;
        let bounds = node::child_bounds_of(&n.pivots, i);
        let src = node::SubSrc::Shared {
            image: &stored,
            offset: 0,
        };
        let enc = self.encoded_buffer(src, &loc, slot, &what, dev_off, g.max_msn, bounds)?;
        slot.keep_encoding(enc);
        self.count_subblock_load();
        self.count_buffer_load();
        self.cache.remeasure(cn, &g);
        Ok(())
    }

    /// Loads what a restructuring step found missing once it let go of its latches; `None` when
    /// the node was merged away meanwhile ([`Tree::load_found`]).
    pub(super) fn satisfy(&self, need: Need) -> Result<Option<Arc<CachedNode>>> {
        match need {
            Need::Node(id) => self.load_found(id, false),
            Need::Partitions(cn) => {
                self.load_partitions(&cn, None)?;
                Ok(Some(cn))
            }
        }
    }
}

/// Checks that a header read from node `id`'s extent is that node's, and (given the extent) that
/// its image fits in it.
pub(crate) fn check_header(
    h: &NodeHeader,
    id: NodeId,
    ext: Option<Extent>,
    what: &str,
) -> Result<()> {
    if h.layout != node::NODE_VERSION {
        // The superblock's format version keeps format-2 images away: this is damage.
        return Err(Error::Corrupt(format!(
            "{what}: node layout {} in a format-3 image",
            h.layout
        )));
    }
    if h.id != id {
        return Err(Error::Corrupt(format!(
            "{what}: extent holds node {} instead",
            h.id
        )));
    }
    if ext.is_some_and(|ext| h.image_len > ext.len()) {
        return Err(Error::Corrupt(format!(
            "{what}: image longer than its extent"
        )));
    }
    Ok(())
}

/// A leaf image read whole: kept for the partitions used in place, or back to the pool.
enum Whole<'a> {
    Shared(SharedImage),
    Pooled(crate::store::Image<'a>),
}
