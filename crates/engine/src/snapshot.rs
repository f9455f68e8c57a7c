//! The snapshot catalog (docs/SURGERY.md §4.7): the snapshots the image keeps, each a name, the
//! id of its root node (a copy of the live root taken when it was made, whose children it
//! shares), the message number of its log record and the time it was taken.
//!
//! The catalog lives in memory in the tree (`Tree::snapshots`) and is changed only by the
//! log records that create and delete snapshots (tags 11 and 12), under `writers` exclusive, so
//! a checkpoint's cut copies it with the table and the counts it must agree with. It is written
//! after the block translation table, in the table's extent (BTT version 3, docs/FORMAT.md
//! "Snapshot catalog"), with a checksum and a version of its own. A replay rebuilds it from the
//! checkpoint's catalog and the records after it.

use std::collections::BTreeMap;

use crate::codec::{crc_with_hole, Dec, Enc};
use crate::error::{Error, Result};
use crate::node::NodeId;

/// The longest snapshot name, in bytes.
pub const MAX_SNAPSHOT_NAME: usize = 255;

const CATALOG_MAGIC: [u8; 4] = *b"AMSC";
const CATALOG_VERSION: u16 = 1;
const CATALOG_HEADER: usize = 16;
const CATALOG_CRC_AT: usize = 12;

/// A snapshot as [`crate::Engine::snapshots`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// Its name.
    pub name: String,
    /// When it was taken, in nanoseconds since the Unix epoch (the writer's clock).
    pub time_ns: u64,
    /// The message number of its log record: every operation acknowledged before it is in the
    /// snapshot, none after.
    pub msn: u64,
    /// The id of its root node (for tools and tests).
    pub root: NodeId,
}

/// What a snapshot holds ([`crate::Engine::snapshot_sizes`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SnapshotSizes {
    /// Nodes only the snapshot reaches.
    pub exclusive_nodes: u64,
    /// Their image bytes, plus the out-of-line blocks only they name: what deleting the
    /// snapshot gives back.
    pub exclusive_bytes: u64,
    /// Nodes it shares with the live tree or another snapshot (a shared subtree's nodes).
    pub shared_nodes: u64,
    /// Their image bytes (without the out-of-line blocks of shared leaves).
    pub shared_bytes: u64,
}

/// One catalog entry in memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub root: NodeId,
    pub msn: u64,
    pub time_ns: u64,
    /// Open views of the snapshot (in memory only): a snapshot with views is not deleted.
    pub readers: u32,
}

/// The snapshots of an image, by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Catalog {
    pub entries: BTreeMap<String, Entry>,
}

/// Checks a snapshot name: 1 to 255 bytes, no `/` and no NUL (a name is also a file name
/// where snapshots are mounted or listed), not `.` or `..`.
pub fn check_snapshot_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > MAX_SNAPSHOT_NAME {
        return Err(Error::InvalidArgument(format!(
            "a snapshot name has 1 to {MAX_SNAPSHOT_NAME} bytes, not {}",
            name.len()
        )));
    }
    if name.contains(['/', '\0']) || name == "." || name == ".." {
        return Err(Error::InvalidArgument(format!(
            "bad snapshot name {name:?} (no '/', no NUL, not '.' or '..')"
        )));
    }
    Ok(())
}

impl Catalog {
    /// The snapshots, by name.
    pub fn list(&self) -> Vec<SnapshotInfo> {
        self.entries
            .iter()
            .map(|(name, e)| SnapshotInfo {
                name: name.clone(),
                time_ns: e.time_ns,
                msn: e.msn,
                root: e.root,
            })
            .collect()
    }

    /// The root ids of every snapshot.
    pub fn roots(&self) -> Vec<NodeId> {
        self.entries.values().map(|e| e.root).collect()
    }

    /// Serialized: a 16-byte header (magic, version, count, crc32c of the whole with its own
    /// field as zeros), then per snapshot its root id, message number, time and name.
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Enc::with_capacity(CATALOG_HEADER + self.entries.len() * 64);
        e.raw(&CATALOG_MAGIC);
        e.u16(CATALOG_VERSION);
        e.u16(0);
        e.u32(self.entries.len() as u32);
        e.u32(0);
        for (name, s) in &self.entries {
            e.u64(s.root);
            e.u64(s.msn);
            e.u64(s.time_ns);
            e.bytes(name.as_bytes());
        }
        let c = crc_with_hole(&e.buf, CATALOG_CRC_AT);
        e.put_u32_at(CATALOG_CRC_AT, c);
        e.buf
    }

    /// Parses and checks a catalog written by [`Catalog::encode`].
    pub fn decode(bytes: &[u8]) -> Result<Catalog> {
        let bad = |m: String| Error::Corrupt(format!("snapshot catalog: {m}"));
        if bytes.len() < CATALOG_HEADER {
            return Err(bad("shorter than its header".into()));
        }
        let stored = u32::from_le_bytes(
            bytes[CATALOG_CRC_AT..CATALOG_CRC_AT + 4]
                .try_into()
                .expect("4 bytes"),
        );
        if crc_with_hole(bytes, CATALOG_CRC_AT) != stored {
            return Err(Error::Checksum {
                what: "snapshot catalog".into(),
                offset: 0,
            });
        }
        let mut d = Dec::new(bytes, "snapshot catalog");
        if d.raw(4)? != CATALOG_MAGIC {
            return Err(bad("bad magic".into()));
        }
        let version = d.u16()?;
        if version != CATALOG_VERSION {
            return Err(bad(format!(
                "version {version}, this build reads {CATALOG_VERSION}"
            )));
        }
        d.u16()?;
        let n = d.u32()?;
        d.u32()?;
        let mut entries = BTreeMap::new();
        for _ in 0..n {
            let root = d.u64()?;
            let msn = d.u64()?;
            let time_ns = d.u64()?;
            let name = std::str::from_utf8(d.bytes(MAX_SNAPSHOT_NAME)?)
                .map_err(|_| bad("a name that is not UTF-8".into()))?
                .to_string();
            check_snapshot_name(&name).map_err(|e| bad(e.to_string()))?;
            let e = Entry {
                root,
                msn,
                time_ns,
                readers: 0,
            };
            if entries.insert(name.clone(), e).is_some() {
                return Err(bad(format!("{name:?} listed twice")));
            }
        }
        d.finish()?;
        Ok(Catalog { entries })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalogs_round_trip_and_are_checked() {
        let mut c = Catalog::default();
        for (i, name) in ["a", "nightly-2026-11-27", "ü"].iter().enumerate() {
            c.entries.insert(
                name.to_string(),
                Entry {
                    root: 100 + i as u64,
                    msn: 7 * i as u64,
                    time_ns: 1 << 60,
                    readers: 0,
                },
            );
        }
        let enc = c.encode();
        assert_eq!(Catalog::decode(&enc).unwrap(), c);
        assert_eq!(
            Catalog::decode(&Catalog::default().encode())
                .unwrap()
                .entries
                .len(),
            0
        );
        let mut bad = enc.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert!(Catalog::decode(&bad).is_err());
        assert!(Catalog::decode(&enc[..enc.len() - 1]).is_err());
    }

    #[test]
    fn names_are_checked() {
        for ok in ["a", "2026-11-27 nightly", &"x".repeat(255)] {
            check_snapshot_name(ok).unwrap();
        }
        for bad in ["", ".", "..", "a/b", "a\0", &"x".repeat(256)] {
            assert!(matches!(
                check_snapshot_name(bad),
                Err(Error::InvalidArgument(_))
            ));
        }
    }
}
