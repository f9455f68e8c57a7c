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

use super::runs::{RunAt, ShedRuns};
use super::summary::ShedSummary;
use super::{longest_field, RekeyPlan, SubLoc, BUFFER_HEADER, LONGEST_UNKNOWN};
use crate::buffer::{Buffer, EncodedBuffer, Taken};
use crate::error::Result;
use crate::msg::{KeyMsgs, Msn, RangeDel};

/// A buffer as it is held in memory: built (a map of its messages, needed to change it or to
/// read a range of it), or in its checked encoding (enough for point queries, for moving it,
/// for writing it back).
#[derive(Debug, Clone)]
pub(crate) enum Resident {
    /// Built.
    Built(Arc<Buffer>),
    /// In its checked encoding, indexed.
    Encoded(Arc<EncodedBuffer>),
}

impl Resident {
    /// Serialized size of the messages.
    pub(crate) fn bytes(&self) -> usize {
        match self {
            Resident::Built(b) => b.bytes(),
            Resident::Encoded(r) => r.raw().len() - BUFFER_HEADER,
        }
    }

    /// Highest message number.
    pub(crate) fn max_msn(&self) -> Msn {
        match self {
            Resident::Built(b) => b.max_msn(),
            Resident::Encoded(r) => r.max_msn(),
        }
    }

    /// Whether the buffer holds no message.
    pub(crate) fn is_empty(&self) -> bool {
        match self {
            Resident::Built(b) => b.is_empty(),
            Resident::Encoded(r) => r.counts() == (0, 0),
        }
    }

    /// Number of range deletes.
    fn range_count(&self) -> usize {
        match self {
            Resident::Built(b) => b.range_count(),
            Resident::Encoded(r) => r.counts().1,
        }
    }

    /// Keys stored: one per point, two per range delete.
    fn keys_stored(&self) -> usize {
        match self {
            Resident::Built(b) => b.keys_stored(),
            Resident::Encoded(r) => r.keys_stored(),
        }
    }

    /// Longest point key (an upper bound for a built buffer, exact for an encoding).
    fn longest_point_key(&self) -> usize {
        match self {
            Resident::Built(b) => b.longest_point_key(),
            Resident::Encoded(r) => r.longest_point_key(),
        }
    }

    /// Whether every message lies in `[lo, hi)` (`hi = None`: unbounded).
    pub(crate) fn within(&self, lo: &[u8], hi: Option<&[u8]>) -> bool {
        match self {
            Resident::Built(b) => {
                b.points_in(&[], None)
                    .all(|(k, _)| k.as_slice() >= lo && hi.is_none_or(|h| k.as_slice() < h))
                    && b.ranges_in(&[], None)
                        .iter()
                        .all(|r| r.lo.as_slice() >= lo && hi.is_none_or(|h| r.hi.as_slice() <= h))
            }
            Resident::Encoded(r) => r.within(lo, hi),
        }
    }

    /// Number of point keys.
    fn point_count(&self) -> usize {
        match self {
            Resident::Built(b) => b.points_in(&[], None).count(),
            Resident::Encoded(r) => r.counts().0,
        }
    }

    /// What a point query needs to know of these messages once they are shed
    /// (`node/summary.rs`); `None` when they have too many range deletes to keep.
    fn summary(&self) -> Option<ShedSummary> {
        match self {
            Resident::Built(b) => {
                let ranges = b.ranges_in(&[], None);
                ShedSummary::build(
                    self.point_count(),
                    b.points_in(&[], None).map(|(k, _)| k.as_slice()),
                    ranges
                        .iter()
                        .map(|r| (r.msn, r.lo.as_slice(), r.hi.as_slice())),
                )
            }
            Resident::Encoded(r) => {
                ShedSummary::build(self.point_count(), r.point_keys(), r.range_deletes())
            }
        }
    }

    /// The same messages with every key rewritten by `plan` (a new copy).
    fn rekeyed(&self, plan: &RekeyPlan) -> Resident {
        match self {
            Resident::Built(b) => Resident::Built(Arc::new((**b).clone().rekeyed(|k| plan.key(k)))),
            Resident::Encoded(r) => Resident::Encoded(Arc::new(r.rekeyed(|k| plan.key(k)))),
        }
    }
}

/// What a child's buffer answers a point query ([`BufSlot::lookup`]).
#[derive(Debug)]
pub(crate) enum BufAnswer {
    /// The MSN of the range delete covering the key, and the key's folded point messages.
    Held(Option<Msn>, Option<KeyMsgs>),
    /// The buffer is shed: the key's point messages, if it has any, lie in this run of the
    /// buffer's place `loc` in its node's image (`node/runs.rs`), to be read and searched with
    /// [`EncodedBuffer::find_in_run`]; `range` is the MSN of the range delete covering the key.
    Run {
        range: Option<Msn>,
        loc: SubLoc,
        at: RunAt,
    },
    /// The buffer is shed and must be read back to answer.
    Load,
}

/// Residency and disk location of one child's message buffer.
///
/// Invariants: `data` and `raw` are never both set (a buffer is held built or encoded, not
/// twice); a pending re-key implies the messages are in memory (one form or the other) and have
/// no place in an image; a summary implies the messages are not in memory and have a place in
/// an image (the summary describes that image's messages); runs imply a summary and describe
/// the same place.
#[derive(Debug, Default)]
struct BufState {
    /// The messages, built (with `pending`, in their form before that rewrite).
    data: Option<Arc<Buffer>>,
    /// The messages in their checked, decompressed encoding, when not built: what a node read
    /// whole keeps (building the maps of every buffer costs far more than the read, and most
    /// are never needed: a point query searches the encoding, a move carries it, a write copies
    /// it out as it is). Built on the first access that needs the map (with `pending`, in the
    /// form before that rewrite).
    raw: Option<Arc<EncodedBuffer>>,
    /// Where the buffer lies in the node's current image (`None`: only in memory).
    loc: Option<SubLoc>,
    /// A key rewrite not yet applied to the messages. When set, `loc` is not (the slot is new
    /// since its move, and its image would be of the old keys).
    pending: Option<RekeyPlan>,
    /// Deliveries spliced into the encoding since it was read ([`BufSlot::deliver`]).
    splices: u8,
    /// While the messages are shed: what a point query needs to know of them
    /// (`node/summary.rs`).
    summary: Option<Arc<ShedSummary>>,
    /// While the messages are shed, if they were held in their encoding and are stored
    /// uncompressed: the runs of their point entries (`node/runs.rs`).
    runs: Option<Arc<ShedRuns>>,
}

impl BufState {
    fn check(&self) {
        assert!(
            self.data.is_none() || self.raw.is_none(),
            "a buffer held both built and encoded"
        );
        if self.pending.is_some() {
            assert!(
                self.loc.is_none() && (self.data.is_some() || self.raw.is_some()),
                "a buffer with a pending re-key is in memory only"
            );
        }
        if self.summary.is_some() {
            assert!(
                self.loc.is_some() && self.data.is_none() && self.raw.is_none(),
                "a buffer with a summary is shed and has a place in an image"
            );
        }
        if let Some(runs) = &self.runs {
            assert!(
                self.summary.is_some() && self.loc == Some(runs.loc()),
                "a buffer's runs go with its summary and describe its place"
            );
        }
    }

    /// What is in memory, in either form.
    fn resident(&self) -> Option<Resident> {
        self.check();
        match (&self.data, &self.raw) {
            (Some(b), _) => Some(Resident::Built(b.clone())),
            (None, Some(r)) => Some(Resident::Encoded(r.clone())),
            (None, None) => None,
        }
    }

    /// Applies the pending rewrite, if any. `bytes` is the slot's size, which is already that of
    /// the rewritten messages.
    fn settle(&mut self, bytes: usize) {
        self.check();
        let Some(plan) = self.pending.take() else {
            return;
        };
        if let Some(data) = self.data.take() {
            let b = Arc::unwrap_or_clone(data).rekeyed(|k| plan.key(k));
            assert_eq!(b.bytes(), bytes, "a re-keyed buffer's size as foreseen");
            self.data = Some(Arc::new(b));
        } else {
            let raw = self
                .raw
                .take()
                .expect("a buffer with a pending re-key is resident");
            let r = raw.rekeyed(|k| plan.key(k));
            assert_eq!(
                r.raw().len(),
                bytes + BUFFER_HEADER,
                "a re-keyed encoding's size as foreseen"
            );
            self.raw = Some(Arc::new(r));
        }
    }

    /// Settles, then builds the messages from their encoding if they are held encoded; whether
    /// it built them.
    fn build(&mut self, bytes: usize) -> bool {
        self.settle(bytes);
        if self.data.is_some() {
            return false;
        }
        let Some(raw) = self.raw.take() else {
            return false;
        };
        let b = raw.build();
        assert_eq!(b.bytes(), bytes, "a built buffer's size as its encoding's");
        self.data = Some(Arc::new(b));
        self.splices = 0;
        true
    }
}

/// How many deliveries a buffer held encoded takes by splicing before it is built: a splice
/// copies the whole encoding (a fresh 256 KiB costs ~0.2 ms here, mostly page faults), a build
/// of one costs ~1.5 ms.
const MAX_SPLICES: u8 = 4;

/// Applies a delivery to a built buffer: range deletes first (in MSN order), then points.
fn apply_delivery(
    b: &mut Buffer,
    ranges: Vec<RangeDel>,
    points: Vec<(Vec<u8>, KeyMsgs)>,
) -> Vec<u64> {
    let mut released = Vec::new();
    for r in ranges {
        released.extend(b.add_range(r.msn, &r.lo, &r.hi));
    }
    for (k, km) in points {
        released.extend(b.add_key_msgs(k, km));
    }
    released
}

/// The bound of a buffer's longest point key once `plan` is applied (every key changes length
/// by as much).
fn pending_longest(longest: usize, plan: &RekeyPlan) -> usize {
    usize::try_from(longest as isize + plan.delta()).unwrap_or(0)
}

/// The message buffer an internal node holds for one child, and the bound on the length of that
/// child's keys. Like a leaf partition the buffer can be read from disk on its own (a point query
/// needs one buffer per level, not the whole node) and dropped from memory while the node's
/// skeleton stays.
#[derive(Debug)]
pub struct BufSlot {
    /// Residency and location, changed under the node's read latch (loads, partial eviction,
    /// a pending re-key applied, the messages built from their encoding).
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

    /// A buffer of `bytes` (serialized) read from an image at `loc`, kept in its encoding or
    /// not in memory.
    pub(crate) fn in_image(
        bytes: usize,
        raw: Option<EncodedBuffer>,
        loc: SubLoc,
        longest: u16,
    ) -> BufSlot {
        if let Some(r) = &raw {
            assert_eq!(
                r.raw().len(),
                bytes + BUFFER_HEADER,
                "a loaded buffer's size as its index says"
            );
        }
        BufSlot {
            bytes,
            state: Mutex::new(BufState {
                raw: raw.map(Arc::new),
                loc: Some(loc),
                ..BufState::default()
            }),
            longest,
        }
    }

    /// The same messages (shared until either copy changes, in the form they are held in),
    /// placed nowhere yet. The buffer must be resident.
    pub(crate) fn copy(&self) -> BufSlot {
        let st = self.state.lock();
        assert!(st.resident().is_some(), "a buffer copied is resident");
        BufSlot {
            bytes: self.bytes,
            state: Mutex::new(BufState {
                data: st.data.clone(),
                raw: st.raw.clone(),
                pending: st.pending.clone(),
                loc: None,
                splices: st.splices,
                summary: None,
                runs: None,
            }),
            longest: self.longest,
        }
    }

    /// This slot with every key of its messages rewritten by `plan`, placed nowhere yet: the
    /// rewrite is left pending (composed with one already pending) until the messages are
    /// needed. The buffer must be resident (in either form, which it stays in). The key-length
    /// bound is kept (the caller sets it).
    pub(crate) fn rekeyed(self, plan: &RekeyPlan) -> BufSlot {
        let BufSlot {
            state,
            bytes,
            longest,
        } = self;
        let st = state.into_inner();
        let held = st.resident().expect("a moved buffer is resident");
        let keys = held.keys_stored() as isize;
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
                held.bytes() as isize + p.delta() * keys,
                bytes as isize,
                "a composed re-key's size"
            );
            (!p.is_identity()).then_some(p)
        };
        BufSlot {
            bytes,
            state: Mutex::new(BufState {
                data: st.data,
                raw: st.raw,
                pending,
                loc: None,
                splices: st.splices,
                summary: None,
                runs: None,
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

    /// The buffer built, if resident: one held encoded is built now, and kept built (the node's
    /// memory is re-measured when its change ends; readers that only look take
    /// [`BufSlot::held`] instead).
    pub fn data(&self) -> Option<Arc<Buffer>> {
        let mut st = self.state.lock();
        st.build(self.bytes);
        st.data.clone()
    }

    /// The resident messages (a pending re-key applied) in the form they are held in, without
    /// building them; `None` when not in memory.
    pub(crate) fn held(&self) -> Option<Resident> {
        let mut st = self.state.lock();
        st.settle(self.bytes);
        st.resident()
    }

    /// Number of range deletes of the resident buffer (`None` when not resident), without
    /// building it.
    pub(crate) fn range_count(&self) -> Option<usize> {
        self.state.lock().resident().map(|h| h.range_count())
    }

    /// Whether the resident buffer holds a range delete over all of `[lo, hi)`. A buffer with a
    /// pending re-key and no range delete answers without applying it (a node's every slot is
    /// asked after each delivery into it); none is built.
    pub(crate) fn deletes_all_of(&self, lo: &[u8], hi: &[u8]) -> bool {
        let mut st = self.state.lock();
        if st.resident().is_none_or(|h| h.range_count() == 0) {
            return false;
        }
        st.settle(self.bytes);
        match st.resident().expect("resident") {
            Resident::Built(d) => d.range_covering(lo).is_some_and(|r| r.hi.as_slice() >= hi),
            Resident::Encoded(r) => r.range_covering(lo).is_some_and(|(_, h)| h >= hi),
        }
    }

    /// An upper bound on the length of the keys in `[lo, hi)` with point messages (0 when none),
    /// or `None` when the buffer is not resident. Exact but for a buffer with a pending re-key,
    /// which answers for all its keys from its longest without applying the re-key.
    pub(crate) fn longest_point_in(&self, lo: &[u8], hi: &[u8]) -> Option<usize> {
        let st = self.state.lock();
        let held = st.resident()?;
        if let Some(plan) = &st.pending {
            return Some(pending_longest(held.longest_point_key(), plan));
        }
        Some(match held {
            Resident::Built(d) => d
                .points_in(lo, Some(hi))
                .map(|(k, _)| k.len())
                .max()
                .unwrap_or(0),
            Resident::Encoded(r) => r.longest_point_in(lo, hi),
        })
    }

    /// An upper bound on the longest point key of the resident buffer (0 when not resident), as
    /// it is after a pending re-key.
    pub(crate) fn longest_point_key(&self) -> usize {
        let st = self.state.lock();
        match (st.resident(), &st.pending) {
            (None, _) => 0,
            (Some(h), None) => h.longest_point_key(),
            (Some(h), Some(plan)) => pending_longest(h.longest_point_key(), plan),
        }
    }

    /// The exact longest point key of the resident buffer (which must be resident), applying a
    /// pending re-key.
    pub(crate) fn longest_point_key_held(&self) -> usize {
        let mut st = self.state.lock();
        st.settle(self.bytes);
        match st
            .resident()
            .expect("a buffer whose keys are measured is resident")
        {
            Resident::Built(b) => b.longest_point_key_held(),
            Resident::Encoded(r) => r.longest_point_key(),
        }
    }

    /// The resident messages in their rewritten form, in the form they are held in, leaving a
    /// pending re-key pending (a copy is rewritten): for checks, which must not change what they
    /// check.
    pub(crate) fn view(&self) -> Option<Resident> {
        let st = self.state.lock();
        let held = st.resident()?;
        let Some(plan) = &st.pending else {
            return Some(held);
        };
        let v = held.rekeyed(plan);
        assert_eq!(
            v.bytes(),
            self.bytes,
            "a re-keyed buffer's size as foreseen"
        );
        Some(v)
    }

    /// The messages as they are to be written: a pending re-key applied, in the form they are
    /// held in (an encoding is written back as it is). The buffer must be resident.
    pub(crate) fn for_write(&self) -> Resident {
        let mut st = self.state.lock();
        st.settle(self.bytes);
        st.resident()
            .expect("an internal node being written is fully resident")
    }

    /// The out-of-line blocks the resident messages reference, one per reference, from the form
    /// they are held in (a re-key does not change them). The buffer must be resident.
    pub(crate) fn ref_blocks(&self) -> Vec<u64> {
        match self.state.lock().resident() {
            Some(Resident::Built(b)) => b.ref_blocks().collect(),
            Some(Resident::Encoded(r)) => r.ref_blocks().collect(),
            None => panic!("the references of a buffer not in memory"),
        }
    }

    /// Whether the buffer is in memory, built or encoded.
    pub fn is_resident(&self) -> bool {
        self.state.lock().resident().is_some()
    }

    /// The highest message number of the resident buffer (a re-key does not change it).
    pub(crate) fn resident_max_msn(&self) -> Option<Msn> {
        self.state.lock().resident().map(|h| h.max_msn())
    }

    /// Whether a key rewrite is pending.
    pub(crate) fn rekey_pending(&self) -> bool {
        self.state.lock().pending.is_some()
    }

    /// Changes the buffer (which must be resident; the caller holds the node's write latch).
    pub fn mutate<R>(&mut self, f: impl FnOnce(&mut Buffer) -> R) -> R {
        let st = self.state.get_mut();
        st.build(self.bytes);
        let arc = st
            .data
            .as_mut()
            .expect("a buffer being changed is resident");
        let b = Arc::make_mut(arc);
        let r = f(b);
        self.bytes = b.bytes();
        st.loc = None;
        assert!(st.raw.is_none(), "a buffer being changed is built");
        r
    }

    /// Delivers messages from the parent: `ranges` (in MSN order, within the child's range), then
    /// `points` (in key order), all newer than what the buffer holds; returns the blocks whose
    /// references the delivery dropped. A buffer held encoded takes a delivery without being
    /// built, up to [`MAX_SPLICES`] times: the messages the delivery can change are built,
    /// changed with [`Buffer`]'s own methods and spliced back into a copy of the encoding
    /// (building a buffer of thousands of keys to add a few cost more than its read); after
    /// that it is built, as one taking deliveries often is worth keeping.
    pub(crate) fn deliver(
        &mut self,
        ranges: Vec<RangeDel>,
        points: Vec<(Vec<u8>, KeyMsgs)>,
    ) -> Vec<u64> {
        let st = self.state.get_mut();
        st.settle(self.bytes);
        let raw = match &st.raw {
            Some(raw) if st.splices < MAX_SPLICES => raw.clone(),
            _ => return self.mutate(|b| apply_delivery(b, ranges, points)),
        };
        let keys: Vec<&[u8]> = points.iter().map(|(k, _)| k.as_slice()).collect();
        let spans: Vec<(&[u8], &[u8])> = ranges
            .iter()
            .map(|r| (r.lo.as_slice(), r.hi.as_slice()))
            .collect();
        let (mut changed, taken) = raw.affected(&keys, &spans);
        drop((keys, spans));
        let released = apply_delivery(&mut changed, ranges, points);
        let new = raw.spliced(&taken, &changed);
        self.bytes = new.raw().len() - BUFFER_HEADER;
        st.raw = Some(Arc::new(new));
        st.loc = None;
        st.splices += 1;
        st.check();
        released
    }

    /// Cuts the messages at `k` ([`Buffer::split_off`]): those for keys from `k` on go to the
    /// returned slot (placed nowhere, with this slot's key-length bound). A buffer held encoded
    /// is cut in its encoding, both halves staying encoded.
    pub(crate) fn split_off(&mut self, k: &[u8]) -> BufSlot {
        let st = self.state.get_mut();
        st.settle(self.bytes);
        let upper = if let Some(raw) = st.raw.take() {
            let (lower, upper) = raw.split_at(k);
            self.bytes = lower.raw().len() - BUFFER_HEADER;
            st.raw = Some(Arc::new(lower));
            st.loc = None;
            st.check();
            BufSlot {
                bytes: upper.raw().len() - BUFFER_HEADER,
                state: Mutex::new(BufState {
                    raw: Some(Arc::new(upper)),
                    splices: st.splices,
                    ..BufState::default()
                }),
                longest: LONGEST_UNKNOWN,
            }
        } else {
            let upper = self.mutate(|b| b.split_off(k));
            BufSlot::resident(upper)
        };
        BufSlot {
            longest: self.longest,
            ..upper
        }
    }

    /// Takes every message out, leaving the buffer empty (its max MSN is kept). A buffer held
    /// encoded is decoded in order, without building its maps (a flush or a merge delivers the
    /// messages one child further down at once).
    pub(crate) fn take(&mut self) -> Taken {
        let st = self.state.get_mut();
        st.settle(self.bytes);
        if let Some(raw) = st.raw.take() {
            let t = raw.taken();
            assert_eq!(t.bytes, self.bytes, "taken messages' size");
            st.data = Some(Arc::new(Buffer::from_sorted(
                t.max_msn,
                Vec::new(),
                Vec::new(),
            )));
            st.loc = None;
            st.splices = 0;
            self.bytes = 0;
            st.check();
            return t;
        }
        self.mutate(|b| b.take()).into_taken()
    }

    /// Counts the node image the encoding lies in, if it is read in place (`subbytes.rs`).
    pub(crate) fn charge_image(&self, images: &mut crate::subbytes::ImageCharge) {
        if let Some(raw) = &self.state.lock().raw {
            images.add(raw.sub_bytes());
        }
    }

    /// Copies the encoding out of its node image if `charge` finds that image used sparsely
    /// ([`crate::node::Node::unshare_sparse_images`]).
    pub(crate) fn unshare_if_sparse(&self, charge: &crate::subbytes::ImageCharge) {
        let mut st = self.state.lock();
        let own = match &st.raw {
            Some(raw) if charge.is_sparse(raw.sub_bytes()) => raw.unshared(),
            _ => return,
        };
        st.raw = Some(Arc::new(own));
    }

    /// Memory held, without the node image its encoding may lie in ([`BufSlot::charge_image`]).
    pub fn mem(&self) -> usize {
        let st = self.state.lock();
        st.data.as_ref().map_or(0, |b| b.mem())
            + st.raw.as_ref().map_or(0, |r| r.mem())
            + st.summary.as_ref().map_or(0, |s| s.mem())
            + st.runs.as_ref().map_or(0, |r| r.mem())
            + 96
    }

    /// What the buffer holds for `key` (range-delete MSN, folded point messages), from the built
    /// buffer or its encoding, or, when it is shed, from its summary if that says it holds no
    /// point message for `key`; else the run that would hold them, if the buffer kept runs and
    /// has not been read this way often enough to be worth loading (`node/runs.rs`); else the
    /// buffer must be read.
    pub(crate) fn lookup(&self, key: &[u8]) -> Result<BufAnswer> {
        let mut st = self.state.lock();
        st.settle(self.bytes);
        let held = st.resident();
        let summary = st.summary.clone();
        let runs = st.runs.clone();
        drop(st);
        match held {
            None => {
                let Some(s) = summary else {
                    return Ok(BufAnswer::Load);
                };
                let range = s.range_covering(key);
                if !s.may_hold(key) {
                    return Ok(BufAnswer::Held(range, None));
                }
                Ok(match runs.map(|r| (r.loc(), r.run_for(key))) {
                    Some((_, Ok(None))) => BufAnswer::Held(range, None),
                    Some((loc, Ok(Some(at)))) => BufAnswer::Run { range, loc, at },
                    Some((_, Err(()))) | None => BufAnswer::Load,
                })
            }
            Some(Resident::Built(b)) => Ok(BufAnswer::Held(
                b.range_covering(key).map(|r| r.msn),
                b.point(key).cloned(),
            )),
            Some(Resident::Encoded(r)) => {
                let (range, point) = r.lookup(key)?;
                Ok(BufAnswer::Held(range, point))
            }
        }
    }

    /// Whether the buffer is shed with runs kept (`node/runs.rs`).
    #[cfg(test)]
    pub(crate) fn has_runs(&self) -> bool {
        self.state.lock().runs.is_some()
    }

    /// Where the buffer lies in its node's image, when it is not in memory.
    pub(crate) fn missing_at(&self) -> Option<SubLoc> {
        let st = self.state.lock();
        if st.resident().is_some() {
            return None;
        }
        Some(st.loc.expect("a buffer not in memory has a disk location"))
    }

    /// Keeps `enc`, read from the slot's place in the image, unless the messages came
    /// meanwhile.
    pub(crate) fn keep_encoding(&self, enc: EncodedBuffer) {
        assert_eq!(
            enc.raw().len(),
            self.bytes + BUFFER_HEADER,
            "a loaded buffer's size as its index says"
        );
        let mut st = self.state.lock();
        if st.resident().is_none() {
            if let Some(s) = st.summary.take() {
                assert!(
                    s.describes(enc.point_keys(), enc.range_deletes()),
                    "a shed buffer's summary describes the messages read back"
                );
            }
            if let Some(runs) = st.runs.take() {
                assert!(
                    Some(runs.loc()) == st.loc && runs.describes(enc.raw(), enc.point_entries()),
                    "a shed buffer's runs describe the encoding read back"
                );
            }
            st.raw = Some(Arc::new(enc));
            st.check();
        }
    }

    /// Drops what is in memory if the image holds it (partial eviction); whether anything was.
    pub(crate) fn drop_if_written(&self) -> bool {
        let mut st = self.state.lock();
        if st.resident().is_some() && st.loc.is_some() {
            assert!(
                st.pending.is_none(),
                "a buffer with a pending re-key has a place in an image"
            );
            let held = st.resident().expect("resident");
            let loc = st.loc.expect("checked above");
            st.summary = held.summary().map(Arc::new);
            // Runs only of an encoding (a built buffer would have to be encoded again), and
            // only beside a summary, which answers first.
            st.runs = match (&held, &st.summary) {
                (Resident::Encoded(enc), Some(_)) => ShedRuns::of_buffer(enc, loc).map(Arc::new),
                _ => None,
            };
            st.data = None;
            st.raw = None;
            st.check();
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
    use super::{BufAnswer, BufSlot, Resident};
    use crate::buffer::testing::{encoding, key, random_messages, seeded_rng};
    use crate::buffer::Buffer;
    use crate::buffer::EncodedBuffer;
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

    /// The answer of a buffer held in memory.
    fn held(a: BufAnswer) -> (Option<crate::msg::Msn>, Option<KeyMsgs>) {
        match a {
            BufAnswer::Held(range, point) => (range, point),
            other => panic!("a resident buffer answered {other:?}"),
        }
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
        let (_, found) = held(copy.lookup(b"xyz2").unwrap());
        assert!(matches!(found, Some(KeyMsgs::Put { msn: 2, .. })));
        assert!(held(copy.lookup(b"ab2").unwrap()).1.is_none());
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
        let keys: Vec<&[u8]> = taken.points.iter().map(|(k, _)| k.as_slice()).collect();
        assert_eq!(keys, [&b"de1"[..]]);
        assert_eq!(moved.bytes(), 0);
    }

    #[test]
    #[should_panic(expected = "outside the moved range")]
    fn a_key_the_rewrite_does_not_cover_is_caught_when_applied() {
        let moved = BufSlot::resident(buffer(&[b"ab1", b"zz"], &[]))
            .rekeyed(&RekeyPlan::new(b"ab".to_vec(), b"c".to_vec()));
        let _ = moved.data();
    }

    fn encoded(b: &Buffer) -> crate::buffer::EncodedBuffer {
        crate::buffer::EncodedBuffer::index(encoding(b), 100, 100).unwrap()
    }

    fn image_slot(b: &Buffer) -> BufSlot {
        let enc = encoded(b);
        let loc = crate::node::SubLoc {
            offset: 4096,
            stored_len: enc.raw().len() as u32,
            raw_len: enc.raw().len() as u32,
            crc: 0,
            codec: 0,
            count: 0,
        };
        BufSlot::in_image(b.bytes(), Some(enc), loc, 9)
    }

    /// A buffer read in its encoding is moved, copied, asked and written without being built;
    /// what it writes is what the built buffer, moved the same way, would write.
    #[test]
    fn an_encoded_buffer_moves_and_is_written_without_being_built() {
        let b = buffer(&[b"ab1", b"ab2", b"ab3"], &[(b"ab4", b"ab6")]);
        let slot = image_slot(&b);
        assert!(slot.is_resident());
        assert!(matches!(slot.view(), Some(Resident::Encoded(_))));
        assert_eq!(slot.range_count(), Some(1));
        assert_eq!(slot.ref_blocks(), Vec::<u64>::new());
        assert!(slot.deletes_all_of(b"ab4", b"ab5"));
        assert!(!slot.deletes_all_of(b"ab3", b"ab5"));
        let there = RekeyPlan::new(b"ab".to_vec(), b"xyz".to_vec());
        let moved = slot.rekeyed(&there);
        assert!(moved.rekey_pending());
        assert_eq!(moved.bytes(), b.bytes() + 5);
        assert_eq!(moved.longest_point_key(), 4);
        assert_eq!(moved.longest_point_in(b"xyz1", b"xyz2"), Some(4));
        let copy = moved.copy();
        // Asked: the re-key is applied to the encoding, which stays an encoding.
        let (_, found) = held(moved.lookup(b"xyz2").unwrap());
        assert!(matches!(found, Some(KeyMsgs::Put { msn: 2, .. })));
        assert!(!moved.rekey_pending());
        assert!(matches!(moved.held(), Some(Resident::Encoded(_))));
        assert_eq!(moved.longest_point_key_held(), 4);
        // Written: the same bytes as the built buffer moved the same way.
        let want = BufSlot::resident(b.clone()).rekeyed(&there);
        let Resident::Built(wb) = want.for_write() else {
            panic!("a built buffer is written built")
        };
        let Resident::Encoded(got) = copy.for_write() else {
            panic!("an encoding is written as it is")
        };
        assert_eq!(got.raw(), encoding(&wb).as_slice());
        // Changed: built first, and no longer held encoded.
        let mut moved = moved;
        let _ = moved.mutate(|b| b.add_point(b"xyz9".to_vec(), 9, PointOp::Delete));
        assert!(matches!(moved.held(), Some(Resident::Built(_))));
        assert_eq!(
            keys_of(&moved.data().unwrap()),
            [&b"xyz1"[..], b"xyz2", b"xyz3", b"xyz9", b"xyz4", b"xyz6"]
        );
    }

    /// Partial eviction drops an encoding the image holds; `data` builds one and keeps only the
    /// built form.
    #[test]
    fn an_encoding_is_dropped_or_built_never_kept_beside_the_map() {
        let b = buffer(&[b"k1", b"k2"], &[]);
        let slot = image_slot(&b);
        assert!(slot.drop_if_written());
        assert!(!slot.is_resident());
        assert!(slot.missing_at().is_some());
        slot.keep_encoding(encoded(&b));
        let mem_encoded = slot.mem();
        let built = slot.data().unwrap();
        assert_eq!(built.bytes(), b.bytes());
        assert!(matches!(slot.held(), Some(Resident::Built(_))));
        assert_eq!(
            slot.mem(),
            built.mem() + 96,
            "only the map is held: {mem_encoded}"
        );
    }

    /// A shed buffer answers a point query from its summary when that says it holds no point
    /// message for the key, with the same answer the buffer would give; otherwise, if it was
    /// held in its encoding, it names the run of its image that holds the key's messages (read
    /// and searched, exactly the buffer's answer); otherwise the query must read it. Read back,
    /// the summary and the runs go. Random buffers, held built and encoded.
    #[test]
    fn a_shed_buffer_answers_from_its_summary_or_one_run_exactly_as_the_buffer() {
        use rand::Rng;
        let mut rng = seeded_rng();
        let (mut answered, mut from_runs, mut asked) = (0, 0, 0);
        for round in 0..200 {
            let mut msn = 0;
            let n = rng.gen_range(0..150);
            // Up to 150 messages over 300 keys: buffers of one run to a few.
            let b = random_messages(&mut rng, &mut msn, n, 300);
            let image = encoded(&b);
            let built = image_slot(&b);
            let _ = built.data(); // held built, with its place in the image
            for (was_encoded, slot) in [(true, image_slot(&b)), (false, built)] {
                assert!(slot.drop_if_written());
                for i in 0..310 {
                    let k = key(i);
                    asked += 1;
                    let want = (b.range_covering(&k).map(|r| r.msn), b.point(&k).cloned());
                    match slot.lookup(&k).unwrap() {
                        BufAnswer::Held(range, point) => {
                            answered += 1;
                            assert_eq!(range, want.0, "round {round}: range delete of {i}");
                            assert_eq!(point, want.1, "round {round}: points of {i}");
                        }
                        BufAnswer::Run { range, loc, at } => {
                            assert!(was_encoded, "round {round}: runs of a built buffer");
                            assert_eq!(Some(loc), slot.missing_at());
                            from_runs += 1;
                            let run = &image.raw()[at.off as usize..(at.off + at.len) as usize];
                            assert!(run.len() < 2 * crate::node::RUN_BYTES + 400);
                            assert_eq!(crc32c::crc32c(run), at.crc);
                            let point = EncodedBuffer::find_in_run(run, &k, 100, 100, msn)
                                .unwrap_or_else(|e| panic!("round {round}: {e}"));
                            assert_eq!((range, point), want, "round {round}: run of {i}");
                        }
                        BufAnswer::Load => assert!(slot.missing_at().is_some()),
                    }
                    if was_encoded {
                        // Read back (its runs checked against it) and shed again: a run read
                        // for every key it may hold, not only the first few before it is
                        // worth loading whole.
                        slot.keep_encoding(encoded(&b));
                        assert!(slot.drop_if_written());
                    }
                }
                slot.keep_encoding(encoded(&b));
                assert!(slot.is_resident());
                assert_eq!(
                    slot.mem(),
                    encoded(&b).mem() + 96,
                    "the summary and runs are gone"
                );
            }
        }
        assert!(
            answered * 2 > asked && from_runs * 20 > asked,
            "{answered} of {asked} answered from summaries, {from_runs} from runs"
        );
    }

    /// A run that is not the one shed (a byte changed on the device) is refused by its
    /// checksum in the read path; here, the search itself refuses damaged structure.
    #[test]
    fn a_damaged_buffer_run_is_refused_by_the_search() {
        let b = buffer(&[b"k1", b"k2", b"k3"], &[]);
        let enc = encoded(&b);
        let (first, _) = enc.point_entries().next().unwrap();
        let mut run = enc.raw()[first..].to_vec();
        assert!(EncodedBuffer::find_in_run(&run, b"k2", 100, 100, 10)
            .unwrap()
            .is_some());
        // A message newer than the node allows.
        assert!(EncodedBuffer::find_in_run(&run, b"k2", 100, 100, 1).is_err());
        run[0] = 0xff; // the first key's length
        assert!(EncodedBuffer::find_in_run(&run, b"k2", 100, 100, 10).is_err());
        let mut cut = enc.raw()[first..].to_vec();
        cut.truncate(cut.len() - 1);
        assert!(EncodedBuffer::find_in_run(&cut, b"k3", 100, 100, 10).is_err());
    }

    /// A summary that does not describe what is read back is caught.
    #[test]
    #[should_panic(expected = "summary describes the messages read back")]
    fn a_summary_of_other_messages_is_caught_when_the_buffer_is_read_back() {
        let slot = image_slot(&buffer(&[b"k1"], &[]));
        assert!(slot.drop_if_written());
        // The same size, another key (the filter of one key sets 7 of its 64 bits).
        slot.keep_encoding(encoded(&buffer(&[b"k9"], &[])));
    }

    /// Deliveries spliced into an encoded buffer leave exactly the encoding, and drop exactly the
    /// references, that the same deliveries into the built buffer do (past the splice limit too).
    #[test]
    fn deliveries_spliced_into_an_encoding_match_the_built_buffer() {
        use rand::Rng;
        let mut rng = seeded_rng();
        let mut spliced = 0;
        for _ in 0..300 {
            let mut msn = 0;
            let n = rng.gen_range(0..150);
            let old = random_messages(&mut rng, &mut msn, n, 300);
            let mut enc = image_slot(&old);
            let mut built = BufSlot::resident(old);
            for round in 0..7 {
                let n = rng.gen_range(0..20);
                let (mut ranges, points) = random_messages(&mut rng, &mut msn, n, 300).into_parts();
                ranges.sort_by_key(|r| r.msn);
                let was_encoded = matches!(enc.held(), Some(Resident::Encoded(_)));
                let mut a = enc.deliver(ranges.clone(), points.clone());
                let mut b = built.deliver(ranges, points);
                a.sort_unstable();
                b.sort_unstable();
                assert_eq!(a, b, "round {round}: references dropped");
                assert_eq!(enc.bytes(), built.bytes(), "round {round}: size");
                let bytes = |s: &BufSlot| match s.for_write() {
                    Resident::Built(b) => encoding(&b),
                    Resident::Encoded(r) => r.raw().to_vec(),
                };
                let got = bytes(&enc);
                assert_eq!(got, bytes(&built), "round {round}: encoding");
                if was_encoded && matches!(enc.held(), Some(Resident::Encoded(_))) {
                    spliced += 1;
                    // The spliced encoding indexes as the one written would.
                    let again = crate::buffer::EncodedBuffer::index(got, 100, 100).unwrap();
                    assert_eq!(Some(again.counts().1), enc.range_count());
                    assert_eq!(again.longest_point_key(), enc.longest_point_key_held());
                }
            }
        }
        assert!(spliced > 500, "{spliced} deliveries spliced");
        // Cut in its encoding: both halves as the built buffer's.
        for _ in 0..200 {
            let mut msn = 0;
            let n = rng.gen_range(0..150);
            let old = random_messages(&mut rng, &mut msn, n, 300);
            let mut enc = image_slot(&old);
            let mut built = BufSlot::resident(old);
            let k = key(rng.gen_range(0..310));
            let (eu, bu) = (enc.split_off(&k), built.split_off(&k));
            assert!(matches!(eu.held(), Some(Resident::Encoded(_))));
            assert_eq!((eu.longest, bu.longest), (enc.longest, built.longest));
            for (a, b) in [(&enc, &built), (&eu, &bu)] {
                assert_eq!(a.bytes(), b.bytes());
                let Resident::Encoded(ae) = a.for_write() else {
                    panic!("an encoding cut stays encoded")
                };
                let Resident::Built(bb) = b.for_write() else {
                    panic!("a built buffer cut stays built")
                };
                let want = encoding(&bb);
                assert_eq!(ae.raw(), want.as_slice());
                let again = crate::buffer::EncodedBuffer::index(want, 100, 100).unwrap();
                assert_eq!(again.counts(), ae.counts());
                assert_eq!(again.longest_point_key(), ae.longest_point_key());
            }
        }
        // Taken out of an encoding: what the built buffer gives.
        let mut msn = 0;
        let old = random_messages(&mut rng, &mut msn, 200, 300);
        let mut enc = image_slot(&old);
        let mut built = BufSlot::resident(old);
        let (a, b) = (enc.take(), built.take());
        assert_eq!((a.ranges, a.points), (b.ranges, b.points));
        assert_eq!((a.max_msn, a.bytes), (b.max_msn, b.bytes));
        assert!(a.longest <= b.longest);
        assert_eq!(enc.bytes(), 0);
        assert_eq!(enc.resident_max_msn(), Some(b.max_msn));
    }
}
