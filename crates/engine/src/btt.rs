//! The block translation table (BTT): which extent holds each node's image, in three versions
//! (`current`, `checkpointed`, `in_progress`; see `store.rs`), the nodes' reference counts
//! (`noderefs.rs`), the images held until the next checkpoint completes, and the table's
//! encoding (docs/FORMAT.md, "Block translation table").

use std::collections::HashMap;

use amaranth_device::AlignedBuf;

use crate::codec::{crc_with_hole, Dec, Enc};
use crate::error::{Error, Result};
use crate::node::{NodeId, ROOT_ID};
use crate::noderefs::NodeRefs;
use crate::store::Allocator;
use crate::superblock::Extent;

/// The three versions of the block translation table, and the allocator they govern.
#[derive(Debug)]
pub struct Btt {
    /// Newest written image of each node.
    pub current: HashMap<NodeId, Extent>,
    /// What the last completed checkpoint references.
    pub checkpointed: HashMap<NodeId, Extent>,
    /// What the checkpoint being written will reference.
    pub in_progress: Option<HashMap<NodeId, Extent>>,
    /// On-disk copy of `checkpointed`.
    pub checkpointed_table: Option<Extent>,
    /// Free space.
    pub alloc: Allocator,
    /// Images held only until the next checkpoint completes.
    pub checkpoint_held: CheckpointHeld,
    /// Blocks allocated for node images being written and not yet recorded in a table: the
    /// node still counts them as its next image (see `SpaceUse::writing`).
    pub writing: u64,
    /// Every node's reference count (docs/SURGERY.md §4.2).
    pub refs: NodeRefs,
    /// The counts the checkpoint being written records (those of its cut), other than 1.
    pub refs_in_progress: Option<HashMap<NodeId, u32>>,
}

/// The space held only until the next checkpoint completes: it is freed then, so the space
/// reported used leaves it out (see `SpaceUse::checkpoint_held`).
#[derive(Debug, Default)]
pub struct CheckpointHeld {
    /// Blocks of the images only the last completed checkpoint references (the node was
    /// rewritten since, by a write-back or by the running checkpoint): the next completion frees
    /// them.
    replaced: u64,
    /// Images it wrote that modifiers saved for it, by node, while the node is still at the
    /// extent it was at when the image was saved: at completion the node becomes current at
    /// the saved image and its older image is freed (`Tree::adopt_checkpoint_images`).
    saved: HashMap<NodeId, u64>,
    saved_blocks: u64,
}

impl CheckpointHeld {
    /// Blocks held in all.
    pub fn blocks(&self) -> u64 {
        self.replaced + self.saved_blocks
    }

    fn forget_saved(&mut self, id: NodeId) {
        if let Some(b) = self.saved.remove(&id) {
            self.saved_blocks -= b;
        }
    }
}

impl Btt {
    /// An empty table (a new image) over the free space `alloc`.
    pub fn empty(alloc: Allocator) -> Btt {
        Btt {
            current: HashMap::new(),
            checkpointed: HashMap::new(),
            in_progress: None,
            checkpoint_held: Default::default(),
            writing: 0,
            checkpointed_table: None,
            refs: NodeRefs::default(),
            refs_in_progress: None,
            alloc,
        }
    }

    fn referenced(&self, id: NodeId, e: Extent) -> bool {
        self.current.get(&id) == Some(&e)
            || self.checkpointed.get(&id) == Some(&e)
            || self
                .in_progress
                .as_ref()
                .is_some_and(|m| m.get(&id) == Some(&e))
    }

    /// Frees `e` (once held by node `id`) if no version of the table references it any more.
    pub fn release(&mut self, id: NodeId, e: Extent) {
        if !self.referenced(id, e) {
            self.alloc.free(e);
        }
    }

    /// Records that node `id`'s newest image is at `e`.
    pub fn relocate(&mut self, id: NodeId, e: Extent) {
        let mut old = None;
        self.change_entry(id, |b| old = b.current.insert(id, e));
        if let Some(old) = old {
            if old != e {
                // A saved image is no longer adopted once the node is elsewhere.
                self.checkpoint_held.forget_saved(id);
                self.release(id, old);
            }
        }
    }

    /// Records that the running checkpoint wrote the image a modifier saved for node `id` at
    /// `ext`, the node having been at `was_at` when it was saved.
    pub fn checkpoint_wrote_saved(&mut self, id: NodeId, ext: Extent, was_at: Option<Extent>) {
        self.set_in_progress(id, ext);
        self.hold_for_adoption(id, ext, was_at);
    }

    /// Counts `ext`, an image of node `id` only the running checkpoint references, as held until
    /// it completes if the node is still at `was_at` (its extent when the image was taken): the
    /// node then becomes current at `ext` and its older image is freed.
    pub fn hold_for_adoption(&mut self, id: NodeId, ext: Extent, was_at: Option<Extent>) {
        if self.current.get(&id).copied() == was_at {
            let held = &mut self.checkpoint_held;
            held.forget_saved(id);
            held.saved.insert(id, ext.blocks);
            held.saved_blocks += ext.blocks;
        }
    }

    /// An image written at `ext` ([`Store::write_placed`]) is recorded in a table or released.
    pub fn written(&mut self, ext: Extent) {
        assert!(
            self.writing >= ext.blocks,
            "more images settled than written"
        );
        self.writing -= ext.blocks;
    }

    /// Blocks of node `id`'s image in the last completed checkpoint if only that checkpoint
    /// references it.
    fn only_checkpointed(&self, id: NodeId) -> u64 {
        match self.checkpointed.get(&id) {
            Some(e)
                if self.current.get(&id) != Some(e)
                    && self
                        .in_progress
                        .as_ref()
                        .is_none_or(|m| m.get(&id) != Some(e)) =>
            {
                e.blocks
            }
            _ => 0,
        }
    }

    /// Applies `change` to the tables' entries for node `id`, keeping the count of blocks only
    /// the last completed checkpoint references.
    fn change_entry(&mut self, id: NodeId, change: impl FnOnce(&mut Btt)) {
        let before = self.only_checkpointed(id);
        change(self);
        let after = self.only_checkpointed(id);
        self.checkpoint_held.replaced = self.checkpoint_held.replaced - before + after;
    }

    /// Records that the running checkpoint's table references node `id` at `ext`.
    pub fn set_in_progress(&mut self, id: NodeId, ext: Extent) {
        self.change_entry(id, |b| {
            b.in_progress
                .as_mut()
                .expect("checkpoint in progress")
                .insert(id, ext);
        });
    }

    /// Blocks of the images only the last completed checkpoint references, counted afresh.
    fn recount_only_checkpointed(&self) -> u64 {
        self.checkpointed
            .iter()
            .filter(|&(id, e)| {
                self.current.get(id) != Some(e)
                    && self
                        .in_progress
                        .as_ref()
                        .is_none_or(|m| m.get(id) != Some(e))
            })
            .map(|(_, e)| e.blocks)
            .sum()
    }

    /// Forgets node `id` (merged away, or dead and collected).
    pub fn remove(&mut self, id: NodeId) {
        self.refs.forget(id);
        self.checkpoint_held.forget_saved(id);
        let mut old = None;
        self.change_entry(id, |b| old = b.current.remove(&id));
        if let Some(old) = old {
            self.release(id, old);
        }
    }

    /// Makes `in_progress` the checkpointed table, freeing what only the old one referenced.
    pub fn complete_checkpoint(&mut self, table: Extent) {
        assert_eq!(
            self.checkpoint_held.replaced,
            self.recount_only_checkpointed(),
            "the images only the last checkpoint references differ from a recount"
        );
        let new = self.in_progress.take().expect("a checkpoint in progress");
        self.refs_in_progress = None;
        let old = std::mem::replace(&mut self.checkpointed, new);
        let free_before = self.alloc.free_blocks();
        for (id, e) in old {
            self.release(id, e);
        }
        assert_eq!(
            self.alloc.free_blocks() - free_before,
            self.checkpoint_held.replaced,
            "a completed checkpoint freed other than the images only the last one referenced"
        );
        // Nodes written back while it ran, at images it does not reference: their images in
        // it are held until the next one.
        self.checkpoint_held = CheckpointHeld {
            replaced: self.recount_only_checkpointed(),
            ..CheckpointHeld::default()
        };
        if let Some(t) = self.checkpointed_table.replace(table) {
            self.alloc.free(t);
        }
    }

    /// Drops an unfinished checkpoint's table, freeing what only it referenced.
    pub fn abort_checkpoint(&mut self, table: Option<Extent>) {
        self.checkpoint_held.saved.clear();
        self.checkpoint_held.saved_blocks = 0;
        self.refs_in_progress = None;
        if let Some(m) = self.in_progress.take() {
            for (id, e) in m {
                self.release(id, e);
            }
        }
        if let Some(t) = table {
            self.alloc.free(t);
        }
        // Images the last completed checkpoint references stay held until the next one.
        self.checkpoint_held.replaced = self.recount_only_checkpointed();
    }
}

const BTT_MAGIC: [u8; 4] = *b"AMBT";
/// Tables whose reference counts are all 1 (nothing shared, nothing dead); what every image
/// held before reference counts existed, and what is still written when no count differs.
const BTT_VERSION_UNSHARED: u16 = 1;
/// Tables with reference counts: 0 for a dead node awaiting collection, above 1 for a shared one.
const BTT_VERSION: u16 = 2;
/// Version 2 followed by a snapshot catalog (`snapshot.rs`), whose length the header holds at
/// [`BTT_CATALOG_AT`]: written only while the image has snapshots, so that builds from before
/// snapshots refuse such an image and read any other.
const BTT_VERSION_SNAPSHOTS: u16 = 3;
const BTT_CATALOG_AT: usize = 20;
const BTT_HEADER: usize = 32;
const BTT_CRC_AT: usize = 16;

/// Serializes a table: a 32-byte header, then `(node id, block, blocks, reference count)` per
/// node; `counts` holds the counts other than 1. Version 1 when there are none (a build from
/// before reference counts reads it), else version 2.
pub fn encode_btt(map: &HashMap<NodeId, Extent>, counts: &HashMap<NodeId, u32>) -> AlignedBuf {
    encode_btt_with_catalog(map, counts, None)
}

/// [`encode_btt`] followed by an encoded snapshot catalog (version 3) when there is one: the
/// table's checksum covers the header (with the catalog's length) and the entries, the catalog
/// has its own.
pub fn encode_btt_with_catalog(
    map: &HashMap<NodeId, Extent>,
    counts: &HashMap<NodeId, u32>,
    catalog: Option<&[u8]>,
) -> AlignedBuf {
    let mut entries: Vec<(&NodeId, &Extent)> = map.iter().collect();
    entries.sort();
    let version = if catalog.is_some() {
        BTT_VERSION_SNAPSHOTS
    } else if counts.keys().any(|id| map.contains_key(id)) {
        BTT_VERSION
    } else {
        BTT_VERSION_UNSHARED
    };
    let mut e = Enc::with_capacity(BTT_HEADER + entries.len() * 24);
    e.raw(&BTT_MAGIC);
    e.u16(version);
    e.u16(0);
    e.u64(entries.len() as u64);
    e.u32(0); // crc at 16
    e.u32(catalog.map_or(0, |c| c.len() as u32)); // at BTT_CATALOG_AT
    e.raw(&[0u8; 8]);
    for (id, ext) in entries {
        e.u64(*id);
        e.u64(ext.block);
        e.u32(ext.blocks as u32);
        e.u32(counts.get(id).copied().unwrap_or(1));
    }
    let c = crc_with_hole(&e.buf, BTT_CRC_AT);
    e.put_u32_at(BTT_CRC_AT, c);
    if let Some(cat) = catalog {
        e.raw(cat);
    }
    AlignedBuf::from_slice(&e.buf)
}

/// The snapshot catalog after a table that [`decode_btt`] accepted (`count` entries): empty
/// unless the table is version 3.
pub(crate) fn decode_btt_catalog(bytes: &[u8], count: u64) -> Result<crate::snapshot::Catalog> {
    if u16::from_le_bytes([bytes[4], bytes[5]]) != BTT_VERSION_SNAPSHOTS {
        return Ok(Default::default());
    }
    let len = u32::from_le_bytes(
        bytes[BTT_CATALOG_AT..BTT_CATALOG_AT + 4]
            .try_into()
            .expect("4 bytes"),
    ) as usize;
    let at = BTT_HEADER + count as usize * 24;
    let cat = bytes
        .get(at..at + len)
        .ok_or_else(|| Error::Corrupt("snapshot catalog beyond its table's extent".into()))?;
    crate::snapshot::Catalog::decode(cat)
}

/// A table as read: each node's extent, and the reference counts other than 1.
pub type DecodedBtt = (HashMap<NodeId, Extent>, HashMap<NodeId, u32>);

/// Parses and verifies a table read from `offset`.
pub fn decode_btt(
    bytes: &[u8],
    count: u64,
    data_start: u64,
    dev_blocks: u64,
    offset: u64,
) -> Result<DecodedBtt> {
    let len = BTT_HEADER
        + usize::try_from(count)
            .ok()
            .and_then(|c| c.checked_mul(24))
            .ok_or_else(|| Error::Corrupt("table size".into()))?;
    if len > bytes.len() {
        return Err(Error::Corrupt(
            "block translation table longer than its extent".into(),
        ));
    }
    let stored = u32::from_le_bytes(
        bytes[BTT_CRC_AT..BTT_CRC_AT + 4]
            .try_into()
            .expect("4 bytes"),
    );
    if crc_with_hole(&bytes[..len], BTT_CRC_AT) != stored {
        return Err(Error::Checksum {
            what: "block translation table".into(),
            offset,
        });
    }
    let mut d = Dec::new(&bytes[..len], "block translation table");
    if d.raw(4)? != BTT_MAGIC {
        return Err(Error::Corrupt("block translation table: bad magic".into()));
    }
    let version = d.u16()?;
    if !(BTT_VERSION_UNSHARED..=BTT_VERSION_SNAPSHOTS).contains(&version) {
        return Err(Error::Corrupt(format!(
            "block translation table: version {version}, this build reads 1 to 3"
        )));
    }
    d.u16()?;
    if d.u64()? != count {
        return Err(Error::Corrupt(
            "block translation table: count differs from the superblock".into(),
        ));
    }
    d.raw(16)?;
    let mut map = HashMap::with_capacity(count as usize);
    let mut counts = HashMap::new();
    for _ in 0..count {
        let id = d.u64()?;
        let block = d.u64()?;
        let blocks = d.u32()? as u64;
        let refcount = d.u32()?;
        let count_ok = refcount == 1 || version >= BTT_VERSION && id != ROOT_ID;
        if !count_ok || blocks == 0 || block < data_start || block + blocks > dev_blocks {
            return Err(Error::Corrupt(format!(
                "block translation table: bad entry for node {id}"
            )));
        }
        if map.insert(id, Extent { block, blocks }).is_some() {
            return Err(Error::Corrupt(format!(
                "block translation table: node {id} listed twice"
            )));
        }
        if refcount != 1 {
            counts.insert(id, refcount);
        }
    }
    Ok((map, counts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn btt_versions_keep_extents_alive() {
        let mut b = Btt::empty(Allocator::new(0, 100));
        let e1 = b.alloc.alloc(4).unwrap();
        b.relocate(7, e1);
        b.in_progress = Some(b.current.clone());
        let e2 = b.alloc.alloc(4).unwrap();
        b.relocate(7, e2);
        // e1 is still referenced by the checkpoint in progress.
        assert_eq!(b.alloc.free_blocks(), 92);
        let t = b.alloc.alloc(1).unwrap();
        b.complete_checkpoint(t);
        assert_eq!(b.alloc.free_blocks(), 91);
        b.in_progress = Some(b.current.clone());
        let t2 = b.alloc.alloc(1).unwrap();
        b.complete_checkpoint(t2);
        // e1 is referenced by nothing now; the old table was freed.
        assert_eq!(b.alloc.free_blocks(), 96 - 1);
        let none = HashMap::new();
        let enc = encode_btt(&b.checkpointed, &none);
        assert_eq!(enc[4], 1, "a table without counts is version 1");
        let back = decode_btt(&enc, 1, 0, 100, 0).unwrap();
        assert_eq!(back, (b.checkpointed.clone(), none));
        // A count other than 1 makes a version-2 table, read back the same.
        let id = *b.checkpointed.keys().next().unwrap();
        let counts: HashMap<NodeId, u32> = [(id, 0)].into();
        let enc2 = encode_btt(&b.checkpointed, &counts);
        assert_eq!(enc2[4], 2);
        assert_eq!(
            decode_btt(&enc2, 1, 0, 100, 0).unwrap(),
            (b.checkpointed.clone(), counts)
        );
        let mut newer = enc2[..BTT_HEADER + 24].to_vec();
        newer[4] = 4;
        let c = crc_with_hole(&newer, BTT_CRC_AT);
        newer[BTT_CRC_AT..BTT_CRC_AT + 4].copy_from_slice(&c.to_le_bytes());
        let err = decode_btt(&newer, 1, 0, 100, 0).unwrap_err().to_string();
        assert!(err.contains("version 4"), "{err}");
        let mut bad = enc.to_vec();
        bad[BTT_HEADER + 3] ^= 1;
        assert!(decode_btt(&bad, 1, 0, 100, 0).is_err());
    }
}
