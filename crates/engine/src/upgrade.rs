//! `amaranth upgrade`: rewrites a format-1 or format-2 image (full keys, node layout 1) as a
//! format-3 image (keys lifted, node layout 2), docs/SURGERY.md §2.4, then makes a format-3 image
//! format 4 (an empty data table, docs/WRITEONCE.md): an open and a close, whose checkpoint
//! writes the table and the new superblock (a read-write open of a format-3 image does the same).
//!
//! The last checkpoint's tree is walked depth first from the root with each node's [`Bounds`],
//! using only the node image code (parse, build, re-lift, serialize), never the tree's hot paths.
//! Every node is written lifted to free space under its own id, then a new block translation table,
//! then a superblock of version 3 one generation on. Nothing of the old checkpoint is overwritten
//! before that superblock is durable (copy-on-write), so a crash leaves the old image as it was,
//! and the upgrade runs again from the start. The log is left as it is: the image must have been
//! closed cleanly, so nothing in it is replayed.

use std::collections::HashMap;
use std::sync::Arc;

use amaranth_device::{AlignedBuf, BlockDevice};

use crate::config::{Compression, Options};
use crate::datatable::RunMap;
use crate::error::{Error, Result};
use crate::load::{build_allocator, read_data_table, read_table};
use crate::node::{self, Body, Node, NodeId, NODE_VERSION, NODE_VERSION_UNLIFTED, ROOT_ID};
use crate::store::{self, Allocator};
use crate::superblock::{backup_blocks, Extent, Superblock, FORMAT_VERSION, LIFTED_VERSION};
use crate::tree::Bounds;

/// What [`upgrade`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpgradeReport {
    /// The image's format version before.
    pub from_version: u32,
    /// The image's format version now.
    pub to_version: u32,
    /// Nodes rewritten (0 when the image was already current).
    pub nodes: u64,
    /// Bytes of node images written.
    pub bytes: u64,
    /// Bytes of the node images read (the old ones).
    pub bytes_before: u64,
    /// Encoded bytes of the leaves' entries (keys as stored, and values) before and after: what
    /// lifting saves in the leaves.
    pub leaf_entry_bytes: (u64, u64),
    /// Nodes of the old table that the tree does not reach (left out of the new table).
    pub unreachable: u64,
}

impl UpgradeReport {
    /// Whether the image was already at this build's format (nothing written).
    pub fn already_current(&self) -> bool {
        self.nodes == 0 && self.from_version == self.to_version
    }
}

/// Upgrades the image on `dev` to this build's format version (4): an image of format 1 or 2 has
/// every node of its last checkpoint rewritten once (`progress(done, total)` is called as nodes
/// are written), then gets, as a format-3 image does, its empty data table by an open and a
/// close. A format-4 image is left untouched (the report says it is already current). Refuses,
/// changing nothing, a format-1 or -2 image that was not closed cleanly or that is marked damaged:
/// its log must be replayed, or it must be repaired, by the build that wrote it. A crash during
/// the upgrade leaves the old image intact; run the upgrade again.
pub fn upgrade(
    dev: Arc<dyn BlockDevice>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<UpgradeReport> {
    let sb = Superblock::locate(&*dev, false)?.sb;
    if sb.version == LIFTED_VERSION {
        return add_data_table(dev, sb.version, None);
    }
    if sb.version == FORMAT_VERSION {
        return Ok(UpgradeReport {
            from_version: sb.version,
            to_version: sb.version,
            nodes: 0,
            bytes: 0,
            bytes_before: 0,
            leaf_entry_bytes: (0, 0),
            unreachable: 0,
        });
    }
    if sb.version > FORMAT_VERSION {
        return Err(Error::UnsupportedVersion {
            found: sb.version,
            supported: FORMAT_VERSION,
        });
    }
    if !sb.clean {
        return Err(Error::InvalidArgument(format!(
            "this format-{} image was not closed cleanly: mount and unmount it (or open and close \
             it) once with the amaranth build that wrote it, so that its log is replayed, then \
             upgrade it",
            sb.version
        )));
    }
    if sb.damaged || sb.needs_check {
        return Err(Error::InvalidArgument(format!(
            "this format-{} image is marked for a check: run `amaranth fsck --repair` on it with \
             the amaranth build that wrote it first, then upgrade it",
            sb.version
        )));
    }
    let report = rewrite(&dev, sb, NODE_VERSION_UNLIFTED, NODE_VERSION, progress)?;
    add_data_table(dev, report.from_version, Some(report))
}

/// Makes the clean format-3 image on `dev` format 4: an open (which replays nothing) and a close,
/// whose checkpoint writes an empty data table and a format-4 superblock. `rewritten` is what a
/// rewrite of older nodes did first.
fn add_data_table(
    dev: Arc<dyn BlockDevice>,
    from_version: u32,
    rewritten: Option<UpgradeReport>,
) -> Result<UpgradeReport> {
    let format = Superblock::locate(&*dev, false)?.sb.format()?;
    let options = Options {
        cache_size: (64 << 20).max(16 * format.node_size),
        background_threads: false,
        read_ahead: 0,
        ..Options::default()
    };
    crate::Engine::open(dev, options)?.close()?;
    let mut report = rewritten.unwrap_or(UpgradeReport {
        from_version,
        to_version: FORMAT_VERSION,
        nodes: 0,
        bytes: 0,
        bytes_before: 0,
        leaf_entry_bytes: (0, 0),
        unreachable: 0,
    });
    report.from_version = from_version;
    report.to_version = FORMAT_VERSION;
    Ok(report)
}

/// Rewrites a cleanly closed format-4 image without out-of-line blocks as the format-`version`
/// image (3: no data table; 2, or 1: no backup superblocks either) an older build would have
/// written: for 1 and 2 with full keys, node layout 1. For tests of the upgrade; the engine never
/// writes older formats otherwise.
#[doc(hidden)]
pub fn downgrade_for_tests(dev: Arc<dyn BlockDevice>, version: u32) -> Result<()> {
    assert!((1..=3).contains(&version), "format {version}");
    let mut sb = Superblock::locate(&*dev, false)?.sb;
    assert_eq!(sb.version, FORMAT_VERSION, "a current image to downgrade");
    assert!(
        read_data_table(&dev, &sb)?.is_empty(),
        "an image with out-of-line blocks cannot be downgraded"
    );
    if version == 3 {
        sb.version = 3;
        sb.generation += 1;
        sb.data_table = None;
        sb.data_table_crc = 0;
        sb.data_table_runs = 0;
        crate::engine::write_primary(&*dev, &sb)?;
        flush(&*dev, "the superblock")?;
        crate::engine::write_backups(&*dev, &sb)?;
        return flush(&*dev, "the backup superblocks");
    }
    rewrite(
        &dev,
        sb,
        NODE_VERSION,
        NODE_VERSION_UNLIFTED,
        &mut |_, _| {},
    )?;
    if version == 1 {
        // Format 1: no backups; one primary copy, the other slot empty.
        let mut sb = Superblock::locate(&*dev, false)?.sb;
        let zero = AlignedBuf::zeroed(amaranth_device::BLOCK_SIZE);
        for &b in sb.backups.iter().chain([1 - sb.generation % 2].iter()) {
            dev.write_at(b * amaranth_device::BLOCK_SIZE as u64, &zero)
                .map_err(|e| Error::io("clearing a superblock copy", e))?;
        }
        sb.version = 1;
        sb.backups.clear();
        crate::engine::write_primary(&*dev, &sb)?;
        flush(&*dev, "the superblock")?;
    }
    Ok(())
}

/// Rewrites every node of `sb`'s tree from layout `from` to layout `to` (one of them lifted) and
/// commits a superblock of the matching format version. The upgrade goes 1 → 2; the tests go
/// back 2 → 1 to make format-2 images.
pub(crate) fn rewrite(
    dev: &Arc<dyn BlockDevice>,
    mut sb: Superblock,
    from: u16,
    to: u16,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<UpgradeReport> {
    let format = sb.format()?;
    let (table, counts) = read_table(dev, &sb)?;
    if !counts.is_empty() {
        // The rewrite writes each node once, as it reaches it from the root: a shared node
        // would be written twice, a dead one lost with its children's references.
        return Err(Error::InvalidArgument(format!(
            "the image has {} shared or dead nodes: mount it with this build until the \
             collector has freed the dead ones, and remove the clones, before rewriting it",
            counts.len()
        )));
    }
    let mut alloc = build_allocator(&sb, &table, &RunMap::default())?;
    let from_version = sb.version;
    let to_version = if to == NODE_VERSION {
        LIFTED_VERSION
    } else {
        2
    };
    // Neither format has a data table (the downgrade's image has no out-of-line block).
    sb.data_table = None;
    sb.data_table_crc = 0;
    sb.data_table_runs = 0;
    if sb.backups.is_empty() && to_version >= 2 {
        // A format-1 image gets the backup superblocks format 2 added (as a format-2 build's
        // first read-write open did), where no extent lies.
        claim_backups(&mut sb, &mut alloc)?;
    }
    let total = table.len() as u64;
    let mut out = Rewriter {
        dev: &**dev,
        format: &format,
        codec: format.compression,
        from,
        to,
        table: &table,
        alloc,
        new_table: HashMap::with_capacity(table.len()),
        bytes: 0,
        bytes_before: 0,
        leaf_entry_bytes: (0, 0),
        end: None,
    };
    let mut stack = vec![(ROOT_ID, Bounds::root())];
    while let Some((id, bounds)) = stack.pop() {
        let children = out.node(id, &bounds)?;
        // Children in reverse so that the leftmost is written next: leaves go out in key order.
        stack.extend(children.into_iter().rev());
        progress(out.new_table.len() as u64, total);
    }
    let nodes = out.new_table.len() as u64;
    let (bytes, bytes_before, leaf_entry_bytes) =
        (out.bytes, out.bytes_before, out.leaf_entry_bytes);
    let encoded = store::encode_btt(&out.new_table, &HashMap::new());
    let blocks = (encoded.len() / amaranth_device::BLOCK_SIZE) as u64;
    let btt = out
        .alloc
        .alloc(blocks)
        .ok_or_else(|| no_space("the block translation table"))?;
    write(&**dev, btt, &encoded, "block translation table")?;
    flush(&**dev, "the rewritten nodes and table")?;
    sb.version = to_version;
    sb.generation += 1;
    sb.btt = btt;
    sb.btt_crc = store::table_crc(&encoded[..32 + nodes as usize * 24]);
    sb.btt_count = nodes;
    sb.checkpoint_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if let Err(e) = sb.validate() {
        panic!("an upgraded superblock fails its own checks: {e}");
    }
    // As a checkpoint commits: the primary copy, durable, then the backups.
    crate::engine::write_primary(&**dev, &sb)?;
    flush(&**dev, "the superblock")?;
    crate::engine::write_backups(&**dev, &sb)?;
    flush(&**dev, "the backup superblocks")?;
    Ok(UpgradeReport {
        from_version,
        to_version,
        nodes,
        bytes,
        bytes_before,
        leaf_entry_bytes,
        unreachable: total - nodes,
    })
}

/// Claims the backup superblock blocks of a format-1 image.
fn claim_backups(sb: &mut Superblock, alloc: &mut Allocator) -> Result<()> {
    let want = backup_blocks(sb.device_blocks);
    for &b in &want {
        let free = b >= sb.data_start_block()
            && alloc.claim(Extent {
                block: b,
                blocks: 1,
            });
        if !free {
            return Err(Error::InvalidArgument(format!(
                "this format-1 image has no backup superblocks and block {b}, where format 2 \
                 puts one, is in use: open and close it once with a format-2 amaranth (which \
                 moves it), then upgrade it"
            )));
        }
    }
    sb.backups = want;
    Ok(())
}

/// The state of one rewrite.
struct Rewriter<'a> {
    dev: &'a dyn BlockDevice,
    format: &'a crate::config::Format,
    codec: Compression,
    from: u16,
    to: u16,
    table: &'a HashMap<NodeId, Extent>,
    alloc: Allocator,
    new_table: HashMap<NodeId, Extent>,
    bytes: u64,
    bytes_before: u64,
    leaf_entry_bytes: (u64, u64),
    /// Where the last node written ends: the next goes right after it if it can.
    end: Option<u64>,
}

impl Rewriter<'_> {
    /// Reads node `id` (layout `from`), writes it in layout `to` at the prefix `bounds` give, and
    /// returns its children with their bounds.
    fn node(&mut self, id: NodeId, bounds: &Bounds) -> Result<Vec<(NodeId, Bounds)>> {
        if self.new_table.contains_key(&id) {
            return Err(Error::Corrupt(format!("node {id} is reachable twice")));
        }
        let ext = *self.table.get(&id).ok_or_else(|| {
            Error::Corrupt(format!("node {id} is referenced but not in the table"))
        })?;
        let what = format!("node {id}");
        let mut image = AlignedBuf::zeroed(ext.len());
        self.dev
            .read_at(ext.offset(), &mut image)
            .map_err(|e| Error::io(format!("reading {what}"), e))?;
        let h = node::parse_header(&image, self.format, &what, ext.offset())?;
        if h.id != id || h.layout != self.from || h.image_len > ext.len() {
            return Err(Error::Corrupt(format!(
                "{what}: image of node {} in layout {} ({} bytes), expected layout {} in {} bytes",
                h.id,
                h.layout,
                h.image_len,
                self.from,
                ext.len()
            )));
        }
        let mut n = node::build_node(&h, Some(&image), self.format, ext.offset())?;
        drop(image);
        self.bytes_before += h.image_len as u64;
        let entry_bytes = |n: &Node| match &n.body {
            Body::Leaf(l) => l.parts.iter().map(|p| p.bytes as u64).sum(),
            Body::Internal(_) => 0,
        };
        self.leaf_entry_bytes.0 += entry_bytes(&n);
        // In the lifted form the node's child bounds are computed from its pivots.
        let lifted = bounds.prefix();
        if self.from == NODE_VERSION_UNLIFTED {
            check_inside(&n, id, lifted)?;
            n.relift(lifted, &[]);
        } else if n.prefix.as_slice() != lifted {
            return Err(Error::Corrupt(format!(
                "{what}: stored under prefix {:?}, its bounds give {:?}",
                n.prefix, lifted
            )));
        }
        let children = match &n.body {
            Body::Internal(int) => (0..int.children.len())
                .map(|c| (int.children[c], bounds.child(int, c)))
                .collect(),
            Body::Leaf(_) => Vec::new(),
        };
        if self.to == NODE_VERSION_UNLIFTED {
            n.relift(&[], lifted);
        }
        self.leaf_entry_bytes.1 += entry_bytes(&n);
        let img = node::serialize_layout(id, &n, self.codec, self.to);
        let blocks = (img.buf.len() / amaranth_device::BLOCK_SIZE) as u64;
        let at = self
            .alloc
            .alloc_next(blocks, self.end, blocks)
            .ok_or_else(|| no_space(&what))?;
        self.end = Some(at.block + at.blocks);
        write(self.dev, at, &img.buf, &what)?;
        self.bytes += img.buf.len() as u64;
        self.new_table.insert(id, at);
        Ok(children)
    }
}

/// Checks that every key an unlifted node stores starts with the prefix its bounds give (as
/// `verify` checks a lifted node's keys against its bounds): a node outside its bounds is damage.
fn check_inside(n: &Node, id: NodeId, prefix: &[u8]) -> Result<()> {
    let bad = || {
        Error::Corrupt(format!(
            "node {id}: a key outside the bounds its parent gives it"
        ))
    };
    let ok = |k: &[u8]| k.starts_with(prefix);
    match &n.body {
        Body::Leaf(l) => {
            for p in l.resident_parts() {
                if !(0..p.len()).all(|i| ok(p.key(i))) {
                    return Err(bad());
                }
            }
            if !l.pivots.iter().all(|p| ok(p)) {
                return Err(bad());
            }
        }
        Body::Internal(int) => {
            if !int.pivots.iter().all(|p| ok(p)) {
                return Err(bad());
            }
            for slot in &int.buffers {
                let b = slot.data().expect("a whole image has every buffer");
                let points = b.points_in(&[], None).all(|(k, _)| ok(k));
                let ranges = b
                    .ranges_in(&[], None)
                    .iter()
                    .all(|r| ok(&r.lo) && ok(&r.hi));
                if !(points && ranges) {
                    return Err(bad());
                }
            }
        }
    }
    Ok(())
}

fn no_space(what: &str) -> Error {
    Error::InvalidArgument(format!(
        "not enough free space to rewrite {what}: the upgrade needs room for every node once more"
    ))
}

fn write(dev: &dyn BlockDevice, at: Extent, buf: &AlignedBuf, what: &str) -> Result<()> {
    dev.write_at(at.offset(), buf)
        .map_err(|e| Error::io(format!("writing {what}"), e))
}

fn flush(dev: &dyn BlockDevice, what: &str) -> Result<()> {
    dev.flush()
        .map_err(|e| Error::io(format!("flushing {what}"), e))
}
