//! Applying flushed messages to a leaf: in place, patching each partition they touch where it is,
//! when every one of them can be (resident, a few messages, staying non-empty and within its
//! size); otherwise by rebuilding the touched partitions (`LeafBuilder`) and re-cutting them at the
//! partition size, a partition split by a merge keeping room for later inserts.
//!
//! Every reference to an out-of-line block the messages drop (an entry deleted by a range, or
//! replaced by a put, a delete or another reference) is reported to the caller, which releases it
//! in the data table; an upsert onto a reference keeps it, patched.

use std::ops::ControlFlow;
use std::sync::Arc;

use super::{separator, Leaf, PartSlot};
use crate::config::Format;
use crate::dataref::{Stored, Val};
use crate::msg::{Cover, KeyMsgs, RangeDel};
use crate::partition::{entry_size, Partition, PartitionBuilder};

/// The encoded size of an entry holding `v`.
fn val_entry_size(key: &[u8], v: &Val) -> usize {
    match v {
        Val::Bytes(b) => entry_size(key, Stored::Bytes(b)),
        Val::Ref(r) => entry_size(key, Stored::Ref(&[])) + r.encoded_len(),
    }
}

impl Leaf {
    /// Applies flushed messages (range deletes first, then point messages, both sorted by key and all
    /// newer than the leaf's contents). Partitions without messages are kept as they are; the others
    /// are rebuilt and re-cut at `format.partition_size`. Every touched partition must be resident.
    /// Returns the blocks whose references the messages dropped (one per reference).
    #[must_use]
    pub fn apply(
        &mut self,
        ranges: &[RangeDel],
        points: &[(Vec<u8>, KeyMsgs)],
        format: &Format,
    ) -> Vec<u64> {
        if let Some(released) = self.apply_in_place(ranges, points, format) {
            return released;
        }
        let old_parts = std::mem::take(&mut self.parts);
        let old_pivots = std::mem::take(&mut self.pivots);
        let parts = old_parts.len();
        let mut slots = old_parts.into_iter();
        let mut out = LeafBuilder::new(format.partition_size);
        let _ = each_partition(parts, &old_pivots, ranges, points, |m| {
            let slot = slots.next().expect("one slot per partition");
            if m.is_empty() {
                out.keep(m.lo, slot);
                return ControlFlow::Continue(());
            }
            // A partition wholly inside one range delete is dropped without going through its
            // entries, except for the references it holds, which are released. (Range deletes
            // are older than the point messages beside them, so the base is not needed.)
            let whole = m.ranges.iter().any(|r| {
                m.lo.is_some_and(|l| r.lo.as_slice() <= l)
                    && m.hi.is_some_and(|h| r.hi.as_slice() >= h)
            });
            // A few messages: patch the partition in place instead of rebuilding it (see
            // `plan_patch`).
            if !whole {
                if let Some(plan) = plan_patch(&slot, &m, format) {
                    out.released.extend_from_slice(&plan.released);
                    out.keep(m.lo, PartSlot::resident(patch(&slot, plan, m.points)));
                    return ControlFlow::Continue(());
                }
            }
            let data = slot.data().expect("touched partition must be resident");
            if whole {
                out.released.extend(data.ref_blocks(0, data.len()));
                out.merge(m.lo, None, &m.ranges, m.points);
            } else {
                out.merge(m.lo, Some(&data), &m.ranges, m.points);
            }
            ControlFlow::Continue(())
        });
        let (pivots, parts, released) = out.finish();
        self.pivots = pivots;
        self.parts = parts;
        released
    }

    /// Applies the messages by patching each partition they touch where it is, when every one of
    /// them can be (resident, a few messages, staying non-empty and within its size): the leaf's
    /// other partitions and its pivots are left alone, so the cost does not grow with the number
    /// of partitions. Returns the blocks whose references it dropped, or `None`, having changed
    /// nothing.
    fn apply_in_place(
        &mut self,
        ranges: &[RangeDel],
        points: &[(Vec<u8>, KeyMsgs)],
        format: &Format,
    ) -> Option<Vec<u64>> {
        let mut plans: Vec<(usize, PatchPlan, usize)> = Vec::new();
        let parts = &self.parts;
        let walk = each_partition(parts.len(), &self.pivots, ranges, points, |m| {
            if m.is_empty() {
                return ControlFlow::Continue(());
            }
            match plan_patch(&parts[m.index], &m, format) {
                Some(plan) => {
                    plans.push((m.index, plan, m.first_point));
                    ControlFlow::Continue(())
                }
                None => ControlFlow::Break(()),
            }
        });
        if walk.is_break() {
            return None;
        }
        let mut released = Vec::new();
        for (i, plan, first) in plans {
            let n = plan.values.len();
            released.extend_from_slice(&plan.released);
            let p = patch(&self.parts[i], plan, &points[first..first + n]);
            self.parts[i] = PartSlot::resident(p);
        }
        Some(released)
    }
}

/// The messages that fall in one partition of a leaf.
struct PartMsgs<'a> {
    /// The partition's index in the leaf.
    index: usize,
    /// Its lowest key (`None` for the first partition).
    lo: Option<&'a [u8]>,
    /// The lowest key of the next partition (`None` for the last).
    hi: Option<&'a [u8]>,
    /// Its point messages, and the index of the first of them in the leaf's point messages.
    points: &'a [(Vec<u8>, KeyMsgs)],
    first_point: usize,
    /// The range deletes that overlap it.
    ranges: Vec<&'a RangeDel>,
}

impl PartMsgs<'_> {
    fn is_empty(&self) -> bool {
        self.points.is_empty() && self.ranges.is_empty()
    }
}

/// Calls `f` with the messages of each of a leaf's `parts` partitions (cut at `pivots`), in
/// order, until it breaks; asserts, when the walk completes, that every point message fell in a
/// partition.
fn each_partition<'a>(
    parts: usize,
    pivots: &'a [Vec<u8>],
    ranges: &'a [RangeDel],
    points: &'a [(Vec<u8>, KeyMsgs)],
    mut f: impl FnMut(PartMsgs<'a>) -> ControlFlow<()>,
) -> ControlFlow<()> {
    assert_eq!(
        pivots.len() + 1,
        parts.max(1),
        "one pivot between partitions"
    );
    let mut pi = 0usize; // next point message
    for index in 0..parts {
        let lo: Option<&[u8]> = (index > 0).then(|| pivots[index - 1].as_slice());
        let hi: Option<&[u8]> = pivots.get(index).map(|v| v.as_slice());
        let first_point = pi;
        while pi < points.len() && hi.is_none_or(|h| points[pi].0.as_slice() < h) {
            pi += 1;
        }
        let ranges: Vec<&RangeDel> = ranges
            .iter()
            .filter(|r| {
                hi.is_none_or(|h| r.lo.as_slice() < h) && lo.is_none_or(|l| r.hi.as_slice() > l)
            })
            .collect();
        f(PartMsgs {
            index,
            lo,
            hi,
            points: &points[first_point..pi],
            first_point,
            ranges,
        })?;
    }
    assert_eq!(
        pi,
        points.len(),
        "every point message belongs to a partition"
    );
    ControlFlow::Continue(())
}

/// How to patch one partition where it is: the runs of entries its range deletes remove, the new
/// value of each point message's key (`None`: deleted), the exact size it ends with, and the
/// blocks whose references it drops.
struct PatchPlan {
    runs: Vec<(usize, usize)>,
    values: Vec<Option<Val>>,
    size: usize,
    released: Vec<u64>,
}

/// A plan for patching the partition in `slot` with its messages `m` (one memmove per entry or
/// per run a range delete removes) instead of rebuilding it: `None` unless the messages are few,
/// the partition is resident, and it stays non-empty (an emptied partition goes through the
/// rebuild, which drops it) and within its size. The size check uses the exact new size (an
/// overwrite of a value by one of the same length grows nothing), so a full partition is patched
/// too.
fn plan_patch(slot: &PartSlot, m: &PartMsgs<'_>, format: &Format) -> Option<PatchPlan> {
    if m.ranges.len() > 4 || m.points.len() > 16 {
        return None;
    }
    let base = slot.data()?;
    let runs = covered_runs(&base, &m.ranges);
    let cut: usize = runs.iter().map(|&(a, b)| base.run_bytes(a, b)).sum();
    let mut released: Vec<u64> = runs
        .iter()
        .flat_map(|&(a, b)| base.ref_blocks(a, b))
        .collect();
    let (size, values) = patched_size(&base, cut, &m.ranges, m.points, &mut released);
    (size > 0 && size <= format.partition_size).then_some(PatchPlan {
        runs,
        values,
        size,
        released,
    })
}

/// The partition in `slot` (taken from it: the slot is left without data) patched by `plan` and
/// its point messages `points`.
fn patch(slot: &PartSlot, plan: PatchPlan, points: &[(Vec<u8>, KeyMsgs)]) -> Partition {
    let base = slot
        .state
        .lock()
        .data
        .take()
        .expect("planned partitions are resident");
    // Without the leaf's own reference the partition is patched where it is (a reader holding it
    // meanwhile keeps its copy).
    let mut p = Arc::try_unwrap(base).unwrap_or_else(|shared| (*shared).clone());
    // Ranges first (they are older than the point messages), last run first.
    for &(a, b) in plan.runs.iter().rev() {
        p.remove_run(a, b);
    }
    for ((k, _), v) in points.iter().zip(plan.values) {
        let stored = v.map(|v| v.encoded());
        p.set(k, stored.as_ref().map(|s| s.as_stored()));
    }
    assert_eq!(p.bytes(), plan.size, "patched partition size");
    p
}

/// Assembles the partitions of a rebuilt leaf.
struct LeafBuilder {
    partition_size: usize,
    /// Bytes a partition being built is filled to before the next one starts (at most
    /// `partition_size`; less while a merge splits a partition, see [`LeafBuilder::merge`]).
    fill: usize,
    /// The buffer a new partition starts with: `fill`, or while a merge builds a single partition,
    /// about the size it will have.
    room: usize,
    pivots: Vec<Vec<u8>>,
    parts: Vec<PartSlot>,
    cur: Option<(Option<Vec<u8>>, PartitionBuilder)>,
    last_key: Option<Vec<u8>>,
    /// Blocks whose references the merged messages dropped.
    released: Vec<u64>,
}

impl LeafBuilder {
    fn new(partition_size: usize) -> LeafBuilder {
        LeafBuilder {
            partition_size,
            fill: partition_size,
            room: partition_size,
            pivots: Vec::new(),
            parts: Vec::new(),
            cur: None,
            last_key: None,
            released: Vec::new(),
        }
    }

    fn seal(&mut self) {
        if let Some((low, b)) = self.cur.take() {
            if b.is_empty() {
                return;
            }
            self.push_slot(low, PartSlot::resident(b.finish()));
        }
    }

    fn push_slot(&mut self, low: Option<Vec<u8>>, slot: PartSlot) {
        if !self.parts.is_empty() {
            // The first partition of a leaf has no pivot; later ones need one.
            self.pivots
                .push(low.expect("a non-first partition has a low key"));
        }
        self.parts.push(slot);
    }

    /// Keeps an untouched partition whose range starts at `lo`.
    fn keep(&mut self, lo: Option<&[u8]>, slot: PartSlot) {
        self.seal();
        if slot.entries == 0 {
            return;
        }
        let low = if self.parts.is_empty() {
            None
        } else {
            Some(lo.expect("non-first partition").to_vec())
        };
        self.push_slot(low, slot);
        self.last_key = None;
    }

    fn push_entry(&mut self, range_lo: Option<&[u8]>, key: &[u8], value: Stored<'_>) {
        let size = entry_size(key, value);
        let full = self
            .cur
            .as_ref()
            .is_some_and(|(_, b)| !b.is_empty() && b.bytes() + size > self.fill);
        if full {
            // Remember only the last key of each sealed partition (for the next pivot).
            let prev = self
                .cur
                .as_ref()
                .and_then(|(_, b)| b.last_key())
                .map(|k| k.to_vec());
            self.seal();
            self.last_key = prev;
        }
        if self.cur.is_none() {
            let low = if self.parts.is_empty() {
                None
            } else {
                Some(match (&self.last_key, range_lo) {
                    // Inside a rebuilt partition: a short separator from the previous entry.
                    (Some(prev), _) => separator(prev, key),
                    // First entry of a rebuilt partition: keep the old lower bound.
                    (None, Some(l)) => l.to_vec(),
                    (None, None) => key.to_vec(),
                })
            };
            // Room for what the partition will hold (it is sealed at `fill`), so the buffer
            // neither grows nor is trimmed, and goes back to the pool for the next one.
            self.cur = Some((low, PartitionBuilder::with_capacity(self.room.max(size))));
        }
        self.cur
            .as_mut()
            .expect("current partition")
            .1
            .push(key, value);
    }

    /// Merges a partition's base entries with messages and appends the result.
    fn merge(
        &mut self,
        lo: Option<&[u8]>,
        base: Option<&Partition>,
        ranges: &[&RangeDel],
        points: &[(Vec<u8>, KeyMsgs)],
    ) {
        self.seal();
        self.last_key = None;
        let mut cover = Cover::new(ranges);
        let empty = Partition::empty();
        let base = base.unwrap_or(&empty);
        // A partition that overflows is split into parts filled to about three quarters, not
        // into full ones and a remainder: a full partition would be rebuilt again by the next
        // insert into it, where one with room takes it in place (`Leaf::apply`).
        let total = base.bytes() + points.iter().map(|(k, km)| grow_hint(k, km)).sum::<usize>();
        if total > self.partition_size {
            let parts = total.div_ceil(self.partition_size * 3 / 4);
            self.fill = total.div_ceil(parts).min(self.partition_size);
            self.room = self.fill;
        } else {
            // One partition of about `total` bytes (an estimate: a little slack).
            self.room = (total + total / 8 + 4096).min(self.partition_size);
        }
        let (mut bi, mut pi) = (0usize, 0usize);
        // The first entry of this range keeps the partition's old lower bound as its pivot.
        let mut range_lo = lo;
        while bi < base.len() || pi < points.len() {
            let take_base =
                pi >= points.len() || (bi < base.len() && base.key(bi) < points[pi].0.as_slice());
            if take_base {
                let k = base.key(bi);
                if cover.covers(k) {
                    self.released.extend(base.value(bi).block());
                } else {
                    self.push_entry(range_lo, k, base.value(bi));
                    range_lo = None;
                }
                bi += 1;
            } else {
                let (k, km) = &points[pi];
                let old = if bi < base.len() && base.key(bi) == k.as_slice() {
                    bi += 1;
                    let v = base.value(bi - 1);
                    let covered = cover.covers(k);
                    if covered || km.replaces() {
                        self.released.extend(v.block());
                    }
                    (!covered).then(|| v.to_val())
                } else {
                    None
                };
                if let Some(v) = km.apply(old) {
                    let stored = v.encoded();
                    self.push_entry(range_lo, k, stored.as_stored());
                    range_lo = None;
                }
                pi += 1;
            }
        }
        self.seal();
        self.last_key = None;
        self.fill = self.partition_size;
        self.room = self.partition_size;
    }

    fn finish(mut self) -> (Vec<Vec<u8>>, Vec<PartSlot>, Vec<u64>) {
        self.seal();
        if self.parts.is_empty() {
            self.parts.push(PartSlot::resident(Partition::empty()));
        }
        // Coalesce neighbours that fit together in one partition (both resident).
        let mut pivots = Vec::with_capacity(self.pivots.len());
        let mut parts: Vec<PartSlot> = Vec::with_capacity(self.parts.len());
        for (i, slot) in self.parts.into_iter().enumerate() {
            let low = if i == 0 {
                None
            } else {
                Some(self.pivots[i - 1].clone())
            };
            if let Some(prev) = parts.last_mut() {
                let small = prev.bytes + slot.bytes <= self.partition_size
                    && (prev.bytes < self.partition_size / 4
                        || slot.bytes < self.partition_size / 4);
                if small {
                    if let (Some(a), Some(b)) = (prev.data(), slot.data()) {
                        let mut bld = PartitionBuilder::with_capacity(prev.bytes + slot.bytes);
                        for j in 0..a.len() {
                            bld.push(a.key(j), a.value(j));
                        }
                        for j in 0..b.len() {
                            bld.push(b.key(j), b.value(j));
                        }
                        *prev = PartSlot::resident(bld.finish());
                        continue;
                    }
                }
            }
            if let Some(l) = low {
                if !parts.is_empty() {
                    pivots.push(l);
                }
            }
            parts.push(slot);
        }
        assert_eq!(pivots.len() + 1, parts.len());
        (pivots, parts, self.released)
    }
}

/// The encoded size of `base` after `points` (distinct keys) are applied, and the new values.
/// About how many bytes the messages of `key` add to a partition (their value's size; an upsert
/// counts its patches' data).
fn grow_hint(key: &[u8], km: &KeyMsgs) -> usize {
    match km {
        KeyMsgs::Put { value, .. } => entry_size(key, Stored::Bytes(value)),
        KeyMsgs::PutRef { r, .. } => entry_size(key, Stored::Ref(&[])) + r.encoded_len(),
        KeyMsgs::Delete { .. } => 0,
        KeyMsgs::Upserts(ps) => {
            let data: usize = ps
                .iter()
                .map(|(_, p)| match p {
                    crate::msg::Patch::Write { data, .. } => data.len(),
                    crate::msg::Patch::Truncate { .. } => 0,
                })
                .sum();
            entry_size(key, Stored::Bytes(&[])) + data
        }
    }
}

/// The runs of entries of `base` (by index, sorted, disjoint) that `ranges` delete.
fn covered_runs(base: &Partition, ranges: &[&RangeDel]) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = ranges
        .iter()
        .map(|r| (base.lower_bound(&r.lo), base.lower_bound(&r.hi)))
        .filter(|(a, b)| a < b)
        .collect();
    runs.sort_unstable();
    let mut merged: Vec<(usize, usize)> = Vec::with_capacity(runs.len());
    for (a, b) in runs {
        match merged.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    merged
}

/// The size of `base` after removing `cut` bytes of entries deleted by `ranges` and applying
/// `points` (each key's old value is gone if a range covers it), and each key's new value. The
/// blocks of the references the points replace go to `released` (those the ranges delete are
/// the caller's).
fn patched_size(
    base: &Partition,
    cut: usize,
    ranges: &[&RangeDel],
    points: &[(Vec<u8>, KeyMsgs)],
    released: &mut Vec<u64>,
) -> (usize, Vec<Option<Val>>) {
    let mut size = base.bytes() - cut;
    let mut values = Vec::with_capacity(points.len());
    let mut cover = Cover::new(ranges);
    for (k, km) in points {
        let old = if cover.covers(k) { None } else { base.get(k) };
        if let Some(o) = old {
            size -= entry_size(k, o);
            if km.replaces() {
                released.extend(o.block());
            }
        }
        // Only upserts read the old value (a put or delete would copy it for nothing).
        let new = match km {
            KeyMsgs::Upserts(_) => km.apply(old.map(|v| v.to_val())),
            _ => km.apply(None),
        };
        if let Some(n) = &new {
            size += val_entry_size(k, n);
        }
        values.push(new);
    }
    (size, values)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::tests::{all_entries, fmt, leaf_with};
    use crate::node::{Body, Node};

    /// Overwriting a value with one of the same size in a full partition patches it in place
    /// (the partition's buffer stays where it was) instead of re-encoding the leaf.
    /// Inserts keys into the first partition one at a time (each patched in place) until it is
    /// full.
    fn fill_first(l: &mut Leaf) {
        for j in 0.. {
            if l.parts[0].data().unwrap().bytes() + 70 > fmt().partition_size {
                return;
            }
            let points = vec![(
                format!("key00000.{j:04}").into_bytes(),
                KeyMsgs::Put {
                    msn: 2,
                    value: vec![1u8; 40],
                },
            )];
            let _ = l.apply(&[], &points, &fmt());
        }
    }

    /// A partition split by a merge keeps room: the next insert into it is patched in place.
    #[test]
    fn an_overflowing_partition_splits_with_room_to_insert_in_place() {
        let mut l = leaf_with(300);
        let first = l.parts[0].data().unwrap();
        assert!(
            first.bytes() <= fmt().partition_size * 3 / 4 + 70,
            "built partitions keep a quarter free: {} of {}",
            first.bytes(),
            fmt().partition_size
        );
        drop(first);
        fill_first(&mut l);
        let parts = l.parts.len();
        // Full: the next insert splits it...
        let put = |j: u32| {
            vec![(
                format!("key00000.x{j}").into_bytes(),
                KeyMsgs::Put {
                    msn: 3,
                    value: vec![2u8; 40],
                },
            )]
        };
        let _ = l.apply(&[], &put(0), &fmt());
        assert_eq!(l.parts.len(), parts + 1, "the full partition split");
        // ...and the one after that goes in place.
        let before = l.parts[0].data().unwrap().raw().as_ptr();
        let _ = l.apply(&[], &put(1), &fmt());
        let p = l.parts[0].data().unwrap();
        assert_eq!(
            p.raw().as_ptr(),
            before,
            "the split partition was rebuilt again"
        );
        assert!(p.get(b"key00000.x1").is_some());
    }

    #[test]
    fn same_size_overwrite_in_a_full_partition_is_patched() {
        let mut l = leaf_with(300);
        fill_first(&mut l);
        let full = l.parts[0].data().unwrap();
        assert!(
            full.bytes() + 70 > fmt().partition_size,
            "the first partition is full"
        );
        let key = full.key(1).to_vec();
        let before = full.raw().as_ptr();
        drop(full);
        let points = vec![(
            key.clone(),
            KeyMsgs::Put {
                msn: 2,
                value: vec![9u8; 50],
            },
        )];
        let _ = l.apply(&[], &points, &fmt());
        let p = l.parts[0].data().unwrap();
        assert_eq!(p.raw().as_ptr(), before, "the partition was rebuilt");
        assert_eq!(p.get(&key), Some(Stored::Bytes(&[9u8; 50])));
    }

    /// Range deletes inside a partition (with point messages beside them, some in the ranges'
    /// gaps, one for a key a range deleted) are patched in place and give what a rebuild gives.
    #[test]
    fn range_deletes_in_a_partition_are_patched_in_place_like_a_rebuild() {
        let key = |i: u32| format!("key{i:05}").into_bytes();
        let ranges = vec![
            RangeDel {
                msn: 2,
                lo: key(3),
                hi: key(7),
            },
            RangeDel {
                msn: 3,
                lo: key(5),
                hi: key(9),
            },
            RangeDel {
                msn: 4,
                lo: key(20),
                hi: key(21),
            },
        ];
        let points = vec![
            (
                key(4),
                KeyMsgs::Put {
                    msn: 5,
                    value: vec![1; 10],
                },
            ),
            (
                key(12),
                KeyMsgs::Put {
                    msn: 6,
                    value: vec![2; 10],
                },
            ),
        ];
        let mut patched = leaf_with(300);
        let before = patched.parts[0].data().unwrap().raw().as_ptr();
        let _ = patched.apply(&ranges, &points, &fmt());
        let p = patched.parts[0].data().unwrap();
        assert_eq!(p.raw().as_ptr(), before, "the partition was rebuilt");
        // The same messages through the rebuild.
        let mut rebuilt = leaf_with(300);
        let slot = &rebuilt.parts[0];
        let base = slot.data().unwrap();
        let refs: Vec<&RangeDel> = ranges.iter().collect();
        let mut out = LeafBuilder::new(fmt().partition_size);
        out.merge(None, Some(&base), &refs, &points);
        let (_, parts, _) = out.finish();
        drop(base);
        rebuilt.parts[0] = parts.into_iter().next().unwrap();
        let q = rebuilt.parts[0].data().unwrap();
        assert_eq!(p.raw(), q.raw());
        assert_eq!(p.get(&key(4)), Some(Stored::Bytes(&[1u8; 10])));
        assert_eq!(p.get(&key(5)), None);
        assert_eq!(p.get(&key(9)).map(|v| v.raw().len()), Some(50));
        assert_eq!(p.get(&key(20)), None);
    }

    #[test]
    fn leaf_apply_partitions_and_deletes() {
        let l = leaf_with(300);
        assert!(l.parts.len() > 3, "entries were cut into partitions");
        let node = Node {
            height: 0,
            max_msn: 1,
            body: Body::Leaf(l),
            prefix: Vec::new(),
        };
        node.check_invariants(7);
        let Body::Leaf(mut l) = node.body else {
            unreachable!()
        };
        let ranges = vec![RangeDel {
            msn: 2,
            lo: b"key00010".to_vec(),
            hi: b"key00290".to_vec(),
        }];
        let points = vec![(
            b"key00100".to_vec(),
            KeyMsgs::Put {
                msn: 3,
                value: b"x".to_vec(),
            },
        )];
        let _ = l.apply(&ranges, &points, &fmt());
        let e = all_entries(&l);
        assert_eq!(e.len(), 10 + 1 + 10);
        assert_eq!(e[10], (b"key00100".to_vec(), b"x".to_vec()));
        let node = Node {
            height: 0,
            max_msn: 3,
            body: Body::Leaf(l),
            prefix: Vec::new(),
        };
        node.check_invariants(7);
    }
}
