//! Format parameters (fixed when an image is created) and runtime options.

use std::time::Duration;

use crate::error::{Error, Result};

/// How node partitions are compressed on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// Stored as is.
    None,
    /// LZ4 block format.
    Lz4,
    /// Zstandard, level 1.
    Zstd,
}

impl Compression {
    /// The code stored on disk.
    pub fn code(self) -> u8 {
        match self {
            Compression::None => 0,
            Compression::Lz4 => 1,
            Compression::Zstd => 2,
        }
    }
    /// Parses an on-disk code.
    pub fn from_code(code: u8) -> Option<Compression> {
        match code {
            0 => Some(Compression::None),
            1 => Some(Compression::Lz4),
            2 => Some(Compression::Zstd),
            _ => None,
        }
    }
    /// Parses a name (`none`, `lz4`, `zstd`).
    pub fn from_name(name: &str) -> Option<Compression> {
        match name {
            "none" => Some(Compression::None),
            "lz4" => Some(Compression::Lz4),
            "zstd" => Some(Compression::Zstd),
            _ => None,
        }
    }
}

/// Parameters of the on-disk format, chosen when an image is created and stored in its superblock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Format {
    /// Target size of a node in bytes: a leaf splits above it, an internal node flushes above it.
    pub node_size: usize,
    /// Target size of a leaf partition (the unit a point query reads from disk).
    pub partition_size: usize,
    /// Most children an internal node has before it splits.
    pub max_fanout: usize,
    /// Longest key accepted.
    pub max_key_len: usize,
    /// Longest value accepted (also the longest result of an upsert).
    pub max_value_len: usize,
    /// Bytes reserved for the redo log (`None`: a sixteenth of the device, between 4 and 256 MiB).
    pub log_size: Option<u64>,
    /// Compression of node partitions and buffers.
    pub compression: Compression,
}

impl Default for Format {
    fn default() -> Format {
        Format {
            node_size: 4 << 20,
            partition_size: 128 << 10,
            max_fanout: 16,
            max_key_len: 16 << 10,
            max_value_len: 68 << 10,
            log_size: None,
            compression: Compression::None,
        }
    }
}

impl Format {
    /// A tiny format for tests: splits, merges and flushes happen constantly.
    pub fn small_for_tests() -> Format {
        Format {
            node_size: 16 << 10,
            partition_size: 4 << 10,
            max_fanout: 4,
            max_key_len: 256,
            max_value_len: 1024,
            log_size: Some(1 << 20),
            compression: Compression::None,
        }
    }

    /// Checks that the parameters are consistent.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidConfig(m));
        if !self.node_size.is_power_of_two()
            || self.node_size < 8 << 10
            || self.node_size > 64 << 20
        {
            return bad(format!(
                "node size {} must be a power of two between 8 KiB and 64 MiB",
                self.node_size
            ));
        }
        if self.partition_size < 1024 || self.partition_size * 2 > self.node_size {
            return bad(format!(
                "partition size {} must be at least 1 KiB and at most half the node size {}",
                self.partition_size, self.node_size
            ));
        }
        if self.max_fanout < 3 || self.max_fanout > 4096 {
            return bad(format!(
                "fanout {} must be between 3 and 4096",
                self.max_fanout
            ));
        }
        if self.max_key_len == 0 || self.max_key_len > u16::MAX as usize {
            return bad(format!(
                "maximum key length {} must be between 1 and 65535",
                self.max_key_len
            ));
        }
        if self.max_key_len + self.max_value_len + 64 > self.partition_size {
            return bad(format!(
                "a maximal entry (key {} + value {}) must fit in a partition of {} bytes",
                self.max_key_len, self.max_value_len, self.partition_size
            ));
        }
        if (self.max_key_len * 2 + self.max_value_len + 64) * 4 > self.node_size {
            return bad(format!(
                "node size {} holds fewer than four maximal messages",
                self.node_size
            ));
        }
        Ok(())
    }

    /// The fewest children an internal node keeps before it is merged with a sibling.
    pub fn min_fanout(&self) -> usize {
        (self.max_fanout / 4).max(2)
    }
}

/// Runtime options of an open engine.
#[derive(Clone, Debug)]
pub struct Options {
    /// Hard bound on the bytes of nodes and partitions held in memory.
    pub cache_size: usize,
    /// Period of the background log flush (group commit without `sync`).
    pub log_flush_interval: Duration,
    /// Period of automatic checkpoints.
    pub checkpoint_interval: Duration,
    /// Fraction of the log that, once used, triggers a checkpoint.
    pub checkpoint_log_fraction: f64,
    /// Run the background threads (log flusher, checkpointer, buffer cleaner). Tests turn them off
    /// to be deterministic; everything then happens in the calling threads.
    pub background_threads: bool,
    /// Open without writing anything (no recovery checkpoint, every write refused).
    pub read_only: bool,
    /// Accept the older superblock copy when the newer one is damaged (repair only: the state
    /// may then be older than what was acknowledged).
    pub fallback_superblock: bool,
    /// Check every node's structural invariants (pivot order, buffer placement, sizes) each time
    /// it changes, panicking on the first broken one. Costs a pass over the node per change:
    /// the tests turn it on; builds with debug assertions always check.
    pub check_invariants: bool,
    /// Repair (`amaranth fsck --repair`): open an image with known damage, and if a walk of the
    /// tree finds damage, rebuild the tree from its intact parts (see
    /// [`crate::Engine::salvage_report`]); replay what the redo log still holds even if later
    /// records are damaged. The checkpoint that follows clears the damage flag. Read-write only.
    pub salvage: bool,
    /// The longest an atomic group may stay open (see [`crate::Engine::begin_atomic`]): past it,
    /// anyone waiting for the group commits it as it stands and its later changes fail.
    pub atomic_group_timeout: Duration,
    /// Leaves read ahead of a sequential scan (one that starts where a recent one ended), by
    /// background threads; at most a quarter of `cache_size` in nodes. 0 turns read-ahead off.
    pub read_ahead: usize,
    /// Threads writing out-of-line data ([`crate::Batch::put_blocks`]) while the batch's record
    /// is logged and applied (docs/WRITEONCE.md: every flush waits for the writes before it). 0:
    /// the writer writes its data itself and waits for it.
    pub data_writers: usize,
    /// After each checkpoint, give the space freed since the last one back to the device: holes
    /// punched in an image file, discards sent to a block device (docs/DESIGN.md, "Discard").
    pub discard: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            cache_size: 256 << 20,
            log_flush_interval: Duration::from_secs(1),
            checkpoint_interval: Duration::from_secs(60),
            checkpoint_log_fraction: 0.5,
            background_threads: true,
            read_only: false,
            fallback_superblock: false,
            check_invariants: false,
            salvage: false,
            atomic_group_timeout: Duration::from_secs(10),
            read_ahead: 4,
            data_writers: 2,
            discard: true,
        }
    }
}

impl Options {
    /// Checks the options against the image's format.
    pub fn validate(&self, format: &Format) -> Result<()> {
        let min = format.node_size * 8;
        if self.cache_size < min {
            return Err(Error::InvalidConfig(format!(
                "cache size {} is below the minimum of {} (eight nodes of {} bytes)",
                self.cache_size, min, format.node_size
            )));
        }
        if self.salvage && self.read_only {
            return Err(Error::InvalidConfig(
                "a repair (salvage) opens the image read-write".into(),
            ));
        }
        if !(0.05..=0.95).contains(&self.checkpoint_log_fraction) {
            return Err(Error::InvalidConfig(
                "checkpoint_log_fraction must be between 0.05 and 0.95".into(),
            ));
        }
        Ok(())
    }
}
