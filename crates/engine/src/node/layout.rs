//! The on-disk image of a node (see docs/FORMAT.md): a 64-byte header, an index (pivots, child
//! ids, sub-block descriptors), then one 4 KiB-aligned sub-block per child: the partition payload
//! of a leaf or the encoded buffer of an internal node. The header and index share one crc32c;
//! each sub-block has its own, so a partition can be read and verified alone. Serializing (with
//! the assertions a written node must pass), parsing and verifying the header, decoding
//! sub-blocks, and building a node from what was read.

use std::borrow::Cow;
use std::sync::Arc;

use amaranth_device::{round_up, AlignedBuf, BLOCK_SIZE};
use parking_lot::Mutex;

use super::{
    child_bounds_of, longest_field, Body, BufSlot, Internal, Leaf, Node, NodeId, PartSlot,
    PartState, Resident, BUFFER_HEADER, LONGEST_UNKNOWN,
};
use crate::buffer::{Buffer, EncodedBuffer};
use crate::codec::{crc, crc_with_hole, Dec, Enc};
use crate::compress;
use crate::config::{Compression, Format};
use crate::error::{Error, Result};
use crate::msg::Msn;
use crate::partition::Partition;
use crate::subbytes::{SharedImage, SubBytes};

/// Magic number at the start of every node image.
pub const NODE_MAGIC: [u8; 4] = *b"AMND";

/// Version of the node image layout (2: keys lifted, `longest` bounds, prefix hint).
pub const NODE_VERSION: u16 = 2;

/// The layout of format-2 images: full keys, no prefix hint, no `longest` bounds. Read by
/// `amaranth upgrade` only (and written by its tests, to make format-2 images).
pub const NODE_VERSION_UNLIFTED: u16 = 1;

/// Header flag: the node's keys are stored lifted (without its prefix). Must be set.
const FLAG_LIFTED: u16 = 1;

/// Size of the fixed node header.
pub const HEADER_LEN: usize = 64;

const HEADER_CRC_AT: usize = 60;

const KIND_LEAF: u8 = 0;

const KIND_INTERNAL: u8 = 1;

/// Where a sub-block lives inside its node's image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubLoc {
    /// Byte offset from the start of the node image (4 KiB-aligned).
    pub offset: u32,
    /// Stored (possibly compressed) length.
    pub stored_len: u32,
    /// Length after decompression.
    pub raw_len: u32,
    /// crc32c of the stored bytes.
    pub crc: u32,
    /// Compression code.
    pub codec: u8,
    /// Number of entries (leaf) or messages (internal).
    pub count: u32,
}

impl SubLoc {
    /// The aligned byte range to read for this sub-block, relative to the node image.
    pub fn aligned_range(&self) -> (u64, usize) {
        (self.offset as u64, round_up(self.stored_len as usize))
    }

    /// Whether the sub-block is stored uncompressed (its stored bytes are its in-memory form).
    pub(crate) fn stored_raw(&self) -> bool {
        Compression::from_code(self.codec) == Some(Compression::None)
    }
}

/// A node serialized for writing.
pub struct NodeImage {
    /// The image, padded to whole blocks.
    pub buf: AlignedBuf,
    /// Locations of the sub-blocks (for leaves: the new partition locations).
    pub sublocs: Vec<SubLoc>,
}

/// Asserts, before a node is written, everything [`parse_header`], [`decode_partition`] and
/// [`decode_buffer`] check when it is read back (shape, pivot order, sizes, key order, message
/// placement and age): a node the parser would reject must stop the engine, not reach the disk.
fn assert_writable(id: NodeId, node: &Node) {
    node.check_invariants(id);
    let (is_leaf, n, pivots) = match &node.body {
        Body::Leaf(l) => (true, l.parts.len(), &l.pivots),
        Body::Internal(int) => (false, int.children.len(), &int.pivots),
    };
    assert!(
        is_leaf == (node.height == 0) && (1..=1 << 20).contains(&n) && node.height <= 64,
        "node {id}: impossible shape (height {}, {n} children)",
        node.height
    );
    for p in pivots {
        assert!(p.len() <= u16::MAX as usize, "node {id}: pivot too long");
    }
    if let Body::Leaf(l) = &node.body {
        for (i, p) in l.resident_parts().iter().enumerate() {
            for j in 1..p.len() {
                assert!(
                    p.key(j - 1) < p.key(j),
                    "node {id}: partition {i} keys out of order"
                );
            }
        }
    }
}

/// Serializes a node, which must be fully resident.
pub fn serialize(id: NodeId, node: &Node, codec: Compression) -> NodeImage {
    serialize_layout(id, node, codec, NODE_VERSION)
}

/// Serializes a node in layout `layout`: [`NODE_VERSION`], or [`NODE_VERSION_UNLIFTED`] for a node
/// whose keys are full (its prefix empty): the format-2 image the upgrade's tests start from.
pub(crate) fn serialize_layout(
    id: NodeId,
    node: &Node,
    codec: Compression,
    layout: u16,
) -> NodeImage {
    assert_writable(id, node);
    let lifted = layout == NODE_VERSION;
    assert!(
        lifted || (layout == NODE_VERSION_UNLIFTED && node.prefix.is_empty()),
        "node {id}: layout {layout} with prefix {:?}",
        node.prefix
    );
    let mut index = Enc::with_capacity(256);
    // A leaf's partitions, held while the image is built: one stored raw is borrowed, not copied.
    let leaf_parts = match &node.body {
        Body::Leaf(l) => l.resident_parts(),
        Body::Internal(_) => Vec::new(),
    };
    // (codec, stored, raw_len, count)
    let mut subs: Vec<(u8, Cow<'_, [u8]>, usize, u32)> = Vec::new();
    let (kind, pivots, n) = match &node.body {
        Body::Leaf(l) => {
            for p in &leaf_parts {
                let (used, stored) = compress::compress(codec, p.raw());
                subs.push((used.code(), stored, p.bytes(), p.len() as u32));
            }
            (KIND_LEAF, &l.pivots, l.parts.len())
        }
        Body::Internal(int) => {
            for slot in &int.buffers {
                // A buffer still in its encoding is written as it is; a built one is encoded.
                let (mut enc, (np, nr)) = match slot.for_write() {
                    Resident::Built(b) => {
                        let mut e = Enc::with_capacity(b.bytes() + BUFFER_HEADER);
                        b.encode(&mut e);
                        (e.buf, b.counts())
                    }
                    Resident::Encoded(r) => (r.raw().to_vec(), r.counts()),
                };
                assert_eq!(
                    enc.len(),
                    slot.bytes() + BUFFER_HEADER,
                    "node {id}: buffer size differs from its encoding"
                );
                let raw_len = enc.len();
                let (used, packed) = match compress::compress(codec, &enc) {
                    (used, Cow::Owned(v)) => (used, Some(v)),
                    (used, Cow::Borrowed(_)) => (used, None),
                };
                // Stored raw: the encoding itself, moved rather than copied.
                let stored = packed.unwrap_or_else(|| std::mem::take(&mut enc));
                subs.push((used.code(), Cow::Owned(stored), raw_len, (np + nr) as u32));
            }
            (KIND_INTERNAL, &int.pivots, int.children.len())
        }
    };
    // The prefix hint for salvage (docs/SURGERY.md §2.7): the node's full prefix as of this write.
    if lifted {
        assert!(
            node.prefix.len() <= u16::MAX as usize,
            "node {id}: prefix too long"
        );
        index.u16(node.prefix.len() as u16);
        index.raw(&node.prefix);
    }
    for p in pivots {
        index.u16(p.len() as u16);
        index.raw(p);
    }
    // Sub-block offsets depend on the index length, which is known once pivots and the fixed-size
    // descriptors are counted.
    let desc_len = match (kind == KIND_INTERNAL, lifted) {
        (true, true) => 8 + 2 + 21,
        (true, false) => 8 + 21,
        (false, _) => 21,
    };
    let index_len = index.len() + n * desc_len;
    let mut offset = round_up(HEADER_LEN + index_len);
    let mut sublocs = Vec::with_capacity(n);
    for (i, (c, stored, raw_len, count)) in subs.iter().enumerate() {
        if let Body::Internal(int) = &node.body {
            index.u64(int.children[i]);
            if lifted {
                index.u16(int.buffers[i].longest);
            }
        }
        let loc = SubLoc {
            offset: offset as u32,
            stored_len: stored.len() as u32,
            raw_len: *raw_len as u32,
            crc: crc(stored),
            codec: *c,
            count: *count,
        };
        index.u32(loc.offset);
        index.u32(loc.stored_len);
        index.u32(loc.raw_len);
        index.u32(loc.crc);
        index.u8(loc.codec);
        index.u32(loc.count);
        sublocs.push(loc);
        offset += round_up(stored.len().max(1));
    }
    assert_eq!(index.len(), index_len, "node index length");
    let total = offset;
    let span = HEADER_LEN + index_len;
    assert!(total <= u32::MAX as usize, "node {id}: image too long");
    // Sub-blocks lie in key order (partition or child order) inside the image, so a scan of the
    // node reads it front to back.
    for w in sublocs.windows(2) {
        let (off, len) = w[0].aligned_range();
        assert!(
            off as usize + len <= w[1].offset as usize,
            "node {id}: sub-blocks out of key order in the image"
        );
    }
    for loc in &sublocs {
        let (off, len) = loc.aligned_range();
        assert!(
            (off as usize).is_multiple_of(BLOCK_SIZE)
                && off as usize >= span
                && off as usize + len <= total
                && loc.raw_len <= 1 << 30,
            "node {id}: sub-block descriptor out of bounds ({loc:?}, span {span}, image {total})"
        );
    }
    // The space accounting charges dirty nodes by this estimate: it must be exact uncompressed
    // and never low.
    if !lifted {
        // Not an image the engine accounts for.
    } else if codec == Compression::None {
        assert_eq!(total, node.image_len(), "node {id}: image length estimate");
    } else {
        assert!(
            total <= node.image_len(),
            "node {id}: image length estimate"
        );
    }
    let mut buf = AlignedBuf::zeroed(total);
    let mut h = Enc::with_capacity(HEADER_LEN);
    h.raw(&NODE_MAGIC);
    h.u16(layout);
    h.u8(kind);
    h.u8(0);
    h.u64(id);
    h.u32(node.height);
    h.u32(n as u32);
    h.u64(node.max_msn);
    h.u32(index_len as u32);
    if lifted {
        // The node's own bound: exact as of this write (docs/SURGERY.md §2.6).
        h.u16(longest_field(node.longest_stored()));
        h.u16(FLAG_LIFTED);
    } else {
        h.u16(0); // layout 1: "lifted prefix length", always 0
        h.u16(0);
    }
    h.u32(total as u32);
    h.raw(&[0u8; 16]);
    h.u32(0); // crc placeholder
    assert_eq!(h.len(), HEADER_LEN);
    buf[..HEADER_LEN].copy_from_slice(&h.buf);
    buf[HEADER_LEN..HEADER_LEN + index_len].copy_from_slice(&index.buf);
    let c = crc_with_hole(&buf[..HEADER_LEN + index_len], HEADER_CRC_AT);
    buf[HEADER_CRC_AT..HEADER_CRC_AT + 4].copy_from_slice(&c.to_le_bytes());
    for ((_, stored, _, _), loc) in subs.iter().zip(&sublocs) {
        let o = loc.offset as usize;
        buf[o..o + stored.len()].copy_from_slice(stored);
    }
    NodeImage { buf, sublocs }
}

/// The parsed header and index of a node image.
#[derive(Debug)]
pub struct NodeHeader {
    /// Node id recorded in the image.
    pub id: NodeId,
    /// Height.
    pub height: u32,
    /// Max applied MSN.
    pub max_msn: Msn,
    /// Whether it is a leaf.
    pub is_leaf: bool,
    /// Pivots.
    pub pivots: Vec<Vec<u8>>,
    /// Child ids (internal nodes).
    pub children: Vec<NodeId>,
    /// Sub-block locations.
    pub sublocs: Vec<SubLoc>,
    /// Total image length.
    pub image_len: usize,
    /// Layout version ([`NODE_VERSION`], or [`NODE_VERSION_UNLIFTED`] in a format-2 image).
    pub layout: u16,
    /// The prefix hint: the node's full prefix when the image was written (empty in layout 1).
    pub prefix: Vec<u8>,
    /// Each child's key-length bound (internal nodes; [`BufSlot::longest`]).
    pub child_longest: Vec<u16>,
}

/// Bytes needed to hold the header and index, given the first block of the image.
pub fn header_span(first_block: &[u8], what: &str, dev_offset: u64) -> Result<usize> {
    let mut d = Dec::new(first_block, "node header");
    let magic = d.raw(4)?;
    if magic != NODE_MAGIC {
        return Err(Error::Corrupt(format!(
            "{what} at byte {dev_offset}: bad node magic"
        )));
    }
    let _ = d.raw(28)?;
    let index_len = d.u32()? as usize;
    Ok(HEADER_LEN + index_len)
}

/// Parses and verifies a node's header and index. `bytes` must hold at least
/// [`header_span`] bytes.
pub fn parse_header(
    bytes: &[u8],
    format: &Format,
    what: &str,
    dev_offset: u64,
) -> Result<NodeHeader> {
    let span = header_span(bytes, what, dev_offset)?;
    if span > bytes.len() {
        return Err(Error::Corrupt(format!("{what}: index runs past the image")));
    }
    let stored_crc = u32::from_le_bytes(
        bytes[HEADER_CRC_AT..HEADER_CRC_AT + 4]
            .try_into()
            .expect("4 bytes"),
    );
    if crc_with_hole(&bytes[..span], HEADER_CRC_AT) != stored_crc {
        return Err(Error::Checksum {
            what: format!("{what} header"),
            offset: dev_offset,
        });
    }
    let mut d = Dec::new(&bytes[..span], "node header");
    d.raw(4)?;
    let version = d.u16()?;
    let lifted = version == NODE_VERSION;
    if !lifted && version != NODE_VERSION_UNLIFTED {
        return Err(Error::UnsupportedVersion {
            found: version as u32,
            supported: NODE_VERSION as u32,
        });
    }
    let kind = d.u8()?;
    d.u8()?;
    let id = d.u64()?;
    let height = d.u32()?;
    let n = d.u32()? as usize;
    let max_msn = d.u64()?;
    let _index_len = d.u32()?;
    let longest = d.u16()?;
    let flags = d.u16()?;
    let image_len = d.u32()? as usize;
    d.raw(16)?;
    d.u32()?;
    if lifted && flags != FLAG_LIFTED {
        return Err(d.corrupt(format!(
            "node flags {flags:#x}: keys not lifted or unknown flags"
        )));
    }
    if !lifted && longest != 0 {
        return Err(d.corrupt("layout 1 with a lifted prefix length"));
    }
    // The node's own key-length bound: exact for its own keys, but its children's bounds are
    // upper bounds that may pass the key limit (a moved subtree's bound is lengthened with its
    // keys, docs/SURGERY.md §2.6): any value is valid, and nothing reads it.
    let _ = longest;
    let is_leaf = match kind {
        KIND_LEAF => true,
        KIND_INTERNAL => false,
        k => return Err(d.corrupt(format!("unknown node kind {k}"))),
    };
    if is_leaf != (height == 0) || n == 0 || n > 1 << 20 || height > 64 {
        return Err(d.corrupt(format!(
            "impossible node shape (kind {kind}, height {height}, {n} children)"
        )));
    }
    let hint = if lifted { d.u16()? as usize } else { 0 };
    if hint > format.max_key_len {
        return Err(d.corrupt("prefix hint longer than the maximum key"));
    }
    let prefix = d.raw(hint)?.to_vec();
    let mut pivots = Vec::with_capacity(n - 1);
    for _ in 0..n - 1 {
        let len = d.u16()? as usize;
        if len > format.max_key_len {
            return Err(d.corrupt("pivot longer than the maximum key"));
        }
        let p = d.raw(len)?.to_vec();
        if pivots.last().is_some_and(|l: &Vec<u8>| *l >= p) {
            return Err(d.corrupt("pivots out of order"));
        }
        pivots.push(p);
    }
    let mut children = Vec::new();
    let mut child_longest = Vec::new();
    let mut sublocs = Vec::with_capacity(n);
    for _ in 0..n {
        if !is_leaf {
            children.push(d.u64()?);
            child_longest.push(if lifted { d.u16()? } else { LONGEST_UNKNOWN });
        }
        let loc = SubLoc {
            offset: d.u32()?,
            stored_len: d.u32()?,
            raw_len: d.u32()?,
            crc: d.u32()?,
            codec: d.u8()?,
            count: d.u32()?,
        };
        let (off, len) = loc.aligned_range();
        if !(off as usize).is_multiple_of(BLOCK_SIZE)
            || off as usize + len > image_len
            || (off as usize) < span
            || Compression::from_code(loc.codec).is_none()
            || loc.raw_len > 1 << 30
        {
            return Err(d.corrupt(format!(
                "sub-block descriptor out of bounds ({loc:?}, span {span}, image {image_len}, node {id})"
            )));
        }
        sublocs.push(loc);
    }
    d.finish()?;
    Ok(NodeHeader {
        id,
        height,
        max_msn,
        is_leaf,
        pivots,
        children,
        sublocs,
        image_len,
        layout: version,
        prefix,
        child_longest,
    })
}

/// Where a sub-block's stored bytes are read from: a slice (decoded into a buffer of its own),
/// or a node image shared with what is decoded from it (an uncompressed sub-block is then used
/// where it lies, `subbytes.rs`). Either may extend past the sub-block.
#[derive(Clone, Copy)]
pub(crate) enum SubSrc<'a> {
    /// The stored bytes start here.
    Slice(&'a [u8]),
    /// The stored bytes start at `offset` of `image`.
    Shared {
        image: &'a SharedImage,
        offset: usize,
    },
}

impl<'a> SubSrc<'a> {
    fn bytes(&self) -> &'a [u8] {
        match *self {
            SubSrc::Slice(s) => s,
            SubSrc::Shared { image, offset } => &image[offset..],
        }
    }
}

/// Verifies and decodes one sub-block from its stored bytes (which may extend past `stored_len`).
pub fn decode_sub(stored: &[u8], loc: &SubLoc, what: &str, dev_offset: u64) -> Result<Vec<u8>> {
    let stored = checked_stored(stored, loc, what, dev_offset)?;
    let codec = Compression::from_code(loc.codec)
        .ok_or_else(|| Error::Corrupt(format!("{what}: bad codec")))?;
    compress::decompress(codec, stored, loc.raw_len as usize)
}

/// The sub-block's stored bytes, once their checksum matches.
fn checked_stored<'a>(
    stored: &'a [u8],
    loc: &SubLoc,
    what: &str,
    dev_offset: u64,
) -> Result<&'a [u8]> {
    let stored = stored
        .get(..loc.stored_len as usize)
        .ok_or_else(|| Error::Corrupt(format!("{what}: sub-block past the bytes read")))?;
    if crc(stored) != loc.crc {
        return Err(Error::Checksum {
            what: what.to_string(),
            offset: dev_offset,
        });
    }
    Ok(stored)
}

/// [`decode_sub`] from `src`: an uncompressed sub-block of a shared image is used in place.
fn decode_sub_src(src: SubSrc<'_>, loc: &SubLoc, what: &str, dev_offset: u64) -> Result<SubBytes> {
    // A slice, or a compressed sub-block: decoded into a buffer of its own.
    let (SubSrc::Shared { image, offset }, Some(Compression::None)) =
        (src, Compression::from_code(loc.codec))
    else {
        return decode_sub(src.bytes(), loc, what, dev_offset).map(SubBytes::from);
    };
    let stored = checked_stored(src.bytes(), loc, what, dev_offset)?;
    if loc.raw_len != loc.stored_len {
        return Err(Error::Corrupt(format!(
            "{what}: uncompressed sub-block of {} bytes, index says {}",
            loc.stored_len, loc.raw_len
        )));
    }
    Ok(SubBytes::in_image(image, offset, stored.len()))
}

/// Decodes a leaf partition sub-block.
pub fn decode_partition(
    stored: &[u8],
    loc: &SubLoc,
    format: &Format,
    what: &str,
    dev_offset: u64,
) -> Result<Partition> {
    decode_partition_in(SubSrc::Slice(stored), loc, format, what, dev_offset)
}

/// [`decode_partition`] from `src` (used in place when it is an uncompressed sub-block of a
/// shared image).
pub(crate) fn decode_partition_in(
    src: SubSrc<'_>,
    loc: &SubLoc,
    format: &Format,
    what: &str,
    dev_offset: u64,
) -> Result<Partition> {
    let bytes = decode_sub_src(src, loc, what, dev_offset)?;
    let p = Partition::decode(bytes, format.max_key_len, format.max_value_len)?;
    if p.len() != loc.count as usize {
        return Err(Error::Corrupt(format!(
            "{what}: {} entries, index says {}",
            p.len(),
            loc.count
        )));
    }
    Ok(p)
}

/// Builds a node from its parsed header and (for internal nodes, or fully read leaves) the whole image.
/// Leaf partitions are left non-resident unless `image` is given.
pub fn build_node(
    h: &NodeHeader,
    image: Option<&[u8]>,
    format: &Format,
    dev_offset: u64,
) -> Result<Node> {
    build_from(h, image.map(SubSrc::Slice), format, dev_offset)
}

/// [`build_node`] from a whole image kept shared: its uncompressed partitions and buffers are
/// used where they lie in it (`subbytes.rs`).
pub(crate) fn build_node_in(
    h: &NodeHeader,
    image: &SharedImage,
    format: &Format,
    dev_offset: u64,
) -> Result<Node> {
    build_from(
        h,
        Some(SubSrc::Shared { image, offset: 0 }),
        format,
        dev_offset,
    )
}

/// [`build_node`] from the whole image `src` starts, if given.
fn build_from(
    h: &NodeHeader,
    src: Option<SubSrc<'_>>,
    format: &Format,
    dev_offset: u64,
) -> Result<Node> {
    let at = |loc: &SubLoc| {
        let o = loc.offset as usize;
        src.map(|src| match src {
            SubSrc::Slice(img) => SubSrc::Slice(&img[o..]),
            SubSrc::Shared { image, offset } => SubSrc::Shared {
                image,
                offset: offset + o,
            },
        })
    };
    if h.is_leaf {
        leaf_of(h, |i, loc| {
            let Some(src) = at(loc) else {
                return Ok(None);
            };
            let what = format!("node {} partition {}", h.id, i);
            let dev = dev_offset + loc.offset as u64;
            decode_partition_in(src, loc, format, &what, dev).map(Some)
        })
    } else {
        internal_of(h, |i, loc| {
            let Some(src) = at(loc) else {
                return Ok(None);
            };
            let what = format!("node {} buffer {}", h.id, i);
            let bounds = child_bounds_of(&h.pivots, i);
            let dev = dev_offset + loc.offset as u64;
            index_buffer_in(src, loc, format, &what, dev, h.max_msn, bounds).map(Some)
        })
    }
}

/// A leaf from its header, with the partitions `part(i, loc)` gives (`None`: not resident).
fn leaf_of(
    h: &NodeHeader,
    mut part: impl FnMut(usize, &SubLoc) -> Result<Option<Partition>>,
) -> Result<Node> {
    let mut parts = Vec::with_capacity(h.sublocs.len());
    for (i, loc) in h.sublocs.iter().enumerate() {
        parts.push(PartSlot {
            state: Mutex::new(PartState {
                data: part(i, loc)?.map(Arc::new),
                loc: Some(*loc),
                runs: None,
                point_loaded: false,
            }),
            bytes: loc.raw_len as usize,
            entries: loc.count as usize,
        });
    }
    let leaf = Leaf {
        pivots: h.pivots.clone(),
        parts,
    };
    Ok(Node {
        height: 0,
        max_msn: h.max_msn,
        body: Body::Leaf(leaf),
        prefix: h.prefix.clone(),
    })
}

/// An internal node from its header, with the buffers `buf(i, loc)` gives (`None`: not
/// resident). A whole image keeps each buffer in its checked encoding: it is built only when
/// something needs its messages (`node/slot.rs`), and written back as it is if not.
fn internal_of(
    h: &NodeHeader,
    mut buf: impl FnMut(usize, &SubLoc) -> Result<Option<EncodedBuffer>>,
) -> Result<Node> {
    let mut buffers = Vec::with_capacity(h.sublocs.len());
    for (i, loc) in h.sublocs.iter().enumerate() {
        if (loc.raw_len as usize) < BUFFER_HEADER {
            return Err(Error::Corrupt(format!(
                "node {} buffer {i}: impossible length",
                h.id
            )));
        }
        buffers.push(BufSlot::in_image(
            loc.raw_len as usize - BUFFER_HEADER,
            buf(i, loc)?,
            *loc,
            h.child_longest[i],
        ));
    }
    let int = Internal {
        pivots: h.pivots.clone(),
        children: h.children.clone(),
        buffers,
    };
    Ok(Node {
        height: h.height,
        max_msn: h.max_msn,
        body: Body::Internal(int),
        prefix: h.prefix.clone(),
    })
}

/// Verifies and decodes one child's message buffer: its checksum, its encoding, that no message is
/// newer than the node and that every message lies in the child's range `[lo, hi)`
/// ([`index_buffer`], then built).
#[allow(clippy::too_many_arguments)]
pub fn decode_buffer(
    stored: &[u8],
    loc: &SubLoc,
    format: &Format,
    what: &str,
    dev_offset: u64,
    node_max_msn: Msn,
    lo: &[u8],
    hi: Option<&[u8]>,
) -> Result<Buffer> {
    index_buffer(
        stored,
        loc,
        format,
        what,
        dev_offset,
        node_max_msn,
        (lo, hi),
    )
    .map(|e| e.build())
}

/// Verifies one child's message buffer as [`decode_buffer`] does (checksum, encoding, message
/// numbers, the child's range `bounds`) and keeps it in its encoding, indexed, without building
/// it.
pub fn index_buffer(
    stored: &[u8],
    loc: &SubLoc,
    format: &Format,
    what: &str,
    dev_offset: u64,
    node_max_msn: Msn,
    bounds: (&[u8], Option<&[u8]>),
) -> Result<EncodedBuffer> {
    let src = SubSrc::Slice(stored);
    index_buffer_in(src, loc, format, what, dev_offset, node_max_msn, bounds)
}

/// [`index_buffer`] from `src` (used in place when it is an uncompressed sub-block of a shared
/// image).
pub(crate) fn index_buffer_in(
    src: SubSrc<'_>,
    loc: &SubLoc,
    format: &Format,
    what: &str,
    dev_offset: u64,
    node_max_msn: Msn,
    bounds: (&[u8], Option<&[u8]>),
) -> Result<EncodedBuffer> {
    let raw = decode_sub_src(src, loc, what, dev_offset)?;
    if raw.len() != loc.raw_len as usize {
        return Err(Error::Corrupt(format!(
            "{what}: size differs from the node index"
        )));
    }
    let enc = EncodedBuffer::index(raw, format.max_key_len, format.max_value_len)
        .map_err(|e| Error::Corrupt(format!("{what}: {e}")))?;
    if enc.max_msn() > node_max_msn {
        return Err(Error::Corrupt(format!(
            "{what}: messages newer than the node"
        )));
    }
    if !enc.within(bounds.0, bounds.1) {
        return Err(Error::Corrupt(format!(
            "{what}: messages outside the child's range"
        )));
    }
    Ok(enc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::PointOp;
    use crate::node::tests::{all_entries, fmt, leaf_with};

    #[test]
    fn serialize_round_trip_leaf_and_internal() {
        let l = leaf_with(200);
        let node = Node {
            height: 0,
            max_msn: 9,
            body: Body::Leaf(l),
            prefix: b"hint/".to_vec(),
        };
        for codec in [Compression::None, Compression::Lz4, Compression::Zstd] {
            let img = serialize(42, &node, codec);
            let h = parse_header(&img.buf, &fmt(), "test", 0).unwrap();
            assert_eq!(h.id, 42);
            assert_eq!(h.prefix, b"hint/".to_vec(), "the prefix hint is written");
            assert_eq!(h.layout, NODE_VERSION);
            let back = build_node(&h, Some(&img.buf), &fmt(), 0).unwrap();
            assert_eq!(
                all_entries(back.leaf().unwrap()),
                all_entries(node.leaf().unwrap())
            );
        }
        // Layout 1 (format 2, full keys, no hint) is still read, for `amaranth upgrade`.
        let mut old = node;
        old.prefix.clear();
        let img = serialize_layout(43, &old, Compression::None, NODE_VERSION_UNLIFTED);
        let h = parse_header(&img.buf, &fmt(), "test", 0).unwrap();
        assert_eq!((h.layout, h.prefix.len()), (NODE_VERSION_UNLIFTED, 0));
        let back = build_node(&h, Some(&img.buf), &fmt(), 0).unwrap();
        assert_eq!(
            all_entries(back.leaf().unwrap()),
            all_entries(old.leaf().unwrap())
        );
        let mut b0 = Buffer::new();
        let _ = b0.add_point(b"a", 5, PointOp::Put(b"v".to_vec()));
        let mut b1 = Buffer::new();
        let _ = b1.add_range(6, b"m", b"q");
        let int = Internal {
            pivots: vec![b"m".to_vec()],
            children: vec![2, 3],
            buffers: vec![BufSlot::resident(b0), BufSlot::resident(b1)],
        };
        let node = Node {
            height: 1,
            max_msn: 6,
            body: Body::Internal(int),
            prefix: Vec::new(),
        };
        let old = serialize_layout(1, &node, Compression::None, NODE_VERSION_UNLIFTED);
        let h = parse_header(&old.buf, &fmt(), "test", 0).unwrap();
        assert_eq!(h.children, vec![2, 3], "layout 1 child ids");
        let img = serialize(1, &node, Compression::None);
        let h = parse_header(&img.buf, &fmt(), "test", 0).unwrap();
        let back = build_node(&h, Some(&img.buf), &fmt(), 0).unwrap();
        let Body::Internal(n) = back.body else {
            panic!("internal expected")
        };
        assert_eq!(n.children, vec![2, 3]);
        assert!(n.buffers[1].data().unwrap().range_covering(b"n").is_some());
        // A flipped byte anywhere is detected.
        for pos in [3usize, 70, 4096 + 5] {
            let mut bad = img.buf.to_vec();
            bad[pos] ^= 0x40;
            let r = parse_header(&bad, &fmt(), "test", 0)
                .and_then(|h| build_node(&h, Some(&bad), &fmt(), 0));
            assert!(r.is_err(), "flip at {pos} not detected");
        }
    }

    /// An image depends on the node's contents only, not on how they came to be in memory:
    /// written, read back whole and written again, an unchanged node gives the same bytes. A
    /// buffer whose longest key left it (split off here; flushed down in the tree) keeps that
    /// key's length as its running bound, and the header's `longest` written from that bound
    /// changed at the node's next eviction and reload (surgery fuzz seed 15818805793745617583:
    /// a held, never changed node then looked changed).
    #[test]
    fn an_unchanged_node_is_written_the_same_after_a_reload() {
        let mut b0 = Buffer::new();
        let _ = b0.add_point(b"a", 5, PointOp::Put(b"v".to_vec()));
        let _ = b0.add_point(b"b-a-much-longer-key", 6, PointOp::Delete);
        let _ = b0.split_off(b"b");
        assert_eq!(b0.counts(), (1, 0), "only the short key stays");
        let int = Internal {
            pivots: vec![b"m".to_vec()],
            children: vec![2, 3],
            buffers: vec![
                BufSlot::resident(b0).with_longest(0),
                BufSlot::empty().with_longest(0),
            ],
        };
        let node = Node {
            height: 1,
            max_msn: 6,
            body: Body::Internal(int),
            prefix: b"p/".to_vec(),
        };
        let img = serialize(1, &node, Compression::None);
        let h = parse_header(&img.buf, &fmt(), "test", 0).unwrap();
        let back = build_node(&h, Some(&img.buf), &fmt(), 0).unwrap();
        let again = serialize(1, &back, Compression::None);
        assert!(
            img.buf[..] == again.buf[..],
            "the image changed at a reload"
        );
        assert_eq!(
            u16::from_le_bytes([img.buf[36], img.buf[37]]),
            1,
            "the header's key-length bound is the longest key held"
        );
    }
}
