//! The space of files: exact data-block counts (`st_blocks`) and `fallocate` reservations.
//!
//! Writes are blind (no read before write), so whether a write adds a block is known without
//! reading only where the file's layout is known: no data block lies at or past the end of a file
//! (truncate deletes them), and a *dense* file (as many blocks as its size spans) has every block
//! below its end. Elsewhere — a file with holes — the blocks of the range are counted by a scan
//! of its keys before the batch is built (under the inode's lock, so nothing changes meanwhile).
//! Each operation then puts the new counts in the inode in the same batch as its data.
//!
//! A reservation is a range of blocks ([`Reserved`], a few per file) whose holes are all
//! reserved; the file system counts the reserved holes of all files in `s/reserved` and keeps
//! their space out of what others may use (see `Fs::check_space`).

use std::ops::Bound;

use amaranth_engine::Engine;

use crate::error::Result;
use crate::inode::{Inode, Reserved, MAX_RESERVED_RANGES};
use crate::keys::{self, BLOCK};

/// Space counted for each reserved hole: the block plus its share of keys, entry headers and
/// partition padding (a 4 KiB block with a key of up to ~250 bytes takes less than this).
pub(crate) const RESERVED_BLOCK_COST: u64 = BLOCK + BLOCK / 16;

/// A half-open range of block numbers.
pub(crate) type Blocks = (u64, u64);

fn len(r: Blocks) -> u64 {
    r.1.saturating_sub(r.0)
}

fn intersect(x: Blocks, y: Blocks) -> Blocks {
    let a = x.0.max(y.0);
    (a, x.1.min(y.1).max(a))
}

/// The blocks bytes `[start, end)` touch.
pub(crate) fn touched(start: u64, end: u64) -> Blocks {
    (start / BLOCK, end.div_ceil(BLOCK))
}

fn range_of(r: &Reserved) -> Blocks {
    (r.lo, r.hi)
}

/// Data blocks the file has in `range`: none at or past its end, every one in a dense file,
/// otherwise counted by a scan of the range's keys (which reads the blocks that exist).
pub(crate) fn count_blocks(
    engine: &Engine,
    fk: &[u8],
    inode: &Inode,
    range: Blocks,
) -> Result<u64> {
    let (a, b) = intersect(range, (0, inode.size.div_ceil(BLOCK)));
    if a >= b {
        return Ok(0);
    }
    if inode.is_dense() {
        return Ok(b - a);
    }
    let (lo, hi) = (keys::data_key(fk, a), keys::data_key(fk, b));
    let mut n = 0u64;
    // Keys only: out-of-line blocks are not read.
    engine.scan_stored(Bound::Included(&lo), Bound::Excluded(&hi), |_, _| {
        n += 1;
        true
    })?;
    assert!(n <= b - a, "more data blocks than blocks in a range");
    Ok(n)
}

/// Holes of the file in `range` (blocks past the end are holes).
fn count_holes(engine: &Engine, fk: &[u8], inode: &Inode, range: Blocks) -> Result<u64> {
    Ok(len(range) - count_blocks(engine, fk, inode, range)?)
}

/// Updates `inode` for a write of bytes `[start, end)`: every block it touches exists afterwards;
/// the holes among them are new blocks, and those inside reserved ranges stop being reserved.
/// Returns the reserved holes the write fills.
pub(crate) fn account_write(
    engine: &Engine,
    fk: &[u8],
    inode: &mut Inode,
    start: u64,
    end: u64,
) -> Result<u64> {
    let t = touched(start, end);
    let holes = count_holes(engine, fk, inode, t)?;
    let mut filled = Vec::with_capacity(inode.reserved.len());
    for r in &inode.reserved {
        let rt = intersect(t, range_of(r));
        filled.push(if rt == t {
            holes
        } else if len(rt) == 0 {
            0
        } else {
            count_holes(engine, fk, inode, rt)?
        });
    }
    for (r, f) in inode.reserved.iter_mut().zip(&filled) {
        r.holes -= f;
    }
    inode.blocks += holes;
    Ok(filled.iter().sum())
}

/// Updates `inode` for a truncate to `size`, below its size: the blocks from `ceil(size / 4096)`
/// on are deleted, and so are the reservations there. Returns the reserved holes released.
pub(crate) fn account_truncate(
    engine: &Engine,
    fk: &[u8],
    inode: &mut Inode,
    size: u64,
) -> Result<u64> {
    assert!(size < inode.size, "a truncate that does not shrink");
    let keep = size.div_ceil(BLOCK);
    let end = inode.size.div_ceil(BLOCK);
    let removed = if keep == 0 {
        inode.blocks
    } else if end - keep <= keep {
        count_blocks(engine, fk, inode, (keep, end))?
    } else {
        inode.blocks - count_blocks(engine, fk, inode, (0, keep))?
    };
    let released = release(engine, fk, inode, (keep, u64::MAX))?;
    inode.blocks -= removed;
    Ok(released)
}

/// Takes blocks `gone` out of `inode`'s reserved ranges (the part of the file whose blocks an
/// operation removes or stops reserving) and recounts the holes of what is left of the ranges it
/// cuts; if that leaves more than [`MAX_RESERVED_RANGES`] ranges, the smallest are given up.
/// Returns the reserved holes released. Call before the inode's counts change.
fn release(engine: &Engine, fk: &[u8], inode: &mut Inode, gone: Blocks) -> Result<u64> {
    if inode
        .reserved
        .iter()
        .all(|r| len(intersect(range_of(r), gone)) == 0)
    {
        return Ok(0);
    }
    let before = inode.reserved_holes();
    let mut out = Vec::with_capacity(inode.reserved.len() + 1);
    for r in &inode.reserved {
        let rr = range_of(r);
        if len(intersect(rr, gone)) == 0 {
            out.push(*r);
            continue;
        }
        let left = (rr.0, gone.0.clamp(rr.0, rr.1));
        let right = (gone.1.clamp(rr.0, rr.1), rr.1);
        for piece in [left, right] {
            if len(piece) > 0 {
                out.push(Reserved {
                    lo: piece.0,
                    hi: piece.1,
                    holes: count_holes(engine, fk, inode, piece)?,
                });
            }
        }
    }
    while out.len() > MAX_RESERVED_RANGES {
        let smallest = (0..out.len())
            .min_by_key(|&i| out[i].hi - out[i].lo)
            .expect("ranges");
        out.remove(smallest);
    }
    inode.reserved = out;
    let after = inode.reserved_holes();
    assert!(after <= before, "releasing reserved blocks added holes");
    Ok(before - after)
}

/// What punching bytes `[start, end)` of a file removes (`end` at most the size; the whole
/// blocks inside become holes, the partial blocks at the edges get zeros).
pub(crate) struct Punch {
    /// The whole blocks removed.
    pub full: Blocks,
    /// Partial blocks at the edges that exist (holes need no zeros).
    pub edges: Vec<u64>,
    /// Data blocks removed.
    pub removed: u64,
}

/// Plans a punch of bytes `[start, end)` (see [`Punch`]).
pub(crate) fn plan_punch(
    engine: &Engine,
    fk: &[u8],
    inode: &Inode,
    start: u64,
    end: u64,
) -> Result<Punch> {
    assert!(start < end && end <= inode.size, "punch outside the file");
    let full = (start.div_ceil(BLOCK), end / BLOCK);
    let mut edges = Vec::new();
    let (first, last) = touched(start, end);
    for blk in [first, last - 1] {
        let partial = blk < full.0 || blk >= full.1;
        if partial && !edges.contains(&blk) && count_blocks(engine, fk, inode, (blk, blk + 1))? == 1
        {
            edges.push(blk);
        }
    }
    let removed = if len(full) == 0 {
        0
    } else {
        count_blocks(engine, fk, inode, full)?
    };
    Ok(Punch {
        full,
        edges,
        removed,
    })
}

/// Updates `inode` for a punch that removes `removed` blocks (see [`plan_punch`]) and gives up
/// the reservations of `unreserve` (the blocks the `fallocate` range touches). Returns the
/// reserved holes released.
pub(crate) fn account_punch(
    engine: &Engine,
    fk: &[u8],
    inode: &mut Inode,
    removed: u64,
    unreserve: Blocks,
) -> Result<u64> {
    let released = release(engine, fk, inode, unreserve)?;
    inode.blocks -= removed;
    Ok(released)
}

/// Reserves blocks `want` in `inode`: they and every reserved range they overlap or touch become
/// one range whose holes are all reserved. A file keeps at most [`MAX_RESERVED_RANGES`] ranges:
/// beyond that the two closest are joined, the gap between them reserved too. `punched` is a
/// punch in the same batch (zero range): its blocks count as holes. Returns the holes newly
/// reserved (call before the punch changes the inode's counts).
pub(crate) fn account_reserve(
    engine: &Engine,
    fk: &[u8],
    inode: &mut Inode,
    want: Blocks,
    punched: Option<&Punch>,
) -> Result<u64> {
    assert!(len(want) > 0, "reserving nothing");
    let before = inode.reserved_holes();
    let (joined, mut rest): (Vec<Reserved>, Vec<Reserved>) = inode
        .reserved
        .iter()
        .partition(|r| r.hi >= want.0 && r.lo <= want.1);
    let lo = joined.iter().map(|r| r.lo).fold(want.0, u64::min);
    let hi = joined.iter().map(|r| r.hi).fold(want.1, u64::max);
    // Blocks in the new range: those of the joined ranges (all but their holes) and of the gaps.
    let mut blocks = 0u64;
    let mut cursor = lo;
    for r in &joined {
        if r.lo > cursor {
            blocks += count_blocks(engine, fk, inode, (cursor, r.lo))?;
        }
        blocks += r.hi - r.lo - r.holes;
        cursor = r.hi;
    }
    if cursor < hi {
        blocks += count_blocks(engine, fk, inode, (cursor, hi))?;
    }
    if let Some(p) = punched {
        assert!(
            len(p.full) == 0 || intersect(p.full, (lo, hi)) == p.full,
            "zeroed blocks outside the reserved range"
        );
        blocks -= p.removed;
    }
    rest.push(Reserved {
        lo,
        hi,
        holes: (hi - lo) - blocks,
    });
    rest.sort_by_key(|r| r.lo);
    while rest.len() > MAX_RESERVED_RANGES {
        let i = (0..rest.len() - 1)
            .min_by_key(|&i| rest[i + 1].lo - rest[i].hi)
            .expect("ranges");
        let gap = (rest[i].hi, rest[i + 1].lo);
        let next = rest.remove(i + 1);
        rest[i].holes += next.holes + count_holes(engine, fk, inode, gap)?;
        rest[i].hi = next.hi;
    }
    assert!(Inode::valid_reserved(&rest), "reserved ranges {rest:?}");
    inode.reserved = rest;
    let after = inode.reserved_holes();
    assert!(after >= before, "reserving more released holes");
    Ok(after - before)
}

/// Updates the counts of the destination of a block-aligned copy into blocks `dst`: its blocks
/// there are replaced by `copied` of the source's, `copied_in[i]` of them inside reserved range
/// `i`. Returns the change of reserved holes (the copy's holes inside a range stay reserved).
pub(crate) fn account_copy(
    engine: &Engine,
    fk: &[u8],
    inode: &mut Inode,
    dst: Blocks,
    copied: u64,
    copied_in: &[u64],
) -> Result<i64> {
    assert_eq!(copied_in.len(), inode.reserved.len(), "a count per range");
    let before = count_blocks(engine, fk, inode, dst)?;
    let mut holes_before = Vec::with_capacity(copied_in.len());
    for r in &inode.reserved {
        let rd = intersect(dst, range_of(r));
        holes_before.push(if len(rd) == 0 {
            0
        } else {
            count_holes(engine, fk, inode, rd)?
        });
    }
    let mut change = 0i64;
    for ((r, hb), c) in inode.reserved.iter_mut().zip(holes_before).zip(copied_in) {
        let ha = len(intersect(dst, range_of(r))) - c;
        r.holes = r.holes - hb + ha;
        change += ha as i64 - hb as i64;
    }
    inode.blocks = inode.blocks - before + copied;
    Ok(change)
}

/// Sets `inode`'s counts to those after two operations on different blocks of it, each counted
/// from `inode` alone: `a` and `b`.
pub(crate) fn add_counts(inode: &mut Inode, a: &Inode, b: &Inode) {
    assert!(
        a.reserved.len() == inode.reserved.len() && b.reserved.len() == inode.reserved.len(),
        "reserved ranges changed"
    );
    inode.blocks = a.blocks + b.blocks - inode.blocks;
    for (i, r) in inode.reserved.iter_mut().enumerate() {
        r.holes = a.reserved[i].holes + b.reserved[i].holes - r.holes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(intersect((2, 10), (5, 20)), (5, 10));
        assert_eq!(len(intersect((2, 4), (5, 20))), 0);
        assert_eq!(touched(4095, 4097), (0, 2));
        assert_eq!(touched(4096, 8192), (1, 2));
    }
}
