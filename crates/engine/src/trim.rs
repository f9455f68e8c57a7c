//! Giving freed space back to the device (docs/DESIGN.md, "Discard").
//!
//! Nodes and data are written copy-on-write, so over time every block of the device is written
//! once and an image file, sparse when made, takes its whole size on the host however little it
//! holds. After each checkpoint completes, the free runs that hold extents freed since the last
//! pass (every free run on the first pass after an open) are discarded in whole granules: an image
//! file gets holes punched, a block device is sent discards.
//!
//! A free extent is referenced by no version of the table (the last checkpoint, the running one,
//! the newest images), so nothing will read it before a new write: discarding it is as safe as
//! reusing it, which the allocator may do at any moment. Each piece is claimed from the allocator
//! while it is being discarded, so that no allocation can hand it out and have its write land
//! before the discard.

use std::sync::atomic::Ordering;

use crate::store::Store;
use crate::superblock::Extent;

/// Discards are whole granules of this many blocks (1 MiB), aligned to it: smaller holes would
/// cut the host file into fragments that later writes fill again.
pub(crate) const GRANULE: u64 = 256;

/// Blocks taken out of the free space at a time while being discarded (64 MiB): the free space
/// reported meanwhile is at most this much short, and never under an eighth of the data area.
const ROUND: u64 = 64 * GRANULE;

impl Store {
    /// Discards the free space freed since the last call (all of it on the first call after
    /// the allocator was made). Returns the bytes handed to the device (which counts what it
    /// carried out: `IoStats::bytes_discarded`). A refused discard ends the pass and
    /// is only counted: the blocks stay free and hold what they held.
    pub(crate) fn discard_freed(&self) -> u64 {
        let mut pieces = self.btt.lock().alloc.discard_candidates(GRANULE, ROUND);
        pieces.reverse();
        let mut done = 0u64;
        while !pieces.is_empty() {
            let mut round: Vec<Extent> = Vec::new();
            {
                let mut btt = self.btt.lock();
                let mut blocks = 0;
                // Never so much claimed that the free space left drops under an eighth of the
                // data area: an allocation meanwhile must not fail for space a discard holds.
                let keep = btt.alloc.total_blocks() / 8;
                while let Some(p) = pieces.pop() {
                    if blocks + p.blocks > ROUND && !round.is_empty() {
                        pieces.push(p);
                        break;
                    }
                    if btt.alloc.free_blocks() < keep + p.blocks {
                        // A nearly full device: what is free stays free, undiscarded.
                        continue;
                    }
                    // Skipped when part of it was allocated since the candidates were listed.
                    if btt.alloc.claim(p) {
                        blocks += p.blocks;
                        round.push(p);
                    }
                }
            }
            let mut failed = false;
            for p in &round {
                match self.dev.discard(p.offset(), p.len() as u64) {
                    Ok(()) => done += p.len() as u64,
                    Err(e) => {
                        log::warn!(
                            "amaranth engine: discarding {} bytes at {}: {e}",
                            p.len(),
                            p.offset()
                        );
                        failed = true;
                        break;
                    }
                }
            }
            let mut btt = self.btt.lock();
            for p in round {
                btt.alloc.give_back(p);
            }
            if failed {
                self.counters
                    .discard_failures
                    .fetch_add(1, Ordering::Relaxed);
                break;
            }
        }
        done
    }
}
