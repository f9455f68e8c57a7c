//! Shared and dead nodes from the engine's side (docs/SURGERY.md §4.2–4.5): what is shared
//! (for `amaranth stat`), the collector's step, and the test hook that shares subtrees so that
//! the model tests exercise copy-on-write and collection without clones.

use amaranth_device::BLOCK_SIZE;

use super::Engine;
use crate::error::Result;

/// What range clones share, and what waits for the collector (docs/SURGERY.md §4.5): read off
/// the block translation table's counts and the data table's runs, without a walk of the tree
/// (a pass over the nodes whose count is not 1 and over the data table).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sharing {
    /// Nodes more than one slot names (reference count above 1): the roots of shared subtrees.
    /// The nodes below them are shared through them, with counts of 1: not counted here.
    pub shared_nodes: u64,
    /// Bytes of the shared nodes' images on the device (a node never written counts 0).
    pub shared_node_bytes: u64,
    /// Dead nodes (count 0) waiting for the collector.
    pub dead_nodes: u64,
    /// Bytes of the dead nodes' images (only theirs: what only they name is freed with them).
    pub dead_node_bytes: u64,
    /// Bytes of out-of-line data blocks that more than one reference names: blocks of a shared
    /// leaf once an owner's copy of the leaf was made (a shared leaf's references count once),
    /// and blocks a copied range move named twice until the source's delete reaches them.
    pub shared_data_bytes: u64,
}

impl Engine {
    /// Frees up to about `max` dead nodes (reference count 0: released by a range move, a
    /// range delete that covered them, or a copy-on-write) and what only they referenced: their
    /// children's references and their out-of-line blocks'. The space comes back at the next
    /// checkpoint. The background cleaner runs this a bounded step at a time; returns how many
    /// nodes it freed.
    pub fn collect_garbage(&self, max: usize) -> Result<usize> {
        self.refuse_if_snapshot()?;
        self.inner.check_writable()?;
        let tree = &self.inner.tree;
        let n = {
            let _w = tree.writers.read();
            self.inner.seen(tree.collect(max))?
        };
        self.inner.seen(tree.make_room())?;
        Ok(n)
    }

    /// Dead nodes waiting for the collector.
    pub fn garbage_nodes(&self) -> usize {
        self.inner.tree.garbage_nodes()
    }

    /// What is shared now, and what waits for the collector ([`Sharing`]).
    pub fn sharing(&self) -> Sharing {
        let tree = &self.inner.tree;
        let block = BLOCK_SIZE as u64;
        let mut s = Sharing::default();
        {
            let btt = tree.store.btt.lock();
            for (id, &count) in btt.refs.counts() {
                let bytes = btt.current.get(id).map_or(0, |e| e.blocks * block);
                if count > 1 {
                    s.shared_nodes += 1;
                    s.shared_node_bytes += bytes;
                } else {
                    assert_eq!(count, 0, "node {id}: a count of 1 is not recorded");
                    s.dead_nodes += 1;
                    s.dead_node_bytes += bytes;
                }
            }
        }
        let d = tree.store.data.lock();
        let blocks: u64 = d.refs.iter().filter(|r| r.2 > 1).map(|r| r.1).sum();
        s.shared_data_bytes = blocks * block;
        s
    }

    /// Test hook: holds one more reference to every `every`th node at `height` (below the
    /// root's), as a snapshot would, so that every change below them must copy them first.
    /// Returns how many it holds. The holds live in memory only: a checkpoint writes the counts
    /// without them (a subtree only a hold names is written dead, and collected after a reopen).
    #[doc(hidden)]
    pub fn hold_for_tests(&self, height: u32, every: usize) -> Result<usize> {
        self.refuse_if_snapshot()?;
        self.inner.check_writable()?;
        let tree = &self.inner.tree;
        let n = {
            let _w = tree.writers.write();
            tree.hold_for_tests(height, every)
        };
        let n = self.inner.seen(n)?;
        self.inner.seen(tree.make_room())?;
        Ok(n)
    }

    /// Test hook: lets go of every subtree [`Engine::hold_for_tests`] holds. Fails with
    /// `Error::Corrupt` if one of them changed while it was held (a change that did not copy a
    /// shared node first).
    #[doc(hidden)]
    pub fn release_holds_for_tests(&self) -> Result<usize> {
        self.refuse_if_snapshot()?;
        let tree = &self.inner.tree;
        let n = {
            let _w = tree.writers.write();
            tree.release_holds_for_tests()
        };
        self.inner.seen(tree.make_room())?;
        n
    }
}
