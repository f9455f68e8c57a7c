//! The Bε-tree: message injection at the root, flushes of the heaviest child, splits and merges.
//!
//! Concurrency rules (see docs/DESIGN.md):
//! - Latches are taken top-down only. Readers couple read latches (parent held while the child is
//!   latched) and never hold a latch across a node load: on a miss they release everything, load, and
//!   restart from the root. Read latches are recursive, so readers never queue behind a writer.
//! - Every modifier holds `writers` shared; a checkpoint's start holds it exclusive, which gives the
//!   checkpoint a consistent cut between flush steps.
//! - A modification is bracketed by [`Tree::begin_modify`] (which first saves the node's image for a
//!   running checkpoint if the node is pending) and [`Tree::end_modify`] (dirty, version, memory).
//! - No latch is held during a node write; a written image is installed only if the node did not
//!   change meanwhile (version check).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use amaranth_device::AlignedBuf;
use parking_lot::{Mutex, RwLock};

use crate::cache::{Cache, CachedNode, WriteGuard};
use crate::config::Format;
use crate::error::{Error, Result};
use crate::msg::{Buffer, EncodedBuffer, Msn, PointOp};
use crate::node::{self, child_index, Body, BufSlot, Internal, Leaf, Node, NodeId, ROOT_ID};
use crate::store::Store;
use crate::superblock::Extent;

/// A message before it gets its sequence number.
#[derive(Clone, Debug)]
pub enum Msg {
    /// A message for one key.
    Point {
        /// The key.
        key: Vec<u8>,
        /// What to do.
        op: PointOp,
    },
    /// Delete `[lo, hi)`.
    Range {
        /// Inclusive low bound.
        lo: Vec<u8>,
        /// Exclusive high bound.
        hi: Vec<u8>,
    },
}

impl Msg {
    /// Serialized size, for accounting.
    pub fn size(&self) -> usize {
        match self {
            Msg::Point { key, op } => {
                key.len()
                    + match op {
                        PointOp::Put(v) => v.len() + 8,
                        PointOp::Delete => 8,
                        PointOp::Upsert(p) => p.size(),
                    }
            }
            Msg::Range { lo, hi } => lo.len() + hi.len() + 8,
        }
    }
}

/// Counters of tree activity.
#[derive(Debug, Default)]
pub struct TreeCounters {
    /// Buffer flushes into a child.
    pub flushes: AtomicU64,
    /// Bytes of messages moved by flushes.
    pub bytes_flushed: AtomicU64,
    /// Leaf splits (pieces created).
    pub leaf_splits: AtomicU64,
    /// Internal node splits.
    pub internal_splits: AtomicU64,
    /// Node merges.
    pub merges: AtomicU64,
    /// Messages injected at the root.
    pub messages: AtomicU64,
    /// Bytes of user data in injected messages.
    pub user_bytes: AtomicU64,
}

/// What a flush step needs loaded before it can go on.
enum Need {
    Node(NodeId),
    Partitions(Arc<CachedNode>),
}

/// The tree: its nodes (through the cache), its space and its counters.
pub struct Tree {
    /// Format parameters.
    pub format: Format,
    /// Device, table and allocator.
    pub store: Arc<Store>,
    /// Resident nodes.
    pub cache: Cache,
    /// Held shared by every modification; exclusive at a checkpoint's start and during prefix moves.
    pub writers: RwLock<()>,
    /// Next node id.
    pub next_node_id: AtomicU64,
    /// Next message sequence number (advanced under the root's write latch).
    pub next_msn: AtomicU64,
    /// Images of pending nodes saved by modifiers for the running checkpoint, with the extent
    /// each node was at then.
    pub ckpt_queue: Mutex<Vec<(NodeId, AlignedBuf, Option<Extent>)>>,
    /// Counters.
    pub counters: TreeCounters,
    /// Check each node's invariants whenever it changes ([`Options::check_invariants`]).
    ///
    /// [`Options::check_invariants`]: crate::Options::check_invariants
    pub check_invariants: bool,
    /// Nothing may be written to the device: modifications are refused and eviction keeps dirty
    /// nodes (a read-only open or remount).
    read_only: AtomicBool,
}

impl Tree {
    /// A tree over `store`.
    pub fn new(
        format: Format,
        store: Arc<Store>,
        cache_size: usize,
        next_node_id: u64,
        next_msn: Msn,
    ) -> Tree {
        let node_size = format.node_size;
        Tree {
            format,
            store,
            cache: Cache::new(cache_size, node_size),
            writers: RwLock::new(()),
            next_node_id: AtomicU64::new(next_node_id),
            next_msn: AtomicU64::new(next_msn),
            ckpt_queue: Mutex::new(Vec::new()),
            counters: TreeCounters::default(),
            check_invariants: cfg!(debug_assertions),
            read_only: AtomicBool::new(false),
        }
    }

    /// Whether nothing may be written to the device.
    pub fn is_read_only(&self) -> bool {
        self.read_only.load(Ordering::Acquire)
    }

    /// Allows or forbids writing to the device (the engine switches modes with writers held off).
    pub fn set_read_only(&self, read_only: bool) {
        self.read_only.store(read_only, Ordering::Release);
    }

    // ----- node residency -------------------------------------------------------------------

    /// The node, loading it if needed (pinned by the returned `Arc`). Call without holding latches.
    pub fn pin(&self, id: NodeId) -> Result<Arc<CachedNode>> {
        if let Some(cn) = self.cache.get(id) {
            return Ok(cn);
        }
        self.load(id)
    }

    fn load(&self, id: NodeId) -> Result<Arc<CachedNode>> {
        self.load_with(id, false)
    }

    /// Loads node `id`; `whole`: read the entire image in one request (a leaf then has every
    /// partition in memory), as scans and flushes want. Otherwise a leaf is loaded as its skeleton.
    pub fn load_with(&self, id: NodeId, whole: bool) -> Result<Arc<CachedNode>> {
        if let Ok(cn) = self.cache.begin_load(id) {
            return Ok(cn);
        }
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
        let first_len = if whole {
            ext.len()
        } else {
            amaranth_device::BLOCK_SIZE
        };
        let first = self.store.read(ext.offset(), first_len, &what)?;
        let span = node::header_span(&first, &what, ext.offset())?;
        let image = if whole || span <= first.len() {
            first
        } else {
            let len = amaranth_device::round_up(span);
            if len > ext.len() {
                return Err(Error::Corrupt(format!(
                    "{what}: header larger than its extent"
                )));
            }
            self.store.read(ext.offset(), len, &what)?
        };
        let h = node::parse_header(&image, &self.format, &what, ext.offset())?;
        if h.id != id {
            return Err(Error::Corrupt(format!(
                "{what}: extent holds node {} instead",
                h.id
            )));
        }
        if h.image_len > ext.len() {
            return Err(Error::Corrupt(format!(
                "{what}: image longer than its extent"
            )));
        }
        let full = if whole { Some(&image[..]) } else { None };
        Ok((node::build_node(&h, full, &self.format, ext.offset())?, ext))
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
        let _loading = cn.subblock_load.lock();
        let g = cn.read();
        let (count, is_leaf) = match &g.body {
            Body::Leaf(l) => (l.parts.len(), true),
            Body::Internal(n) => (n.buffers.len(), false),
        };
        let resident = |i: usize| match &g.body {
            Body::Leaf(l) => l.parts[i].data().is_some(),
            Body::Internal(n) => n.buffers[i].is_resident(),
        };
        let mut missing: Vec<usize> = (from..to.min(count)).filter(|&i| !resident(i)).collect();
        if missing.is_empty() {
            return Ok(());
        }
        let ext = self.store.location(cn.id).ok_or_else(|| {
            Error::Corrupt(format!(
                "node {} has sub-blocks on disk but no location",
                cn.id
            ))
        })?;
        let whole = if missing.len() > 2 {
            if is_leaf {
                // The whole image is read anyway: keep every partition of the leaf, not only the
                // ones asked for. A sequential read asks for a leaf's range piece by piece (1 MiB
                // FUSE reads of a 4 MiB leaf); taking only the asked part re-read the whole leaf
                // for every piece (measured: 2.5x the file's bytes read in the sequential-read
                // benchmark). Partitions decode cheaply; buffers do not, so they stay as asked.
                missing = (0..count).filter(|&i| !resident(i)).collect();
            }
            let img = self.store.read(ext.offset(), ext.len(), "node")?;
            if let Body::Internal(n) = &g.body {
                // Keep the encodings of the other buffers too (cheap: no map is built), so that
                // the next range asked for does not read the whole node again.
                for (i, slot) in n.buffers.iter().enumerate() {
                    if missing.contains(&i) {
                        continue;
                    }
                    let loc = {
                        let st = slot.state.lock();
                        if st.data.is_some() || st.raw.is_some() {
                            continue;
                        }
                        st.loc.expect("a buffer not in memory has a disk location")
                    };
                    let what = format!("node {} buffer {i}", cn.id);
                    let dev_off = ext.offset() + loc.offset as u64;
                    let enc = self.encoded_buffer(
                        &img[loc.offset as usize..],
                        &loc,
                        slot,
                        &what,
                        dev_off,
                        g.max_msn,
                    )?;
                    let mut st = slot.state.lock();
                    if st.data.is_none() && st.raw.is_none() {
                        st.raw = Some(Arc::new(enc));
                    }
                }
            }
            Some(img)
        } else {
            None
        };
        for i in missing {
            let loc = match &g.body {
                Body::Leaf(l) => l.parts[i].state.lock().loc,
                Body::Internal(n) => n.buffers[i].state.lock().loc,
            }
            .expect("a sub-block not in memory has a disk location");
            let what = format!(
                "node {} {} {i}",
                cn.id,
                if is_leaf { "partition" } else { "buffer" }
            );
            let dev_off = ext.offset() + loc.offset as u64;
            // A buffer's encoding kept for point queries saves the read.
            let kept = match &g.body {
                Body::Internal(n) => n.buffers[i].state.lock().raw.clone(),
                Body::Leaf(_) => None,
            };
            let fetched;
            let stored: &[u8] = match (&kept, &whole) {
                (Some(_), _) => &[],
                (None, Some(img)) => &img[loc.offset as usize..],
                (None, None) => {
                    let (off, len) = loc.aligned_range();
                    fetched = self.store.read(ext.offset() + off, len, &what)?;
                    &fetched
                }
            };
            match &g.body {
                Body::Leaf(l) => {
                    let slot = &l.parts[i];
                    let p = node::decode_partition(stored, &loc, &self.format, &what, dev_off)?;
                    if p.len() != slot.entries || p.bytes() != slot.bytes {
                        return Err(Error::Corrupt(format!(
                            "{what}: contents differ from the node index"
                        )));
                    }
                    let mut st = slot.state.lock();
                    if st.data.is_none() {
                        st.data = Some(Arc::new(p));
                    }
                }
                Body::Internal(n) => {
                    let decoded;
                    let payload: &[u8] = match &kept {
                        Some(enc) => enc.raw(),
                        None => {
                            decoded = node::decode_sub(stored, &loc, &what, dev_off)?;
                            &decoded
                        }
                    };
                    let (lo, hi) = node::child_bounds_of(&n.pivots, i);
                    let b = node::decode_buffer_payload(
                        payload,
                        &self.format,
                        &what,
                        g.max_msn,
                        lo,
                        hi,
                    )?;
                    if b.bytes() != n.buffers[i].bytes() {
                        return Err(Error::Corrupt(format!(
                            "{what}: contents differ from the node index"
                        )));
                    }
                    let mut st = n.buffers[i].state.lock();
                    if st.data.is_none() {
                        st.data = Some(Arc::new(b));
                    }
                    // The built buffer answers point queries from now on.
                    st.raw = None;
                }
            }
            self.count_subblock_load();
        }
        self.cache.remeasure(cn, &g);
        Ok(())
    }

    fn count_subblock_load(&self) {
        self.cache
            .counters
            .partition_loads
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Checks and indexes a buffer sub-block's encoding (`stored` starts at the sub-block).
    fn encoded_buffer(
        &self,
        stored: &[u8],
        loc: &node::SubLoc,
        slot: &BufSlot,
        what: &str,
        dev_off: u64,
        node_max_msn: Msn,
    ) -> Result<EncodedBuffer> {
        let raw = node::decode_sub(stored, loc, what, dev_off)?;
        if raw.len() != slot.bytes() + node::BUFFER_HEADER {
            return Err(Error::Corrupt(format!(
                "{what}: size differs from the node index"
            )));
        }
        let enc = EncodedBuffer::index(raw, self.format.max_key_len, self.format.max_value_len)
            .map_err(|e| Error::Corrupt(format!("{what}: {e}")))?;
        if enc.max_msn() > node_max_msn {
            return Err(Error::Corrupt(format!(
                "{what}: messages newer than the node"
            )));
        }
        Ok(enc)
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
        let loc = {
            let st = slot.state.lock();
            if st.data.is_some() || st.raw.is_some() {
                return Ok(());
            }
            st.loc.expect("a buffer not in memory has a disk location")
        };
        let ext = self.store.location(cn.id).ok_or_else(|| {
            Error::Corrupt(format!(
                "node {} has buffers on disk but no location",
                cn.id
            ))
        })?;
        let what = format!("node {} buffer {i}", cn.id);
        let (off, len) = loc.aligned_range();
        let stored = self.store.read(ext.offset() + off, len, &what)?;
        let dev_off = ext.offset() + loc.offset as u64;
        let enc = self.encoded_buffer(&stored, &loc, slot, &what, dev_off, g.max_msn)?;
        {
            let mut st = slot.state.lock();
            if st.data.is_none() && st.raw.is_none() {
                st.raw = Some(Arc::new(enc));
            }
        }
        self.count_subblock_load();
        self.cache.remeasure(cn, &g);
        Ok(())
    }

    // ----- the modification protocol ---------------------------------------------------------

    /// Call before changing a node under its write latch: if a running checkpoint still needs the
    /// node's current state, save its image first.
    pub fn begin_modify(&self, cn: &CachedNode, node: &Node) -> Result<()> {
        if !cn.meta.lock().pending {
            return Ok(());
        }
        let mut q = self.ckpt_queue.lock();
        {
            let mut m = cn.meta.lock();
            if !m.pending {
                return Ok(());
            }
            m.pending = false;
        }
        assert!(
            node.fully_resident(),
            "a dirty node is always fully resident"
        );
        let img = node::serialize(cn.id, node, self.format.compression);
        self.cache.add_used(img.buf.len() as isize);
        q.push((cn.id, img.buf, self.store.location(cn.id)));
        Ok(())
    }

    /// Call after changing a node: marks it dirty, bumps its version, re-measures its memory.
    pub fn end_modify(&self, cn: &CachedNode, node: &Node) {
        if self.check_invariants {
            node.check_invariants(cn.id);
        }
        {
            let mut m = cn.meta.lock();
            assert!(!m.deleted, "modifying deleted node {}", cn.id);
            m.dirty = true;
            m.version += 1;
        }
        self.cache.remeasure(cn, node);
    }

    fn new_node(&self, node: Node) -> NodeId {
        let id = self.next_node_id.fetch_add(1, Ordering::Relaxed);
        if self.check_invariants {
            node.check_invariants(id);
        }
        self.cache.insert(id, node, true, 0);
        id
    }

    fn delete_node(&self, cn: &CachedNode, node: &mut Node) -> Result<()> {
        self.begin_modify(cn, node)?;
        cn.meta.lock().deleted = true;
        node.body = Body::Leaf(Leaf::empty());
        self.cache.forget(cn);
        self.store.btt.lock().remove(cn.id);
        Ok(())
    }

    // ----- injection --------------------------------------------------------------------------

    /// Applies `msgs` at the root as one atomic step. `before_apply(first_msn)` runs under the root
    /// latch just before the messages get their numbers (the engine appends the log record there, so
    /// log order is application order); it must not fail after side effects. Returns the first MSN
    /// and whether the root now needs a flush.
    pub fn inject(
        &self,
        msgs: Vec<Msg>,
        before_apply: &mut dyn FnMut(Msn) -> Result<()>,
    ) -> Result<(Msn, bool)> {
        let mut pins = Vec::new();
        loop {
            let root = self.pin(ROOT_ID)?;
            let mut g = root.write();
            if !g.fully_resident() {
                drop(g);
                self.load_partitions(&root, None)?;
                pins.push(root);
                continue;
            }
            self.begin_modify(&root, &g)?;
            let first = self.next_msn.load(Ordering::Relaxed);
            before_apply(first)?;
            let count = msgs.len() as u64;
            let bytes: usize = msgs.iter().map(|m| m.size()).sum();
            let node = &mut *g;
            match &mut node.body {
                Body::Internal(n) => {
                    for (i, m) in msgs.into_iter().enumerate() {
                        route(n, first + i as u64, m);
                    }
                }
                Body::Leaf(l) => {
                    let mut tmp = Buffer::new();
                    for (i, m) in msgs.into_iter().enumerate() {
                        let msn = first + i as u64;
                        match m {
                            Msg::Point { key, op } => tmp.add_point(key, msn, op),
                            Msg::Range { lo, hi } => tmp.add_range(msn, &lo, &hi),
                        }
                    }
                    let (ranges, points) = tmp.into_parts();
                    l.apply(&ranges, &points, &self.format);
                }
            }
            if count > 0 {
                node.max_msn = first + count - 1;
            }
            self.next_msn.store(first + count, Ordering::Relaxed);
            self.end_modify(&root, &g);
            self.counters.messages.fetch_add(count, Ordering::Relaxed);
            self.counters
                .user_bytes
                .fetch_add(bytes as u64, Ordering::Relaxed);
            let needs_flush = g.bytes() > self.format.node_size;
            return Ok((first, needs_flush));
        }
    }

    /// Bytes the root holds (entries for a leaf root, buffered messages for an internal one).
    pub fn root_bytes(&self) -> Result<usize> {
        let root = self.pin(ROOT_ID)?;
        let g = root.read();
        Ok(g.bytes())
    }

    // ----- flushing ---------------------------------------------------------------------------

    /// Flushes along the heaviest path from the root while buffers hold more than `threshold` bytes,
    /// fixing the root's shape first. Returns whether anything changed. The caller holds `writers`
    /// shared (or exclusive) and no latch.
    pub fn flush_step(&self, threshold: usize) -> Result<bool> {
        let mut pins: Vec<Arc<CachedNode>> = Vec::new();
        let mut did = false;
        'retry: for _ in 0..256 {
            let root = self.pin(ROOT_ID)?;
            let mut pg = root.write();
            if !pg.fully_resident() {
                drop(pg);
                self.load_partitions(&root, None)?;
                pins.push(root);
                continue 'retry;
            }
            match self.fix_root(&root, &mut pg)? {
                Ok(changed) => did |= changed,
                Err(need) => {
                    drop(pg);
                    pins.push(self.satisfy(need)?);
                    continue 'retry;
                }
            }
            let mut pcn = root;
            loop {
                let (c, cid) = match &pg.body {
                    Body::Internal(n) if n.buffered_bytes() > threshold => {
                        let c = n.heaviest_child();
                        (c, n.children[c])
                    }
                    _ => return Ok(did),
                };
                // Below the root the child is loaded while this node stays latched (only readers
                // passing through this node wait); at the root, let go and start again instead.
                let at_root = pcn.id == ROOT_ID;
                let ccn = match self.cache.get(cid) {
                    Some(c) => c,
                    None if at_root => {
                        drop(pg);
                        pins.push(self.load_with(cid, true)?);
                        continue 'retry;
                    }
                    None => self.load_with(cid, true)?,
                };
                if !ccn.read().fully_resident() {
                    if at_root {
                        drop(pg);
                        self.load_partitions(&ccn, None)?;
                        pins.push(ccn);
                        continue 'retry;
                    }
                    self.load_partitions(&ccn, None)?;
                }
                let mut cg = ccn.write();
                if !cg.fully_resident() {
                    // Evicted again between the load and the latch (tiny cache): start over.
                    drop(cg);
                    drop(pg);
                    pins.push(ccn);
                    continue 'retry;
                }
                let child_alive = self.flush_into_child(&pcn, &mut pg, c, &ccn, &mut cg)?;
                did = true;
                let child_over = child_alive
                    && matches!(&cg.body, Body::Internal(n) if n.buffered_bytes() > threshold);
                if child_over {
                    // Go down: the child must drain before more is pushed into it.
                    drop(pg);
                    pg = cg;
                    pcn = ccn;
                }
                // Otherwise stay at this node and flush its next heaviest buffer if it is still over.
            }
        }
        Err(Error::Corrupt(
            "a flush could not keep its path in memory (cache too small for the tree?)".into(),
        ))
    }

    /// Flushes buffers down to the leaves, depth first in key order, starting with the subtree
    /// holding `from` and stopping after about `max_flushes` flushes. Returns where to resume
    /// (`None`: the end of the tree was reached). Holds the write latches of the path it works on,
    /// so readers wait: a maintenance operation (reclaiming the space of deleted data), not for the
    /// fast path. The caller holds `writers` shared. With `deletes_only`, only buffers that hold a
    /// range delete are flushed (what frees the space of deleted data).
    pub fn drain_from(
        &self,
        from: &[u8],
        max_flushes: usize,
        deletes_only: bool,
    ) -> Result<(usize, Option<Vec<u8>>)> {
        let root = self.pin(ROOT_ID)?;
        self.load_partitions(&root, None)?;
        let mut g = root.write();
        if !g.fully_resident() {
            return Ok((0, Some(from.to_vec())));
        }
        let mut work = DrainWork {
            max_flushes,
            deletes_only,
            flushes: 0,
        };
        let resume = self.drain_node(&root, &mut g, from, None, &mut work)?;
        Ok((work.flushes, resume))
    }

    fn drain_node(
        &self,
        cn: &Arc<CachedNode>,
        g: &mut WriteGuard,
        from: &[u8],
        node_hi: Option<&[u8]>,
        work: &mut DrainWork,
    ) -> Result<Option<Vec<u8>>> {
        let mut i = match &g.body {
            Body::Internal(n) => child_index(&n.pivots, from),
            Body::Leaf(_) => return Ok(None),
        };
        loop {
            let (cid, pending, lo, hi) = match &g.body {
                Body::Internal(n) if i < n.children.len() => {
                    let (l, h) = n.child_bounds(i, &[], node_hi);
                    let pending = if work.deletes_only {
                        n.buffers[i].data().is_some_and(|b| b.counts().1 > 0)
                    } else {
                        !n.buffers[i].is_empty()
                    };
                    (n.children[i], pending, l.to_vec(), h.map(|h| h.to_vec()))
                }
                _ => return Ok(None),
            };
            if work.flushes >= work.max_flushes {
                return Ok(Some(lo));
            }
            if !pending && g.height == 1 {
                // A leaf with nothing to receive: no need to read it.
                i += 1;
                continue;
            }
            let ccn = match self.cache.get(cid) {
                Some(c) => c,
                None => self.load_with(cid, true)?,
            };
            if !ccn.read().fully_resident() {
                self.load_partitions(&ccn, None)?;
            }
            // A pass pushing range deletes down empties leaves: keep a sibling in memory so that
            // the emptied child can merge into it (merges only take resident siblings).
            let _sibling = if pending && work.deletes_only {
                self.pin_sibling(g, i)?
            } else {
                None
            };
            let mut cg = ccn.write();
            if pending {
                let alive = self.flush_into_child(cn, g, i, &ccn, &mut cg)?;
                work.flushes += 1;
                if !alive {
                    // Merged into its left sibling: look at that one again.
                    i = i.saturating_sub(1);
                    continue;
                }
            }
            if matches!(cg.body, Body::Internal(_)) {
                let start = if from > lo.as_slice() {
                    from
                } else {
                    lo.as_slice()
                };
                if let Some(resume) = self.drain_node(&ccn, &mut cg, start, hi.as_deref(), work)? {
                    return Ok(Some(resume));
                }
            }
            i += 1;
        }
    }

    /// Loads and pins a sibling of child `c` (the one a merge of `c` would use), fully resident.
    fn pin_sibling(&self, pg: &WriteGuard, c: usize) -> Result<Option<Arc<CachedNode>>> {
        let Body::Internal(pn) = &pg.body else {
            return Ok(None);
        };
        if pn.children.len() < 2 {
            return Ok(None);
        }
        let s = if c + 1 < pn.children.len() {
            c + 1
        } else {
            c - 1
        };
        let id = pn.children[s];
        let scn = match self.cache.get(id) {
            Some(x) => x,
            None => self.load_with(id, true)?,
        };
        if !scn.read().fully_resident() {
            self.load_partitions(&scn, None)?;
        }
        Ok(Some(scn))
    }

    fn satisfy(&self, need: Need) -> Result<Arc<CachedNode>> {
        match need {
            Need::Node(id) => self.load(id),
            Need::Partitions(cn) => {
                self.load_partitions(&cn, None)?;
                Ok(cn)
            }
        }
    }

    /// Keeps the root's shape within bounds: splits an oversized root leaf or an over-wide root
    /// (the root keeps its id; its contents move into new children) and collapses a root with a
    /// single child. `Err(need)` asks the caller to load something and retry.
    fn fix_root(
        &self,
        root: &Arc<CachedNode>,
        rg: &mut WriteGuard,
    ) -> Result<std::result::Result<bool, Need>> {
        let f = &self.format;
        let height = rg.height;
        let max_msn = rg.max_msn;
        enum Fix {
            SplitLeaf,
            SplitInternal,
            Collapse(NodeId),
            None,
        }
        let fix = match &rg.body {
            Body::Leaf(l) if l.bytes() > f.node_size => Fix::SplitLeaf,
            Body::Internal(n) if n.children.len() > f.max_fanout => Fix::SplitInternal,
            Body::Internal(n) if n.children.len() == 1 && n.buffers[0].is_empty() => {
                Fix::Collapse(n.children[0])
            }
            _ => Fix::None,
        };
        match fix {
            Fix::None => Ok(Ok(false)),
            Fix::SplitLeaf => {
                self.begin_modify(root, rg)?;
                let Body::Leaf(l) = &mut rg.body else {
                    unreachable!()
                };
                let pieces = l.split(f);
                let first = std::mem::replace(l, Leaf::empty());
                let mut pivots = Vec::new();
                let mut children = vec![self.new_node(Node {
                    height: 0,
                    max_msn,
                    body: Body::Leaf(first),
                })];
                self.counters
                    .leaf_splits
                    .fetch_add(pieces.len() as u64, Ordering::Relaxed);
                for (low, leaf) in pieces {
                    pivots.push(low);
                    children.push(self.new_node(Node {
                        height: 0,
                        max_msn,
                        body: Body::Leaf(leaf),
                    }));
                }
                let buffers = children.iter().map(|_| BufSlot::empty()).collect();
                rg.body = Body::Internal(Internal {
                    pivots,
                    children,
                    buffers,
                });
                rg.height = 1;
                self.end_modify(root, rg);
                Ok(Ok(true))
            }
            Fix::SplitInternal => {
                self.begin_modify(root, rg)?;
                let Body::Internal(n) = &mut rg.body else {
                    unreachable!()
                };
                let all = std::mem::replace(
                    n,
                    Internal {
                        pivots: vec![],
                        children: vec![],
                        buffers: vec![],
                    },
                );
                let (first, rest) = split_internal(all, f.max_fanout, true);
                let mut pivots = Vec::new();
                let mut children = vec![self.new_node(Node {
                    height,
                    max_msn,
                    body: Body::Internal(first),
                })];
                self.counters
                    .internal_splits
                    .fetch_add(rest.len() as u64, Ordering::Relaxed);
                for (low, piece) in rest {
                    pivots.push(low);
                    children.push(self.new_node(Node {
                        height,
                        max_msn,
                        body: Body::Internal(piece),
                    }));
                }
                let buffers = children.iter().map(|_| BufSlot::empty()).collect();
                rg.body = Body::Internal(Internal {
                    pivots,
                    children,
                    buffers,
                });
                rg.height = height + 1;
                self.end_modify(root, rg);
                Ok(Ok(true))
            }
            Fix::Collapse(cid) => {
                let Some(ccn) = self.cache.get(cid) else {
                    return Ok(Err(Need::Node(cid)));
                };
                let mut cg = ccn.write();
                if !cg.fully_resident() {
                    drop(cg);
                    return Ok(Err(Need::Partitions(ccn)));
                }
                self.begin_modify(root, rg)?;
                self.begin_modify(&ccn, &cg)?;
                let body = std::mem::replace(&mut cg.body, Body::Leaf(Leaf::empty()));
                rg.height = cg.height;
                rg.max_msn = rg.max_msn.max(cg.max_msn);
                rg.body = body;
                self.delete_node(&ccn, &mut cg)?;
                self.end_modify(root, rg);
                self.counters.merges.fetch_add(1, Ordering::Relaxed);
                Ok(Ok(true))
            }
        }
    }

    /// Moves buffer `c` of the parent into the child, then restructures the child (split or merge).
    /// Returns whether the child still exists (a merge may fold it into its left sibling).
    fn flush_into_child(
        &self,
        pcn: &Arc<CachedNode>,
        pg: &mut WriteGuard,
        c: usize,
        ccn: &Arc<CachedNode>,
        cg: &mut WriteGuard,
    ) -> Result<bool> {
        self.begin_modify(pcn, pg)?;
        self.begin_modify(ccn, cg)?;
        let Body::Internal(pn) = &mut pg.body else {
            unreachable!("flush from a leaf")
        };
        let buf = pn.buffers[c].take();
        self.counters.flushes.fetch_add(1, Ordering::Relaxed);
        self.counters
            .bytes_flushed
            .fetch_add(buf.bytes() as u64, Ordering::Relaxed);
        deliver(buf, cg, &self.format);
        // The buffer left the parent: count that before the child's growth, or the accounted
        // usage holds the messages twice (measured: 13 MiB above the eviction point in one step).
        self.cache.remeasure(pcn, pg);
        self.end_modify(ccn, cg);
        let alive = self.restructure_child(pg, c, ccn, cg)?;
        self.end_modify(pcn, pg);
        Ok(alive)
    }

    /// Splits an oversized child, or merges an undersized one with a sibling when that is cheap
    /// (sibling resident). Both latches are held. Returns whether the child still exists.
    fn restructure_child(
        &self,
        pg: &mut WriteGuard,
        c: usize,
        ccn: &Arc<CachedNode>,
        cg: &mut WriteGuard,
    ) -> Result<bool> {
        if self.split_child(pg, c, ccn, cg) {
            return Ok(true);
        }
        let f = &self.format;
        let under = match &cg.body {
            Body::Leaf(l) => l.bytes() < f.node_size / 4,
            Body::Internal(n) => n.children.len() < f.min_fanout(),
        };
        let Body::Internal(pn) = &pg.body else {
            unreachable!()
        };
        if !under || pn.children.len() < 2 {
            return Ok(true);
        }
        let s = if c + 1 < pn.children.len() {
            c + 1
        } else {
            c - 1
        };
        let Some(scn) = self.cache.get(pn.children[s]) else {
            return Ok(true);
        };
        let mut sg = scn.write();
        if !sg.fully_resident() || sg.height != cg.height {
            return Ok(true);
        }
        // Merge only when the result fits comfortably (no merge-then-split churn).
        let fits = match (&cg.body, &sg.body) {
            (Body::Leaf(a), Body::Leaf(b)) => a.bytes() + b.bytes() <= f.node_size * 3 / 4,
            (Body::Internal(a), Body::Internal(b)) => {
                a.children.len() + b.children.len() <= f.max_fanout
                    && a.buffered_bytes() + b.buffered_bytes() + pn.buffers[s].bytes()
                        <= f.node_size
            }
            _ => false,
        };
        if !fits {
            return Ok(true);
        }
        self.begin_modify(&scn, &sg)?;
        // The sibling must receive its pending messages first: after the merge both halves share one
        // buffer slot, which must hold only messages newer than everything below it.
        let Body::Internal(pn) = &mut pg.body else {
            unreachable!()
        };
        let sbuf = pn.buffers[s].take();
        if !sbuf.is_empty() {
            self.counters.flushes.fetch_add(1, Ordering::Relaxed);
            self.counters
                .bytes_flushed
                .fetch_add(sbuf.bytes() as u64, Ordering::Relaxed);
            deliver(sbuf, &mut sg, &self.format);
        }
        let (left_is_child, li) = if s > c { (true, c) } else { (false, s) };
        let pivot = pn.pivots.remove(li);
        pn.children.remove(li + 1);
        pn.buffers.remove(li + 1);
        let (lcn, lg, rcn, rg): (
            &Arc<CachedNode>,
            &mut WriteGuard,
            &Arc<CachedNode>,
            &mut WriteGuard,
        ) = if left_is_child {
            (ccn, cg, &scn, &mut sg)
        } else {
            (&scn, &mut sg, ccn, cg)
        };
        let right_body = std::mem::replace(&mut rg.body, Body::Leaf(Leaf::empty()));
        lg.max_msn = lg.max_msn.max(rg.max_msn);
        match (&mut lg.body, right_body) {
            (Body::Leaf(a), Body::Leaf(b)) => a.absorb(pivot, b),
            (Body::Internal(a), Body::Internal(b)) => a.absorb(pivot, b),
            _ => unreachable!("siblings of different kinds"),
        }
        self.delete_node(rcn, rg)?;
        self.end_modify(lcn, lg);
        self.counters.merges.fetch_add(1, Ordering::Relaxed);
        Ok(left_is_child)
    }

    /// Splits child `c` if it is over its size or fanout bound; returns whether it did.
    fn split_child(
        &self,
        pg: &mut WriteGuard,
        c: usize,
        ccn: &Arc<CachedNode>,
        cg: &mut WriteGuard,
    ) -> bool {
        let f = &self.format;
        let height = cg.height;
        let max_msn = cg.max_msn;
        let pieces: Vec<(Vec<u8>, Node)> = match &mut cg.body {
            Body::Leaf(l) if l.bytes() > f.node_size => {
                let p: Vec<_> = l
                    .split(f)
                    .into_iter()
                    .map(|(k, leaf)| {
                        (
                            k,
                            Node {
                                height,
                                max_msn,
                                body: Body::Leaf(leaf),
                            },
                        )
                    })
                    .collect();
                self.counters
                    .leaf_splits
                    .fetch_add(p.len() as u64, Ordering::Relaxed);
                p
            }
            Body::Internal(n) if n.children.len() > f.max_fanout => {
                let all = std::mem::replace(
                    n,
                    Internal {
                        pivots: vec![],
                        children: vec![],
                        buffers: vec![],
                    },
                );
                let (first, rest) = split_internal(all, f.max_fanout, false);
                *n = first;
                let p: Vec<_> = rest
                    .into_iter()
                    .map(|(k, int)| {
                        (
                            k,
                            Node {
                                height,
                                max_msn,
                                body: Body::Internal(int),
                            },
                        )
                    })
                    .collect();
                self.counters
                    .internal_splits
                    .fetch_add(p.len() as u64, Ordering::Relaxed);
                p
            }
            _ => return false,
        };
        // The pieces moved out of the child: count it smaller before counting them, or the
        // accounted usage passes the bound by the pieces (measured: 72 MiB with a 64 MiB bound).
        self.cache.remeasure(ccn, cg);
        let Body::Internal(pn) = &mut pg.body else {
            unreachable!()
        };
        for (k, (low, node)) in pieces.into_iter().enumerate() {
            let id = self.new_node(node);
            pn.pivots.insert(c + k, low);
            pn.children.insert(c + 1 + k, id);
            pn.buffers.insert(c + 1 + k, BufSlot::empty());
        }
        self.end_modify(ccn, cg);
        true
    }
}

/// Routes a numbered message into the right child buffer(s) of an internal node.
fn route(n: &mut Internal, msn: Msn, m: Msg) {
    match m {
        Msg::Point { key, op } => {
            let c = child_index(&n.pivots, &key);
            n.buffers[c].mutate(|b| b.add_point(key, msn, op));
        }
        Msg::Range { lo, hi } => route_range(n, msn, &lo, &hi),
    }
}

/// Adds a range delete to every child buffer whose range it intersects, clipped to that range.
fn route_range(n: &mut Internal, msn: Msn, lo: &[u8], hi: &[u8]) {
    let first = child_index(&n.pivots, lo);
    let last = n.pivots.partition_point(|p| p.as_slice() < hi);
    for c in first..=last.min(n.children.len() - 1) {
        let (cl, ch) = n.child_bounds(c, lo, None);
        let l = if cl > lo { cl.to_vec() } else { lo.to_vec() };
        let h = match ch {
            Some(h) if h < hi => h.to_vec(),
            _ => hi.to_vec(),
        };
        if l < h {
            n.buffers[c].mutate(|b| b.add_range(msn, &l, &h));
        }
    }
}

/// Applies a parent's buffer to a child (internal: into its buffers; leaf: into its entries).
fn deliver(buf: Buffer, node: &mut Node, format: &Format) {
    let max = buf.max_msn();
    let (mut ranges, points) = buf.into_parts();
    match &mut node.body {
        Body::Internal(n) => {
            // Ranges are independent of each other; deliver them in MSN order so each buffer sees
            // increasing numbers, then the point messages (newer than the ranges they overlap).
            ranges.sort_by_key(|r| r.msn);
            for r in ranges {
                route_range(n, r.msn, &r.lo, &r.hi);
            }
            for (k, km) in points {
                let c = child_index(&n.pivots, &k);
                n.buffers[c].mutate(|b| b.add_key_msgs(k, km));
            }
        }
        Body::Leaf(l) => l.apply(&ranges, &points, format),
    }
    node.max_msn = node.max_msn.max(max);
}

/// Cuts an internal node into pieces of at most `max` children (at least two pieces if `force`).
fn split_internal(
    mut n: Internal,
    max: usize,
    force: bool,
) -> (Internal, Vec<(Vec<u8>, Internal)>) {
    let len = n.children.len();
    let mut k = len.div_ceil(max);
    if force {
        k = k.max(2);
    }
    let per = len.div_ceil(k);
    let mut cuts: Vec<usize> = (1..k).map(|i| i * per).filter(|&c| c < len).collect();
    cuts.reverse();
    let mut rest = Vec::new();
    for cut in cuts {
        let children = n.children.split_off(cut);
        let buffers = n.buffers.split_off(cut);
        let mut pivots = n.pivots.split_off(cut - 1);
        let low = pivots.remove(0);
        rest.push((
            low,
            Internal {
                pivots,
                children,
                buffers,
            },
        ));
    }
    rest.reverse();
    (n, rest)
}

/// The budget and filter of one [`Tree::drain_from`] round.
struct DrainWork {
    max_flushes: usize,
    /// Flush only buffers holding a range delete.
    deletes_only: bool,
    flushes: usize,
}
