//! Amaranth's storage engine: a write-optimized Bε-tree key-value store.
//!
//! Keys and values are byte strings; keys sort in `memcmp` order. Writes are *messages* (put,
//! delete, upsert, range delete) injected at the root and moved down in batches when a node's
//! buffers overflow (the heaviest child's buffer is flushed first), so a small write costs a small
//! fraction of a node write. Queries apply pending messages on the way down without flushing.
//!
//! Durability comes from a redo log in the image (group commit; [`Engine::sync`] waits for it) and
//! from copy-on-write checkpoints: nodes are never written over blocks the last checkpoint
//! references, and a superblock switch makes a checkpoint current. After a crash, [`Engine::open`]
//! replays the longest valid prefix of the log, so the state is always that of a prefix of the
//! operations, and includes every operation acknowledged before a completed `sync`.
//!
//! ```
//! use std::sync::Arc;
//! use amaranth_device::MemDevice;
//! use amaranth_engine::{Engine, Format, Options, Patch};
//!
//! let dev = Arc::new(MemDevice::new(128 << 20));
//! let opts = Options { cache_size: 32 << 20, background_threads: false, ..Options::default() };
//! let engine = Engine::create(dev.clone(), Format::default(), opts.clone()).unwrap();
//! engine.put(b"a", b"hello").unwrap();
//! engine.upsert(b"a", Patch::Write { offset: 5, data: b" world".to_vec() }).unwrap();
//! assert_eq!(engine.get(b"a").unwrap().as_deref(), Some(&b"hello world"[..]));
//! engine.close().unwrap();
//! let engine = Engine::open(dev, opts).unwrap();
//! assert_eq!(engine.get(b"a").unwrap().as_deref(), Some(&b"hello world"[..]));
//! ```

#![deny(missing_docs)]

mod apply;
#[cfg(test)]
mod batch_bound_tests;
mod blockdata;
mod btt;
mod buffer;
#[cfg(test)]
mod buffer_mem_tests;
mod bufpool;
mod cache;
mod codec;
mod compress;
mod config;
mod copies;
mod dataio;
mod dataref;
mod datatable;
mod datawriter;
mod destination;
mod engine;
mod error;
#[cfg(test)]
mod eviction_tests;
#[cfg(test)]
mod heal_tests;
mod heap;
mod info;
#[cfg(test)]
mod inplace_tests;
#[cfg(test)]
mod invariant_tests;
#[cfg(test)]
mod lift_tests;
mod load;
#[cfg(test)]
mod load_found_tests;
#[cfg(test)]
mod longest_tests;
mod msg;
mod node;
mod noderefs;
mod ops;
mod partition;
mod placement;
#[cfg(test)]
mod prefer_tests;
mod prefix;
mod read;
#[cfg(test)]
mod readahead_tests;
mod rebuild;
mod refcheck;
#[cfg(test)]
mod run_read_tests;
mod salvage;
mod snapshot;
mod space;
#[cfg(test)]
mod stepwise_tests;
mod store;
mod subbytes;
mod superblock;
mod tree;
mod trim;
mod upgrade;
mod verify;
mod wal;
mod writeback;
mod writebuf;

pub use config::{Compression, Format, Options};
#[doc(hidden)]
pub use copies::Located;
pub use engine::{BlockRead, BlockRef, Engine, RangeIter, Sharing, Stats, StoredValue, View};
pub use error::{Error, Result};
pub use info::ImageInfo;
pub use msg::Patch;
pub use ops::{prefix_end, Batch, BlockData, Op};
pub use refcheck::RefCheck;
pub use salvage::{Damage, DamagedPart, SalvageReport};
pub use snapshot::{check_snapshot_name, SnapshotInfo, SnapshotSizes, MAX_SNAPSHOT_NAME};
pub use space::SpaceUse;
/// The superblock itself, for tests that read or forge images byte by byte; tools read an image
/// through [`ImageInfo`], and only the engine's checkpointer writes superblocks.
#[doc(hidden)]
pub use superblock::Superblock;
pub use superblock::{backup_blocks, check_label, format_uuid, parse_uuid, FORMAT_VERSION};
pub use upgrade::{downgrade_for_tests, upgrade, UpgradeReport};
pub use verify::Report;
pub use wal::{LogStats, Lsn};
