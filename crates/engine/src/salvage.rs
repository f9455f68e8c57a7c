//! Salvage: a walk of the checkpointed tree that survives damage, names every damaged node and
//! what it held, and (when rebuilding) hands every intact piece to [`crate::rebuild::Builder`].
//!
//! The walk goes depth first in key order from the root, reading each node whole and checking
//! every partition and buffer on its own. An intact leaf is kept as it is; a leaf with damaged
//! partitions is rebuilt from the intact ones; the range of a damaged leaf becomes an empty leaf.
//! The messages intact ancestors buffer for a leaf go with it (into its new parent's buffer), so
//! nothing newer than the leaf is lost unless it sat in a damaged node.
//!
//! A damaged internal node hides its children, but they are still in the block translation table:
//! intact nodes that no intact node references ("orphans") are adopted by the damaged node whose
//! key range holds their first key, and walked in its place. Orphans nothing adopts (leaks, or
//! subtrees whose keys cannot be placed) are counted and left out.
//!
//! Nodes store their keys lifted (docs/SURGERY.md §2): the walk reads every node under the prefix
//! hint its image records, so that an orphan, whose parent is lost, is placed by its full keys.
//! The new tree is re-lifted to the bounds it gives each node ([`crate::rebuild`]).
//!
//! Nodes may be shared (range clones, docs/SURGERY.md §4): a node whose reference count is above
//! 1, and everything below it, is walked once under each parent, at each of its places; reaching
//! any other node twice is damage. A rebuild keeps a shared leaf at its first place and writes
//! copies of it for the others (the new tree shares nothing). Orphans are found by their counts:
//! an intact node is one when fewer intact nodes name it than its count says (a damaged node
//! named it), so a shared node can be the orphan of a damaged parent while an intact one reaches
//! it, and a dead node (count 0, its keys deleted) is never adopted.

use std::collections::{HashMap, HashSet};

use amaranth_device::AlignedBuf;

use crate::buffer::Buffer;
use crate::dataref::Val;
use crate::error::{Error, Result};
use crate::msg::Msn;
use crate::node::{self, NodeHeader, NodeId, ROOT_ID};
use crate::partition::Partition;
use crate::rebuild::{restrict, Builder};
use crate::superblock::Extent;
use crate::tree::{check_header, lift_len, Tree};

/// Which part of a node is damaged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DamagedPart {
    /// The node as a whole (its header or index): a leaf, an internal node of `height`, or
    /// unknown (`None`) when no intact parent says.
    Node {
        /// What the parent says it was: 0 for a leaf.
        height: Option<u32>,
    },
    /// One partition of an intact leaf.
    Partition {
        /// Its index in the leaf.
        index: usize,
        /// Entries it held (from the leaf's index).
        entries: u64,
        /// Bytes of entries it held.
        bytes: u64,
    },
    /// One child's message buffer of an intact internal node: the child's subtree is intact but
    /// misses these (newer) messages.
    Buffer {
        /// Its index (the child's).
        index: usize,
        /// Keys with messages plus range deletes it held.
        messages: u64,
        /// Bytes of messages it held.
        bytes: u64,
    },
}

/// One damaged node, partition or buffer.
#[derive(Clone, Debug)]
pub struct Damage {
    /// The node's id.
    pub node: NodeId,
    /// Where its image lies: (first block, blocks).
    pub extent: Option<(u64, u64)>,
    /// What is damaged.
    pub part: DamagedPart,
    /// The key range it held, `[lo, hi)` (`hi` `None`: unbounded), when an intact parent or
    /// the node's own index says; `None` for an unreachable node whose range nothing records.
    pub range: Option<(Vec<u8>, Option<Vec<u8>>)>,
    /// What the read found.
    pub error: String,
}

/// What a salvage walk found, and (when rebuilding) what it kept.
#[derive(Clone, Debug, Default)]
pub struct SalvageReport {
    /// Every damaged node, partition and buffer, in key order of the walk (unreachable ones last).
    pub damage: Vec<Damage>,
    /// Nodes read (reachable from the root, or adopted).
    pub nodes_read: u64,
    /// Leaves kept as they were.
    pub leaves_kept: u64,
    /// Leaves written anew (from the intact partitions of a damaged leaf, or empty in place of a
    /// lost one).
    pub leaves_rebuilt: u64,
    /// Entries in the leaves kept and rebuilt.
    pub entries: u64,
    /// Intact subtrees of damaged internal nodes found through the table and put back.
    pub orphans_adopted: u64,
    /// Intact nodes nothing references and no damaged range could take (left out).
    pub orphans_left: Vec<NodeId>,
    /// Messages left out because they fell outside the range their subtree was given.
    pub messages_dropped: u64,
    /// Kept leaves rewritten because their new bounds give them another prefix than the one they
    /// were stored under (adopted orphans: docs/SURGERY.md §2.7).
    pub nodes_relifted: u64,
    /// Whether the tree was rebuilt.
    pub rebuilt: bool,
    /// What happened to the redo log (when a repair replayed it): where replay stopped if the log
    /// was damaged.
    pub log: Option<String>,
    /// What was wrong with the superblock copies.
    pub superblock: Vec<String>,
    /// The snapshots a rebuild deleted, by name: the rebuilt tree shares no node with them, and
    /// their nodes are dropped with the old tree's (a snapshot may hold the very node that was
    /// damaged; its own tree is not salvaged).
    pub snapshots_dropped: Vec<String>,
}

impl SalvageReport {
    /// Whether anything is damaged.
    pub fn is_damaged(&self) -> bool {
        !self.damage.is_empty() || self.log.is_some()
    }
}

/// A node id's parsed header, or why it could not be read.
type HeaderRead = std::result::Result<NodeHeader, String>;

/// An intact node nothing intact references, with the smallest and largest intact keys under it.
struct Orphan {
    id: NodeId,
    first: Vec<u8>,
    last: Vec<u8>,
}

/// One level of ancestors' messages for the node being visited (`None`: the buffer is lost).
type Level = Option<Buffer>;

/// The damage-tolerant walk.
pub(crate) struct Walker<'t> {
    tree: &'t Tree,
    report: SalvageReport,
    visited: HashSet<NodeId>,
    /// Shared nodes (count above 1) on the path being walked: below one, every node may be
    /// reached again (through the shared node's other parents).
    shared_above: u32,
    /// Headers of every table node (read once, when a damaged internal node needs orphans).
    headers: Option<HashMap<NodeId, HeaderRead>>,
    /// Orphans not adopted yet, by first key.
    pool: Vec<Orphan>,
    build: Option<Builder<'t>>,
}

fn dmg(
    node: NodeId,
    ext: Option<Extent>,
    part: DamagedPart,
    range: Option<(&[u8], Option<&[u8]>)>,
    error: String,
) -> Damage {
    Damage {
        node,
        extent: ext.map(|e| (e.block, e.blocks)),
        part,
        range: range.map(|(l, h)| (l.to_vec(), h.map(|h| h.to_vec()))),
        error,
    }
}

impl<'t> Walker<'t> {
    /// A walk that only looks (`build` false) or also rebuilds the tree.
    pub(crate) fn new(tree: &'t Tree, build: bool) -> Walker<'t> {
        Walker {
            tree,
            report: SalvageReport::default(),
            visited: HashSet::new(),
            shared_above: 0,
            headers: None,
            pool: Vec::new(),
            build: build.then(|| Builder::new(tree)),
        }
    }

    /// Walks the whole tree; returns the report and the builder (if rebuilding).
    pub(crate) fn run(mut self) -> Result<(SalvageReport, Option<Builder<'t>>)> {
        let mut stack = Vec::new();
        self.walk(ROOT_ID, &[], None, None, true, &mut stack)?;
        // Damaged nodes no intact node reaches (children of a damaged node that are damaged too).
        if let Some(headers) = &self.headers {
            let mut lost: Vec<(&NodeId, &String)> = headers
                .iter()
                .filter_map(|(id, h)| h.as_ref().err().map(|e| (id, e)))
                .filter(|(id, _)| !self.visited.contains(id))
                .collect();
            lost.sort();
            for (id, e) in lost {
                let ext = self.tree.store.location(*id);
                let d = dmg(
                    *id,
                    ext,
                    DamagedPart::Node { height: None },
                    None,
                    e.clone(),
                );
                self.report.damage.push(d);
            }
        }
        self.report.orphans_left = self.pool.iter().map(|o| o.id).collect();
        Ok((self.report, self.build))
    }

    fn read(&self, id: NodeId) -> Result<(NodeHeader, AlignedBuf, Extent)> {
        let ext = self.tree.store.location(id).ok_or_else(|| {
            Error::Corrupt(format!("node {id} is referenced but not in the table"))
        })?;
        let what = format!("node {id}");
        let img = self.tree.store.read(ext.offset(), ext.len(), &what)?;
        let span = node::header_span(&img, &what, ext.offset())?;
        if span > img.len() {
            return Err(Error::Corrupt(format!(
                "{what}: header larger than its extent"
            )));
        }
        let h = node::parse_header(&img, &self.tree.format, &what, ext.offset())?;
        check_header(&h, id, Some(ext), &what)?;
        Ok((h, img, ext))
    }

    /// Walks node `id` with the range `[lo, hi)`. `placed`: the range is the node's own (it was
    /// reached through intact parents, or is an orphan's inner child), so the node is read under
    /// the prefix the range gives; otherwise (an adopted orphan, or an orphan's edge child) under
    /// its prefix hint.
    #[allow(clippy::too_many_arguments)]
    fn walk(
        &mut self,
        id: NodeId,
        lo: &[u8],
        hi: Option<&[u8]>,
        expect: Option<u32>,
        placed: bool,
        stack: &mut Vec<Level>,
    ) -> Result<()> {
        let ext = self.tree.store.location(id);
        let range = Some((lo, hi));
        let shared = self.count(id) > 1;
        if !self.visited.insert(id) && !shared && self.shared_above == 0 {
            let d = dmg(
                id,
                ext,
                DamagedPart::Node { height: expect },
                range,
                "reachable twice".into(),
            );
            self.report.damage.push(d);
            return self.lost(lo, hi, expect, stack);
        }
        let (mut h, img, ext) = match self.read(id) {
            Ok(x) => x,
            Err(e) if e.is_damage() => {
                let d = dmg(
                    id,
                    ext,
                    DamagedPart::Node { height: expect },
                    range,
                    e.to_string(),
                );
                self.report.damage.push(d);
                return self.lost(lo, hi, expect, stack);
            }
            Err(e) => return Err(e),
        };
        if let Some(x) = expect.filter(|&x| x != h.height) {
            let msg = format!("height {} where its parent says {x}", h.height);
            let d = dmg(
                id,
                Some(ext),
                DamagedPart::Node { height: expect },
                range,
                msg,
            );
            self.report.damage.push(d);
            return self.lost(lo, hi, expect, stack);
        }
        self.report.nodes_read += 1;
        // From here on `h.prefix` is the prefix the node is read under.
        if placed {
            let plen = lift_len(lo, hi);
            h.prefix = lo[..plen].to_vec();
        }
        self.shared_above += u32::from(shared);
        let r = if h.is_leaf {
            self.leaf(id, &h, &img, ext, lo, hi, stack)
        } else {
            self.internal(&h, &img, ext, lo, hi, placed, stack)
        };
        self.shared_above -= u32::from(shared);
        r
    }

    /// Node `id`'s reference count in the checkpoint's table.
    fn count(&self, id: NodeId) -> u32 {
        self.tree.store.btt.lock().refs.count(id)
    }

    /// The range of a damaged node: a lost leaf's range becomes an empty leaf; a lost internal
    /// node's is filled with the orphans found in it.
    fn lost(
        &mut self,
        lo: &[u8],
        hi: Option<&[u8]>,
        expect: Option<u32>,
        stack: &mut Vec<Level>,
    ) -> Result<()> {
        if expect == Some(0) {
            return self.fresh(lo, hi, Vec::new(), stack);
        }
        self.adopt(lo, hi, stack)
    }

    #[allow(clippy::too_many_arguments)]
    fn leaf(
        &mut self,
        id: NodeId,
        h: &NodeHeader,
        img: &[u8],
        ext: Extent,
        lo: &[u8],
        hi: Option<&[u8]>,
        stack: &[Level],
    ) -> Result<()> {
        let mut parts: Vec<Partition> = Vec::with_capacity(h.sublocs.len());
        let mut intact = true;
        let pivots = full_pivots(h);
        for (i, loc) in h.sublocs.iter().enumerate() {
            let (plo, phi) = node::child_bounds_of(&pivots, i);
            let plo = plo.max(lo);
            let phi = match (phi, hi) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let what = format!("node {id} partition {i}");
            let off = loc.offset as usize;
            let decoded = node::decode_partition(
                &img[off..],
                loc,
                &self.tree.format,
                &what,
                ext.offset() + off as u64,
            )
            .and_then(|p| {
                let inside = (0..p.len()).all(|j| {
                    let k = full_key(&h.prefix, p.key(j));
                    k.as_slice() >= plo && phi.is_none_or(|h| k.as_slice() < h)
                });
                if inside {
                    Ok(p)
                } else {
                    Err(Error::Corrupt(format!("{what}: keys outside its range")))
                }
            });
            match decoded {
                Ok(p) => parts.push(p),
                Err(e) if e.is_damage() => {
                    intact = false;
                    let part = DamagedPart::Partition {
                        index: i,
                        entries: loc.count as u64,
                        bytes: loc.raw_len as u64,
                    };
                    self.report.damage.push(dmg(
                        id,
                        Some(ext),
                        part,
                        Some((plo, phi)),
                        e.to_string(),
                    ));
                }
                Err(e) => return Err(e),
            }
        }
        let entries: u64 = parts.iter().map(|p| p.len() as u64).sum();
        let Some(build) = &mut self.build else {
            if intact {
                self.report.leaves_kept += 1;
            } else {
                self.report.leaves_rebuilt += 1;
            }
            self.report.entries += entries;
            return Ok(());
        };
        let (pending, dropped) = merge_levels(stack, lo, hi);
        self.report.messages_dropped += dropped;
        // A kept leaf must be older than every message its new parent buffers for it (queries
        // skip messages at or below a leaf's max MSN); otherwise rebuild it. A shared leaf is
        // kept at its first place only (every count in the new tree is 1): copied at the others.
        let older = min_msn(&pending).is_none_or(|m| m > h.max_msn);
        if intact && older && !build.reused.contains_key(&id) {
            self.report.leaves_kept += 1;
            self.report.entries += entries;
            return build.reuse(id, lo.to_vec(), h.max_msn, pending, h.prefix.clone());
        }
        let mut all = Vec::with_capacity(entries as usize);
        for p in &parts {
            for j in 0..p.len() {
                all.push((full_key(&h.prefix, p.key(j)), p.value(j).to_val()));
            }
        }
        self.report.entries += entries;
        self.report.leaves_rebuilt += 1;
        build.fresh(lo.to_vec(), hi.map(|h| h.to_vec()), all, pending)
    }

    #[allow(clippy::too_many_arguments)]
    fn internal(
        &mut self,
        h: &NodeHeader,
        img: &[u8],
        ext: Extent,
        lo: &[u8],
        hi: Option<&[u8]>,
        placed: bool,
        stack: &mut Vec<Level>,
    ) -> Result<()> {
        let n = h.children.len();
        let pivots = full_pivots(h);
        for i in 0..n {
            let (plo, phi) = node::child_bounds_of(&pivots, i);
            let cl = plo.max(lo);
            let ch = match (phi, hi) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            if ch.is_some_and(|c| c <= cl) {
                if !placed {
                    // An adopted orphan's range runs from its first intact key to the next
                    // orphan's (`adopt`): a child wholly outside it holds no intact key (its
                    // leaves are empty, or emptied by deletes). Its buffered messages, if any,
                    // have no place and are counted as dropped; the node is not damaged.
                    self.report.messages_dropped += h.sublocs[i].count as u64;
                    continue;
                }
                // A pivot outside the node's range: nothing of this child can be placed.
                let msg = "a pivot outside the node's range".to_string();
                let d = dmg(
                    h.id,
                    Some(ext),
                    DamagedPart::Node {
                        height: Some(h.height),
                    },
                    Some((lo, hi)),
                    msg,
                );
                self.report.damage.push(d);
                continue;
            }
            let loc = &h.sublocs[i];
            let what = format!("node {} buffer {i}", h.id);
            let off = loc.offset as usize;
            // Checked against the child's bounds as the node stores them, then given full keys.
            let (slo, shi) = node::child_bounds_of(&h.pivots, i);
            let level = match node::decode_buffer(
                &img[off..],
                loc,
                &self.tree.format,
                &what,
                ext.offset() + off as u64,
                h.max_msn,
                slo,
                shi,
            ) {
                Ok(b) if h.prefix.is_empty() => Some(b),
                Ok(b) => Some(b.rekeyed(|k| full_key(&h.prefix, k))),
                Err(e) if e.is_damage() => {
                    let part = DamagedPart::Buffer {
                        index: i,
                        messages: loc.count as u64,
                        bytes: (loc.raw_len as u64).saturating_sub(node::BUFFER_HEADER as u64),
                    };
                    self.report.damage.push(dmg(
                        h.id,
                        Some(ext),
                        part,
                        Some((cl, ch)),
                        e.to_string(),
                    ));
                    None
                }
                Err(e) => return Err(e),
            };
            stack.push(level);
            // An orphan's edge children have bounds clipped to its adopted range, not their own;
            // so has an inner child when the next orphan's first key (found under a hint that
            // may be stale: a clone's chain nodes keep their source's) cuts into the orphan.
            let clipped = cl != plo || ch != phi;
            let inner = placed || (i > 0 && i + 1 < n && !clipped);
            let r = self.walk(h.children[i], cl, ch, Some(h.height - 1), inner, stack);
            stack.pop();
            r?;
        }
        Ok(())
    }

    fn fresh(
        &mut self,
        lo: &[u8],
        hi: Option<&[u8]>,
        entries: Vec<(Vec<u8>, Val)>,
        stack: &mut [Level],
    ) -> Result<()> {
        self.report.leaves_rebuilt += 1;
        self.report.entries += entries.len() as u64;
        let Some(build) = &mut self.build else {
            return Ok(());
        };
        let (pending, dropped) = merge_levels(stack, lo, hi);
        self.report.messages_dropped += dropped;
        build.fresh(lo.to_vec(), hi.map(|h| h.to_vec()), entries, pending)
    }

    /// Fills the range `[lo, hi)` of a damaged internal node with the orphans whose first key lies
    /// in it (each given the range up to the next one's first key), or an empty leaf.
    fn adopt(&mut self, lo: &[u8], hi: Option<&[u8]>, stack: &mut Vec<Level>) -> Result<()> {
        self.find_orphans()?;
        let inside = |k: &[u8]| k >= lo && hi.is_none_or(|h| k < h);
        // Candidates in key order; one whose first key lies inside an earlier one's span belongs
        // to a damaged node inside that one, and waits for the walk to get there.
        let mut taken: Vec<Orphan> = Vec::new();
        let mut rest = Vec::with_capacity(self.pool.len());
        for o in std::mem::take(&mut self.pool) {
            let nested = taken.last().is_some_and(|t| o.first <= t.last);
            if inside(&o.first) && !nested {
                taken.push(o);
            } else {
                rest.push(o);
            }
        }
        self.pool = rest;
        if taken.is_empty() {
            return self.fresh(lo, hi, Vec::new(), stack);
        }
        let firsts: Vec<Vec<u8>> = taken.iter().map(|o| o.first.clone()).collect();
        for (j, o) in taken.iter().enumerate() {
            let l: &[u8] = if j == 0 { lo } else { &firsts[j] };
            let h = firsts.get(j + 1).map(|f| f.as_slice()).or(hi);
            self.report.orphans_adopted += 1;
            self.walk(o.id, l, h, None, false, stack)?;
        }
        Ok(())
    }

    /// Reads every table node's header (once) and builds the pool of orphans.
    fn find_orphans(&mut self) -> Result<()> {
        if self.headers.is_some() {
            return Ok(());
        }
        let ids: Vec<NodeId> = {
            let btt = self.tree.store.btt.lock();
            let mut v: Vec<NodeId> = btt.current.keys().copied().collect();
            v.sort_unstable();
            v
        };
        let mut headers: HashMap<NodeId, HeaderRead> = HashMap::new();
        for id in ids {
            let h = match self.read_header(id) {
                Ok(h) => Ok(h),
                Err(e) if e.is_damage() => Err(e.to_string()),
                Err(e) => return Err(e),
            };
            headers.insert(id, h);
        }
        // How many intact nodes (live or dead) name each node. A node named less often than its
        // count says was named by a damaged one: an orphan, even if an intact parent reaches it
        // too (shared). A dead node (count 0) is no orphan, and neither is what only it names.
        let mut named: HashMap<NodeId, u32> = HashMap::new();
        for c in headers
            .values()
            .filter_map(|h| h.as_ref().ok())
            .flat_map(|h| h.children.iter())
        {
            *named.entry(*c).or_default() += 1;
        }
        // Snapshot roots are named by the catalog, not by a node: no orphans either.
        let snapshot_roots: HashSet<NodeId> = self.tree.snapshot_roots().into_iter().collect();
        let mut tops: Vec<NodeId> = {
            let btt = self.tree.store.btt.lock();
            headers
                .iter()
                .filter(|(id, h)| h.is_ok() && **id != ROOT_ID && !snapshot_roots.contains(id))
                .filter(|(id, _)| named.get(id).copied().unwrap_or(0) < btt.refs.count(**id))
                .map(|(id, _)| *id)
                .collect()
        };
        tops.sort_unstable();
        self.headers = Some(headers);
        let mut pool = Vec::new();
        for id in tops {
            let first = self.edge_key(id, true, 0)?;
            let last = self.edge_key(id, false, 0)?;
            match (first, last) {
                (Some(first), Some(last)) => pool.push(Orphan { id, first, last }),
                _ => self.report.orphans_left.push(id),
            }
        }
        pool.sort_by(|a, b| a.first.cmp(&b.first));
        self.pool = pool;
        Ok(())
    }

    fn read_header(&self, id: NodeId) -> Result<NodeHeader> {
        let ext = self
            .tree
            .store
            .location(id)
            .ok_or_else(|| Error::Corrupt(format!("node {id} has no location")))?;
        let what = format!("node {id}");
        let img = self.tree.read_header_image(ext, &what)?;
        let h = node::parse_header(&img, &self.tree.format, &what, ext.offset())?;
        check_header(&h, id, None, &what)?;
        Ok(h)
    }

    /// The smallest (`first`) or largest intact key under node `id`, going down through intact
    /// headers and reading leaf partitions from the near end.
    fn edge_key(&self, id: NodeId, first: bool, depth: u32) -> Result<Option<Vec<u8>>> {
        let h = match self.headers.as_ref().and_then(|m| m.get(&id)) {
            Some(Ok(h)) if depth < 64 => h,
            _ => return Ok(None),
        };
        if !h.is_leaf {
            let mut kids = h.children.clone();
            if !first {
                kids.reverse();
            }
            for c in kids {
                if let Some(k) = self.edge_key(c, first, depth + 1)? {
                    return Ok(Some(k));
                }
            }
            return Ok(None);
        }
        let (_, img, ext) = match self.read(id) {
            Ok(x) => x,
            Err(e) if e.is_damage() => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut order: Vec<usize> = (0..h.sublocs.len()).collect();
        if !first {
            order.reverse();
        }
        for i in order {
            let loc = &h.sublocs[i];
            let off = loc.offset as usize;
            let what = format!("node {id} partition {i}");
            if let Ok(p) = node::decode_partition(
                &img[off..],
                loc,
                &self.tree.format,
                &what,
                ext.offset() + off as u64,
            ) {
                if !p.is_empty() {
                    let j = if first { 0 } else { p.len() - 1 };
                    return Ok(Some(full_key(&h.prefix, p.key(j))));
                }
            }
        }
        Ok(None)
    }
}

/// A key stored under prefix hint `prefix`, made full. Salvage reads every node by its hint
/// (docs/SURGERY.md §2.7): the parent that gives its position may be lost.
fn full_key(prefix: &[u8], stored: &[u8]) -> Vec<u8> {
    [prefix, stored].concat()
}

/// A node's pivots as full keys (under its prefix hint).
fn full_pivots(h: &NodeHeader) -> Vec<Vec<u8>> {
    h.pivots.iter().map(|p| full_key(&h.prefix, p)).collect()
}

/// The oldest MSN in a buffer.
fn min_msn(b: &Buffer) -> Option<Msn> {
    let points = b.points_in(&[], None).map(|(_, km)| km.min_msn());
    let ranges = b.ranges_in(&[], None).into_iter().map(|r| r.msn);
    points.chain(ranges).min()
}

/// The messages the ancestors on `stack` hold for `[lo, hi)`, folded into one buffer (deepest,
/// i.e. oldest, level first). Returns it and the number of messages left out because they break
/// the order a buffer needs (only possible in an image whose checksums hide a bug).
pub(crate) fn merge_levels(stack: &[Level], lo: &[u8], hi: Option<&[u8]>) -> (Buffer, u64) {
    let mut out = Buffer::new();
    let mut dropped = 0u64;
    for level in stack.iter().rev() {
        let Some(b) = level else { continue };
        dropped += restrict(b, lo, hi, &mut out);
    }
    (out, dropped)
}

/// Walks the checkpointed tree and reports its damage (reads every node; changes nothing).
pub(crate) fn survey(tree: &Tree) -> Result<SalvageReport> {
    Walker::new(tree, false).run().map(|(r, _)| r)
}

/// Replaces the tree by one built from its intact parts (in the cache, dirty: the next checkpoint
/// writes it). Every node of the old tree but the leaves kept leaves the current table; the old
/// checkpoint keeps its extents until a new checkpoint completes.
pub(crate) fn rebuild(tree: &Tree) -> Result<SalvageReport> {
    assert!(
        tree.cache.all().is_empty(),
        "a rebuild starts from a tree with nothing in memory"
    );
    let (mut report, build) = Walker::new(tree, true).run()?;
    let build = build.expect("a rebuilding walk has a builder");
    let keep: HashSet<NodeId> = build.reused.keys().copied().collect();
    {
        // Every node outside the rebuilt tree leaves the table below, the snapshot roots and
        // what only they reach among them: the catalog must not name them any more.
        let dropped = std::mem::take(&mut *tree.snapshots.lock());
        report.snapshots_dropped = dropped.list().into_iter().map(|s| s.name).collect();
        let mut btt = tree.store.btt.lock();
        // The rebuilt tree reaches each node it keeps once (a shared leaf is kept at one place
        // and copied for the others): every count is 1, and nothing is dead (the dead nodes are
        // dropped below, with what they referenced).
        btt.refs = Default::default();
        let old: Vec<NodeId> = btt
            .checkpointed
            .keys()
            .copied()
            .filter(|id| !keep.contains(id))
            .collect();
        for id in old {
            btt.remove(id);
        }
    }
    report.nodes_relifted = build.finish()?;
    report.rebuilt = true;
    Ok(report)
}
