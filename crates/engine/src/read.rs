//! Queries: point lookups and leaf-sized chunks for range iteration.
//!
//! A query descends with coupled read latches, collecting the messages that ancestors hold for its
//! key (or its leaf's range), and applies them to what the leaf stores, deepest first (deeper
//! messages are older). Nothing is flushed and nothing is marked dirty.

use std::borrow::Cow;
use std::cell::Cell;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use crate::buffer::{Buffer, EncodedBuffer};
use crate::cache::{CachedNode, ReadGuard};
use crate::dataref::{Stored, Val};
use crate::error::{Error, Result};
use crate::msg::{KeyMsgs, Msn, RangeDel};
use crate::node::{child_index, Body, BufAnswer, NodeId, Resident, RunAt, SubLoc};
use crate::partition::Partition;
use crate::tree::{Bounds, Tree, LIFT_KEYS};

/// How many times a query restarts after loading a node before giving up.
const MAX_RESTARTS: usize = 1000;

thread_local! {
    /// The bounds a point query carries down, kept per thread so that their buffers are reused
    /// (two allocations per query otherwise: measured +5% CPU per point read).
    static POINT_BOUNDS: Cell<Bounds> = Cell::new(Bounds::root());
}

impl Tree {
    /// The value of `key` in the tree under `root` (the live root, `ROOT_ID`, or a
    /// snapshot's), with pending messages applied (a reference is not read here).
    pub fn get_at(&self, root: NodeId, key: &[u8]) -> Result<Option<Val>> {
        let mut bounds = POINT_BOUNDS.with(Cell::take);
        let r = self.get_with(root, key, &mut bounds);
        POINT_BOUNDS.with(|c| c.set(bounds));
        r
    }

    fn get_with(&self, root: NodeId, key: &[u8], bounds: &mut Bounds) -> Result<Option<Val>> {
        let mut pins = Vec::new();
        for _ in 0..MAX_RESTARTS {
            // (range delete msn covering the key, folded point messages), top to bottom.
            let mut layers: Vec<(Option<Msn>, Option<KeyMsgs>)> = Vec::new();
            // The node's bounds; the key as it stores it is `key[bounds.prefix().len()..]`.
            bounds.reset_root();
            let mut cn = self.pin(root)?;
            let mut g = cn.read();
            loop {
                let stored = bounds.lift(key);
                let next = match &g.body {
                    Body::Internal(n) => {
                        let c = child_index(&n.pivots, stored);
                        let layer = match n.buffers[c].lookup(stored)? {
                            BufAnswer::Held(range, point) => (range, point),
                            BufAnswer::Run { range, loc, at } => {
                                let what =
                                    || format!("node {} buffer {c} run at {}", cn.id, at.off);
                                let point = self.read_run(cn.id, loc, at, what, |run| {
                                    EncodedBuffer::find_in_run(
                                        run,
                                        stored,
                                        self.format.max_key_len,
                                        self.format.max_value_len,
                                        g.max_msn,
                                    )
                                })?;
                                self.cache.counters.buffer_run_reads.fetch_add(1, Relaxed);
                                (range, point)
                            }
                            BufAnswer::Load => {
                                drop(g);
                                self.load_buffer_encoding(&cn, c)?;
                                pins.push(cn);
                                break;
                            }
                        };
                        layers.push(layer);
                        if LIFT_KEYS {
                            // Off, every prefix is empty: the hottest path skips the bookkeeping.
                            bounds.descend(n, c);
                        }
                        n.children[c]
                    }
                    Body::Leaf(l) => {
                        let p = child_index(&l.pivots, stored);
                        let mut v = match l.parts[p].data() {
                            Some(part) => part.get(stored).map(|x| x.to_val()),
                            None => match self.get_from_run(&cn, &l.parts[p], p, stored)? {
                                Some(v) => v,
                                None => {
                                    drop(g);
                                    self.load_partitions(&cn, Some(p))?;
                                    pins.push(cn);
                                    break;
                                }
                            },
                        };
                        let leaf_msn = g.max_msn;
                        for (range, point) in layers.iter().rev() {
                            if let Some(m) = range {
                                assert!(*m > leaf_msn, "ancestor message already applied below");
                                if *m > leaf_msn {
                                    v = None;
                                }
                            }
                            if let Some(km) = point {
                                assert!(
                                    km.min_msn() > leaf_msn,
                                    "ancestor message already applied below"
                                );
                                if km.max_msn() > leaf_msn {
                                    v = km.apply(v);
                                }
                            }
                        }
                        return Ok(v);
                    }
                };
                match self.couple(next, g, &mut pins)? {
                    Some((ccn, cg)) => (cn, g) = (ccn, cg),
                    None => break,
                }
            }
        }
        Err(Error::Corrupt(
            "a lookup could not keep its path in memory (cache too small?)".into(),
        ))
    }

    /// The value of `key` in shed partition `p` of leaf `cn` (whose read latch the caller holds),
    /// read from the one run of it that may hold the key (`node/runs.rs`): `Some` with the
    /// answer, or `None` when the partition must be loaded (it kept no runs, or has been read
    /// this way often enough to be worth loading). The run's bytes must match the checksum taken
    /// when it was shed.
    fn get_from_run(
        &self,
        cn: &CachedNode,
        slot: &crate::node::PartSlot,
        p: usize,
        key: &[u8],
    ) -> Result<Option<Option<Val>>> {
        let (runs, loc) = {
            let st = slot.state.lock();
            match (&st.data, &st.runs, st.loc) {
                (None, Some(runs), Some(loc)) => (runs.clone(), loc),
                _ => return Ok(None),
            }
        };
        assert_eq!(
            runs.loc(),
            loc,
            "a shed partition's runs describe its place"
        );
        let at = match runs.run_for(key) {
            Err(()) => return Ok(None),
            Ok(None) => return Ok(Some(None)),
            Ok(Some(at)) => at,
        };
        let what = || format!("node {} partition {p} run at {}", cn.id, at.off);
        let found = self.read_run(cn.id, loc, at, what, |run| {
            Ok(Partition::find_in_run(
                run,
                key,
                self.format.max_key_len,
                self.format.max_value_len,
            )?
            .map(|s| s.to_val()))
        })?;
        self.cache.counters.run_reads.fetch_add(1, Relaxed);
        Ok(Some(found))
    }

    /// Reads run `at` of the sub-block at `loc` in node `id`'s image (`node/runs.rs`), checks it
    /// against the checksum taken when the sub-block was shed (a mismatch is corruption), and
    /// hands it to `search`.
    fn read_run<T>(
        &self,
        id: NodeId,
        loc: SubLoc,
        at: RunAt,
        what: impl Fn() -> String,
        search: impl FnOnce(&[u8]) -> Result<T>,
    ) -> Result<T> {
        let ext = self
            .store
            .location(id)
            .ok_or_else(|| Error::Corrupt(format!("{}: the node has no location", what())))?;
        let start = ext.offset() + loc.offset as u64 + at.off as u64;
        let block = amaranth_device::BLOCK_SIZE as u64;
        let from = start / block * block;
        let len = (start + at.len as u64 - from) as usize;
        let buf = self.store.read(from, len, &what())?;
        let skip = (start - from) as usize;
        let bytes = &buf[skip..skip + at.len as usize];
        if crc32c::crc32c(bytes) != at.crc {
            return Err(Error::Corrupt(format!(
                "{}: checksum mismatch (device offset {start})",
                what()
            )));
        }
        search(bytes)
    }

    /// One step down a coupled descent: the read latch of child `next`, taken while `parent`'s
    /// is held, then the parent's let go. `None` when the child is not in memory: the parent's
    /// latch is let go, the child loaded (pinned in `pins`), and the caller starts over from the
    /// root (the child may have been merged away meanwhile, `Tree::load_found`).
    pub(crate) fn couple(
        &self,
        next: NodeId,
        parent: ReadGuard,
        pins: &mut Vec<Arc<CachedNode>>,
    ) -> Result<Option<(Arc<CachedNode>, ReadGuard)>> {
        match self.cache.get(next) {
            Some(ccn) => {
                let cg = ccn.read();
                drop(parent);
                Ok(Some((ccn, cg)))
            }
            None => {
                drop(parent);
                pins.extend(self.load_found(next, false)?);
                Ok(None)
            }
        }
    }

    /// The chunk of the tree around a position: the part of one leaf's range that lies in
    /// `[from, to)`, with every pending message applied. Only the partitions and buffers that
    /// part needs are read.
    /// `root` is the live root (`ROOT_ID`) or a snapshot's.
    pub fn chunk_at(
        &self,
        root: NodeId,
        target: Target<'_>,
        from: &[u8],
        to: Option<&[u8]>,
    ) -> Result<Chunk> {
        self.chunk_at_most(root, target, from, to, usize::MAX)
    }

    /// [`Tree::chunk_at`] over at most `max_parts` partitions of the leaf (at least one): the
    /// chunk then ends where the last of them ends (its `hi`), and only the ancestors' messages
    /// for that part are applied. For scans that usually stop early (whether a range holds more
    /// than some bytes, or any key): a rename's copy-or-surgery check built the chunk of a whole
    /// 4 MiB leaf, every buffered message for it applied, to look at its first 128 KiB (a fifth
    /// of the daemon's CPU in renames of a directory back and forth).
    pub(crate) fn chunk_at_most(
        &self,
        root: NodeId,
        target: Target<'_>,
        from: &[u8],
        to: Option<&[u8]>,
        max_parts: usize,
    ) -> Result<Chunk> {
        assert!(max_parts >= 1, "a chunk holds at least one partition");
        let mut pins = Vec::new();
        'restart: for _ in 0..MAX_RESTARTS {
            let mut bounds = Bounds::root();
            // The path's read latches stay held until the leaf is reached and its range known, so
            // only the messages for the wanted range are copied out of each ancestor's buffer.
            // Each buffer comes with the prefix length of the node holding it.
            let mut path: Vec<(ReadGuard, Resident, usize)> = Vec::new();
            let mut cn = self.pin(root)?;
            let mut g = cn.read();
            loop {
                let next = match &g.body {
                    Body::Internal(n) => {
                        let c = match target {
                            Target::AtOrAfter(k) => child_index(&n.pivots, bounds.lift(k)),
                            Target::Before(Some(e)) => {
                                let e = bounds.lift(e);
                                n.pivots.partition_point(|p| p.as_slice() < e)
                            }
                            Target::Before(None) => n.children.len() - 1,
                        };
                        // A buffer held encoded stays so: the leaf's window is taken out of its
                        // encoding once the window is known.
                        let Some(b) = n.buffers[c].held() else {
                            drop(g);
                            drop(path);
                            self.load_partitions(&cn, Some(c))?;
                            pins.push(cn);
                            continue 'restart;
                        };
                        let plen = bounds.prefix().len();
                        bounds.descend(n, c);
                        (n.children[c], b, plen)
                    }
                    Body::Leaf(l) => {
                        // The part of the leaf that is wanted (stored form), and the partitions
                        // holding it.
                        let cf = bounds.lift_clipped(from);
                        let mut ct: Option<Vec<u8>> = match to {
                            Some(t) => Some(bounds.lift_clipped(t)),
                            None => bounds.hi().map(|h| h.to_vec()),
                        };
                        let p0 = child_index(&l.pivots, &cf);
                        let mut p1 = match &ct {
                            Some(t) => l.pivots.partition_point(|p| p.as_slice() < t.as_slice()),
                            None => l.parts.len() - 1,
                        }
                        .max(p0);
                        // Fewer partitions than the window holds: it ends where the last one
                        // taken ends, the pivot after it (there is one: a later partition holds
                        // part of the window).
                        let mut cut = None;
                        if p1 - p0 >= max_parts {
                            p1 = p0 + max_parts - 1;
                            let end = l.pivots[p1].clone();
                            assert!(
                                end.as_slice() > cf.as_slice(),
                                "a partition's end is past the window's start"
                            );
                            ct = Some(end.clone());
                            cut = Some(end);
                        }
                        let mut parts = Vec::with_capacity(p1 + 1 - p0);
                        for slot in &l.parts[p0..=p1] {
                            match slot.data() {
                                Some(p) => parts.push(p),
                                None => {
                                    drop(g);
                                    drop(path);
                                    self.load_subblocks(&cn, p0, p1 + 1)?;
                                    pins.push(cn);
                                    continue 'restart;
                                }
                            }
                        }
                        self.note_leaf_use(&cn);
                        let window = (cf.as_slice(), ct.as_deref());
                        // The window of each buffer held encoded, built (the rest of it is not).
                        let windows: Vec<Option<Buffer>> = path
                            .iter()
                            .map(|(_, b, plen)| match b {
                                Resident::Built(_) => None,
                                Resident::Encoded(e) => {
                                    let (from, to) = layer_window(&bounds, *plen, window);
                                    Some(e.window(&from, to.as_deref()))
                                }
                            })
                            .collect();
                        let layers: Vec<(&Buffer, usize)> = path
                            .iter()
                            .zip(&windows)
                            .map(|((_, b, plen), w)| match (b, w) {
                                (Resident::Built(b), _) => (&**b, *plen),
                                (Resident::Encoded(_), w) => {
                                    (w.as_ref().expect("taken above"), *plen)
                                }
                            })
                            .collect();
                        let mut chunk = Chunk::build(&bounds, window, parts, &layers, g.max_msn);
                        if let Some(end) = cut {
                            chunk.hi = Some(bounds.full(&end));
                        }
                        drop(layers);
                        drop(g);
                        drop(path);
                        return Ok(chunk);
                    }
                };
                let (next, buf, plen) = next;
                match self.cache.get(next) {
                    Some(ccn) => {
                        let cg = ccn.read();
                        path.push((std::mem::replace(&mut g, cg), buf, plen));
                        cn = ccn;
                    }
                    None => {
                        drop(g);
                        drop(path);
                        // A whole-image read for an open-ended scan; otherwise the skeleton, then
                        // only the partitions and buffers the range needs.
                        pins.extend(self.load_found(next, to.is_none())?);
                        continue 'restart;
                    }
                }
            }
        }
        Err(Error::Corrupt(
            "a scan could not keep its path in memory (cache too small?)".into(),
        ))
    }
}

/// The leaf's stored `window` in the form of an ancestor whose prefix is `lp` bytes long (its
/// keys carry the part of the leaf's prefix beyond its own).
fn layer_window(
    leaf: &Bounds,
    lp: usize,
    window: (&[u8], Option<&[u8]>),
) -> (Vec<u8>, Option<Vec<u8>>) {
    let plen = leaf.prefix().len();
    assert!(lp <= plen, "an ancestor with a longer prefix than its leaf");
    let tail = &leaf.prefix()[lp..];
    let up = |k: &[u8]| [tail, k].concat();
    (up(window.0), window.1.map(up))
}

/// Which leaf a chunk is wanted for.
#[derive(Clone, Copy, Debug)]
pub enum Target<'a> {
    /// The leaf holding this key.
    AtOrAfter(&'a [u8]),
    /// The leaf holding the greatest key below this bound (`None`: the last leaf).
    Before(Option<&'a [u8]>),
}

/// One leaf's range with every pending ancestor message applied.
#[derive(Debug)]
pub struct Chunk {
    /// Inclusive low bound of the range (empty: unbounded).
    pub lo: Vec<u8>,
    /// Exclusive high bound (`None`: unbounded).
    pub hi: Option<Vec<u8>>,
    /// The leaf's bounds: the stored keys below (entries, overlay, deletes) omit its prefix.
    bounds: Bounds,
    parts: Vec<Arc<Partition>>,
    /// Keys touched by point messages and their resulting values, sorted by key; bytes in `arena`.
    overlay: Vec<OvEntry>,
    arena: Vec<u8>,
    /// Union of pending range deletes, sorted and disjoint.
    deleted: Vec<(Vec<u8>, Vec<u8>)>,
}

/// An overlay entry: offsets into the chunk's arena (`v_len == u32::MAX`: deleted), and whether
/// the value is an encoded reference.
#[derive(Clone, Copy, Debug)]
struct OvEntry {
    k_off: u32,
    k_len: u32,
    v_off: u32,
    v_len: u32,
    is_ref: bool,
}

const GONE: u32 = u32::MAX;

/// A value while a chunk applies messages to it: borrowed from a partition or a message, or
/// made by an upsert.
enum Cur<'a> {
    Bytes(Cow<'a, [u8]>),
    Ref(Cow<'a, [u8]>),
}

impl<'a> Cur<'a> {
    fn borrowed(s: Stored<'a>) -> Cur<'a> {
        match s {
            Stored::Bytes(b) => Cur::Bytes(Cow::Borrowed(b)),
            Stored::Ref(r) => Cur::Ref(Cow::Borrowed(r)),
        }
    }

    fn to_val(&self) -> Val {
        match self {
            Cur::Bytes(b) => Stored::Bytes(b).to_val(),
            Cur::Ref(r) => Stored::Ref(r).to_val(),
        }
    }

    fn owned(v: Val) -> Cur<'a> {
        match v {
            Val::Bytes(b) => Cur::Bytes(Cow::Owned(b)),
            Val::Ref(r) => Cur::Ref(Cow::Owned(r.to_bytes())),
        }
    }
}

impl Chunk {
    /// Builds the chunk of a leaf with bounds `leaf` (its resident partitions holding the stored
    /// `window`) under the buffers of its ancestors for it, top to bottom, each with the prefix
    /// length of its node (the caller holds their latches). Ancestor messages are re-expressed as
    /// the leaf stores its keys.
    fn build(
        leaf: &Bounds,
        window: (&[u8], Option<&[u8]>),
        parts: Vec<Arc<Partition>>,
        layers: &[(&Buffer, usize)],
        leaf_msn: Msn,
    ) -> Chunk {
        let plen = leaf.prefix().len();
        // Per layer: the bytes its keys have beyond the leaf's (`d`), and the window in its form.
        let windows: Vec<(usize, Vec<u8>, Option<Vec<u8>>)> = layers
            .iter()
            .map(|&(_, lp)| {
                let (from, to) = layer_window(leaf, lp, window);
                (plen - lp, from, to)
            })
            .collect();
        let ranges: Vec<Vec<RangeDel>> = layers
            .iter()
            .zip(&windows)
            .map(|((b, _), (d, from, to))| {
                b.ranges_in(from, to.as_deref())
                    .into_iter()
                    .filter(|r| r.msn > leaf_msn)
                    .map(|r| RangeDel {
                        msn: r.msn,
                        lo: r.lo[*d..].to_vec(),
                        hi: r.hi[*d..].to_vec(),
                    })
                    .collect()
            })
            .collect();
        // Per layer, a cursor into its sorted, disjoint range deletes (keys come in order).
        let mut rcur = vec![0usize; ranges.len()];
        let mut iters: Vec<_> = layers
            .iter()
            .zip(&windows)
            .map(|((b, _), (d, from, to))| {
                b.points_in(from, to.as_deref())
                    .map(move |(k, km)| (&k[*d..], km))
                    .peekable()
            })
            .collect();
        let mut overlay = Vec::new();
        let mut arena = Vec::new();
        // A cursor over the base entries, moving forward with the (sorted) overlay keys.
        let (mut bp, mut bi) = (0usize, 0usize);
        loop {
            let mut min: Option<&[u8]> = None;
            for it in iters.iter_mut() {
                if let Some((k, _)) = it.peek() {
                    if min.is_none_or(|m| *k < m) {
                        min = Some(*k);
                    }
                }
            }
            let Some(k) = min else { break };
            // Base value.
            let mut base: Option<Stored<'_>> = None;
            while bp < parts.len() {
                let p = &parts[bp];
                if bi >= p.len() {
                    bp += 1;
                    bi = 0;
                    continue;
                }
                match p.key(bi).cmp(k) {
                    std::cmp::Ordering::Less => bi += 1,
                    std::cmp::Ordering::Equal => {
                        base = Some(p.value(bi));
                        break;
                    }
                    std::cmp::Ordering::Greater => break,
                }
            }
            // Apply the layers deepest first; the common case (one put or delete) copies once.
            let mut value: Option<Cur<'_>> = base.map(Cur::borrowed);
            for li in (0..iters.len()).rev() {
                let rs = &ranges[li];
                while rcur[li] < rs.len() && rs[rcur[li]].hi.as_slice() <= k {
                    rcur[li] += 1;
                }
                if rcur[li] < rs.len() && rs[rcur[li]].covers(k) {
                    value = None;
                }
                let take = iters[li].peek().is_some_and(|(hk, _)| *hk == k);
                if take {
                    let (_, km) = iters[li].next().expect("peeked");
                    assert!(
                        km.min_msn() > leaf_msn,
                        "ancestor message already applied below"
                    );
                    if km.max_msn() > leaf_msn {
                        value = match km {
                            KeyMsgs::Put { value, .. } => {
                                Some(Cur::Bytes(Cow::Borrowed(value.as_slice())))
                            }
                            KeyMsgs::Delete { .. } => None,
                            KeyMsgs::PutRef { r, .. } => Some(Cur::Ref(Cow::Owned(r.to_bytes()))),
                            KeyMsgs::Upserts(_) => {
                                km.apply(value.map(|v| v.to_val())).map(Cur::owned)
                            }
                        };
                    }
                }
            }
            let k_off = arena.len() as u32;
            arena.extend_from_slice(k);
            let (v_off, v_len, is_ref) = match value {
                Some(Cur::Bytes(v)) => {
                    let off = arena.len() as u32;
                    arena.extend_from_slice(&v);
                    (off, v.len() as u32, false)
                }
                Some(Cur::Ref(v)) => {
                    let off = arena.len() as u32;
                    arena.extend_from_slice(&v);
                    (off, v.len() as u32, true)
                }
                None => (0, GONE, false),
            };
            overlay.push(OvEntry {
                k_off,
                k_len: k.len() as u32,
                v_off,
                v_len,
                is_ref,
            });
        }
        let mut all: Vec<(Vec<u8>, Vec<u8>)> =
            ranges.into_iter().flatten().map(|r| (r.lo, r.hi)).collect();
        all.sort();
        let mut deleted: Vec<(Vec<u8>, Vec<u8>)> = Vec::with_capacity(all.len());
        for (l, h) in all {
            match deleted.last_mut() {
                Some(last) if l <= last.1 => {
                    if h > last.1 {
                        last.1 = h;
                    }
                }
                _ => deleted.push((l, h)),
            }
        }
        drop(iters);
        Chunk {
            lo: leaf.full_lo(),
            hi: leaf.full_hi(),
            bounds: leaf.clone(),
            parts,
            overlay,
            arena,
            deleted,
        }
    }

    fn ov_key(&self, i: usize) -> &[u8] {
        let e = self.overlay[i];
        &self.arena[e.k_off as usize..(e.k_off + e.k_len) as usize]
    }

    fn ov_value(&self, i: usize) -> Option<Stored<'_>> {
        let e = self.overlay[i];
        if e.v_len == GONE {
            return None;
        }
        let v = &self.arena[e.v_off as usize..(e.v_off + e.v_len) as usize];
        Some(if e.is_ref {
            Stored::Ref(v)
        } else {
            Stored::Bytes(v)
        })
    }

    /// Calls `f(key, value)` for live entries in `[start, end)` in key order (or reverse order if
    /// `!forward`), until `f` returns false. Returns false if `f` stopped the walk. Values are as
    /// stored: a reference is not read.
    pub fn walk(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        forward: bool,
        f: &mut dyn FnMut(&[u8], Stored<'_>) -> bool,
    ) -> bool {
        let parts = &self.parts;
        let start = &self.bounds.lift_clipped(start)[..];
        let end_stored = end.map(|e| self.bounds.lift_clipped(e));
        let end = end_stored.as_deref();
        // The callback gets full keys: the prefix and the stored key in one reused buffer.
        let prefix = self.bounds.prefix();
        let mut full = Vec::new();
        let mut f = |k: &[u8], v: Stored<'_>| {
            if prefix.is_empty() {
                return f(k, v);
            }
            full.clear();
            full.extend_from_slice(prefix);
            full.extend_from_slice(k);
            f(&full, v)
        };
        // A walk starts at its first bound (the positions below are found by it), so only the
        // bound it walks towards is checked: one key comparison per entry instead of two.
        let in_range = |k: &[u8]| {
            if forward {
                end.is_none_or(|e| k < e)
            } else {
                k >= start
            }
        };
        // Position of the first base entry >= k, as (partition, index).
        let lower = |k: &[u8]| -> (usize, usize) {
            let p = parts.partition_point(|p| p.is_empty() || p.key(p.len() - 1) < k);
            if p == parts.len() {
                (p, 0)
            } else {
                (p, parts[p].lower_bound(k))
            }
        };
        let ov_lower = |k: &[u8]| {
            self.overlay.partition_point(|e| {
                &self.arena[e.k_off as usize..(e.k_off + e.k_len) as usize] < k
            })
        };
        // Base and overlay are merged in order: a base key below the next overlay key is not in the
        // overlay, so only range deletes need a check (a cursor moving with the walk).
        if forward {
            let (mut p, mut i) = lower(start);
            let mut o = ov_lower(start);
            let mut d = self.deleted.partition_point(|(_, h)| h.as_slice() <= start);
            loop {
                while p < parts.len() && i >= parts[p].len() {
                    p += 1;
                    i = 0;
                }
                let kb = (p < parts.len()).then(|| parts[p].key(i));
                let ko = (o < self.overlay.len()).then(|| self.ov_key(o));
                let take_base = match (kb, ko) {
                    (None, None) => return true,
                    (Some(_), None) => true,
                    (None, Some(_)) => false,
                    (Some(x), Some(y)) => x < y,
                };
                if take_base {
                    let k = kb.expect("base key");
                    if !in_range(k) {
                        return true;
                    }
                    while d < self.deleted.len() && self.deleted[d].1.as_slice() <= k {
                        d += 1;
                    }
                    let covered = d < self.deleted.len() && self.deleted[d].0.as_slice() <= k;
                    if !covered && !f(k, parts[p].value(i)) {
                        return false;
                    }
                    i += 1;
                } else {
                    let k = self.ov_key(o);
                    if !in_range(k) {
                        return true;
                    }
                    if kb == Some(k) {
                        i += 1;
                    }
                    if let Some(v) = self.ov_value(o) {
                        if !f(k, v) {
                            return false;
                        }
                    }
                    o += 1;
                }
            }
        } else {
            // (p, i) is one past the next entry to visit.
            let (mut p, mut i) = match end {
                Some(e) => lower(e),
                None => (parts.len(), 0),
            };
            let mut o = match end {
                Some(e) => ov_lower(e),
                None => self.overlay.len(),
            };
            let mut d = match end {
                Some(e) => self.deleted.partition_point(|(l, _)| l.as_slice() < e),
                None => self.deleted.len(),
            };
            loop {
                while i == 0 && p > 0 {
                    p -= 1;
                    i = parts[p].len();
                }
                let kb = (i > 0).then(|| parts[p].key(i - 1));
                let ko = (o > 0).then(|| self.ov_key(o - 1));
                let take_base = match (kb, ko) {
                    (None, None) => return true,
                    (Some(_), None) => true,
                    (None, Some(_)) => false,
                    (Some(x), Some(y)) => x > y,
                };
                if take_base {
                    let k = kb.expect("base key");
                    if !in_range(k) {
                        return true;
                    }
                    while d > 0 && self.deleted[d - 1].0.as_slice() > k {
                        d -= 1;
                    }
                    let covered = d > 0 && k < self.deleted[d - 1].1.as_slice();
                    if !covered && !f(k, parts[p].value(i - 1)) {
                        return false;
                    }
                    i -= 1;
                } else {
                    let k = self.ov_key(o - 1);
                    if !in_range(k) {
                        return true;
                    }
                    if kb == Some(k) {
                        i -= 1;
                    }
                    if let Some(v) = self.ov_value(o - 1) {
                        if !f(k, v) {
                            return false;
                        }
                    }
                    o -= 1;
                }
            }
        }
    }
}
