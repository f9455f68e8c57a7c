//! Space reclaim: deleted data leaves the device only once its range deletes reach the leaves
//! (and a checkpoint frees the old images). A pass pushes them down; the write path forces one
//! when deleted data holds too much space, the background threads run them when idle. Subtrees a
//! range delete covers whole are let go rather than flushed into; a pass collects them.

use std::sync::atomic::Ordering;

use super::Inner;
use crate::error::Result;
use crate::space::{DataSpace, SpaceUse};

/// Nodes' worth of space deleted data may hold beyond 1.5 times the baseline use before a pass that
/// pushes range deletes down and a checkpoint are forced (see `Inner::space_baseline`).
pub(super) const GARBAGE_SLACK_NODES: u64 = 16;

/// Dead nodes a round of a pass pushing range deletes down frees at most (the pass's last round
/// frees all that are left).
const COLLECT_PER_ROUND: usize = 256;

impl Inner {
    /// Whether deleted data may hold more space than the bound allows: deletes are pending and
    /// use is past 1.5 times the baseline plus [`GARBAGE_SLACK_NODES`] nodes.
    pub(super) fn garbage_over_bound(&self) -> bool {
        if !self.deletes_pending() {
            return false;
        }
        let slack = GARBAGE_SLACK_NODES * self.tree.format.node_size as u64;
        let base = self.space_baseline.load(Ordering::Relaxed);
        let bound = base + base / 2 + slack;
        self.space_use().used() > bound
    }

    /// Records the use now as the baseline (call after a checkpoint that followed a complete pass).
    pub(super) fn note_space_baseline(&self) {
        self.space_baseline
            .store(self.space_use().used(), Ordering::Relaxed);
    }

    pub(super) fn space_use(&self) -> SpaceUse {
        let t = &self.tree;
        // Both locks at once (data first): a checkpoint frees released data blocks under them.
        let d = t.store.data.lock();
        let data = DataSpace {
            blocks: d.refs.blocks() + d.writing,
            held: d.held_blocks(),
            runs: d.refs.runs() as u64,
        };
        let (total, free, entries, held, writing) = {
            let b = t.store.btt.lock();
            (
                b.alloc.total_blocks(),
                b.alloc.free_blocks(),
                b.current.len() as u64,
                b.checkpoint_held.blocks(),
                b.writing,
            )
        };
        drop(d);
        SpaceUse::new(
            total,
            free,
            t.cache.dirty_space(),
            entries,
            held,
            writing,
            data,
        )
    }

    /// Whether range deletes were applied since the last complete pass pushed them down.
    pub(super) fn deletes_pending(&self) -> bool {
        self.deletes_seen.load(Ordering::Relaxed) > self.deletes_pushed.load(Ordering::Relaxed)
    }

    /// One round of a pass that pushes range deletes down to the leaves (merging emptied
    /// leaves), resuming at `from`, with at most `flushes` flushes. Returns where the next round
    /// resumes (`None`: the pass is complete).
    pub(super) fn push_deletes_round(
        &self,
        from: &[u8],
        flushes: usize,
    ) -> Result<Option<Vec<u8>>> {
        let round = {
            let _w = self.tree.writers.read();
            self.tree.drain_from(from, flushes, true)
        };
        let (_, resume) = round?;
        self.tree.make_room()?;
        // The subtrees the range deletes covered whole were let go, not flushed into: their
        // nodes are freed here, a bounded number per round, and all of them when the pass ends.
        loop {
            let freed = {
                let _w = self.tree.writers.read();
                self.tree.collect(COLLECT_PER_ROUND)
            }?;
            if freed == 0 || resume.is_some() {
                break;
            }
        }
        Ok(resume)
    }

    /// A whole pass (unless `give_up` says stop between rounds; returns whether it completed):
    /// afterwards every range delete applied before it began is in the leaves, whose next images
    /// no longer hold the deleted data; the next checkpoint frees the old images.
    /// The nodes a pass dirties need new extents before the old ones are freed: when they would
    /// take more than half the unallocated space, a checkpoint comes between rounds.
    pub(super) fn push_deletes_down(&self, give_up: impl Fn() -> bool) -> Result<bool> {
        let counted = self.deletes_seen.load(Ordering::Relaxed);
        let mut from = Vec::new();
        while let Some(next) = self.push_deletes_round(&from, 32)? {
            if give_up() {
                return Ok(false);
            }
            let s = self.space_use();
            if s.dirty_next + s.table > (s.total - s.allocated) / 2 {
                self.checkpoint(false)?;
            }
            from = next;
        }
        self.deletes_pushed.fetch_max(counted, Ordering::Relaxed);
        Ok(true)
    }
}
