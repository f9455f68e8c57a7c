//! The superblock: its layout, encoding and where its copies live.
//!
//! Block 0 and block 1 each hold a primary copy; a checkpoint writes the one its generation selects
//! (`generation % 2`), so a torn superblock write leaves the other intact. From format version 2,
//! three backup copies sit at a quarter, half and three quarters of the device (reserved in the
//! allocator), so that damage to the start of the image loses nothing: a checkpoint writes them
//! after its primary copy is durable. Which copy to use is decided in [`crate::copies`].

use amaranth_device::{AlignedBuf, BlockDevice, BLOCK_SIZE};

use crate::codec::{crc_with_hole, Dec, Enc};
use crate::config::{Compression, Format};
use crate::copies::Located;
use crate::error::{Error, Result};

/// Magic bytes at the start of each superblock.
pub const SUPER_MAGIC: [u8; 8] = *b"AMARANTH";
/// The on-disk format version this build writes (4: out-of-line data blocks and the data table).
/// Superblocks of versions 1 and 2 are still decoded (to name them and for `amaranth upgrade`),
/// but the engine opens only versions 3 and 4; a read-write open of a version-3 image makes it
/// version 4 at its first checkpoint (nothing else changes: it has no out-of-line block).
pub const FORMAT_VERSION: u32 = 4;
/// The first format version with node keys lifted (docs/SURGERY.md §2), the oldest the engine
/// opens.
pub const LIFTED_VERSION: u32 = 3;
/// The oldest format version this build reads.
pub const OLDEST_VERSION: u32 = 1;
/// Superblock flag: log records were skipped at an open; the image wants a check.
const FLAG_NEEDS_CHECK: u16 = 1;
/// Superblock flag: a read found a damaged node; read-write opens are refused until a repair.
const FLAG_DAMAGED: u16 = 2;
const CRC_AT: usize = 12;
/// Offset of the backup list in a version-2 superblock.
const BACKUPS_AT: usize = 192;
/// Most backup copies a superblock can list.
const MAX_BACKUPS: usize = 8;
/// Offset of the data table's location (version 4), after the longest backup list.
const DATA_TABLE_AT: usize = BACKUPS_AT + 8 + 8 * MAX_BACKUPS;

/// Blocks of the backup superblock copies of a device of `device_blocks` blocks (format version 2):
/// a quarter, half and three quarters of the way, far from the start that a stray write of a
/// partition table or another file system's superblock would hit.
pub fn backup_blocks(device_blocks: u64) -> Vec<u64> {
    (1..=3).map(|k| device_blocks / 4 * k).collect()
}
/// Offset of the label in a superblock block (fixed, for blkid-style probes; zeros: no label).
pub const LABEL_AT: usize = 1024;
/// Longest label in bytes (UTF-8, no NUL; the rest of the field is zeros).
pub const LABEL_MAX: usize = 64;
// The backup list (version 2) ends before the label, and the label inside the block.
const _: () = assert!(DATA_TABLE_AT + 32 <= LABEL_AT);
const _: () = assert!(LABEL_AT + LABEL_MAX <= BLOCK_SIZE);

/// An extent of whole blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Extent {
    /// First block.
    pub block: u64,
    /// Number of blocks.
    pub blocks: u64,
}

impl Extent {
    /// Byte offset on the device.
    pub fn offset(&self) -> u64 {
        self.block * BLOCK_SIZE as u64
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.blocks as usize * BLOCK_SIZE
    }
    /// Whether the extent is empty.
    pub fn is_empty(&self) -> bool {
        self.blocks == 0
    }
}

/// Everything the engine needs to find its state after a restart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    /// Format version of this image (1 to 3; version 1 has no backup copies). The engine opens
    /// version 3 only; `amaranth upgrade` rewrites the others.
    pub version: u32,
    /// Checkpoint number; the higher valid copy wins.
    pub generation: u64,
    /// Identity of the image.
    pub uuid: [u8; 16],
    /// Size of the image in blocks when it was created.
    pub device_blocks: u64,
    /// Format parameters.
    pub node_size: u32,
    /// Leaf partition size.
    pub partition_size: u32,
    /// Maximum fanout.
    pub max_fanout: u32,
    /// Maximum key length.
    pub max_key_len: u32,
    /// Maximum value length.
    pub max_value_len: u32,
    /// Compression code.
    pub compression: u8,
    /// Whether the engine was closed cleanly after this checkpoint.
    pub clean: bool,
    /// Log records that could not be applied were skipped at an open: the image wants a check
    /// (kept until a check clears it).
    pub needs_check: bool,
    /// A read found damage (a checksum error or an inconsistent node) since the last repair:
    /// read-write opens are refused until `amaranth fsck --repair` clears it.
    pub damaged: bool,
    /// First block of the log region.
    pub log_start_block: u64,
    /// Blocks in the log region.
    pub log_blocks: u64,
    /// Log incarnation: chunks from another epoch are never replayed.
    pub log_epoch: u64,
    /// Virtual log offset where replay starts.
    pub log_tail_voff: u64,
    /// LSN of the first record at `log_tail_voff`.
    pub log_tail_lsn: u64,
    /// Records with a lower LSN are included in this checkpoint.
    pub ckpt_lsn: u64,
    /// The next message sequence number after the checkpointed state.
    pub next_msn: u64,
    /// Next node id to hand out.
    pub next_node_id: u64,
    /// Id of the root node.
    pub root_id: u64,
    /// Where the block translation table of this checkpoint lies.
    pub btt: Extent,
    /// crc32c of the table.
    pub btt_crc: u32,
    /// Number of table entries.
    pub btt_count: u64,
    /// Where this checkpoint's data table lies (version 4; `None` before), its crc32c and its
    /// number of runs.
    pub data_table: Option<Extent>,
    /// crc32c of the data table's bytes.
    pub data_table_crc: u32,
    /// Runs in the data table.
    pub data_table_runs: u64,
    /// When the image was created (Unix seconds).
    pub created_unix: u64,
    /// When this checkpoint was written (Unix seconds).
    pub checkpoint_unix: u64,
    /// Blocks of the backup copies (empty in version 1).
    pub backups: Vec<u64>,
    /// The file system's label (`mkfs -L`), at most [`LABEL_MAX`] bytes; empty: none.
    pub label: String,
}

impl Superblock {
    /// The format parameters recorded in the superblock.
    pub fn format(&self) -> Result<Format> {
        let compression = Compression::from_code(self.compression).ok_or_else(|| {
            Error::Corrupt(format!(
                "superblock: unknown compression {}",
                self.compression
            ))
        })?;
        let f = Format {
            node_size: self.node_size as usize,
            partition_size: self.partition_size as usize,
            max_fanout: self.max_fanout as usize,
            max_key_len: self.max_key_len as usize,
            max_value_len: self.max_value_len as usize,
            log_size: Some(self.log_blocks * BLOCK_SIZE as u64),
            compression,
        };
        f.validate()
            .map_err(|e| Error::Corrupt(format!("superblock format parameters: {e}")))?;
        Ok(f)
    }

    /// First block after the superblocks and the log, where extents are allocated.
    pub fn data_start_block(&self) -> u64 {
        self.log_start_block + self.log_blocks
    }

    /// Serializes into one block. Asserts first what [`Superblock::decode`] checks on read.
    pub fn encode(&self) -> AlignedBuf {
        if let Err(err) = self.validate().and_then(|()| self.format().map(drop)) {
            panic!("a superblock about to be written fails its own checks: {err}");
        }
        let mut e = Enc::with_capacity(BLOCK_SIZE);
        assert!(
            (OLDEST_VERSION..=FORMAT_VERSION).contains(&self.version),
            "writing a superblock of unknown version {}",
            self.version
        );
        assert!(self.backups.len() <= MAX_BACKUPS, "too many backup copies");
        e.raw(&SUPER_MAGIC);
        e.u32(self.version);
        e.u32(0);
        e.u64(self.generation);
        e.raw(&self.uuid);
        e.u64(self.device_blocks);
        e.u32(self.node_size);
        e.u32(self.partition_size);
        e.u32(self.max_fanout);
        e.u32(self.max_key_len);
        e.u32(self.max_value_len);
        e.u8(self.compression);
        e.u8(self.clean as u8);
        e.u16(
            if self.needs_check {
                FLAG_NEEDS_CHECK
            } else {
                0
            } | if self.damaged { FLAG_DAMAGED } else { 0 },
        );
        e.u64(self.log_start_block);
        e.u64(self.log_blocks);
        e.u64(self.log_epoch);
        e.u64(self.log_tail_voff);
        e.u64(self.log_tail_lsn);
        e.u64(self.ckpt_lsn);
        e.u64(self.next_msn);
        e.u64(self.next_node_id);
        e.u64(self.root_id);
        e.u64(self.btt.block);
        e.u64(self.btt.blocks);
        e.u32(self.btt_crc);
        e.u32(0);
        e.u64(self.btt_count);
        e.u64(self.created_unix);
        e.u64(self.checkpoint_unix);
        assert_eq!(e.len(), BACKUPS_AT, "superblock layout");
        if self.version >= 2 {
            e.u32(self.backups.len() as u32);
            e.u32(0);
            for b in &self.backups {
                e.u64(*b);
            }
        } else {
            assert!(self.backups.is_empty(), "a version-1 image has no backups");
        }
        if let Some(t) = self.data_table {
            e.raw(&vec![0u8; DATA_TABLE_AT - e.len()]);
            e.u64(t.block);
            e.u64(t.blocks);
            e.u32(self.data_table_crc);
            e.u32(0);
            e.u64(self.data_table_runs);
        }
        let mut buf = AlignedBuf::zeroed(BLOCK_SIZE);
        buf[..e.len()].copy_from_slice(&e.buf);
        assert!(e.len() <= LABEL_AT, "superblock fields reach the label");
        assert!(
            check_label(&self.label).is_ok(),
            "writing a bad label {:?}",
            self.label
        );
        buf[LABEL_AT..LABEL_AT + self.label.len()].copy_from_slice(self.label.as_bytes());
        let c = crc_with_hole(&buf, CRC_AT);
        buf[CRC_AT..CRC_AT + 4].copy_from_slice(&c.to_le_bytes());
        buf
    }

    /// Parses and verifies one superblock copy read from byte `offset`.
    pub fn decode(block: &[u8], offset: u64) -> Result<Superblock> {
        let mut d = Dec::new(block, "superblock");
        if d.raw(8)? != SUPER_MAGIC {
            return Err(Error::BadMagic(format!(
                "no Amaranth superblock at byte {offset}"
            )));
        }
        let version = d.u32()?;
        let stored = d.u32()?;
        if crc_with_hole(block, CRC_AT) != stored {
            return Err(Error::Checksum {
                what: "superblock".into(),
                offset,
            });
        }
        if !(OLDEST_VERSION..=FORMAT_VERSION).contains(&version) {
            return Err(Error::UnsupportedVersion {
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        let generation = d.u64()?;
        let uuid: [u8; 16] = d.raw(16)?.try_into().expect("16 bytes");
        let flags: u16;
        let mut sb = Superblock {
            version,
            generation,
            uuid,
            device_blocks: d.u64()?,
            node_size: d.u32()?,
            partition_size: d.u32()?,
            max_fanout: d.u32()?,
            max_key_len: d.u32()?,
            max_value_len: d.u32()?,
            compression: d.u8()?,
            clean: d.u8()? != 0,
            needs_check: {
                flags = d.u16()?;
                flags & FLAG_NEEDS_CHECK != 0
            },
            damaged: flags & FLAG_DAMAGED != 0,
            log_start_block: d.u64()?,
            log_blocks: d.u64()?,
            log_epoch: d.u64()?,
            log_tail_voff: d.u64()?,
            log_tail_lsn: d.u64()?,
            ckpt_lsn: d.u64()?,
            next_msn: d.u64()?,
            next_node_id: d.u64()?,
            root_id: d.u64()?,
            btt: Extent {
                block: d.u64()?,
                blocks: d.u64()?,
            },
            btt_crc: d.u32()?,
            btt_count: {
                d.u32()?;
                d.u64()?
            },
            created_unix: d.u64()?,
            checkpoint_unix: d.u64()?,
            label: decode_label(&block[LABEL_AT..LABEL_AT + LABEL_MAX])?,
            backups: Vec::new(),
            data_table: None,
            data_table_crc: 0,
            data_table_runs: 0,
        };
        if version >= 2 {
            let n = d.u32()? as usize;
            d.u32()?;
            if n > MAX_BACKUPS {
                return Err(Error::Corrupt(format!("superblock: {n} backup copies")));
            }
            for _ in 0..n {
                sb.backups.push(d.u64()?);
            }
        }
        if version >= 4 {
            let mut d = Dec::new(&block[DATA_TABLE_AT..DATA_TABLE_AT + 32], "superblock");
            sb.data_table = Some(Extent {
                block: d.u64()?,
                blocks: d.u64()?,
            });
            sb.data_table_crc = d.u32()?;
            d.u32()?;
            sb.data_table_runs = d.u64()?;
        }
        sb.validate()?;
        Ok(sb)
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(Error::Corrupt(format!("superblock: {m}")));
        if self.log_start_block != 2 || self.log_blocks == 0 {
            return bad("log region out of place");
        }
        if self.data_start_block() >= self.device_blocks {
            return bad("log region beyond the device");
        }
        if self.btt.block < self.data_start_block()
            || self.btt.block + self.btt.blocks > self.device_blocks
        {
            return bad("block translation table out of bounds");
        }
        if self.root_id == 0 || self.next_node_id <= self.root_id || self.next_msn == 0 {
            return bad("impossible counters");
        }
        if self.log_tail_lsn > self.ckpt_lsn {
            return bad("log tail after the checkpoint");
        }
        if let Err(m) = check_label(&self.label) {
            return bad(&m);
        }
        if self.version >= 2 && self.backups != backup_blocks(self.device_blocks) {
            return bad("backup copies out of place");
        }
        if self.backups.iter().any(|&b| b < self.data_start_block()) {
            return bad("a backup copy inside the log");
        }
        let ext = self.btt;
        if self
            .backups
            .iter()
            .any(|&b| b >= ext.block && b < ext.block + ext.blocks)
        {
            return bad("the block translation table covers a backup copy");
        }
        match self.data_table {
            None if self.version >= 4 => return bad("no data table"),
            None if self.data_table_crc != 0 || self.data_table_runs != 0 => {
                return bad("a data table count without a data table")
            }
            None => {}
            Some(_) if self.version < 4 => return bad("a data table before format 4"),
            Some(t) => {
                if t.blocks == 0
                    || t.block < self.data_start_block()
                    || t.block + t.blocks > self.device_blocks
                {
                    return bad("data table out of bounds");
                }
                if self
                    .backups
                    .iter()
                    .any(|&b| b >= t.block && b < t.block + t.blocks)
                {
                    return bad("the data table covers a backup copy");
                }
                if crate::datatable::RunMap::encoded_len(self.data_table_runs) > t.len() {
                    return bad("data table longer than its extent");
                }
            }
        }
        Ok(())
    }

    /// Writes this superblock into its primary slot (`generation % 2`) as it is, without the
    /// checks the engine makes before it writes one: for tests that forge or damage an image.
    /// The engine writes superblocks only through its checkpointer (`engine/checkpoint.rs`).
    #[doc(hidden)]
    pub fn forge_for_tests(&self, dev: &dyn BlockDevice) -> Result<()> {
        crate::engine::write_primary(dev, self)
    }

    /// The uuid in the usual text form (`8-4-4-4-12` hexadecimal digits).
    pub fn uuid_string(&self) -> String {
        format_uuid(&self.uuid)
    }

    /// Reads the copies and returns the one to use, or the most telling error (see
    /// [`crate::copies::locate`]); `allow_fallback` accepts a copy that no backup vouches for
    /// when the newer one is damaged (the repair path).
    pub fn read_newest(dev: &dyn BlockDevice, allow_fallback: bool) -> Result<Superblock> {
        Superblock::locate(dev, allow_fallback).map(|l| l.sb)
    }

    /// Reads every copy, picks the one to use and says what is wrong with the others.
    pub fn locate(dev: &dyn BlockDevice, allow_fallback: bool) -> Result<Located> {
        crate::copies::locate(dev, allow_fallback)
    }
}

/// Checks a label for the superblock: at most [`LABEL_MAX`] bytes of UTF-8 without NUL.
pub fn check_label(label: &str) -> std::result::Result<(), String> {
    if label.len() > LABEL_MAX {
        return Err(format!(
            "a label holds at most {LABEL_MAX} bytes ({} given)",
            label.len()
        ));
    }
    if label.contains('\0') {
        return Err("a label cannot hold a NUL byte".into());
    }
    Ok(())
}

fn decode_label(field: &[u8]) -> Result<String> {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    if field[end..].iter().any(|&b| b != 0) {
        return Err(Error::Corrupt(
            "superblock: bytes after the label's end".into(),
        ));
    }
    String::from_utf8(field[..end].to_vec())
        .map_err(|_| Error::Corrupt("superblock: the label is not UTF-8".into()))
}

/// Formats a uuid as `8-4-4-4-12` hexadecimal digits.
pub fn format_uuid(u: &[u8; 16]) -> String {
    let hex: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// Parses a uuid written as 32 hexadecimal digits, with or without the four dashes.
pub fn parse_uuid(s: &str) -> std::result::Result<[u8; 16], String> {
    let bad = || format!("{s:?} is not a UUID (like 0b8f9a3e-4c1d-4f6a-9e2b-7d5c3a1f0e42)");
    let dashes: Vec<usize> = s.match_indices('-').map(|(i, _)| i).collect();
    if !dashes.is_empty() && dashes != [8, 13, 18, 23] {
        return Err(bad());
    }
    let hex: String = s.chars().filter(|&c| c != '-').collect();
    if hex.len() != 32 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(bad());
    }
    let mut u = [0u8; 16];
    for (i, b) in u.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(u)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::engine::{write_backups, write_primary};
    use amaranth_device::MemDevice;

    /// A superblock of generation `generation` for a device of 1000 blocks.
    pub(crate) fn sample(generation: u64) -> Superblock {
        Superblock {
            version: FORMAT_VERSION,
            generation,
            uuid: [7; 16],
            device_blocks: 1000,
            node_size: 16384,
            partition_size: 4096,
            max_fanout: 4,
            max_key_len: 256,
            max_value_len: 1024,
            compression: 0,
            clean: true,
            needs_check: false,
            damaged: false,
            log_start_block: 2,
            log_blocks: 100,
            log_epoch: 3,
            log_tail_voff: 4096,
            log_tail_lsn: 5,
            ckpt_lsn: 9,
            next_msn: 77,
            next_node_id: 10,
            root_id: 1,
            btt: Extent {
                block: 200,
                blocks: 1,
            },
            btt_crc: 1234,
            btt_count: 3,
            created_unix: 1,
            checkpoint_unix: 2,
            label: "data-é".into(),
            backups: backup_blocks(1000),
            data_table: Some(Extent {
                block: 201,
                blocks: 1,
            }),
            data_table_crc: 99,
            data_table_runs: 4,
        }
    }

    #[test]
    fn the_check_flag_round_trips_and_sits_in_the_reserved_bytes() {
        let mut sb = sample(3);
        let plain = sb.encode();
        assert_eq!(&plain[70..72], &[0, 0]);
        sb.needs_check = true;
        let flagged = sb.encode();
        assert_eq!(&flagged[70..72], &[1, 0]);
        assert_eq!(Superblock::decode(&flagged, 0).unwrap(), sb);
        sb.damaged = true;
        assert_eq!(&sb.encode()[70..72], &[3, 0]);
        assert_eq!(Superblock::decode(&sb.encode(), 0).unwrap(), sb);
        sb.needs_check = false;
        sb.damaged = false;
        assert_eq!(Superblock::decode(&plain, 0).unwrap(), sb);
    }

    /// `sb` encoded, then `f` applied to the bytes and the checksum fixed (for what `encode`
    /// refuses to write).
    fn forged(sb: &Superblock, f: impl FnOnce(&mut [u8])) -> Vec<u8> {
        let mut b = sb.encode().to_vec();
        f(&mut b);
        let c = crc_with_hole(&b, CRC_AT);
        b[CRC_AT..CRC_AT + 4].copy_from_slice(&c.to_le_bytes());
        b
    }

    #[test]
    fn label_and_uuid_round_trip() {
        let sb = sample(3);
        let buf = sb.encode();
        assert_eq!(&buf[LABEL_AT..LABEL_AT + 7], "data-é".as_bytes());
        assert_eq!(Superblock::decode(&buf, 0).unwrap(), sb);
        assert_eq!(sb.uuid_string(), "07070707-0707-0707-0707-070707070707");
        let u = parse_uuid("0b8f9a3e-4c1d-4f6a-9e2b-7d5c3a1f0e42").unwrap();
        assert_eq!(format_uuid(&u), "0b8f9a3e-4c1d-4f6a-9e2b-7d5c3a1f0e42");
        assert_eq!(parse_uuid("0b8f9a3e4c1d4f6a9e2b7d5c3a1f0e42").unwrap(), u);
        for bad in [
            "",
            "xyz",
            "0b8f9a3e-4c1d-4f6a-9e2b-7d5c3a1f0e4",
            "0b8f-9a3e4c1d-4f6a-9e2b-7d5c3a1f0e42",
        ] {
            assert!(parse_uuid(bad).is_err(), "{bad:?}");
        }
        assert!(check_label(&"x".repeat(LABEL_MAX)).is_ok());
        assert!(check_label(&"x".repeat(LABEL_MAX + 1)).is_err());
        assert!(check_label("a\0b").is_err());
    }

    #[test]
    fn the_label_and_the_backup_list_live_together_and_the_checksum_covers_both() {
        let sb = sample(4);
        let buf = sb.encode();
        assert_eq!(
            u32::from_le_bytes(buf[BACKUPS_AT..BACKUPS_AT + 4].try_into().unwrap()),
            3
        );
        assert_eq!(&buf[LABEL_AT..LABEL_AT + 7], "data-é".as_bytes());
        // A flipped bit in the label is a checksum error, as one in the backup list.
        for at in [LABEL_AT + 2, LABEL_AT + LABEL_MAX - 1, BACKUPS_AT + 9] {
            let mut b = buf.to_vec();
            b[at] ^= 1;
            assert!(
                matches!(Superblock::decode(&b, 0), Err(Error::Checksum { .. })),
                "byte {at}"
            );
        }
        // Bytes after the label's NUL, or a label that is not UTF-8: damage even with a good crc.
        let tail = forged(&sb, |b| b[LABEL_AT + LABEL_MAX - 1] = b'x');
        assert!(matches!(
            Superblock::decode(&tail, 0),
            Err(Error::Corrupt(_))
        ));
        let not_utf8 = forged(&sb, |b| b[LABEL_AT] = 0xff);
        assert!(matches!(
            Superblock::decode(&not_utf8, 0),
            Err(Error::Corrupt(_))
        ));
        // A version-1 superblock reads its label at the same place (zeros there: no label).
        let mut v1 = sample(4);
        v1.version = 1;
        v1.backups.clear();
        v1.data_table = None;
        v1.data_table_crc = 0;
        v1.data_table_runs = 0;
        assert_eq!(Superblock::decode(&v1.encode(), 0).unwrap().label, "data-é");
        v1.label.clear();
        assert!(v1.encode()[BACKUPS_AT..].iter().all(|&x| x == 0));
    }

    #[test]
    fn the_data_table_location_is_in_format_4_only() {
        let sb = sample(4);
        let buf = sb.encode();
        assert_eq!(
            u64::from_le_bytes(buf[DATA_TABLE_AT..DATA_TABLE_AT + 8].try_into().unwrap()),
            201
        );
        assert_eq!(Superblock::decode(&buf, 0).unwrap(), sb);
        // Format 3: no data table, and zeros where format 4 has it.
        let mut v3 = sample(4);
        v3.version = 3;
        assert!(v3.validate().is_err(), "a data table in format 3");
        v3.data_table = None;
        v3.data_table_crc = 0;
        v3.data_table_runs = 0;
        let b3 = v3.encode();
        assert!(b3[DATA_TABLE_AT..DATA_TABLE_AT + 32]
            .iter()
            .all(|&x| x == 0));
        assert_eq!(Superblock::decode(&b3, 0).unwrap(), v3);
        // Format 4 without one, or with one over a backup copy, is damage.
        let none = forged(&sb, |b| b[DATA_TABLE_AT..DATA_TABLE_AT + 32].fill(0));
        assert!(Superblock::decode(&none, 0).is_err());
        let over = forged(&sb, |b| {
            b[DATA_TABLE_AT..DATA_TABLE_AT + 8].copy_from_slice(&250u64.to_le_bytes())
        });
        assert!(Superblock::decode(&over, 0).is_err());
    }

    #[test]
    fn encoding_round_trips_both_versions() {
        let mut sb = sample(4);
        sb.damaged = true;
        let back = Superblock::decode(&sb.encode(), 0).unwrap();
        assert_eq!(back, sb);
        let mut v1 = sample(4);
        v1.version = 1;
        v1.backups.clear();
        v1.data_table = None;
        v1.data_table_crc = 0;
        v1.data_table_runs = 0;
        assert_eq!(Superblock::decode(&v1.encode(), 0).unwrap(), v1);
        // Backups must be where the device size puts them.
        let moved = forged(&sample(4), |b| b[BACKUPS_AT + 16] ^= 1);
        let err = Superblock::decode(&moved, 0).unwrap_err();
        assert!(err.to_string().contains("backup"), "{err}");
        let future = forged(&sample(4), |b| {
            b[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes())
        });
        assert!(matches!(
            Superblock::decode(&future, 0),
            Err(Error::UnsupportedVersion { found, supported })
                if found == FORMAT_VERSION + 1 && supported == FORMAT_VERSION
        ));
    }

    #[test]
    fn writes_go_to_the_slot_and_the_backups() {
        let dev = MemDevice::new(1000 * 4096);
        let sb = sample(5);
        write_primary(&dev, &sb).unwrap();
        write_backups(&dev, &sb).unwrap();
        for b in [1u64, 250, 500, 750] {
            let got = dev.with_bytes_mut(|d| {
                Superblock::decode(&d[b as usize * 4096..(b as usize + 1) * 4096], 0)
            });
            assert_eq!(got.unwrap(), sb, "copy at block {b}");
        }
        assert!(dev.with_bytes_mut(|d| d[..4096].iter().all(|&x| x == 0)));
    }
}
