//! Applying a batch to the tree: the one path shared by the write path (which logs the batch as
//! one record) and log replay (which applies a record again after a crash).
//!
//! The rule that keeps an image openable: a record reaches the log only once nothing but an I/O
//! failure can stop its application. Operations are validated before the batch is built into a
//! record; prefix moves and copies additionally have every key they would produce checked against
//! the tree (see [`crate::prefix`]) before the record is appended, with writers held off so that
//! the check, the application and any later replay see the same tree.

use std::sync::atomic::Ordering;

use crate::dataref::{DataRef, Stored};
use crate::destination;
use crate::error::{Error, Result};
use crate::msg::PointOp;
use crate::node::{NodeId, ROOT_ID};
use crate::ops::{self, GroupMark, Op};
use crate::prefix;
use crate::read::Target;
use crate::tree::{Msg, Tree};
use crate::wal::{Log, Lsn};

/// An atomic-group record's mark and its gate (see [`apply_ops`]).
pub(crate) type Gate<'a> = (GroupMark, &'a mut dyn FnMut(Lsn) -> Result<()>);

/// Messages per injection when a prefix move or copy is expanded.
const EXPAND_CHUNK: usize = 2048;

/// Applies operations to the tree (and, unless replaying, logs them as one record first).
///
/// Validation failures ([`prefix::is_refusal`]) come before anything is logged or applied. Once the
/// record is logged (or, replaying, once the first message is applied), any failure is one the
/// engine must stop for: it is returned as an I/O, checksum or corruption error, which makes the
/// engine refuse further writes.
///
/// A record of an atomic group carries `group`'s mark; its gate is called with the LSN the record
/// is about to get, under the root latch (so in log order), and refusing there leaves nothing
/// logged or applied.
///
/// Out-of-line blocks ([`Op::PutBlocks`]) are written before this is called; their extents get
/// their references in the data table where the record is appended (under the root latch and
/// `writers`, so a checkpoint's table and log tail agree on them), or at replay where it is
/// applied. Extents written for a record that is not appended go back to the free space here.
pub(crate) fn apply_ops(
    tree: &Tree,
    log: Option<&Log>,
    ops: Vec<Op>,
    replay_first_msn: Option<u64>,
    group: Option<Gate<'_>>,
) -> Result<Option<Lsn>> {
    let placed: Vec<_> = ops.iter().filter_map(Op::placed_extent).collect();
    let mut registered = placed.is_empty();
    let r = apply_placed(
        tree,
        log,
        ops,
        replay_first_msn,
        group,
        &placed,
        &mut registered,
    );
    if !registered && log.is_some() {
        for &e in &placed {
            tree.store.settle_data(e, false);
        }
    }
    r
}

fn apply_placed(
    tree: &Tree,
    log: Option<&Log>,
    ops: Vec<Op>,
    replay_first_msn: Option<u64>,
    group: Option<Gate<'_>>,
    placed: &[crate::superblock::Extent],
    registered: &mut bool,
) -> Result<Option<Lsn>> {
    let (mark, mut gate) = match group {
        Some((mark, gate)) => (Some(mark), Some(gate)),
        None => (None, None),
    };
    let mut record = log.map(|_| ops::encode_marked_record(&ops, mark));
    let mut lsn = None;
    let mut started = false;
    let mut check_first = replay_first_msn;
    let mut before = |first: u64| -> Result<()> {
        if let Some(expect) = check_first.take() {
            if expect != first {
                return Err(Error::Corrupt(format!(
                    "log record expects message number {expect} but the tree is at {first}"
                )));
            }
        }
        if let (Some(log), Some(mut rec)) = (log, record.take()) {
            let predicted = log.next_lsn();
            if let Some(gate) = gate.as_mut() {
                gate(predicted)?;
            }
            rec[..8].copy_from_slice(&first.to_le_bytes());
            let got = log.append(&rec)?;
            // Appends happen under the root latch, so the gate saw the record's real position.
            assert_eq!(got, predicted, "a log append outside the root latch");
            lsn = Some(got);
        }
        if !*registered {
            *registered = true;
            for &e in placed {
                match log {
                    Some(_) => tree.store.settle_data(e, true),
                    None => tree.store.data.lock().add_replayed(e),
                }
            }
        }
        started = true;
        Ok(())
    };
    if !ops.iter().any(|o| o.reads_tree()) {
        let mut msgs: Vec<Msg> = Vec::with_capacity(ops.len());
        for op in ops {
            op.into_msgs(&mut msgs);
        }
        let _w = tree.writers.read();
        let (_, needs_flush) = tree.inject(msgs, &mut before)?;
        drop(_w);
        if needs_flush && log.is_none() {
            flush_root(tree, false)?;
        }
        return Ok(lsn);
    }
    // Prefix operations read the tree: nothing else may write meanwhile, so that replaying the record
    // reads exactly what was read now.
    let _w = tree.writers.write();
    check_key_lengths(tree, &ops)?;
    destination::check_destinations(&ops, tree.format.max_key_len, &mut |lo, hi| {
        has_key_in(tree, lo, hi)
    })?;
    tree.check_snapshot_ops(&ops, log.is_some())?;
    let r = expand(tree, &ops, &mut before);
    match r {
        Ok(()) => Ok(lsn),
        Err(e) if started => Err(fatal(e)),
        Err(e) => Err(e),
    }
}

/// Applies a batch holding prefix operations, injecting their expansion in chunks.
fn expand(tree: &Tree, ops: &[Op], before: &mut dyn FnMut(u64) -> Result<()>) -> Result<()> {
    let inject = |msgs: Vec<Msg>, before: &mut dyn FnMut(u64) -> Result<()>| -> Result<()> {
        let (_, needs_flush) = tree.inject(msgs, before)?;
        if needs_flush {
            go_on_without_space(flush_root(tree, true))?;
        }
        go_on_without_space(tree.make_room())
    };
    let mut simple: Vec<Msg> = Vec::new();
    for op in ops {
        let (from, to, keep) = match op {
            Op::MovePrefix { from, to } => (from, to, false),
            Op::CopyPrefix { from, to } => (from, to, true),
            Op::RangeMove { from, to, copy_max } | Op::RangeClone { from, to, copy_max } => {
                if !simple.is_empty() {
                    inject(std::mem::take(&mut simple), before)?;
                }
                let clone = matches!(op, Op::RangeClone { .. });
                // The choice depends on the source's contents only, so a replay makes the same
                // one, with the same message numbers (docs/SURGERY.md §3.1).
                if holds_more_than(tree, from, *copy_max as usize)? {
                    if clone {
                        tree.range_clone(from, to, before)?;
                    } else {
                        tree.range_move(from, to, before)?;
                    }
                    go_on_without_space(tree.make_room())?;
                    continue;
                }
                (from, to, clone)
            }
            Op::SnapshotCreate { name, time_ns } => {
                if !simple.is_empty() {
                    inject(std::mem::take(&mut simple), before)?;
                }
                // The copy holds at most a node's worth of buffers, as any written node does.
                go_on_without_space(flush_root(tree, true))?;
                tree.snapshot_create(name, *time_ns, before)?;
                continue;
            }
            Op::SnapshotDelete { name } => {
                if !simple.is_empty() {
                    inject(std::mem::take(&mut simple), before)?;
                }
                tree.snapshot_delete(name, before)?;
                continue;
            }
            other => {
                other.clone().into_msgs(&mut simple);
                continue;
            }
        };
        if !simple.is_empty() {
            inject(std::mem::take(&mut simple), before)?;
        }
        let end = ops::prefix_end(from, tree.format.max_key_len);
        let mut cursor = from.clone();
        loop {
            let mut msgs = Vec::new();
            let mut last: Option<Vec<u8>> = None;
            // A moved or copied reference is a second reference to its block (the source's goes
            // when the move's range delete reaches it): counted before it can be dropped.
            let mut shared: Vec<u64> = Vec::new();
            scan_tree(tree, &cursor, Some(&end), &mut |k, v| {
                let mut nk = to.clone();
                nk.extend_from_slice(&k[from.len()..]);
                assert!(
                    nk.len() <= tree.format.max_key_len,
                    "a checked prefix operation produced a key of {} bytes",
                    nk.len()
                );
                let op = match v {
                    Stored::Bytes(b) => PointOp::Put(b.to_vec()),
                    Stored::Ref(r) => {
                        let r = DataRef::decode_checked(r);
                        shared.push(r.block);
                        PointOp::PutRef(r)
                    }
                };
                msgs.push(Msg::Point { key: nk, op });
                last = Some(k.to_vec());
                msgs.len() < EXPAND_CHUNK
            })?;
            let Some(mut l) = last else { break };
            if !shared.is_empty() {
                let mut d = tree.store.data.lock();
                for b in shared {
                    d.refs.add(b, 1);
                }
            }
            inject(msgs, before)?;
            l.push(0);
            cursor = l;
        }
        if !keep {
            simple.push(Msg::Range {
                lo: from.clone(),
                hi: end,
            });
        }
    }
    inject(simple, before)
}

/// Lack of device space for writing nodes back does not stop a batch that is being applied: the
/// cache stays over its bound until space comes back.
fn go_on_without_space(r: Result<()>) -> Result<()> {
    match r {
        Err(Error::NoSpace(m)) => {
            log::warn!("amaranth engine: cannot write back nodes ({m}) during a prefix move");
            Ok(())
        }
        r => r,
    }
}

/// A failure in the middle of applying a logged batch: the tree holds part of it, the log all of
/// it. Errors that would not stop the engine by themselves are turned into one that does.
fn fatal(e: Error) -> Error {
    match e {
        Error::Io { .. } | Error::Corrupt(_) | Error::Checksum { .. } => e,
        other => Error::Corrupt(format!(
            "a logged batch could not be applied in full: {other}"
        )),
    }
}

/// Checks the keys a batch's prefix operations would produce against the key limit
/// ([`prefix::check_keys`]): first against the key-length bounds of the tree (O(height) per
/// source), and only if those do not show that every key fits, against the tree's keys (a scan of
/// each source). So the outcome is the exact one, and a replay, whose tree has other bounds, comes
/// to the same (docs/SURGERY.md §2.6).
pub(crate) fn check_key_lengths(tree: &Tree, ops: &[Op]) -> Result<()> {
    let max = tree.format.max_key_len;
    let by_bounds = prefix::check_keys(ops, max, &mut |p| {
        let end = ops::prefix_end(p, max);
        let bound = tree.longest_bound(p, &end)?;
        // Every key under `p` is at least as long as `p`: a shorter bound says there is none.
        Ok((bound >= p.len()).then_some(bound))
    });
    match by_bounds {
        Err(Error::KeyTooLong { .. }) => {
            prefix::check_keys(ops, max, &mut |p| longest_key_under(tree, p))
        }
        r => r,
    }
}

/// Whether the tree holds a live key in `[lo, hi)`.
fn has_key_in(tree: &Tree, lo: &[u8], hi: &[u8]) -> Result<bool> {
    let mut found = false;
    scan_tree_stepwise(tree, lo, Some(hi), 1, &mut |_, _| {
        found = true;
        false
    })?;
    Ok(found)
}

/// Whether the keys and values under `prefix` take more than `max` bytes (read until they do).
/// Values count at their logical length: an out-of-line block as the value it holds, not as its
/// reference. How a value is stored depends on when flushes ran (a leaf turns a reference with
/// many patches into an inline value), which a replay does not repeat, and the choice this makes
/// must be the same at replay (docs/SURGERY.md §3.1).
fn holds_more_than(tree: &Tree, prefix: &[u8], max: usize) -> Result<bool> {
    let end = ops::prefix_end(prefix, tree.format.max_key_len);
    let mut bytes = 0usize;
    // Enough partitions for `max` bytes past a partly used first one: a small source is looked at
    // in one chunk, as before (one partition at a time, a 64 KiB file's rename took two).
    let parts = max / tree.format.partition_size + 2;
    scan_tree_stepwise(tree, prefix, Some(&end), parts, &mut |k, v| {
        let len = match v {
            Stored::Bytes(b) => b.len(),
            Stored::Ref(r) => DataRef::decode_checked(r).value_len(),
        };
        bytes += k.len() + len;
        bytes <= max
    })?;
    Ok(bytes > max)
}

/// The longest key under `prefix` in the tree (`None` if there is none).
fn longest_key_under(tree: &Tree, prefix: &[u8]) -> Result<Option<usize>> {
    let end = ops::prefix_end(prefix, tree.format.max_key_len);
    let mut longest = None;
    scan_tree(tree, prefix, Some(&end), &mut |k, _| {
        longest = longest.max(Some(k.len()));
        true
    })?;
    Ok(longest)
}

/// Applies one log record at open. A record that cannot be applied — it does not decode, or an
/// operation fails validation or its key check (only a writer with a bug logs such a record) — is
/// skipped whole, nothing of it applied, with an error in the daemon's log; `skipped` counts it.
/// After a skip, the next record may start at a higher message number than the tree (the skipped
/// record may have used some): the tree moves up to it.
pub(crate) fn replay_record(
    tree: &Tree,
    lsn: Lsn,
    payload: &[u8],
    skipped: &mut u64,
) -> Result<()> {
    let (first_msn, ops) = match ops::decode_record(payload, &tree.format) {
        Ok(r) => r,
        Err(e) => {
            skip(lsn, &e, skipped);
            return Ok(());
        }
    };
    if *skipped > 0 {
        tree.next_msn.fetch_max(first_msn, Ordering::Relaxed);
    }
    // Room for the batch before it lands in the root, as a live write makes it
    // (`Inner::write_marked`): a record larger than a node would pass the bound by its size.
    let mem = ops::record_bytes(&ops) + ops.len() * crate::buffer::ENTRY_OVERHEAD;
    match tree.make_room_for_batch(mem) {
        Ok(()) => {}
        Err(Error::NoSpace(m)) => log::warn!(
            "amaranth engine: cannot write back nodes ({m}); the cache is over its bound"
        ),
        Err(e) => return Err(e),
    }
    match apply_ops(tree, None, ops, Some(first_msn), None) {
        Err(e) if prefix::is_refusal(&e) => {
            skip(lsn, &e, skipped);
            Ok(())
        }
        Err(e) => Err(e),
        Ok(_) => tree.make_room(),
    }
}

fn skip(lsn: Lsn, e: &Error, skipped: &mut u64) {
    *skipped += 1;
    log::error!(
        "amaranth engine: log record {lsn} cannot be applied and is skipped ({e}); \
         the image is flagged for a check (`amaranth fsck`)"
    );
}

/// Flushes until the root is back under its size bound. `exclusive`: the caller holds `writers`.
pub(crate) fn flush_root(tree: &Tree, exclusive: bool) -> Result<()> {
    for _ in 0..10_000 {
        let over = tree.root_bytes()? > tree.format.node_size;
        if !over {
            return Ok(());
        }
        let did = if exclusive {
            tree.flush_step(tree.format.node_size)?
        } else {
            let _w = tree.writers.read();
            tree.flush_step(tree.format.node_size)?
        };
        tree.make_room()?;
        if !did {
            return Ok(());
        }
    }
    Err(Error::Corrupt(
        "the root stays over its bound after many flushes".into(),
    ))
}

/// Walks live entries of `[lo, hi)` in order until `f` returns false (values as stored: a
/// reference is not read).
pub(crate) fn scan_tree(
    tree: &Tree,
    lo: &[u8],
    hi: Option<&[u8]>,
    f: &mut dyn FnMut(&[u8], Stored<'_>) -> bool,
) -> Result<()> {
    scan_tree_at(tree, ROOT_ID, lo, hi, f)
}

/// [`scan_tree`] of the live tree that, once it has walked one leaf's chunk whole (its second:
/// the first may start anywhere in its leaf) and goes on into the next, has the leaves after
/// that one read ahead in the background (`tree/readahead.rs`, up to the read-ahead window), so
/// that the device reads while the scan walks. A scan that ends within its first three leaves
/// (a directory listing that stops when its buffer is full) reads nothing ahead.
pub(crate) fn scan_tree_reading_ahead(
    tree: &Tree,
    lo: &[u8],
    hi: Option<&[u8]>,
    f: &mut dyn FnMut(&[u8], Stored<'_>) -> bool,
) -> Result<()> {
    scan_tree_by(tree, ROOT_ID, lo, hi, usize::MAX, true, f)
}

/// [`scan_tree`] in the tree under `root` (the live root or a snapshot's).
pub(crate) fn scan_tree_at(
    tree: &Tree,
    root: NodeId,
    lo: &[u8],
    hi: Option<&[u8]>,
    f: &mut dyn FnMut(&[u8], Stored<'_>) -> bool,
) -> Result<()> {
    scan_tree_by(tree, root, lo, hi, usize::MAX, false, f)
}

/// [`scan_tree`] `parts` leaf partitions at a time: for a scan that usually stops early, which
/// then applies only the buffered messages for the partitions it looked at, not for the whole
/// leaf ([`Tree::chunk_at_most`]).
pub(crate) fn scan_tree_stepwise(
    tree: &Tree,
    lo: &[u8],
    hi: Option<&[u8]>,
    parts: usize,
    f: &mut dyn FnMut(&[u8], Stored<'_>) -> bool,
) -> Result<()> {
    scan_tree_by(tree, ROOT_ID, lo, hi, parts, false, f)
}

fn scan_tree_by(
    tree: &Tree,
    root: NodeId,
    lo: &[u8],
    hi: Option<&[u8]>,
    max_parts: usize,
    read_ahead: bool,
    f: &mut dyn FnMut(&[u8], Stored<'_>) -> bool,
) -> Result<()> {
    let mut cursor = lo.to_vec();
    let mut chunks = 0usize;
    loop {
        let chunk = tree.chunk_at_most(root, Target::AtOrAfter(&cursor), &cursor, hi, max_parts)?;
        chunks += 1;
        if read_ahead && chunks >= 3 {
            if let Some(h) = chunk.hi.as_deref().filter(|h| hi.is_none_or(|e| *h < e)) {
                tree.read_ahead_from(h);
            }
        }
        if !chunk.walk(&cursor, hi, true, f) {
            return Ok(());
        }
        match &chunk.hi {
            Some(h) if hi.is_none_or(|e| h.as_slice() < e) => cursor = h.clone(),
            _ => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use amaranth_device::MemDevice;

    use crate::{Engine, Format, Op, Options};

    fn options() -> Options {
        Options {
            cache_size: 1 << 20,
            background_threads: false,
            ..Options::default()
        }
    }

    /// Records a buggy writer could have logged: a prefix move whose keys pass the limit (after
    /// using message numbers for part of it) and a payload that does not decode. The image opens,
    /// the records are skipped whole, the records around them are applied, and the image stays
    /// flagged for a check until the flag is cleared.
    #[test]
    fn records_that_cannot_be_applied_are_skipped_and_flag_the_image() {
        let dev = Arc::new(MemDevice::new(16 << 20));
        let f = Format::small_for_tests();
        let e = Engine::create(dev.clone(), f.clone(), options()).unwrap();
        let long = [b"d/".as_slice(), &[b'x'; 250]].concat();
        e.put(&long, b"deep").unwrap();
        e.put(b"d/short", b"s").unwrap();
        e.checkpoint().unwrap();
        e.put(b"before", b"1").unwrap();
        let bad_move = Op::MovePrefix {
            from: b"d/".to_vec(),
            to: b"dddddddddd/".to_vec(),
        };
        e.log_unapplied_for_tests(None, &[bad_move], 3);
        e.put(b"between", b"2").unwrap();
        e.log_unapplied_for_tests(Some(b"not a record"), &[], 0);
        e.put(b"after", b"3").unwrap();
        e.sync().unwrap();
        e.abandon();

        let e = Engine::open(dev.clone(), options()).expect("the image opens");
        let st = e.stats();
        assert_eq!(st.skipped_records, 2);
        assert!(st.needs_check);
        for (k, v) in [
            (&b"before"[..], &b"1"[..]),
            (b"between", b"2"),
            (b"after", b"3"),
            (&long, b"deep"),
            (b"d/short", b"s"),
        ] {
            assert_eq!(e.get(k).unwrap().as_deref(), Some(v), "{k:?}");
        }
        let moved: Vec<_> = e
            .range(
                std::ops::Bound::Included(&b"dddddddddd/"[..]),
                std::ops::Bound::Excluded(&b"dddddddddd0"[..]),
            )
            .collect();
        assert!(moved.is_empty(), "nothing of the skipped move applied");
        e.verify().unwrap();
        // Writes go on, and the flag survives a clean close.
        e.put(b"later", b"4").unwrap();
        e.close().unwrap();
        let e = Engine::open(dev.clone(), options()).unwrap();
        let st = e.stats();
        assert_eq!((st.skipped_records, st.needs_check), (0, true));
        assert_eq!(e.get(b"later").unwrap().as_deref(), Some(&b"4"[..]));
        e.clear_needs_check().unwrap();
        e.close().unwrap();
        let e = Engine::open(dev, options()).unwrap();
        assert!(!e.stats().needs_check);
        e.close().unwrap();
    }
}
