//! Atomic groups: batches that survive a crash all together or not at all.
//!
//! A group's batches are applied as they come (everyone sees them at once) and logged as ordinary
//! records that carry the group's mark; a commit record ends the group. Recovery replays the
//! longest prefix of the log in which every group that has a record also has its commit
//! ([`Replay`]): it stops before the first record of a group that never committed, so that group
//! and everything logged after it — which may have been derived from the group's changes by
//! anyone — are dropped together. The crash state stays a prefix of the operations in log order;
//! the prefix can only end where no group is open.
//!
//! What that asks of the running engine:
//! - **One group open at a time.** [`Engine::begin_atomic`] waits while another one is open, so
//!   a record of a group never follows the first record of another uncommitted one, and a commit
//!   is always a point where no group is open.
//! - **No checkpoint while the open group has records**: the checkpoint would keep part of it.
//!   A checkpoint waits for the commit (`Inner::checkpoint`).
//! - **`sync` keeps its promise**: everything acknowledged before it must survive. If the open
//!   group's first record comes before that point, a crash would drop it, so [`Engine::sync`]
//!   waits for the group's commit. Its own owner uses [`Engine::flush_log`] instead (it cannot
//!   wait for itself): its group becomes durable with its commit.
//! - **Bounds**, so that nothing waits forever: a group holds at most
//!   [`Engine::max_batch_bytes`] of records (more is refused with [`Error::GroupTooLarge`],
//!   nothing of the refused batch applied), and lives at most `Options::atomic_group_timeout`
//!   from its beginning. Whoever waits for a group past its deadline commits it as it stands
//!   (*cuts* it); every later change in it and its owner's commit fail with
//!   [`Error::GroupExpired`]. Every change that succeeded is still all-or-nothing.
//!
//! Lock order: the tree's `writers` lock, then the root latch, then the group state (the gates of
//! group records take it under the root latch); nothing takes the first two while holding it.

use std::collections::HashSet;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use super::{Engine, Inner};
use crate::apply::apply_ops;
use crate::error::{Error, Result};
use crate::ops::{self, Batch, GroupMark, Op, MARK_BYTES};
use crate::wal::Lsn;

/// The engine's atomic groups.
#[derive(Default)]
pub(super) struct Groups {
    state: Mutex<State>,
    cond: Condvar,
}

#[derive(Default)]
struct State {
    /// The last group id given out (ids are unique within one log epoch, i.e. one open).
    last_id: u64,
    /// The open group, if any.
    open: Option<Open>,
    /// A group whose commit record is being appended (it is closed, but a flush that must cover
    /// it has to wait until the record is in the log).
    committing: Option<u64>,
    /// Groups cut at their deadline (or at close) whose owner has not committed them since.
    cut: HashSet<u64>,
}

#[derive(Clone, Copy, Debug)]
struct Open {
    id: u64,
    deadline: Instant,
    /// LSN of the group's first record (none yet: nothing to lose or to wait for).
    first_lsn: Option<Lsn>,
    /// Bytes of its records so far.
    bytes: usize,
}

impl Groups {
    /// Whether the open group has logged anything (a checkpoint must wait for its commit).
    pub(super) fn has_records(&self) -> bool {
        self.state
            .lock()
            .open
            .is_some_and(|o| o.first_lsn.is_some())
    }

    fn open_id(&self) -> Option<u64> {
        self.state.lock().open.map(|o| o.id)
    }
}

impl Inner {
    /// Waits while the open group satisfies `blocks`; a group past its deadline is cut.
    fn wait_groups(&self, blocks: impl Fn(&Open) -> bool) -> Result<()> {
        loop {
            let mut st = self.groups.state.lock();
            if st.committing.is_some() {
                self.groups.cond.wait(&mut st);
                continue;
            }
            let Some(open) = st.open.filter(|o| blocks(o)) else {
                return Ok(());
            };
            if Instant::now() >= open.deadline {
                drop(st);
                log::warn!(
                    "amaranth engine: atomic group {} outlived its limit of {:?}; committing it as it stands",
                    open.id,
                    self.options.atomic_group_timeout
                );
                self.commit_group(open.id, true)?;
                continue;
            }
            self.groups.cond.wait_until(&mut st, open.deadline);
        }
    }

    /// Waits until nothing logged before `target` belongs to an open group (so that a flush up to
    /// `target` makes it all recoverable).
    pub(super) fn settle_before(&self, target: Lsn) -> Result<()> {
        self.wait_groups(|o| o.first_lsn.is_some_and(|first| first < target))
    }

    /// Waits until the open group has no records (a checkpoint may then be taken).
    pub(super) fn settle_for_checkpoint(&self) -> Result<()> {
        self.wait_groups(|o| o.first_lsn.is_some())
    }

    /// Writes the commit record of group `id` if it is still the open group; `cut` marks it for
    /// its owner. Returns the commit's LSN, or `None` if the group had logged nothing or was
    /// already closed by someone else.
    pub(super) fn commit_group(&self, id: u64, cut: bool) -> Result<Option<Lsn>> {
        let close = |st: &mut State| {
            st.open = None;
            if cut {
                st.cut.insert(id);
            }
            self.groups.cond.notify_all();
        };
        {
            let mut st = self.groups.state.lock();
            match st.open {
                Some(o) if o.id == id && o.first_lsn.is_none() => {
                    close(&mut st);
                    return Ok(None);
                }
                Some(o) if o.id == id => {}
                _ => return Ok(None),
            }
        }
        let mut gate = |_: Lsn| -> Result<()> {
            let mut st = self.groups.state.lock();
            if st.open.is_none_or(|o| o.id != id) {
                // Closed by someone else meanwhile: nothing to write.
                return Err(Error::GroupExpired(id));
            }
            close(&mut st);
            st.committing = Some(id);
            Ok(())
        };
        // No admission: a commit record is a few bytes and the log keeps a quarter free.
        let r = apply_ops(
            &self.tree,
            Some(&self.log),
            Vec::new(),
            None,
            Some((GroupMark::Commit(id), &mut gate)),
        );
        {
            let mut st = self.groups.state.lock();
            if st.committing == Some(id) {
                st.committing = None;
                self.groups.cond.notify_all();
            }
        }
        match r {
            Ok(lsn) => Ok(lsn),
            Err(Error::GroupExpired(_)) => Ok(None),
            Err(e) => {
                // The engine stops accepting writes; nobody must wait for this group any more.
                self.fail(&e);
                let mut st = self.groups.state.lock();
                if st.open.is_some_and(|o| o.id == id) {
                    close(&mut st);
                }
                Err(e)
            }
        }
    }

    /// Applies `ops` as a record of group `id`.
    pub(super) fn write_in_group(&self, id: u64, ops: Vec<Op>) -> Result<Lsn> {
        let past_deadline = {
            let st = self.groups.state.lock();
            if st.cut.contains(&id) {
                return Err(Error::GroupExpired(id));
            }
            match st.open {
                Some(o) if o.id == id => Instant::now() >= o.deadline,
                _ => return Err(not_open(id)),
            }
        };
        if past_deadline {
            self.commit_group(id, true)?;
            return Err(Error::GroupExpired(id));
        }
        let max = self.log.max_record();
        let bytes = ops::record_bytes(&ops) + MARK_BYTES;
        let mut gate = |lsn: Lsn| -> Result<()> {
            let mut st = self.groups.state.lock();
            if st.cut.contains(&id) {
                return Err(Error::GroupExpired(id));
            }
            let Some(o) = st.open.as_mut().filter(|o| o.id == id) else {
                return Err(not_open(id));
            };
            if o.bytes + bytes > max {
                return Err(Error::GroupTooLarge {
                    group: id,
                    bytes: o.bytes + bytes,
                    max,
                });
            }
            o.bytes += bytes;
            o.first_lsn.get_or_insert(lsn);
            Ok(())
        };
        self.write_marked(ops, Some((GroupMark::Member(id), &mut gate)))
    }

    /// Cuts the open group, if any (at close: nothing may wait for it any more).
    pub(super) fn cut_open_group(&self) -> Result<()> {
        match self.groups.open_id() {
            Some(id) => self.commit_group(id, true).map(|_| ()),
            None => Ok(()),
        }
    }
}

fn not_open(id: u64) -> Error {
    Error::InvalidArgument(format!("atomic group {id} is not open"))
}

impl Engine {
    /// Begins an atomic group: every batch written with [`Engine::write_atomic`] until
    /// [`Engine::commit_atomic`] survives a crash together with the others or not at all, and so
    /// does everything anyone writes after the group's first batch (it is dropped with an
    /// uncommitted group). One group is open at a time: this waits while another one is open
    /// (at most until that group's deadline, when it is cut). Returns the group's id.
    pub fn begin_atomic(&self) -> Result<u64> {
        self.refuse_if_snapshot()?;
        let inner = &*self.inner;
        loop {
            inner.check_writable()?;
            inner.wait_groups(|_| true)?;
            let mut st = inner.groups.state.lock();
            if st.open.is_none() {
                st.last_id += 1;
                let id = st.last_id;
                st.open = Some(Open {
                    id,
                    deadline: Instant::now() + inner.options.atomic_group_timeout,
                    first_lsn: None,
                    bytes: 0,
                });
                return Ok(id);
            }
        }
    }

    /// Applies a batch as part of atomic group `id` and returns its LSN. Refused, with nothing
    /// applied, if it would make the group larger than [`Engine::max_batch_bytes`]
    /// ([`Error::GroupTooLarge`]) or if the group was cut ([`Error::GroupExpired`]).
    pub fn write_atomic(&self, id: u64, batch: &Batch) -> Result<Lsn> {
        self.refuse_if_snapshot()?;
        self.inner.write_in_group(id, batch.ops.clone())
    }

    /// Commits atomic group `id`: returns the LSN of its commit record (`None` if it logged
    /// nothing), or [`Error::GroupExpired`] if it was cut meanwhile (what it held then is
    /// committed). Not durable yet: [`Engine::sync`] (or the next background flush) makes it so.
    pub fn commit_atomic(&self, id: u64) -> Result<Option<Lsn>> {
        self.refuse_if_snapshot()?;
        let inner = &*self.inner;
        let cut = |st: &mut State| st.cut.remove(&id).then_some(Error::GroupExpired(id));
        {
            let mut st = inner.groups.state.lock();
            if let Some(e) = cut(&mut st) {
                return Err(e);
            }
            if st.open.is_none_or(|o| o.id != id) {
                return Err(not_open(id));
            }
        }
        let lsn = inner.commit_group(id, false)?;
        // Cut by someone else between the check and the commit?
        match cut(&mut inner.groups.state.lock()) {
            Some(e) => Err(e),
            None => Ok(lsn),
        }
    }

    /// The open atomic group, if any.
    pub fn open_atomic(&self) -> Option<u64> {
        self.inner.groups.open_id()
    }

    /// Writes and flushes the log without waiting for the open atomic group: afterwards every
    /// record before that group's first one (every record, if no group has any) is durable. For
    /// the group's own owner, which [`Engine::sync`] would make wait for itself.
    pub fn flush_log(&self) -> Result<()> {
        if self.snap.is_some() {
            return Ok(());
        }
        self.inner.sync()
    }
}

/// Replays the recovered log with the atomic-group rule: records from the first one of a group
/// until its commit are held back and applied at the commit; if the log ends first, they (and
/// everything after them) are dropped.
#[derive(Default)]
pub(super) struct Replay {
    /// The group being held back and its records (the group's and everyone else's since).
    held: Option<(u64, Vec<Held>)>,
}

/// A recovered record held back: its LSN and payload.
type Held = (Lsn, Vec<u8>);

impl Replay {
    /// Takes the next recovered record; `apply` replays one record.
    pub(super) fn record(
        &mut self,
        lsn: Lsn,
        payload: &[u8],
        apply: &mut impl FnMut(Lsn, &[u8]) -> Result<()>,
    ) -> Result<()> {
        match (ops::record_mark(payload), &mut self.held) {
            (Some(GroupMark::Member(g)), None) => {
                self.held = Some((g, vec![(lsn, payload.to_vec())]));
            }
            (Some(GroupMark::Member(g)), Some((open, _))) if g != *open => {
                return Err(Error::Corrupt(format!(
                    "log record {lsn} belongs to atomic group {g} while group {open} is open"
                )));
            }
            (Some(GroupMark::Commit(g)), Some((open, _))) if g == *open => {
                let (_, records) = self.held.take().expect("a held group");
                for (l, p) in records {
                    apply(l, &p)?;
                }
                apply(lsn, payload)?;
            }
            (_, Some((_, records))) => records.push((lsn, payload.to_vec())),
            (_, None) => apply(lsn, payload)?,
        }
        Ok(())
    }

    /// Ends the replay: the group left open (if any) and the number of records dropped with it.
    pub(super) fn finish(self) -> Option<(u64, usize)> {
        self.held.map(|(g, records)| (g, records.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(mark: Option<GroupMark>) -> Vec<u8> {
        ops::encode_marked_record(&[Op::Delete { key: b"k".to_vec() }], mark)
    }

    fn replay(log: &[Option<GroupMark>]) -> (Vec<Lsn>, Option<(u64, usize)>) {
        let mut r = Replay::default();
        let mut applied = Vec::new();
        for (i, m) in log.iter().enumerate() {
            let payload = match m {
                Some(GroupMark::Commit(g)) => {
                    ops::encode_marked_record(&[], Some(GroupMark::Commit(*g)))
                }
                m => rec(*m),
            };
            r.record(i as Lsn, &payload, &mut |l, _| {
                applied.push(l);
                Ok(())
            })
            .unwrap();
        }
        (applied, r.finish())
    }

    #[test]
    fn replay_stops_before_the_first_record_of_an_uncommitted_group() {
        use GroupMark::{Commit, Member};
        // Records of others inside a committed group are applied with it, in order.
        let (applied, left) = replay(&[None, Some(Member(1)), None, Some(Commit(1)), None]);
        assert_eq!(applied, vec![0, 1, 2, 3, 4]);
        assert_eq!(left, None);
        // An uncommitted group drops itself and everything after its first record.
        let (applied, left) = replay(&[
            None,
            Some(Member(1)),
            Some(Commit(1)),
            None,
            Some(Member(2)),
            None,
            Some(Member(2)),
        ]);
        assert_eq!(applied, vec![0, 1, 2, 3]);
        assert_eq!(left, Some((2, 3)));
        // A commit of a group that logged nothing is harmless.
        let (applied, _) = replay(&[Some(Commit(5)), None]);
        assert_eq!(applied, vec![0, 1]);
    }

    #[test]
    fn a_second_group_inside_an_open_one_is_corruption() {
        let mut r = Replay::default();
        let mut nop = |_: Lsn, _: &[u8]| Ok(());
        r.record(0, &rec(Some(GroupMark::Member(1))), &mut nop)
            .unwrap();
        let e = r
            .record(1, &rec(Some(GroupMark::Member(2))), &mut nop)
            .unwrap_err();
        assert!(matches!(e, Error::Corrupt(_)), "{e}");
    }
}
