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
        assert!(
            self.store.btt.lock().refs.drop_ref(e.root),
            "a snapshot root is named by its catalog entry only"
        );
        Ok(())
    }

    /// The roots of every snapshot.
    pub(crate) fn snapshot_roots(&self) -> Vec<NodeId> {
        self.snapshots.lock().roots()
    }
}
