//! A full check of the tree: every node read and checksummed, every invariant checked.

use std::collections::{HashMap, HashSet};

use crate::datatable::RunMap;
use crate::error::{Error, Result};
use crate::node::{Body, NodeId, ROOT_ID};
use crate::refcheck::{check_refs, RefCheck};
use crate::tree::{Bounds, Tree};

/// What a verification found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Height of the root.
    pub height: u32,
    /// Internal nodes visited.
    pub internal_nodes: u64,
    /// Leaves visited.
    pub leaves: u64,
    /// Entries stored in leaves (before pending messages are applied).
    pub leaf_entries: u64,
    /// Bytes of entries stored in leaves.
    pub leaf_bytes: u64,
    /// Leaves holding less than a quarter of a node (a leaf that small merges with a sibling
    /// when the two fit in three quarters), not counting a root leaf.
    pub small_leaves: u64,
    /// Keys with pending point messages in buffers.
    pub buffered_keys: u64,
    /// Pending range deletes in buffers.
    pub buffered_ranges: u64,
    /// Bytes of pending messages.
    pub buffered_bytes: u64,
    /// Nodes in the translation table that the tree does not reach and that are not dead
    /// (space leaks, harmless).
    pub leaked_nodes: Vec<NodeId>,
    /// Dead nodes (reference count 0) waiting for the collector: garbage, not leaks. Their
    /// subtrees are walked too (they still hold their children's references and their
    /// out-of-line blocks'), without the checks that need a node's bounds.
    pub dead_nodes: u64,
    /// Nodes named by more than one slot, root or holder (each visited once).
    pub shared_nodes: u64,
    /// Where each leaf's current image lies, `(first block, blocks)`, leaves in key order (a
    /// leaf never written yet is left out).
    pub leaf_extents: Vec<(u64, u64)>,
    /// References to out-of-line data blocks (leaf entries and buffered messages), and the
    /// blocks they name: the data table must count exactly these.
    pub data_refs: u64,
    /// Distinct out-of-line blocks referenced.
    pub data_blocks: u64,
    /// The data table against those references: leaks are reported here (a reference that may
    /// lose its block makes the verification fail).
    pub references: RefCheck,
}

impl Report {
    /// The leaves' static layout score: the fraction of leaves, after the first in key order,
    /// whose image starts on the device where the previous leaf's ends (1.0: a scan in key order
    /// reads the leaves in one sweep). 1.0 with fewer than two leaves.
    pub fn leaf_layout_score(&self) -> f64 {
        if self.leaf_extents.len() < 2 {
            return 1.0;
        }
        let next = self
            .leaf_extents
            .windows(2)
            .filter(|w| w[0].0 + w[0].1 == w[1].0)
            .count();
        next as f64 / (self.leaf_extents.len() - 1) as f64
    }
}

/// A node still to visit.
struct Pending {
    id: NodeId,
    bounds: Bounds,
    /// The height its parent expects (`None`: a root).
    height: Option<u32>,
    /// The oldest message its parent buffers for it.
    msn_bound: u64,
    /// The longest its stored keys may be by its ancestors' key-length bounds.
    longest: usize,
    /// Whether `bounds` are the node's (false below a dead node, whose bounds are unknown: every
    /// bounds check passes with the root's).
    exact: bool,
    /// Whether this visit is a reference the node's count includes (not for a dead root).
    counted: bool,
}

fn broken(msg: String) -> Error {
    Error::Corrupt(msg)
}

/// Walks the whole tree, every snapshot's tree, the subtrees the test hook holds and the dead subtrees waiting for the
/// collector, visiting each node once and counting the references to it: every node's reference
/// count must equal the slots, roots, catalog entries and holders that name it (no leaked and no over-freed
/// node). Holds `writers` exclusive so the tree does not change meanwhile.
pub fn verify(tree: &Tree) -> Result<Report> {
    let _w = tree.writers.write();
    let mut report = Report::default();
    let mut seen: HashSet<NodeId> = HashSet::new();
    // References found per node, and the bounds (stored form) it was first reached under.
    let mut found: HashMap<NodeId, u32> = HashMap::new();
    let mut first: HashMap<NodeId, (Bounds, bool)> = HashMap::new();
    let mut leaves: Vec<(Vec<u8>, (u64, u64))> = Vec::new();
    let root = |id, bounds, height, exact, counted| Pending {
        id,
        bounds,
        height,
        msn_bound: u64::MAX,
        longest: usize::MAX,
        exact,
        counted,
    };
    // The live tree is popped first (reached exactly before anything else reaches a node).
    let mut stack: Vec<Pending> = Vec::new();
    let dead = {
        let btt = tree.store.btt.lock();
        btt.refs.dead(usize::MAX)
    };
    report.dead_nodes = dead.len() as u64;
    for &id in &dead {
        stack.push(root(id, Bounds::root(), None, false, false));
    }
    for h in tree.holds() {
        stack.push(root(h.id, h.bounds, Some(h.height), true, true));
    }
    // Snapshot roots: each named by its catalog entry, bounded as the live root is.
    for id in tree.snapshot_roots() {
        stack.push(root(id, Bounds::root(), None, true, true));
    }
    stack.push(root(ROOT_ID, Bounds::root(), None, true, true));
    let mut refs = RunMap::default();
    while let Some(Pending {
        id,
        bounds,
        height,
        msn_bound,
        longest,
        exact,
        counted,
    }) = stack.pop()
    {
        if counted {
            *found.entry(id).or_default() += 1;
        }
        if !seen.insert(id) {
            // Reached again (shared): the same node under this parent too.
            let cn = tree.pin(id)?;
            let g = cn.read();
            if height.is_some_and(|h| g.height != h) {
                return Err(broken(format!(
                    "shared node {id} has height {} where another parent expects {height:?}",
                    g.height
                )));
            }
            if g.max_msn >= msn_bound {
                return Err(broken(format!(
                    "shared node {id} has applied message {} but a parent still buffers \
                     messages from {msn_bound}",
                    g.max_msn
                )));
            }
            let (b0, exact0) = &first[&id];
            if exact && *exact0 && (b0.lo(), b0.hi()) != (bounds.lo(), bounds.hi()) {
                let show = |b: &Bounds| {
                    format!(
                        "[{:?}, {:?}) under {:?}",
                        String::from_utf8_lossy(b.lo()),
                        b.hi().map(String::from_utf8_lossy),
                        String::from_utf8_lossy(b.prefix())
                    )
                };
                return Err(broken(format!(
                    "shared node {id} has other stored bounds under its parents: {} and {}",
                    show(b0),
                    show(&bounds)
                )));
            }
            continue;
        }
        first.insert(id, (bounds.clone(), exact));
        let cn = tree.pin(id)?;
        tree.load_partitions(&cn, None)?;
        let g = cn.read();
        if let Some(h) = height {
            if g.height != h {
                return Err(broken(format!(
                    "node {id} has height {} where {h} was expected",
                    g.height
                )));
            }
        } else if id == ROOT_ID {
            report.height = g.height;
        }
        if g.max_msn >= msn_bound {
            return Err(broken(format!(
                "node {id} has applied message {} but its parent still buffers messages from {msn_bound}",
                g.max_msn
            )));
        }
        // Stored keys, compared with the node's bounds in stored form: the same as comparing the
        // full keys (the prefix put back) with the full bounds.
        // Below a dead node the bounds are unknown: only the checks that need none.
        let in_bounds = |k: &[u8]| !exact || bounds.contains(k);
        match &g.body {
            Body::Leaf(l) => {
                report.leaves += 1;
                if height.is_some() && l.bytes() < tree.format.node_size / 4 {
                    report.small_leaves += 1;
                }
                if let Some(e) = tree.store.location(id).filter(|_| exact) {
                    leaves.push((bounds.full_lo(), (e.block, e.blocks)));
                }
                if l.pivots.len() + 1 != l.parts.len() {
                    return Err(broken(format!(
                        "leaf {id}: {} pivots for {} partitions",
                        l.pivots.len(),
                        l.parts.len()
                    )));
                }
                let mut prev: Option<Vec<u8>> = None;
                for (i, slot) in l.parts.iter().enumerate() {
                    let p = slot
                        .data()
                        .ok_or_else(|| broken(format!("leaf {id}: partition {i} did not load")))?;
                    for j in 0..p.len() {
                        let k = p.key(j);
                        if !in_bounds(k) {
                            return Err(broken(format!(
                                "leaf {id}: key outside the range its parent gives it"
                            )));
                        }
                        if k.len() > longest {
                            return Err(broken(format!(
                                "leaf {id}: a key of {} bytes where the key-length bounds \
                                 above it say at most {longest}",
                                k.len()
                            )));
                        }
                        if i > 0 && k < l.pivots[i - 1].as_slice()
                            || i < l.pivots.len() && k >= l.pivots[i].as_slice()
                        {
                            return Err(broken(format!(
                                "leaf {id}: partition {i} holds a key outside its pivots"
                            )));
                        }
                        if prev.as_deref().is_some_and(|q| q >= k) {
                            return Err(broken(format!("leaf {id}: keys out of order")));
                        }
                        prev = Some(k.to_vec());
                        if let Some(b) = p.value(j).block() {
                            refs.add(b, 1);
                            report.data_refs += 1;
                        }
                        report.leaf_entries += 1;
                        report.leaf_bytes += (k.len() + p.value(j).raw().len()) as u64;
                    }
                }
            }
            Body::Internal(n) => {
                report.internal_nodes += 1;
                if n.children.len() != n.pivots.len() + 1 || n.buffers.len() != n.children.len() {
                    return Err(broken(format!(
                        "node {id}: inconsistent child, pivot and buffer counts"
                    )));
                }
                if g.height == 0 {
                    return Err(broken(format!("node {id}: internal node at height 0")));
                }
                for p in &n.pivots {
                    if !in_bounds(p) && p.as_slice() != bounds.lo() {
                        return Err(broken(format!("node {id}: pivot outside the node's range")));
                    }
                }
                for w in n.pivots.windows(2) {
                    if w[0] >= w[1] {
                        return Err(broken(format!("node {id}: pivots out of order")));
                    }
                }
                for (i, slot) in n.buffers.iter().enumerate() {
                    let b = slot
                        .data()
                        .ok_or_else(|| broken(format!("node {id}: buffer {i} did not load")))?;
                    if b.bytes() != slot.bytes() {
                        return Err(broken(format!(
                            "node {id}: buffer {i} size differs from its slot"
                        )));
                    }
                    let (cl, ch) = n.child_bounds(i, bounds.lo(), bounds.hi());
                    let mut oldest = u64::MAX;
                    for (k, km) in b.points_in(&[], None) {
                        if exact && (k.as_slice() < cl || ch.is_some_and(|h| k.as_slice() >= h)) {
                            return Err(broken(format!(
                                "node {id}: buffer {i} holds a key outside its child's range"
                            )));
                        }
                        if k.len() > longest {
                            return Err(broken(format!(
                                "node {id}: buffer {i} holds a key of {} bytes where the \
                                 key-length bounds above it say at most {longest}",
                                k.len()
                            )));
                        }
                        if km.max_msn() > g.max_msn {
                            return Err(broken(format!(
                                "node {id}: buffered message newer than the node"
                            )));
                        }
                        oldest = oldest.min(km.min_msn());
                        report.buffered_keys += 1;
                    }
                    for r in b.ranges_in(&[], None) {
                        if exact
                            && (r.lo.as_slice() < cl || ch.is_some_and(|h| r.hi.as_slice() > h))
                        {
                            return Err(broken(format!(
                                "node {id}: buffer {i} holds a range outside its child's range"
                            )));
                        }
                        oldest = oldest.min(r.msn);
                        report.buffered_ranges += 1;
                    }
                    report.buffered_bytes += b.bytes() as u64;
                    for block in b.ref_blocks() {
                        refs.add(block, 1);
                        report.data_refs += 1;
                    }
                    // The child's keys in its own form: this bound and the slot's, less the
                    // bytes it strips.
                    let below = if exact {
                        longest
                            .min(slot.longest as usize)
                            .saturating_sub(bounds.extra(n, i))
                    } else {
                        usize::MAX
                    };
                    stack.push(Pending {
                        id: n.children[i],
                        bounds: if exact {
                            bounds.child(n, i)
                        } else {
                            Bounds::root()
                        },
                        height: Some(g.height - 1),
                        msn_bound: oldest,
                        longest: below,
                        exact,
                        counted: true,
                    });
                }
            }
        }
        drop(g);
        drop(cn);
        tree.make_room()?;
    }
    report.data_blocks = refs.blocks();
    report.references = check_refs(tree, &refs, false);
    if report.references.is_dangerous() {
        return Err(broken(report.references.describe()));
    }
    let btt = tree.store.btt.lock();
    for &id in &seen {
        let (count, refs_found) = (btt.refs.count(id), found.get(&id).copied().unwrap_or(0));
        if count != refs_found {
            let what = if count > refs_found {
                "leaked"
            } else {
                "over-freed"
            };
            return Err(broken(format!(
                "node {id} has reference count {count} but {refs_found} references ({what})"
            )));
        }
        if count > 1 {
            report.shared_nodes += 1;
        }
    }
    let mut leaked: Vec<NodeId> = btt
        .current
        .keys()
        .chain(btt.refs.counts().keys())
        .filter(|id| !seen.contains(id))
        .copied()
        .collect();
    leaked.sort();
    leaked.dedup();
    report.leaked_nodes = leaked;
    // Leaves' ranges are disjoint, so their low bounds order them.
    leaves.sort_by(|a, b| a.0.cmp(&b.0));
    report.leaf_extents = leaves.into_iter().map(|(_, e)| e).collect();
    Ok(report)
}
