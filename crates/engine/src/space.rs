//! What the data area's space holds, as the file system reports it (see docs/DESIGN.md, Space).
//!
//! Node images are written copy-on-write and many nodes are dirty in memory at any moment, so
//! "allocated" blocks alone lag behind the writes: data written since the last checkpoint lives
//! in dirty nodes (and the log) and takes no extent yet. [`SpaceUse`] adds the dirty nodes'
//! growth, so that `used` follows the writes at once and does not jump when a checkpoint (or a
//! remount) writes them.

use amaranth_device::BLOCK_SIZE;

use crate::cache::DirtySpace;

/// How the data area is used, in bytes (a moment's view; writers change it concurrently).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpaceUse {
    /// Size of the data area: the device less the superblocks and the log.
    pub total: u64,
    /// Allocated extents: current node images, images the last (or running) checkpoint still
    /// references, and the tables.
    pub allocated: u64,
    /// What the dirty nodes' next images will take (exact without compression, an upper bound
    /// with it).
    pub dirty_next: u64,
    /// What the dirty nodes' current images take (part of `allocated`). Once a dirty node is
    /// written its old image stays allocated until the next checkpoint completes.
    pub dirty_current: u64,
    /// Bytes of the block translation table the next checkpoint writes.
    pub table: u64,
    /// Images held only until the next checkpoint completes (part of `allocated`): those only the
    /// last completed checkpoint references (the node was written again since, by a write-back
    /// or by the running checkpoint), and images the running checkpoint wrote for nodes changed
    /// meanwhile (their older images are freed instead when it completes). Not in `used`, but in
    /// `checkpoint_need`.
    pub checkpoint_held: u64,
    /// Extents allocated for node images being written, not yet recorded (part of `allocated`):
    /// the nodes still count them as their next images (`dirty_next`), so `used` leaves them out
    /// (else `used` rose by a node's image for the time of each node write).
    pub writing: u64,
    /// Out-of-line data blocks the tree references, or being written (part of `allocated` and of
    /// `used`); released ones wait for the next checkpoint in `checkpoint_held`.
    pub data: u64,
}

/// The data table's share of the space (docs/WRITEONCE.md), in blocks.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct DataSpace {
    /// Blocks referenced or being written.
    pub blocks: u64,
    /// Blocks released, freed when the next checkpoint completes.
    pub held: u64,
    /// Runs in the table the next checkpoint writes.
    pub runs: u64,
}

impl SpaceUse {
    pub(crate) fn new(
        total_blocks: u64,
        free_blocks: u64,
        dirty: DirtySpace,
        table_entries: u64,
        held_blocks: u64,
        writing_blocks: u64,
        data: DataSpace,
    ) -> SpaceUse {
        assert!(free_blocks <= total_blocks, "more free blocks than blocks");
        let held_blocks = held_blocks + data.held;
        assert!(
            held_blocks + writing_blocks + data.blocks <= total_blocks - free_blocks,
            "more blocks held, being written or holding data than are allocated"
        );
        let b = BLOCK_SIZE as u64;
        let data_table = crate::datatable::RunMap::encoded_len(data.runs) as u64;
        SpaceUse {
            checkpoint_held: held_blocks * b,
            writing: writing_blocks * b,
            total: total_blocks * b,
            allocated: (total_blocks - free_blocks) * b,
            dirty_next: dirty.next_blocks * b,
            dirty_current: dirty.current_blocks * b,
            table: (32 + 24 * table_entries).div_ceil(b) * b + data_table.div_ceil(b) * b,
            data: data.blocks * b,
        }
    }

    /// Used: the allocated extents with every dirty node counted at its next image instead of its
    /// current one, less the images held only until the next checkpoint completes — the tree as
    /// it would be written now, what is left once that checkpoint completes. So a checkpoint
    /// neither makes it jump while it runs (by up to every dirty node's old image) nor drop when
    /// it completes. Never above `total`.
    pub fn used(&self) -> u64 {
        (self.allocated + self.dirty_next)
            .saturating_sub(self.dirty_current + self.checkpoint_held + self.writing)
            .min(self.total)
    }

    /// `total - used`.
    pub fn free(&self) -> u64 {
        self.total - self.used()
    }

    /// Space taken beyond `used` until the next checkpoint completes: the dirty nodes' old images
    /// stay allocated until it does (those it or a write-back already replaced, and those of the
    /// nodes still dirty), and it writes a new table before freeing the old one.
    pub fn checkpoint_need(&self) -> u64 {
        self.dirty_current + self.checkpoint_held + self.table
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn used_counts_dirty_growth_and_never_exceeds_total() {
        let dirty = DirtySpace {
            next_blocks: 30,
            current_blocks: 10,
        };
        let none = DataSpace::default();
        let s = SpaceUse::new(100, 60, dirty, 3, 0, 0, none);
        assert_eq!(s.used(), (40 + 30 - 10) * 4096);
        assert_eq!(s.free(), 40 * 4096);
        assert_eq!(s.checkpoint_need(), 10 * 4096 + 2 * 4096);
        // A running checkpoint that replaced 5 blocks of old images: not used, but needed.
        let s = SpaceUse::new(100, 55, dirty, 3, 5, 0, none);
        assert_eq!(s.used(), (45 + 30 - 10 - 5) * 4096);
        assert_eq!(s.checkpoint_need(), (10 + 5) * 4096 + 2 * 4096);
        // 10 blocks being written for dirty nodes that still count their next images.
        let s = SpaceUse::new(100, 50, dirty, 3, 0, 10, none);
        assert_eq!(s.used(), (50 + 30 - 10 - 10) * 4096);
        // Data: 20 blocks referenced are used, 4 released ones wait for the checkpoint.
        let data = DataSpace {
            blocks: 20,
            held: 4,
            runs: 300,
        };
        let s = SpaceUse::new(100, 36, dirty, 3, 0, 0, data);
        assert_eq!(s.used(), (64 + 30 - 10 - 4) * 4096);
        assert_eq!(s.data, 20 * 4096);
        assert_eq!(s.checkpoint_need(), (10 + 4) * 4096 + 4096 + 2 * 4096);
        let s = SpaceUse::new(
            100,
            10,
            DirtySpace {
                next_blocks: 500,
                current_blocks: 0,
            },
            0,
            0,
            0,
            none,
        );
        assert_eq!(s.used(), s.total);
        assert_eq!(s.free(), 0);
    }
}
