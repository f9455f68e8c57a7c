//! Operations, batches, their validation and their encoding in log records.

use amaranth_device::BLOCK_SIZE;

pub use crate::blockdata::BlockData;
use crate::codec::{Dec, Enc};
use crate::config::Format;
use crate::dataref::DataRef;
use crate::error::{Error, Result};
use crate::msg::{Patch, PointOp};
use crate::tree::Msg;

/// One operation of a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Set `key` to `value`.
    Put {
        /// The key.
        key: Vec<u8>,
        /// The value.
        value: Vec<u8>,
    },
    /// Remove `key`.
    Delete {
        /// The key.
        key: Vec<u8>,
    },
    /// Patch the value of `key` without reading it.
    Upsert {
        /// The key.
        key: Vec<u8>,
        /// The patch.
        patch: Patch,
    },
    /// Remove every key in `[lo, hi)`.
    RangeDelete {
        /// Inclusive low bound.
        lo: Vec<u8>,
        /// Exclusive high bound.
        hi: Vec<u8>,
    },
    /// Move every key that starts with `from` to the same key with `to` in place of the prefix
    /// (keys already under `to` are overwritten when a moved key lands on them, kept otherwise).
    MovePrefix {
        /// Source prefix.
        from: Vec<u8>,
        /// Destination prefix.
        to: Vec<u8>,
    },
    /// Like [`Op::MovePrefix`] but the source stays.
    CopyPrefix {
        /// Source prefix.
        from: Vec<u8>,
        /// Destination prefix.
        to: Vec<u8>,
    },
    /// Set each key to one 4 KiB block of `data`, stored out of line: written once to its own
    /// place before the batch is logged, the tree and the log holding a 12-byte reference per
    /// block (docs/WRITEONCE.md). Keys strictly increasing, `data` 4 KiB per key.
    PutBlocks {
        /// The keys, one per block.
        keys: Vec<Vec<u8>>,
        /// The blocks.
        data: BlockData,
    },
    /// Move every key that starts with `from` to the same key with `to` in place of the prefix,
    /// into a range that must hold no key (the batch is refused otherwise): by tree surgery, at
    /// a cost proportional to the tree's height, when the keys and values under `from` take more
    /// than `copy_max` bytes; by copying them, as [`Op::MovePrefix`] does, otherwise
    /// (docs/SURGERY.md §3). The prefixes end in the same byte, below 0xff, and neither is a
    /// prefix of the other.
    RangeMove {
        /// Source prefix.
        from: Vec<u8>,
        /// Destination prefix.
        to: Vec<u8>,
        /// The most bytes of keys and values a range is copied at rather than moved by surgery.
        copy_max: u32,
    },
    /// Copy every key that starts with `from` to the same key with `to` in place of the prefix,
    /// into a range that must hold no key (the batch is refused otherwise): by grafting the
    /// source's subtrees, shared, under the destination (each gains a reference; a change to
    /// either side copies the shared nodes it reaches), at a cost proportional to the tree's
    /// height, when the keys and values under `from` take more than `copy_max` bytes; by copying
    /// them, as [`Op::CopyPrefix`] does, otherwise (docs/SURGERY.md §4.1). The prefixes follow
    /// the rules of [`Op::RangeMove`].
    RangeClone {
        /// Source prefix.
        from: Vec<u8>,
        /// Destination prefix.
        to: Vec<u8>,
        /// The most bytes of keys and values a range is copied at rather than cloned by surgery.
        copy_max: u32,
    },
    /// Takes a snapshot of the whole tree named `name` (docs/SURGERY.md §4.7): a read-only,
    /// point-in-time copy holding every operation logged before it and none after, made by
    /// copying the root node and sharing its children. Refused if the name is taken.
    SnapshotCreate {
        /// The snapshot's name (see [`crate::check_snapshot_name`]).
        name: String,
        /// When it is taken, in nanoseconds since the Unix epoch (kept in the record, so that a
        /// replay lists the same time).
        time_ns: u64,
    },
    /// Deletes the snapshot named `name`; its nodes that the tree does not share are freed in
    /// the background. Refused if there is none.
    SnapshotDelete {
        /// The snapshot's name.
        name: String,
    },
}

impl Op {
    /// Whether the operation must read the tree to be applied (prefix moves and copies, range
    /// moves).
    pub fn reads_tree(&self) -> bool {
        matches!(
            self,
            Op::MovePrefix { .. }
                | Op::CopyPrefix { .. }
                | Op::RangeMove { .. }
                | Op::RangeClone { .. }
                | Op::SnapshotCreate { .. }
                | Op::SnapshotDelete { .. }
        )
    }

    /// Bytes of user data (keys and values) the operation carries.
    pub fn user_bytes(&self) -> usize {
        match self {
            Op::Put { key, value } => key.len() + value.len(),
            Op::Delete { key } => key.len(),
            Op::Upsert { key, patch } => key.len() + patch.size(),
            Op::RangeDelete { lo, hi }
            | Op::MovePrefix { from: lo, to: hi }
            | Op::CopyPrefix { from: lo, to: hi } => lo.len() + hi.len(),
            Op::PutBlocks { keys, data } => keys.iter().map(Vec::len).sum::<usize>() + data.len(),
            Op::RangeMove { from, to, .. } | Op::RangeClone { from, to, .. } => {
                from.len() + to.len() + 4
            }
            Op::SnapshotCreate { name, .. } => name.len() + 8,
            Op::SnapshotDelete { name } => name.len(),
        }
    }

    /// Bytes the operation takes in a log record at most (see [`Batch::log_bytes`]): the data of
    /// [`Op::PutBlocks`] is not in the log, only its keys and references.
    pub fn log_bytes(&self) -> usize {
        match self {
            Op::PutBlocks { keys, .. } => {
                16 + keys
                    .iter()
                    .map(|k| k.len() + PUT_BLOCKS_PER_KEY)
                    .sum::<usize>()
            }
            _ => self.user_bytes() + 16,
        }
    }

    /// Checks sizes and arguments against the format.
    pub fn validate(&self, f: &Format) -> Result<()> {
        let key = |k: &[u8]| {
            if k.len() > f.max_key_len {
                Err(Error::KeyTooLong {
                    len: k.len(),
                    max: f.max_key_len,
                })
            } else {
                Ok(())
            }
        };
        match self {
            Op::Put { key: k, value } => {
                key(k)?;
                if value.len() > f.max_value_len {
                    return Err(Error::ValueTooLarge {
                        len: value.len(),
                        max: f.max_value_len,
                    });
                }
            }
            Op::Delete { key: k } => key(k)?,
            Op::Upsert { key: k, patch } => {
                key(k)?;
                if patch.result_len_bound() > f.max_value_len {
                    return Err(Error::ValueTooLarge {
                        len: patch.result_len_bound(),
                        max: f.max_value_len,
                    });
                }
            }
            Op::RangeDelete { lo, hi } => {
                key(lo)?;
                if hi.len() > f.max_key_len + 1 {
                    return Err(Error::KeyTooLong {
                        len: hi.len(),
                        max: f.max_key_len + 1,
                    });
                }
                if lo > hi {
                    return Err(Error::InvalidArgument(
                        "range delete with its low bound above its high bound".into(),
                    ));
                }
            }
            Op::MovePrefix { from, to } | Op::CopyPrefix { from, to } => {
                key(from)?;
                key(to)?;
                if from.starts_with(to) || to.starts_with(from) {
                    return Err(Error::InvalidArgument(
                        "a prefix cannot be moved or copied into itself".into(),
                    ));
                }
            }
            Op::PutBlocks { keys, data } => {
                if f.max_value_len < BLOCK_SIZE {
                    return Err(Error::InvalidArgument(format!(
                        "out-of-line blocks hold {BLOCK_SIZE} bytes, more than this image's \
                         largest value ({} bytes)",
                        f.max_value_len
                    )));
                }
                if keys.is_empty() || data.len() != keys.len() * BLOCK_SIZE {
                    return Err(Error::InvalidArgument(format!(
                        "{} keys for {} bytes of blocks",
                        keys.len(),
                        data.len()
                    )));
                }
                for k in keys {
                    key(k)?;
                }
                if keys.windows(2).any(|w| w[0] >= w[1]) {
                    return Err(Error::InvalidArgument(
                        "the keys of out-of-line blocks must be strictly increasing".into(),
                    ));
                }
            }
            Op::RangeMove { from, to, .. } | Op::RangeClone { from, to, .. } => {
                key(from)?;
                key(to)?;
                if from.starts_with(to) || to.starts_with(from) {
                    return Err(Error::InvalidArgument(
                        "a prefix cannot be moved into itself".into(),
                    ));
                }
                // A subtree keeps its stored keys under its new pivots only if both ranges end
                // in the same byte (docs/SURGERY.md §2.1, the move lemma).
                if from.last() != to.last() || from.last() == Some(&0xff) {
                    return Err(Error::InvalidArgument(
                        "a range move or clone needs prefixes ending in the same byte, below 0xff"
                            .into(),
                    ));
                }
            }
            Op::SnapshotCreate { name, .. } | Op::SnapshotDelete { name } => {
                crate::snapshot::check_snapshot_name(name)?
            }
        }
        Ok(())
    }

    /// Adds the messages of a simple operation to `out`, consuming it (nothing for prefix
    /// operations and empty ranges). Out-of-line blocks must have been written (placed).
    pub(crate) fn into_msgs(self, out: &mut Vec<Msg>) {
        match self {
            Op::PutBlocks { keys, data } => {
                let (start, crcs) = data
                    .placed()
                    .expect("blocks written before they are applied");
                for (i, (key, crc)) in keys.into_iter().zip(crcs).enumerate() {
                    out.push(Msg::Point {
                        key,
                        op: PointOp::PutRef(DataRef::new(start + i as u64, *crc)),
                    });
                }
            }
            op => out.extend(op.into_msg()),
        }
    }

    /// The message for a simple operation, consuming it (`None` for prefix operations and empty
    /// ranges).
    pub fn into_msg(self) -> Option<Msg> {
        Some(match self {
            Op::Put { key, value } => Msg::Point {
                key,
                op: PointOp::Put(value),
            },
            Op::Delete { key } => Msg::Point {
                key,
                op: PointOp::Delete,
            },
            Op::Upsert { key, patch } => Msg::Point {
                key,
                op: PointOp::Upsert(patch),
            },
            Op::RangeDelete { lo, hi } if lo < hi => Msg::Range { lo, hi },
            _ => return None,
        })
    }

    /// The extent an [`Op::PutBlocks`] was written to (`None` for other operations, and before).
    pub(crate) fn placed_extent(&self) -> Option<crate::superblock::Extent> {
        match self {
            Op::PutBlocks { data, .. } => {
                data.placed()
                    .map(|(block, crcs)| crate::superblock::Extent {
                        block,
                        blocks: crcs.len() as u64,
                    })
            }
            _ => None,
        }
    }

    /// The message for a simple operation (`None` for prefix operations and empty ranges).
    pub fn to_msg(&self) -> Option<Msg> {
        Some(match self {
            Op::Put { key, value } => Msg::Point {
                key: key.clone(),
                op: PointOp::Put(value.clone()),
            },
            Op::Delete { key } => Msg::Point {
                key: key.clone(),
                op: PointOp::Delete,
            },
            Op::Upsert { key, patch } => Msg::Point {
                key: key.clone(),
                op: PointOp::Upsert(patch.clone()),
            },
            Op::RangeDelete { lo, hi } if lo < hi => Msg::Range {
                lo: lo.clone(),
                hi: hi.clone(),
            },
            _ => return None,
        })
    }
}

/// A group of operations applied atomically: after a crash, all or none of them are present.
///
/// A batch only collects operations; every limit (key and value lengths, what a prefix operation
/// may make of the keys it moves, the size of a log record) is checked when it is written
/// ([`crate::Engine::write`]), so no way of building one bypasses them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Batch {
    /// The operations, applied in order.
    pub(crate) ops: Vec<Op>,
}

impl From<Vec<Op>> for Batch {
    /// A batch of `ops`, applied in order.
    fn from(ops: Vec<Op>) -> Batch {
        Batch { ops }
    }
}

impl FromIterator<Op> for Batch {
    fn from_iter<I: IntoIterator<Item = Op>>(iter: I) -> Batch {
        Batch {
            ops: iter.into_iter().collect(),
        }
    }
}

impl Extend<Op> for Batch {
    fn extend<I: IntoIterator<Item = Op>>(&mut self, iter: I) {
        self.ops.extend(iter);
    }
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Batch {
        Batch::default()
    }
    /// Adds a put.
    pub fn put(&mut self, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> &mut Batch {
        self.ops.push(Op::Put {
            key: key.into(),
            value: value.into(),
        });
        self
    }
    /// Adds a delete.
    pub fn delete(&mut self, key: impl Into<Vec<u8>>) -> &mut Batch {
        self.ops.push(Op::Delete { key: key.into() });
        self
    }
    /// Adds an upsert.
    pub fn upsert(&mut self, key: impl Into<Vec<u8>>, patch: Patch) -> &mut Batch {
        self.ops.push(Op::Upsert {
            key: key.into(),
            patch,
        });
        self
    }
    /// Adds a range delete of `[lo, hi)`.
    pub fn range_delete(&mut self, lo: impl Into<Vec<u8>>, hi: impl Into<Vec<u8>>) -> &mut Batch {
        self.ops.push(Op::RangeDelete {
            lo: lo.into(),
            hi: hi.into(),
        });
        self
    }
    /// Adds a prefix move.
    pub fn move_prefix(&mut self, from: impl Into<Vec<u8>>, to: impl Into<Vec<u8>>) -> &mut Batch {
        self.ops.push(Op::MovePrefix {
            from: from.into(),
            to: to.into(),
        });
        self
    }
    /// Adds a prefix copy.
    pub fn copy_prefix(&mut self, from: impl Into<Vec<u8>>, to: impl Into<Vec<u8>>) -> &mut Batch {
        self.ops.push(Op::CopyPrefix {
            from: from.into(),
            to: to.into(),
        });
        self
    }
    /// Adds a put of one 4 KiB block of `data` under each of `keys` (strictly increasing), stored
    /// out of line (see [`Op::PutBlocks`]); `data` is copied once, into a buffer the device writes
    /// as it is.
    pub fn put_blocks(&mut self, keys: Vec<Vec<u8>>, data: &[u8]) -> &mut Batch {
        self.ops.push(Op::PutBlocks {
            keys,
            data: BlockData::copy_from(data),
        });
        self
    }

    /// Adds a range move (see [`Op::RangeMove`]).
    pub fn range_move(
        &mut self,
        from: impl Into<Vec<u8>>,
        to: impl Into<Vec<u8>>,
        copy_max: u32,
    ) -> &mut Batch {
        self.ops.push(Op::RangeMove {
            from: from.into(),
            to: to.into(),
            copy_max,
        });
        self
    }
    /// Adds a range clone (see [`Op::RangeClone`]).
    pub fn range_clone(
        &mut self,
        from: impl Into<Vec<u8>>,
        to: impl Into<Vec<u8>>,
        copy_max: u32,
    ) -> &mut Batch {
        self.ops.push(Op::RangeClone {
            from: from.into(),
            to: to.into(),
            copy_max,
        });
        self
    }

    /// Adds `op` (any operation; the builders above are shorthands for it).
    pub fn push(&mut self, op: Op) -> &mut Batch {
        self.ops.push(op);
        self
    }
    /// Moves every operation of `other` to the end of this batch, in order (`other` is left empty).
    pub fn append(&mut self, other: &mut Batch) -> &mut Batch {
        self.ops.append(&mut other.ops);
        self
    }
    /// The operations, in the order they apply.
    pub fn ops(&self) -> &[Op] {
        &self.ops
    }
    /// Keeps the first `n` operations and drops the rest (nothing if the batch has `n` or fewer):
    /// for a caller that cuts a batch to the prefix that fits a limit.
    pub fn keep_first(&mut self, n: usize) {
        self.ops.truncate(n);
    }
    /// The value of the first put of `key` in the batch, to change in place (`None` if no put
    /// of `key` is queued): for a caller that accumulates one value, such as a counter, across
    /// the steps that build a batch, without queuing one put per step.
    pub fn put_value_mut(&mut self, key: &[u8]) -> Option<&mut Vec<u8>> {
        self.ops.iter_mut().find_map(|op| match op {
            Op::Put { key: k, value } if k.as_slice() == key => Some(value),
            _ => None,
        })
    }
    /// Number of operations.
    pub fn len(&self) -> usize {
        self.ops.len()
    }
    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
    /// Bytes the batch takes in the log at most: what [`crate::Engine::write`] compares with
    /// [`crate::Engine::max_batch_bytes`].
    pub fn log_bytes(&self) -> usize {
        record_bytes(&self.ops)
    }
}

/// Bytes a record of `ops` takes at most (its encoding is never longer).
pub(crate) fn record_bytes(ops: &[Op]) -> usize {
    16 + ops.iter().map(Op::log_bytes).sum::<usize>()
}

/// The smallest key greater than every key starting with `prefix` (`max_key_len + 1` bytes of 0xff
/// when every byte of the prefix is 0xff, which is above any valid key).
pub fn prefix_end(prefix: &[u8], max_key_len: usize) -> Vec<u8> {
    let mut p = prefix.to_vec();
    while let Some(&last) = p.last() {
        if last == 0xff {
            p.pop();
        } else {
            *p.last_mut().expect("non-empty") += 1;
            return p;
        }
    }
    vec![0xff; max_key_len + 1]
}

const TAG_PUT: u8 = 1;
const TAG_DELETE: u8 = 2;
const TAG_UPSERT: u8 = 3;
const TAG_RANGE_DELETE: u8 = 4;
const TAG_MOVE_PREFIX: u8 = 5;
const TAG_COPY_PREFIX: u8 = 6;
const TAG_GROUP_MEMBER: u8 = 7;
const TAG_GROUP_COMMIT: u8 = 8;
const TAG_PUT_BLOCKS: u8 = 13;
/// Log bytes per block of a [`Op::PutBlocks`] beyond its key: the key's length and the crc.
const PUT_BLOCKS_PER_KEY: usize = 8;
const TAG_RANGE_MOVE: u8 = 9;
const TAG_RANGE_CLONE: u8 = 10;
const TAG_SNAPSHOT_CREATE: u8 = 11;
const TAG_SNAPSHOT_DELETE: u8 = 12;
/// Bytes a group mark adds to a record (its tag and the group id).
pub(crate) const MARK_BYTES: usize = 9;

/// How a log record belongs to an atomic group (see `engine/atomic.rs`). Encoded as the record's
/// first operation (tag 7 or 8, then the group id), which produces no message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GroupMark {
    /// The record's operations are part of the group.
    Member(u64),
    /// The group is complete (a record with no operations of its own).
    Commit(u64),
}

/// Encodes a log record payload: `first_msn` (8 bytes, filled in when the record is appended), the
/// operation count, then each operation.
#[cfg(test)]
pub(crate) fn encode_record(ops: &[Op]) -> Vec<u8> {
    encode_marked_record(ops, None)
}

/// [`encode_record`] with an atomic-group mark as the first operation.
pub(crate) fn encode_marked_record(ops: &[Op], mark: Option<GroupMark>) -> Vec<u8> {
    let mut e = Enc::with_capacity(
        16 + MARK_BYTES + ops.iter().map(|o| o.user_bytes() + 16).sum::<usize>(),
    );
    e.u64(0);
    e.u32((ops.len() + usize::from(mark.is_some())) as u32);
    match mark {
        Some(GroupMark::Member(g)) => {
            e.u8(TAG_GROUP_MEMBER);
            e.u64(g);
        }
        Some(GroupMark::Commit(g)) => {
            e.u8(TAG_GROUP_COMMIT);
            e.u64(g);
        }
        None => {}
    }
    for op in ops {
        match op {
            Op::Put { key, value } => {
                e.u8(TAG_PUT);
                e.bytes(key);
                e.bytes(value);
            }
            Op::Delete { key } => {
                e.u8(TAG_DELETE);
                e.bytes(key);
            }
            Op::Upsert { key, patch } => {
                e.u8(TAG_UPSERT);
                e.bytes(key);
                patch.encode(&mut e);
            }
            Op::RangeDelete { lo, hi } => {
                e.u8(TAG_RANGE_DELETE);
                e.bytes(lo);
                e.bytes(hi);
            }
            Op::MovePrefix { from, to } => {
                e.u8(TAG_MOVE_PREFIX);
                e.bytes(from);
                e.bytes(to);
            }
            Op::CopyPrefix { from, to } => {
                e.u8(TAG_COPY_PREFIX);
                e.bytes(from);
                e.bytes(to);
            }
            Op::PutBlocks { keys, data } => {
                let (start, crcs) = data
                    .placed()
                    .expect("blocks written before they are logged");
                e.u8(TAG_PUT_BLOCKS);
                e.u64(start);
                e.u32(keys.len() as u32);
                for (k, c) in keys.iter().zip(crcs) {
                    e.bytes(k);
                    e.u32(*c);
                }
            }
            Op::RangeMove { from, to, copy_max } => {
                e.u8(TAG_RANGE_MOVE);
                e.bytes(from);
                e.bytes(to);
                e.u32(*copy_max);
            }
            Op::RangeClone { from, to, copy_max } => {
                e.u8(TAG_RANGE_CLONE);
                e.bytes(from);
                e.bytes(to);
                e.u32(*copy_max);
            }
            Op::SnapshotCreate { name, time_ns } => {
                e.u8(TAG_SNAPSHOT_CREATE);
                e.bytes(name.as_bytes());
                e.u64(*time_ns);
            }
            Op::SnapshotDelete { name } => {
                e.u8(TAG_SNAPSHOT_DELETE);
                e.bytes(name.as_bytes());
            }
        }
    }
    e.buf
}

/// The atomic-group mark of a record payload, if it has one (a payload too short to hold one has
/// none; decoding it fails later).
pub(crate) fn record_mark(payload: &[u8]) -> Option<GroupMark> {
    let id = |at: usize| -> Option<u64> {
        Some(u64::from_le_bytes(
            payload.get(at..at + 8)?.try_into().ok()?,
        ))
    };
    let count = u32::from_le_bytes(payload.get(8..12)?.try_into().ok()?);
    match (count, payload.get(12)?) {
        (1.., &TAG_GROUP_MEMBER) => id(13).map(GroupMark::Member),
        (1.., &TAG_GROUP_COMMIT) => id(13).map(GroupMark::Commit),
        _ => None,
    }
}

/// Decodes a log record payload into its first MSN and operations (an atomic-group mark, which
/// may only come first, is checked and left out).
pub fn decode_record(payload: &[u8], f: &Format) -> Result<(u64, Vec<Op>)> {
    let mut d = Dec::new(payload, "log record");
    let first_msn = d.u64()?;
    let n = d.u32()? as usize;
    if n > payload.len() {
        return Err(d.corrupt(format!("impossible operation count {n}")));
    }
    let mut ops = Vec::with_capacity(n);
    let (mk, mv) = (f.max_key_len + 1, f.max_value_len);
    for i in 0..n {
        let op = match d.u8()? {
            TAG_GROUP_MEMBER | TAG_GROUP_COMMIT if i == 0 => {
                d.u64()?;
                continue;
            }
            TAG_PUT => Op::Put {
                key: d.bytes(mk)?.to_vec(),
                value: d.bytes(mv)?.to_vec(),
            },
            TAG_DELETE => Op::Delete {
                key: d.bytes(mk)?.to_vec(),
            },
            TAG_UPSERT => Op::Upsert {
                key: d.bytes(mk)?.to_vec(),
                patch: Patch::decode(&mut d, mv)?,
            },
            TAG_RANGE_DELETE => Op::RangeDelete {
                lo: d.bytes(mk)?.to_vec(),
                hi: d.bytes(mk)?.to_vec(),
            },
            TAG_MOVE_PREFIX => Op::MovePrefix {
                from: d.bytes(mk)?.to_vec(),
                to: d.bytes(mk)?.to_vec(),
            },
            TAG_COPY_PREFIX => Op::CopyPrefix {
                from: d.bytes(mk)?.to_vec(),
                to: d.bytes(mk)?.to_vec(),
            },
            TAG_PUT_BLOCKS => {
                let start = d.u64()?;
                let n = d.u32()? as usize;
                if n == 0 || n > d.remaining() {
                    return Err(d.corrupt(format!("impossible block count {n}")));
                }
                let mut keys = Vec::with_capacity(n);
                let mut crcs = Vec::with_capacity(n);
                for _ in 0..n {
                    keys.push(d.bytes(mk)?.to_vec());
                    crcs.push(d.u32()?);
                }
                Op::PutBlocks {
                    keys,
                    data: BlockData::placed_at(start, crcs),
                }
            }
            TAG_RANGE_MOVE => Op::RangeMove {
                from: d.bytes(mk)?.to_vec(),
                to: d.bytes(mk)?.to_vec(),
                copy_max: d.u32()?,
            },
            TAG_RANGE_CLONE => Op::RangeClone {
                from: d.bytes(mk)?.to_vec(),
                to: d.bytes(mk)?.to_vec(),
                copy_max: d.u32()?,
            },
            TAG_SNAPSHOT_CREATE => Op::SnapshotCreate {
                name: snapshot_name(&mut d)?,
                time_ns: d.u64()?,
            },
            TAG_SNAPSHOT_DELETE => Op::SnapshotDelete {
                name: snapshot_name(&mut d)?,
            },
            t => return Err(d.corrupt(format!("unknown operation tag {t}"))),
        };
        op.validate(f)
            .map_err(|e| Error::Corrupt(format!("log record holds an invalid operation: {e}")))?;
        ops.push(op);
    }
    d.finish()?;
    Ok((first_msn, ops))
}

/// A snapshot name in a log record.
fn snapshot_name(d: &mut Dec<'_>) -> Result<String> {
    let b = d.bytes(crate::snapshot::MAX_SNAPSHOT_NAME)?;
    match std::str::from_utf8(b) {
        Ok(s) => Ok(s.to_string()),
        Err(_) => Err(d.corrupt("a snapshot name that is not UTF-8")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_methods_keep_order_and_edit_in_place() {
        let mut b = Batch::new();
        b.put(b"n".to_vec(), vec![1]).delete(b"x".to_vec());
        b.push(Op::Put {
            key: b"n".to_vec(),
            value: vec![2],
        });
        let mut more = Batch::from(vec![Op::Delete { key: b"y".to_vec() }]);
        b.append(&mut more);
        assert!(more.is_empty());
        assert_eq!(b.len(), 4);
        assert_eq!(b.ops()[3], Op::Delete { key: b"y".to_vec() });
        // The first put of a key is the one changed.
        b.put_value_mut(b"n").expect("a put of n").push(9);
        assert_eq!(
            b.ops()[0],
            Op::Put {
                key: b"n".to_vec(),
                value: vec![1, 9],
            }
        );
        assert!(b.put_value_mut(b"x").is_none(), "a delete is not a put");
        b.keep_first(2);
        assert_eq!(b.ops().len(), 2);
        b.keep_first(5);
        assert_eq!(b.len(), 2);
        let c: Batch = b.ops().iter().cloned().collect();
        assert_eq!(c, b);
    }

    #[test]
    fn record_round_trip() {
        let f = Format::small_for_tests();
        let ops = vec![
            Op::Put {
                key: b"a".to_vec(),
                value: b"1".to_vec(),
            },
            Op::Delete { key: b"b".to_vec() },
            Op::Upsert {
                key: b"c".to_vec(),
                patch: Patch::Write {
                    offset: 3,
                    data: b"xy".to_vec(),
                },
            },
            Op::RangeDelete {
                lo: b"d".to_vec(),
                hi: b"e".to_vec(),
            },
            Op::MovePrefix {
                from: b"f/".to_vec(),
                to: b"g/".to_vec(),
            },
            Op::RangeMove {
                from: b"h/".to_vec(),
                to: b"ij/".to_vec(),
                copy_max: 4 << 20,
            },
            Op::RangeClone {
                from: b"k/".to_vec(),
                to: b"lm/".to_vec(),
                copy_max: 7,
            },
            Op::SnapshotCreate {
                name: "nightly".into(),
                time_ns: 1 << 62,
            },
            Op::SnapshotDelete { name: "ü".into() },
        ];
        let mut rec = encode_record(&ops);
        rec[..8].copy_from_slice(&42u64.to_le_bytes());
        assert_eq!(decode_record(&rec, &f).unwrap(), (42, ops));
        assert!(decode_record(&rec[..rec.len() - 1], &f).is_err());
        assert_eq!(record_mark(&rec), None);
    }

    #[test]
    fn group_marks_round_trip_and_come_only_first() {
        let f = Format::small_for_tests();
        let ops = vec![Op::Put {
            key: b"a".to_vec(),
            value: b"1".to_vec(),
        }];
        let member = encode_marked_record(&ops, Some(GroupMark::Member(7)));
        assert_eq!(record_mark(&member), Some(GroupMark::Member(7)));
        assert_eq!(decode_record(&member, &f).unwrap(), (0, ops.clone()));
        let commit = encode_marked_record(&[], Some(GroupMark::Commit(7)));
        assert_eq!(record_mark(&commit), Some(GroupMark::Commit(7)));
        assert_eq!(decode_record(&commit, &f).unwrap(), (0, vec![]));
        // A mark after an operation is not a mark: the record does not decode.
        let mut late = encode_record(&ops);
        late[8..12].copy_from_slice(&2u32.to_le_bytes());
        late.push(TAG_GROUP_COMMIT);
        late.extend_from_slice(&7u64.to_le_bytes());
        assert!(decode_record(&late, &f).is_err());
        assert_eq!(record_mark(&late), None);
        assert_eq!(record_mark(&member[..15]), None);
    }

    #[test]
    fn the_record_estimate_bounds_the_encoding() {
        let ops = vec![
            Op::Put {
                key: vec![1; 300],
                value: vec![2; 4096],
            },
            Op::Upsert {
                key: vec![3; 20],
                patch: Patch::Write {
                    offset: 7,
                    data: vec![4; 100],
                },
            },
            Op::Upsert {
                key: vec![3; 20],
                patch: Patch::Truncate { len: 9 },
            },
            Op::Delete { key: vec![5; 9] },
            Op::MovePrefix {
                from: b"a".to_vec(),
                to: b"bcd".to_vec(),
            },
            Op::RangeMove {
                from: b"a/".to_vec(),
                to: b"bcd/".to_vec(),
                copy_max: u32::MAX,
            },
            Op::RangeClone {
                from: b"a/".to_vec(),
                to: b"bcd/".to_vec(),
                copy_max: u32::MAX,
            },
        ];
        assert!(encode_record(&ops).len() <= record_bytes(&ops));
        for op in &ops {
            assert!(
                encode_record(std::slice::from_ref(op)).len()
                    <= record_bytes(std::slice::from_ref(op))
            );
        }
    }

    #[test]
    fn range_moves_are_validated() {
        let f = Format::small_for_tests();
        let mv = |from: &[u8], to: &[u8]| Op::RangeMove {
            from: from.to_vec(),
            to: to.to_vec(),
            copy_max: 0,
        };
        assert!(mv(b"a/", b"bb/").validate(&f).is_ok());
        for bad in [
            mv(b"a/", b"a/b/"),
            mv(b"a/b/", b"a/"),
            mv(b"a/", b"b\x00"),
            mv(b"a\xff", b"b\xff"),
            mv(b"", b"b/"),
        ] {
            assert!(
                matches!(bad.validate(&f), Err(Error::InvalidArgument(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end(b"ab", 8), b"ac".to_vec());
        assert_eq!(prefix_end(b"a\xff", 8), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff", 3), vec![0xff; 4]);
    }
}
