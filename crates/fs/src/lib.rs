//! Amaranth's file system: the key schema and the POSIX operations on top of the engine.
//!
//! This crate knows nothing of FUSE: the adapter (`amaranth-fuse`) translates requests into calls on
//! [`Fs`], and tests drive [`Fs`] directly (for example on a fault-injecting device). Every
//! operation becomes one atomic engine batch, so after a crash the file system is the result of a
//! prefix of the operations, in order.

#![deny(missing_docs)]

pub mod acl;
pub mod check;
mod check_counts;
mod check_fix;
mod check_index;
mod check_scan;
pub mod describe;
mod error;
mod fs;
mod inode;
pub mod keys;
mod memory;
pub mod patchgroup;
mod space;
mod table;

pub use error::{Errno, Result};
pub use fs::{
    write_ops, zero_ops, Caller, Cloned, Ctx, DirEntry, Fs, FsCounters, FsOptions, Modes, SetAttr,
    SetTime, StatFs, COPY_MAX, DOOMED_MAX, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE,
    FALLOC_FL_ZERO_RANGE, NAME_MAX, OUT_OF_LINE_MIN, RENAME_COPY_MAX, RENAME_EXCHANGE,
    RENAME_NOREPLACE, SCHEMA_VERSION, SYMLINK_MAX, XATTR_VALUE_MAX,
};
pub use inode::{Inode, Kind, Meta, Reserved, Time};
pub use memory::TABLE_UNCHARGED;
pub use table::ROOT_INO;
