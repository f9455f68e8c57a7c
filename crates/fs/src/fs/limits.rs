//! The space and key-length policies: what an operation may use before it is refused.
//!
//! Space: an operation that adds data is refused with `ENOSPC` when the free space (less the holes
//! `fallocate` reserved) would fall below the reserve, after one attempt to reclaim deleted space;
//! `statfs` reports the same numbers. Key length: every path key, with room for the data keys
//! built on it, must fit the engine's key limit, so a name, or a move of a subtree, that would
//! make a key too long is refused with `ENAMETOOLONG` before anything changes.

use std::ops::Bound;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use amaranth_engine::SpaceUse;

use super::{Found, Fs, StatFs, NAME_MAX};
use crate::error::{Errno, Result};
use crate::inode::Kind;
use crate::keys::{self, BLOCK};
use crate::space::RESERVED_BLOCK_COST;

impl Fs {
    /// Space held back from users (`f_bfree - f_bavail`): the configured reserve (at most a
    /// quarter of the data area), or what the next checkpoint needs to rewrite the dirty nodes
    /// when that is more.
    fn reserve(&self, s: &SpaceUse) -> u64 {
        self.opts
            .reserve_bytes
            .min(s.total / 4)
            .max(s.checkpoint_need())
    }

    /// Free bytes now (see `statfs`: the engine's free space less the holes `fallocate`
    /// reserved) and the reserve; available is free less the reserve.
    fn free_and_reserve(&self) -> (u64, u64) {
        let s = self.engine.space_use();
        let free = s.free().saturating_sub(self.reserved_bytes());
        (free, self.reserve(&s))
    }

    /// Space of the holes `fallocate` reserved.
    fn reserved_bytes(&self) -> u64 {
        self.reserved_blocks.load(Ordering::Relaxed) * RESERVED_BLOCK_COST
    }

    /// Refuses growth when free space runs below the reserve (after trying to reclaim deleted space).
    pub(super) fn check_space(&self, extra: u64) -> Result<()> {
        let (free, reserve) = self.free_and_reserve();
        if free >= reserve + extra {
            return Ok(());
        }
        // Deletes free space only once they reach the leaves and a checkpoint completes: try that
        // when something was deleted since the last attempt, when the last attempt freed something,
        // or after a while.
        let mut last = self.last_reclaim.lock();
        let deleted = self.deletions.load(Ordering::Relaxed);
        let (when, seen, gained) = *last;
        if deleted != seen
            || gained > 0
            || when.is_none_or(|t| t.elapsed() > Duration::from_secs(2))
        {
            // The engine's target is unallocated space: what is free plus the reservations.
            let target = 2 * reserve + extra + self.reserved_bytes();
            let _ = self.engine.reclaim_space(target);
            let (after, reserve) = self.free_and_reserve();
            *last = (Some(Instant::now()), deleted, after.saturating_sub(free));
            drop(last);
            if after >= reserve + extra {
                return Ok(());
            }
        }
        Err(Errno::ENOSPC)
    }

    pub(super) fn max_key(&self) -> usize {
        self.engine.format().max_key_len
    }

    pub(super) fn check_key_len(&self, key: &[u8]) -> Result<()> {
        // Data keys add a tag, a terminator and a block number to the path key.
        if key.len() + 10 > self.max_key() {
            return Err(Errno::ENAMETOOLONG);
        }
        Ok(())
    }

    /// Longest key in `[lo, hi)` (0 when the range is empty): with `exact`, by a scan of the
    /// range; otherwise the engine's key-length bound, never below it, read in O(height).
    pub(super) fn longest_key_in(&self, lo: &[u8], hi: &[u8], exact: bool) -> Result<usize> {
        if !exact {
            return Ok(self.engine.longest_key_bound(lo, hi)?);
        }
        let mut longest = 0;
        self.engine
            .scan_stored(Bound::Included(lo), Bound::Excluded(hi), |k, _| {
                longest = longest.max(k.len());
                true
            })?;
        Ok(longest)
    }

    /// Checks that moving the entry `found` to the path key `to` keeps every key it moves within
    /// the engine's limit: its own name, its extended attributes and, for a directory, every
    /// descendant's metadata (with room for data keys, as at creation) and extended attributes.
    /// `ENAMETOOLONG` otherwise, before anything is changed. The engine's key-length bounds
    /// decide in O(height) when they show that everything fits; only when they do not are the
    /// moved ranges scanned (docs/SURGERY.md §2.6), so the outcome is the exact one.
    pub(super) fn check_move_fits(&self, found: &Found, to: &[u8]) -> Result<()> {
        self.check_key_len(to)?;
        let from = &found.key;
        if found.redirect || to.len() <= from.len() {
            // A redirect moves alone; shorter or equal prefixes only shorten keys.
            return Ok(());
        }
        let growth = to.len() - from.len();
        let limit = self.max_key();
        let longest = |exact: bool| -> Result<usize> {
            let end = |p: &[u8]| amaranth_engine::prefix_end(p, limit);
            let x = keys::xattr_prefix(from);
            let mut longest = self.longest_key_in(&x, &end(&x), exact)?;
            if found.inode.kind == Kind::Dir {
                let [m, _, x] = keys::subtree_prefixes(from);
                // Data keys are 9 bytes longer than their file's metadata key.
                let meta = self.longest_key_in(&m, &end(&m), exact)?;
                if meta > 0 {
                    longest = longest.max(meta + 9);
                }
                longest = longest.max(self.longest_key_in(&x, &end(&x), exact)?);
            }
            Ok(longest)
        };
        if longest(false)? + growth <= limit || longest(true)? + growth <= limit {
            return Ok(());
        }
        Err(Errno::ENAMETOOLONG)
    }

    // ----- whole-file-system operations ---------------------------------------------------

    /// Space and inode counts: the data area's size, what is free once the dirty nodes are
    /// counted at the size they will be written (see DESIGN.md, Space), and what is available
    /// beyond the reserve.
    pub fn statfs(&self) -> StatFs {
        // What the kernel forgot is gone before it is counted.
        self.reap_forgotten();
        let blocks = self.engine.space_use().total / BLOCK;
        let (free, reserve) = self.free_and_reserve();
        let (bfree, bavail) = (free / BLOCK, free.saturating_sub(reserve) / BLOCK);
        let used = self.inodes_used.load(Ordering::Relaxed);
        StatFs {
            blocks,
            bfree,
            bavail,
            files: used + bavail,
            ffree: bavail,
            bsize: BLOCK as u32,
            namelen: NAME_MAX as u32,
        }
    }
}
