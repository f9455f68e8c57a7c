//! Snapshots (docs/SURGERY.md §4.7): a snapshot is a copy of the live root under a new id that
//! shares the root's children (each gains a reference), listed in the catalog. Nothing ever
//! flushes into a snapshot root or changes it: queries through it apply its buffers as they
//! were. Every modifier of the live tree copies a shared child before changing it
//! ([`Tree::own_child`]), so the snapshot keeps the tree as it was when it was taken. Deleting a
//! snapshot takes its root's reference away; the collector frees what only it reached.

use std::sync::atomic::Ordering;

use super::Tree;
use crate::error::{Error, Result};
use crate::msg::Msn;
use crate::node::{Body, NodeId, ROOT_ID};
use crate::ops::Op;
use crate::snapshot::Entry;

impl Tree {
    /// Checks a batch's snapshot operations against the catalog before its record is logged
    /// (creates of a name that exists, deletes of one that does not, or of one a view reads
    /// while `live`), going through the batch in order. The caller holds `writers` exclusive,
    /// so the catalog seen here is the one the batch applies to, at replay too.
    pub(crate) fn check_snapshot_ops(&self, ops: &[Op], live: bool) -> Result<()> {
        let cat = self.snapshots.lock();
        let mut names: std::collections::BTreeMap<&str, u32> = cat
            .entries
            .iter()
            .map(|(n, e)| (n.as_str(), e.readers))
            .collect();
        for op in ops {
            match op {
                Op::SnapshotCreate { name, .. } if names.insert(name, 0).is_some() => {
                    return Err(Error::SnapshotExists(name.clone()));
                }
                Op::SnapshotDelete { name } => match names.remove(name.as_str()) {
                    None => return Err(Error::NoSuchSnapshot(name.clone())),
                    Some(r) if r > 0 && live => {
                        return Err(Error::InUse(format!(
                            "snapshot {name:?} is being read ({r} open views: unmount it first)"
                        )))
                    }
                    Some(_) => {}
                },
                _ => {}
            }
        }
        Ok(())
    }

    /// Takes snapshot `name` (checked absent) at the next message number, calling `before`
    /// with it under the root latch: the live root, wholly in memory, copied to a new id, each
    /// of its children and out-of-line blocks gaining a reference. The caller holds `writers`
    /// exclusive (no flush runs below the root meanwhile) and brought the root under its bound.
    pub(crate) fn snapshot_create(
        &self,
        name: &str,
        time_ns: u64,
        before: &mut dyn FnMut(Msn) -> Result<()>,
    ) -> Result<NodeId> {
        let root = self.pin_whole(ROOT_ID)?;
        let (copy, children, blocks, msn) = {
            let g = root.write();
            let msn = self.next_msn.load(Ordering::Relaxed);
            before(msn)?;
            self.next_msn.store(msn + 1, Ordering::Relaxed);
            let children = match &g.body {
                Body::Internal(n) => n.children.clone(),
                Body::Leaf(_) => Vec::new(),
            };
            (g.copy_resident(), children, g.ref_blocks(), msn)
        };
        drop(root);
        let id = self.new_node(copy);
        {
            let mut btt = self.store.btt.lock();
            for &c in &children {
                btt.refs.add(c);
            }
        }
        if !blocks.is_empty() {
            let mut d = self.store.data.lock();
            for &b in &blocks {
                d.refs.add(b, 1);
            }
        }
        let old = self.snapshots.lock().entries.insert(
            name.to_string(),
            Entry {
                root: id,
                msn,
                time_ns,
                readers: 0,
            },
        );
        assert!(old.is_none(), "snapshot {name:?} created twice");
        self.counters
            .snapshots_taken
            .fetch_add(1, Ordering::Relaxed);
        Ok(id)
    }

    /// Deletes snapshot `name` (checked present) at the next message number: its root loses
    /// the catalog's reference and is dead (the collector frees it and what only it reached).
    /// The caller holds `writers` exclusive.
    pub(crate) fn snapshot_delete(
        &self,
        name: &str,
        before: &mut dyn FnMut(Msn) -> Result<()>,
    ) -> Result<()> {
        self.take_msn(before)?;
        let e = self
            .snapshots
            .lock()
            .entries
            .remove(name)
            .expect("a checked snapshot delete");
        assert_eq!(e.readers, 0, "snapshot {name:?} deleted while it is read");
        assert!(
            self.store.btt.lock().refs.drop_ref(e.root),
            "a snapshot root is named by its catalog entry only"
        );
        Ok(())
    }

    /// What the snapshot under `root` holds (docs/SURGERY.md §4.7, "List"): its *exclusive*
    /// part, the nodes reached from its root only through nodes of count 1 and the out-of-line
    /// blocks only those nodes name (what deleting it gives back), and its *shared* part, the
    /// nodes of the subtrees it shares (each counted once; the out-of-line blocks of shared
    /// leaves are not counted, so that only exclusive leaves are read). Node sizes are their
    /// images' extents (a node not written yet: its image's length). Walks skeletons, bounded by the node
    /// count; the tree may change meanwhile (a figure of the moment). The caller holds a view.
    pub(crate) fn snapshot_sizes(&self, root: NodeId) -> Result<crate::SnapshotSizes> {
        let mut out = crate::SnapshotSizes::default();
        let block = amaranth_device::BLOCK_SIZE as u64;
        // Its image's extent; a node not written yet is in memory (dirty): its image's length.
        let bytes = |id| match self.store.location(id) {
            Some(e) => e.blocks * block,
            None => self.cache.peek(id).map_or(0, |cn| {
                (cn.read().image_len() as u64).div_ceil(block) * block
            }),
        };
        let mut seen = std::collections::HashSet::new();
        // (node, reached only through nodes of count 1, whether it is a leaf)
        let mut stack = vec![(root, true, false)];
        while let Some((id, only, leaf)) = stack.pop() {
            if !seen.insert(id) {
                continue;
            }
            let exclusive = only && !self.is_shared(id);
            if exclusive {
                out.exclusive_nodes += 1;
                out.exclusive_bytes += bytes(id);
            } else {
                out.shared_nodes += 1;
                out.shared_bytes += bytes(id);
            }
            if leaf && !exclusive {
                continue;
            }
            let cn = if leaf {
                self.pin_whole(id)?
            } else {
                self.pin(id)?
            };
            {
                let g = cn.read();
                match &g.body {
                    Body::Internal(n) => {
                        let below_leaves = g.height == 1;
                        for &c in &n.children {
                            stack.push((c, exclusive, below_leaves));
                        }
                    }
                    Body::Leaf(_) => {
                        let d = self.store.data.lock();
                        for b in g.ref_blocks() {
                            if d.refs.refs(b) == 1 {
                                out.exclusive_bytes += amaranth_device::BLOCK_SIZE as u64;
                            }
                        }
                    }
                }
            }
            drop(cn);
            self.make_room()?;
        }
        Ok(out)
    }

    /// The roots of every snapshot.
    pub(crate) fn snapshot_roots(&self) -> Vec<NodeId> {
        self.snapshots.lock().roots()
    }
}
