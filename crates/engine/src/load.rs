//! Loading a checkpoint at open: the superblock copies, the block translation table, the allocator
//! (table extents and backup superblocks reserved) and an empty tree over them (read-only if the
//! open is). Nothing is written.

use std::collections::HashMap;
use std::sync::Arc;

use amaranth_device::BlockDevice;

use crate::config::Options;
use crate::copies::Located;
use crate::datatable::{DataTable, RunMap};
use crate::error::{Error, Result};
use crate::node::NodeId;
use crate::noderefs::NodeRefs;
use crate::store::{self, Allocator, Btt, DecodedBtt, Store};
use crate::superblock::{Extent, Superblock, LIFTED_VERSION};
use crate::tree::Tree;

/// A checkpoint read from the device.
pub(crate) struct Loaded {
    /// What the superblock copies hold.
    pub located: Located,
    /// The superblock to continue from.
    pub sb: Superblock,
    /// The tree, no node loaded yet.
    pub tree: Tree,
}

/// Reads the superblock copies, the table, and builds the allocator and an empty tree.
pub(crate) fn load_checkpoint(dev: &Arc<dyn BlockDevice>, options: &Options) -> Result<Loaded> {
    let located = Superblock::locate(&**dev, options.fallback_superblock)?;
    for line in located.describe() {
        log::warn!("amaranth engine: {line}");
    }
    let sb = located.sb.clone();
    if sb.version < LIFTED_VERSION {
        // Older images store full keys: the tree code reads only lifted nodes (§2.4 of
        // docs/SURGERY.md), read-only opens included.
        return Err(Error::UnsupportedVersion {
            found: sb.version,
            supported: crate::superblock::FORMAT_VERSION,
        });
    }
    let format = sb.format()?;
    options.validate(&format)?;
    let ((table, counts), catalog) = read_table_with_catalog(dev, &sb)?;
    let data = read_data_table(dev, &sb)?;
    let alloc = build_allocator(&sb, &table, &data)?;
    let btt = Btt {
        current: table.clone(),
        checkpointed: table,
        in_progress: None,
        checkpoint_held: Default::default(),
        writing: 0,
        checkpointed_table: Some(sb.btt),
        refs: NodeRefs::from_counts(counts),
        refs_in_progress: None,
        alloc,
    };
    let store = Arc::new(Store::new(
        dev.clone(),
        btt,
        DataTable::new(data, sb.data_table),
    ));
    let mut tree = Tree::new(
        format.clone(),
        store,
        options.cache_size,
        sb.next_node_id,
        sb.next_msn,
    );
    tree.check_invariants |= options.check_invariants;
    *tree.snapshots.lock() = catalog;
    // A read-only open writes nothing, not even the nodes that replaying the log dirtied.
    tree.set_read_only(options.read_only);
    Ok(Loaded { located, sb, tree })
}

pub(crate) fn read_table(dev: &Arc<dyn BlockDevice>, sb: &Superblock) -> Result<DecodedBtt> {
    read_table_with_catalog(dev, sb).map(|(t, _)| t)
}

/// The table of `sb`'s checkpoint and its snapshot catalog (empty without snapshots), each
/// snapshot's root checked to be in the table.
pub(crate) fn read_table_with_catalog(
    dev: &Arc<dyn BlockDevice>,
    sb: &Superblock,
) -> Result<(DecodedBtt, crate::snapshot::Catalog)> {
    let mut raw = amaranth_device::AlignedBuf::zeroed(sb.btt.len());
    dev.read_at(sb.btt.offset(), &mut raw)
        .map_err(|e| Error::io("reading block translation table", e))?;
    let table_len = 32 + sb.btt_count as usize * 24;
    if table_len > raw.len() || store::table_crc(&raw[..table_len]) != sb.btt_crc {
        return Err(Error::Checksum {
            what: "block translation table".into(),
            offset: sb.btt.offset(),
        });
    }
    let table = store::decode_btt(
        &raw,
        sb.btt_count,
        sb.data_start_block(),
        sb.device_blocks,
        sb.btt.offset(),
    )?;
    if !table.0.contains_key(&sb.root_id) {
        return Err(Error::Corrupt(
            "the block translation table has no root".into(),
        ));
    }
    let catalog = store::decode_btt_catalog(&raw, sb.btt_count)?;
    for (name, e) in &catalog.entries {
        if !table.0.contains_key(&e.root) || e.root == sb.root_id {
            return Err(Error::Corrupt(format!(
                "snapshot {name:?} names root node {}, which the table does not hold",
                e.root
            )));
        }
    }
    Ok((table, catalog))
}

/// The data table of `sb`'s checkpoint (empty in a format-3 image, which has none).
pub(crate) fn read_data_table(dev: &Arc<dyn BlockDevice>, sb: &Superblock) -> Result<RunMap> {
    let Some(ext) = sb.data_table else {
        return Ok(RunMap::default());
    };
    let mut raw = amaranth_device::AlignedBuf::zeroed(ext.len());
    dev.read_at(ext.offset(), &mut raw)
        .map_err(|e| Error::io("reading the data table", e))?;
    let len = RunMap::encoded_len(sb.data_table_runs);
    if len > raw.len() || store::table_crc(&raw[..len]) != sb.data_table_crc {
        return Err(Error::Checksum {
            what: "data table".into(),
            offset: ext.offset(),
        });
    }
    RunMap::decode(
        &raw,
        sb.data_table_runs,
        sb.data_start_block(),
        sb.device_blocks,
        ext.offset(),
    )
}

/// Free space: the data area less the table's extents, the table itself, the data table, the
/// blocks it counts references to, and the backup copies.
pub(crate) fn build_allocator(
    sb: &Superblock,
    table: &HashMap<NodeId, Extent>,
    data: &RunMap,
) -> Result<Allocator> {
    let mut alloc = Allocator::new(sb.data_start_block(), sb.device_blocks);
    let mut claimed: Vec<(u64, Extent)> = table.iter().map(|(id, e)| (*id, *e)).collect();
    claimed.sort_by_key(|(_, e)| e.block);
    for (id, e) in claimed.iter().copied().chain(std::iter::once((0, sb.btt))) {
        if id >= sb.next_node_id {
            return Err(Error::Corrupt(format!(
                "node id {id} is not below the next id {}",
                sb.next_node_id
            )));
        }
        if !alloc.claim(e) {
            return Err(Error::Corrupt(format!(
                "extent of node {id} (blocks {}..{}) overlaps another",
                e.block,
                e.block + e.blocks
            )));
        }
    }
    for &b in &sb.backups {
        if !alloc.claim(Extent {
            block: b,
            blocks: 1,
        }) {
            return Err(Error::Corrupt(format!(
                "a node or the table overlaps the backup superblock at block {b}"
            )));
        }
    }
    for e in sb.data_table.into_iter().chain(
        data.iter()
            .map(|(block, blocks, _)| Extent { block, blocks }),
    ) {
        if !alloc.claim(e) {
            return Err(Error::Corrupt(format!(
                "data blocks {}..{} overlap a node, a table or a backup superblock",
                e.block,
                e.block + e.blocks
            )));
        }
    }
    Ok(alloc)
}
