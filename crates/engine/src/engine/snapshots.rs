//! Snapshots (docs/SURGERY.md §4.7): taking, listing and deleting them, and [`View`], a
//! read-only view of one.

use std::ops::Bound;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use super::range::RangeIter;
use super::{Engine, Inner};
use crate::engine::data::{BlockRead, StoredValue};
use crate::error::{Error, Result};
use crate::node::NodeId;
use crate::ops::Op;
use crate::snapshot::{check_snapshot_name, SnapshotInfo, SnapshotSizes};
use crate::wal::Lsn;

impl Engine {
    /// Takes a snapshot of the whole store named `name`: a read-only, point-in-time copy that
    /// holds every operation acknowledged before it and none after (one log record, so after a
    /// crash it is there or not, and a prefix of the acknowledged operations when there; it
    /// waits while an atomic group is open, and never holds part of one). It
    /// costs one root node's copy, whatever the size of the store; the nodes it shares with the
    /// live tree are copied only as the tree changes them. Kept until
    /// [`Engine::snapshot_delete`]. Refused ([`Error::SnapshotExists`], [`Error::InvalidArgument`]
    /// for a bad name) with nothing changed.
    pub fn snapshot_create(&self, name: &str) -> Result<Lsn> {
        check_snapshot_name(name)?;
        let time_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        // In an atomic group of its own: no other group is open meanwhile, so the snapshot
        // never holds part of one (a checkpoint waits for the same reason).
        let group = self.begin_atomic()?;
        let op = Op::SnapshotCreate {
            name: name.to_string(),
            time_ns,
        };
        let written = self.inner.write_in_group(group, vec![op]);
        let committed = self.commit_atomic(group);
        let lsn = written?;
        committed?;
        Ok(lsn)
    }

    /// Deletes snapshot `name`: its nodes that the live tree (or another snapshot) does not
    /// share are freed in the background. Refused with nothing changed when there is none
    /// ([`Error::NoSuchSnapshot`]) or while a [`View`] of it is open ([`Error::InUse`]).
    pub fn snapshot_delete(&self, name: &str) -> Result<Lsn> {
        check_snapshot_name(name)?;
        self.write_ops(vec![Op::SnapshotDelete {
            name: name.to_string(),
        }])
    }

    /// The snapshots, by name.
    pub fn snapshots(&self) -> Vec<SnapshotInfo> {
        self.inner.tree.snapshots.lock().list()
    }

    /// What snapshot `name` holds alone (what deleting it would give back) and what it shares
    /// (see [`SnapshotSizes`]): a walk of its nodes, reading the skeletons of its internal nodes
    /// and its exclusive leaves.
    pub fn snapshot_sizes(&self, name: &str) -> Result<SnapshotSizes> {
        let v = self.snapshot_view(name)?;
        let r = self.inner.tree.snapshot_sizes(v.root);
        self.inner.seen(r)
    }

    /// A read-only view of snapshot `name` ([`Error::NoSuchSnapshot`] if there is none). The
    /// snapshot cannot be deleted while the view lives.
    pub fn snapshot_view(&self, name: &str) -> Result<View> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        // Not between a delete's check and its application (both under `writers` exclusive):
        // a view taken there would read a snapshot being freed.
        let _w = self.inner.tree.writers.read();
        let mut cat = self.inner.tree.snapshots.lock();
        let e = cat
            .entries
            .get_mut(name)
            .ok_or_else(|| Error::NoSuchSnapshot(name.to_string()))?;
        e.readers += 1;
        Ok(View {
            inner: self.inner.clone(),
            name: name.to_string(),
            root: e.root,
        })
    }
}

impl Engine {
    /// A handle of this engine that reads snapshot `name` ([`Error::NoSuchSnapshot`] if there is
    /// none): every query of [`Engine`] answers from the snapshot, every change is refused with
    /// [`Error::ReadOnly`] (sync and flushes do nothing), [`Engine::is_read_only`] is true, and
    /// closing or dropping it only lets go of its view (the snapshot cannot be deleted while it
    /// lives). For serving a snapshot with the code that serves the live tree (a read-only file
    /// system).
    pub fn snapshot_engine(&self, name: &str) -> Result<Engine> {
        let view = self.snapshot_view(name)?;
        Ok(Engine {
            inner: self.inner.clone(),
            threads: Default::default(),
            snap: Some(view),
        })
    }

    /// The snapshot this handle reads (`None`: the live tree).
    pub fn snapshot_name(&self) -> Option<&str> {
        self.snap.as_ref().map(View::name)
    }
}

/// A read-only view of a snapshot ([`Engine::snapshot_view`]): the queries of [`Engine`] against
/// the tree as it was when the snapshot was taken. It changes nothing, not even by flushing:
/// queries apply the snapshot root's buffered messages as any query applies its ancestors'.
/// Keeps the snapshot from being deleted while it lives; holds the engine's state, not the
/// [`Engine`] (close it after the views are dropped).
pub struct View {
    inner: Arc<Inner>,
    name: String,
    root: NodeId,
}

impl View {
    pub(super) fn root(&self) -> NodeId {
        self.root
    }

    /// The snapshot's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The value of `key` in the snapshot.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.inner.get_checked(self.root, key)
    }

    /// [`Engine::scan`] in the snapshot.
    pub fn scan(
        &self,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
        mut f: impl FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<()> {
        self.inner.scan_values(self.root, lo, hi, &mut f)
    }

    /// [`Engine::scan_stored`] in the snapshot.
    pub fn scan_stored(
        &self,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
        mut f: impl FnMut(&[u8], StoredValue<'_>) -> bool,
    ) -> Result<()> {
        self.inner.scan_stored_at(self.root, lo, hi, &mut f)
    }

    /// [`Engine::read_blocks`] for references found in the snapshot.
    pub fn read_blocks(&self, reads: &[BlockRead<'_>], dest: &mut [u8]) -> Result<()> {
        super::data::read_blocks(&self.inner, reads, dest)
    }

    /// [`Engine::range`] in the snapshot.
    pub fn range(&self, lo: Bound<&[u8]>, hi: Bound<&[u8]>) -> RangeIter<'_> {
        RangeIter::new(&self.inner, self.root, lo, hi, true)
    }

    /// [`Engine::range_rev`] in the snapshot.
    pub fn range_rev(&self, lo: Bound<&[u8]>, hi: Bound<&[u8]>) -> RangeIter<'_> {
        RangeIter::new(&self.inner, self.root, lo, hi, false)
    }

    /// The format parameters of the image.
    pub fn format(&self) -> &crate::config::Format {
        &self.inner.tree.format
    }
}

impl Drop for View {
    fn drop(&mut self) {
        let mut cat = self.inner.tree.snapshots.lock();
        let e = cat
            .entries
            .get_mut(&self.name)
            .expect("a snapshot with a view is not deleted");
        assert_eq!(e.root, self.root, "a viewed snapshot replaced");
        e.readers -= 1;
    }
}
