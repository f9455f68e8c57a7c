//! Shared and dead nodes from the engine's side (docs/SURGERY.md §4.2–4.4): the collector's
//! step, and the test hook that shares subtrees so that the model tests exercise copy-on-write
//! and collection before clones exist.

use super::Engine;
use crate::error::Result;

impl Engine {
    /// Frees up to about `max` dead nodes (reference count 0: released by a range move, a
    /// range delete that covered them, or a copy-on-write) and what only they referenced: their
    /// children's references and their out-of-line blocks'. The space comes back at the next
    /// checkpoint. The background cleaner runs this a bounded step at a time; returns how many
    /// nodes it freed.
    pub fn collect_garbage(&self, max: usize) -> Result<usize> {
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

    /// Test hook: holds one more reference to every `every`th node at `height` (below the
    /// root's), as a snapshot would, so that every change below them must copy them first.
    /// Returns how many it holds. The holds live in memory only: a checkpoint writes the counts
    /// without them (a subtree only a hold names is written dead, and collected after a reopen).
    #[doc(hidden)]
    pub fn hold_for_tests(&self, height: u32, every: usize) -> Result<usize> {
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
        let tree = &self.inner.tree;
        let n = {
            let _w = tree.writers.write();
            tree.release_holds_for_tests()
        };
        self.inner.seen(tree.make_room())?;
        n
    }
}
