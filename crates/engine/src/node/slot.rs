//! An internal node's message buffer for one child: residency, disk location, and a key rewrite
//! left pending by a range move (docs/SURGERY.md §3.2 step 6).
//!
//! A move rewrites the keys of every message its run's slots buffer (they are stored in the old
//! parent's form). A directory of a few thousand files leaves megabytes of messages in those
//! slots, and rewriting them took a third of the daemon's CPU when one was renamed back and
//! forth. So a moved slot keeps its messages as they were, with the rewrite beside them: the
//! first access that needs the messages themselves applies it, and a slot moved again composes
//! the two rewrites (a move and its reverse cancel). The rewrite lives only in memory: a slot
//! with one is new (it has no place in an image) and is resident until it is written, and what
//! is written is always the rewritten form.

use std::sync::Arc;

use parking_lot::Mutex;

use super::{longest_field, RekeyPlan, SubLoc, LONGEST_UNKNOWN};
use crate::buffer::{Buffer, EncodedBuffer};
use crate::error::Result;
use crate::msg::{KeyMsgs, Msn};

/// Residency and disk location of one child's message buffer.
#[derive(Debug, Default)]
struct BufState {
    /// The messages, when in memory (with `pending`, in their form before that rewrite).
    data: Option<Arc<Buffer>>,
    /// The checked, decompressed encoding of the messages, kept for point queries when `data` is
    /// not built (building the map costs far more than the read; the encoding is also smaller).
    /// Only ever the encoding of exactly the messages the slot holds.
    raw: Option<Arc<EncodedBuffer>>,
    /// Where the buffer lies in the node's current image (`None`: only in memory).
    loc: Option<SubLoc>,
    /// A key rewrite not yet applied to `data`. When set, `data` is resident and `raw` and `loc`
    /// are not (the slot is new since its move, and the encoding would be of the old keys).
    pending: Option<RekeyPlan>,
}

impl BufState {
    /// Applies the pending rewrite, if any. `bytes` is the slot's size, which is already that of
    /// the rewritten messages.
    fn settle(&mut self, bytes: usize) {
        let Some(plan) = self.pending.take() else {
            return;
        };
        assert!(
            self.raw.is_none() && self.loc.is_none(),
            "a buffer with a pending re-key has an encoding"
        );
        let data = self
            .data
            .take()
            .expect("a buffer with a pending re-key is resident");
        let b = Arc::unwrap_or_clone(data).rekeyed(|k| plan.key(k));
        assert_eq!(b.bytes(), bytes, "a re-keyed buffer's size as foreseen");
        self.data = Some(Arc::new(b));
    }
}

/// The bound of [`Buffer::longest_point_key`] once `plan` is applied to `d` (every key changes
/// length by as much).
fn pending_longest(d: &Buffer, plan: &RekeyPlan) -> usize {
    usize::try_from(d.longest_point_key() as isize + plan.delta()).unwrap_or(0)
}

/// The message buffer an internal node holds for one child, and the bound on the length of that
/// child's keys. Like a leaf partition the buffer can be read from disk on its own (a point query
/// needs one buffer per level, not the whole node) and dropped from memory while the node's
/// skeleton stays.
#[derive(Debug)]
pub struct BufSlot {
    /// Residency and location, changed under the node's read latch (loads, partial eviction,
    /// a pending re-key applied).
    state: Mutex<BufState>,
    /// Serialized size of the messages (known even when not resident; with a pending re-key,
    /// of the rewritten messages).
    bytes: usize,
    /// An upper bound on the length, in this node's stored form, of every key the child's
    /// subtree holds (leaf entries and point messages of the child and everything below it; not
    /// this slot's own buffer, and not range-delete bounds): docs/SURGERY.md §2.6. Raised when
    /// the slot's buffer is flushed into the child, copied to the pieces of a split, the larger
    /// of the two in a merge; deletions leave it high. [`LONGEST_UNKNOWN`] when nothing better
    /// is known.
    pub longest: u16,
}

impl BufSlot {
    /// A resident buffer not yet written anywhere.
    pub fn resident(b: Buffer) -> BufSlot {
        BufSlot {
            bytes: b.bytes(),
            state: Mutex::new(BufState {
                data: Some(Arc::new(b)),
                ..BufState::default()
            }),
            longest: LONGEST_UNKNOWN,
        }
    }

    /// A buffer of `bytes` (serialized) read from an image at `loc`, built or not.
    pub(crate) fn in_image(
        bytes: usize,
        data: Option<Arc<Buffer>>,
        loc: SubLoc,
        longest: u16,
    ) -> BufSlot {
        if let Some(b) = &data {
            assert_eq!(b.bytes(), bytes, "a loaded buffer's size as its index says");
        }
        BufSlot {
            bytes,
            state: Mutex::new(BufState {
                data,
                loc: Some(loc),
                ..BufState::default()
            }),
            longest,
        }
    }

    /// The same messages (shared until either copy changes), placed nowhere yet. The buffer must
    /// be resident.
    pub(crate) fn copy(&self) -> BufSlot {
        let st = self.state.lock();
        let data = st.data.clone().expect("a buffer copied is resident");
        BufSlot {
            bytes: self.bytes,
            state: Mutex::new(BufState {
                data: Some(data),
                pending: st.pending.clone(),
                ..BufState::default()
            }),
            longest: self.longest,
        }
    }

    /// This slot with every key of its messages rewritten by `plan`, placed nowhere yet: the
    /// rewrite is left pending (composed with one already pending) until the messages are
    /// needed. The buffer must be resident. The key-length bound is kept (the caller sets it).
    pub(crate) fn rekeyed(self, plan: &RekeyPlan) -> BufSlot {
        let BufSlot {
            state,
            bytes,
            longest,
        } = self;
        let st = state.into_inner();
        let data = st.data.expect("a moved buffer is resident");
        let keys = data.keys_stored() as isize;
        let bytes = usize::try_from(bytes as isize + plan.delta() * keys)
            .expect("a re-keyed buffer's size");
        let pending = if keys == 0 {
            None
        } else {
            let p = match st.pending {
                Some(before) => before.then(plan),
                None => plan.clone(),
            };
            assert_eq!(
                data.bytes() as isize + p.delta() * keys,
                bytes as isize,
                "a composed re-key's size"
            );
            (!p.is_identity()).then_some(p)
        };
        BufSlot {
            bytes,
            state: Mutex::new(BufState {
                data: Some(data),
                pending,
                ..BufState::default()
            }),
            longest,
        }
    }

    /// This slot with the child's key-length bound set to `longest` (see [`BufSlot::longest`]).
    pub fn with_longest(mut self, longest: usize) -> BufSlot {
        self.longest = longest_field(longest);
        self
    }

    /// Raises the child's key-length bound to cover keys of `len` bytes (in this node's form).
    pub fn raise_longest(&mut self, len: usize) {
        self.longest = self.longest.max(longest_field(len));
    }

    /// An empty resident buffer.
    pub fn empty() -> BufSlot {
        BufSlot::resident(Buffer::new())
    }

    /// Serialized size of the messages.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether the buffer holds no message.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// The buffer if resident.
    pub fn data(&self) -> Option<Arc<Buffer>> {
        let mut st = self.state.lock();
        st.settle(self.bytes);
        st.data.clone()
    }

    /// Whether the resident buffer holds a range delete over all of `[lo, hi)`. A buffer with a
    /// pending re-key and no range delete answers without applying it (a node's every slot is
    /// asked after each delivery into it).
    pub(crate) fn deletes_all_of(&self, lo: &[u8], hi: &[u8]) -> bool {
        let mut st = self.state.lock();
        if st
            .data
            .as_ref()
            .is_none_or(|d| st.pending.is_some() && d.range_count() == 0)
        {
            return false;
        }
        st.settle(self.bytes);
        let d = st.data.as_ref().expect("resident");
        d.range_covering(lo).is_some_and(|r| r.hi.as_slice() >= hi)
    }

    /// An upper bound on the length of the keys in `[lo, hi)` with point messages (0 when none),
    /// or `None` when the buffer is not resident. Exact but for a buffer with a pending re-key,
    /// which answers for all its keys from its longest without applying the re-key.
    pub(crate) fn longest_point_in(&self, lo: &[u8], hi: &[u8]) -> Option<usize> {
        let st = self.state.lock();
        let d = st.data.as_ref()?;
        if let Some(plan) = &st.pending {
            return Some(pending_longest(d, plan));
        }
        Some(
            d.points_in(lo, Some(hi))
                .map(|(k, _)| k.len())
                .max()
                .unwrap_or(0),
        )
    }

    /// [`Buffer::longest_point_key`] of the resident buffer (0 when not resident), as it is
    /// after a pending re-key.
    pub(crate) fn longest_point_key(&self) -> usize {
        let st = self.state.lock();
        match (&st.data, &st.pending) {
            (None, _) => 0,
            (Some(d), None) => d.longest_point_key(),
            (Some(d), Some(plan)) => pending_longest(d, plan),
        }
    }

    /// The resident messages in their rewritten form, leaving a pending re-key pending (a copy
    /// is rewritten): for checks, which must not change what they check.
    pub(crate) fn view(&self) -> Option<Arc<Buffer>> {
        let st = self.state.lock();
        let d = st.data.clone()?;
        let Some(plan) = &st.pending else {
            return Some(d);
        };
        let b = (*d).clone().rekeyed(|k| plan.key(k));
        assert_eq!(
            b.bytes(),
            self.bytes,
            "a re-keyed buffer's size as foreseen"
        );
        Some(Arc::new(b))
    }

    /// Whether the buffer is in memory.
    pub fn is_resident(&self) -> bool {
        self.state.lock().data.is_some()
    }

    /// The highest message number of the resident buffer (a re-key does not change it).
    pub(crate) fn resident_max_msn(&self) -> Option<Msn> {
        self.state.lock().data.as_ref().map(|b| b.max_msn())
    }

    /// Whether a key rewrite is pending.
    pub(crate) fn rekey_pending(&self) -> bool {
        self.state.lock().pending.is_some()
    }

    /// Changes the buffer (which must be resident; the caller holds the node's write latch).
    pub fn mutate<R>(&mut self, f: impl FnOnce(&mut Buffer) -> R) -> R {
        let st = self.state.get_mut();
        st.settle(self.bytes);
        let arc = st
            .data
            .as_mut()
            .expect("a buffer being changed is resident");
        let b = Arc::make_mut(arc);
        let r = f(b);
        self.bytes = b.bytes();
        st.loc = None;
        st.raw = None;
        r
    }

    /// Takes every message out, leaving the buffer empty (its max MSN is kept).
    pub fn take(&mut self) -> Buffer {
        self.mutate(|b| b.take())
    }

    /// Memory held.
    pub fn mem(&self) -> usize {
        let st = self.state.lock();
        st.data.as_ref().map_or(0, |b| b.mem()) + st.raw.as_ref().map_or(0, |r| r.mem()) + 96
    }

    /// What the buffer holds for `key` (range-delete MSN, folded point messages), from the built
    /// buffer or its encoding; `None` when neither is in memory.
    pub fn lookup(&self, key: &[u8]) -> Result<Option<(Option<Msn>, Option<KeyMsgs>)>> {
        let mut st = self.state.lock();
        st.settle(self.bytes);
        if let Some(b) = &st.data {
            return Ok(Some((
                b.range_covering(key).map(|r| r.msn),
                b.point(key).cloned(),
            )));
        }
        let Some(raw) = st.raw.clone() else {
            return Ok(None);
        };
        drop(st);
        raw.lookup(key).map(Some)
    }

    /// Where the buffer lies in its node's image, when neither it nor its encoding is in memory.
    pub(crate) fn missing_at(&self) -> Option<SubLoc> {
        let st = self.state.lock();
        if st.data.is_some() || st.raw.is_some() {
            return None;
        }
        Some(st.loc.expect("a buffer not in memory has a disk location"))
    }

    /// Where the buffer lies in its node's image (`None`: only in memory).
    pub(crate) fn loc(&self) -> Option<SubLoc> {
        self.state.lock().loc
    }

    /// The encoding kept for point queries, if any.
    pub(crate) fn raw(&self) -> Option<Arc<EncodedBuffer>> {
        self.state.lock().raw.clone()
    }

    /// Keeps `enc`, read from the slot's place in the image, unless the buffer or an encoding
    /// came meanwhile.
    pub(crate) fn keep_encoding(&self, enc: EncodedBuffer) {
        let mut st = self.state.lock();
        if st.data.is_none() && st.raw.is_none() {
            st.raw = Some(Arc::new(enc));
        }
    }

    /// Keeps `b`, built from the slot's place in the image, unless it came meanwhile; the
    /// encoding is dropped (the built buffer answers point queries from now on).
    pub(crate) fn keep_built(&self, b: Buffer) {
        assert_eq!(
            b.bytes(),
            self.bytes,
            "a loaded buffer's size as its index says"
        );
        let mut st = self.state.lock();
        if st.data.is_none() {
            st.data = Some(Arc::new(b));
        }
        st.raw = None;
    }

    /// Drops what is in memory if the image holds it (partial eviction); whether anything was.
    pub(crate) fn drop_if_written(&self) -> bool {
        let mut st = self.state.lock();
        if (st.data.is_some() || st.raw.is_some()) && st.loc.is_some() {
            assert!(
                st.pending.is_none(),
                "a buffer with a pending re-key has a place in an image"
            );
            st.data = None;
            st.raw = None;
            return true;
        }
        false
    }

    /// Records where the node's image just written holds the buffer.
    pub(crate) fn set_loc(&self, loc: SubLoc) {
        let mut st = self.state.lock();
        assert!(
            st.pending.is_none(),
            "a buffer written with its re-key still pending"
        );
        st.loc = Some(loc);
    }
}

#[cfg(test)]
mod tests {
    use super::BufSlot;
    use crate::buffer::Buffer;
    use crate::msg::{KeyMsgs, PointOp};
    use crate::node::RekeyPlan;

    fn buffer(keys: &[&[u8]], ranges: &[(&[u8], &[u8])]) -> Buffer {
        let mut b = Buffer::new();
        let mut msn = 1;
        for k in keys {
            let _ = b.add_point(k.to_vec(), msn, PointOp::Put(vec![7; 3]));
            msn += 1;
        }
        for (lo, hi) in ranges {
            let _ = b.add_range(msn, lo, hi);
            msn += 1;
        }
        b
    }

    fn keys_of(b: &Buffer) -> Vec<Vec<u8>> {
        let (ranges, points) = b.clone().into_parts();
        let mut out: Vec<Vec<u8>> = points.into_iter().map(|(k, _)| k).collect();
        for r in ranges {
            out.push(r.lo);
            out.push(r.hi);
        }
        out
    }

    #[test]
    fn a_pending_rekey_is_applied_when_the_messages_are_needed() {
        let b = buffer(&[b"ab1", b"ab2", b"ab3"], &[(b"ab4", b"ab6")]);
        let bytes = b.bytes();
        let slot = BufSlot::resident(b);
        let there = RekeyPlan::new(b"ab".to_vec(), b"xyz".to_vec());
        let moved = slot.rekeyed(&there);
        assert!(moved.rekey_pending());
        assert_eq!(moved.bytes(), bytes + 5, "one byte more per key, five keys");
        assert_eq!(moved.resident_max_msn(), Some(4));
        let copy = moved.copy();
        let data = moved.data().unwrap();
        assert!(!moved.rekey_pending());
        assert_eq!(data.bytes(), moved.bytes());
        assert_eq!(
            keys_of(&data),
            [&b"xyz1"[..], b"xyz2", b"xyz3", b"xyz4", b"xyz6"]
        );
        // The copy shares the messages and the rewrite, and applies it on its own.
        assert!(copy.rekey_pending());
        let (_, found) = copy.lookup(b"xyz2").unwrap().unwrap();
        assert!(matches!(found, Some(KeyMsgs::Put { msn: 2, .. })));
        assert!(copy.lookup(b"ab2").unwrap().unwrap().1.is_none());
    }

    #[test]
    fn a_move_and_its_reverse_leave_nothing_to_do() {
        let b = buffer(&[b"ab1", b"ab2"], &[]);
        let bytes = b.bytes();
        let there = RekeyPlan::new(b"ab".to_vec(), b"q".to_vec());
        let back = RekeyPlan::new(b"q".to_vec(), b"ab".to_vec());
        let moved = BufSlot::resident(b).rekeyed(&there);
        assert_eq!(moved.bytes(), bytes - 2);
        let home = moved.rekeyed(&back);
        assert!(!home.rekey_pending());
        assert_eq!(home.bytes(), bytes);
        assert_eq!(keys_of(&home.data().unwrap()), [&b"ab1"[..], b"ab2"]);
    }

    #[test]
    fn changing_a_moved_buffer_rewrites_its_keys_first() {
        let moved = BufSlot::resident(buffer(&[b"ab1"], &[]))
            .rekeyed(&RekeyPlan::new(b"ab".to_vec(), b"c".to_vec()));
        let mut moved = moved.rekeyed(&RekeyPlan::new(b"c".to_vec(), b"de".to_vec()));
        assert!(moved.rekey_pending());
        let taken = moved.take();
        assert_eq!(keys_of(&taken), [&b"de1"[..]]);
        assert_eq!(moved.bytes(), 0);
    }

    #[test]
    #[should_panic(expected = "outside the moved range")]
    fn a_key_the_rewrite_does_not_cover_is_caught_when_applied() {
        let moved = BufSlot::resident(buffer(&[b"ab1", b"zz"], &[]))
            .rekeyed(&RekeyPlan::new(b"ab".to_vec(), b"c".to_vec()));
        let _ = moved.data();
    }
}
