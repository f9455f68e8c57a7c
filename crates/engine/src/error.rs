//! The engine's typed errors.

use std::io;

/// Everything that can go wrong in the engine. Each variant says what is wrong in words a user can
/// act on; none of them is ever replaced by a panic or by silently wrong data.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The device failed an I/O request.
    #[error("I/O error during {context}: {source}")]
    Io {
        /// What the engine was doing.
        context: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The image is already open in another process.
    #[error("the image is in use by another process: {0}")]
    InUse(String),
    /// A key longer than the configured maximum.
    #[error("key of {len} bytes is longer than the maximum of {max} bytes")]
    KeyTooLong {
        /// Length of the rejected key.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// A value (or an upsert's result) longer than the configured maximum.
    #[error("value of {len} bytes is longer than the maximum of {max} bytes")]
    ValueTooLarge {
        /// Length of the rejected value.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// A range whose low bound is above its high bound, or another malformed argument.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The device does not hold an Amaranth image.
    #[error("not an Amaranth image ({0})")]
    BadMagic(String),
    /// The image was written by an incompatible format version.
    #[error("{}", unsupported_version(*found, *supported))]
    UnsupportedVersion {
        /// Version found on disk.
        found: u32,
        /// Version this build supports.
        supported: u32,
    },
    /// A structure failed its checksum.
    #[error("checksum mismatch in {what} at byte {offset}")]
    Checksum {
        /// Which structure.
        what: String,
        /// Byte offset on the device.
        offset: u64,
    },
    /// A structure is internally inconsistent (checksummed correctly but impossible).
    #[error("corrupt image: {0}")]
    Corrupt(String),
    /// The image has known damage (a read found it, and no repair has run since): read-write opens
    /// are refused so that nothing is built on top of it.
    #[error(
        "the image has known damage ({0}); it can be opened read-only, or repaired with \
         `amaranth fsck --repair`"
    )]
    Damaged(String),
    /// The device is smaller than the image needs.
    #[error("device too small: {0}")]
    TooSmall(String),
    /// No free space left on the device.
    #[error("no space left on the device ({0})")]
    NoSpace(String),
    /// A configuration value out of range.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// An earlier device failure made the engine refuse further writes to protect the image.
    #[error("the engine is read-only after an earlier failure: {0}")]
    ReadOnly(String),
    /// The engine is closed.
    #[error("the engine is closed")]
    Closed,
    /// A change would make an atomic group larger than its limit (nothing of it was applied).
    #[error(
        "atomic group {group} would hold {bytes} bytes of log records, above its limit of {max}"
    )]
    GroupTooLarge {
        /// The group.
        group: u64,
        /// Its size with the refused change.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// An atomic group was committed as it stood when it outlived its time limit (or the engine
    /// closed); later changes in it are refused.
    #[error("atomic group {0} was committed at its time limit; it takes no more changes")]
    GroupExpired(u64),
    /// A snapshot of that name exists already (nothing was changed).
    #[error("a snapshot named {0:?} exists already")]
    SnapshotExists(String),
    /// No snapshot has that name (nothing was changed).
    #[error("no snapshot named {0:?}")]
    NoSuchSnapshot(String),
}

/// Result type of the engine.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Wraps a device error with what the engine was doing.
    pub fn io(context: impl Into<String>, source: io::Error) -> Error {
        if source.kind() == io::ErrorKind::ResourceBusy {
            return Error::InUse(source.to_string());
        }
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// Whether this error means the image itself is damaged (as opposed to a transient or usage error).
    pub fn is_corruption(&self) -> bool {
        matches!(
            self,
            Error::Checksum { .. } | Error::Corrupt(_) | Error::BadMagic(_) | Error::Damaged(_)
        )
    }

    /// Whether a read of the tree found this damage (a checksum mismatch or an impossible node):
    /// what makes the engine record known damage in the superblock.
    pub fn is_damage(&self) -> bool {
        matches!(self, Error::Checksum { .. } | Error::Corrupt(_))
    }
}

impl Clone for Error {
    fn clone(&self) -> Error {
        match self {
            Error::Io { context, source } => Error::Io {
                context: context.clone(),
                source: match source.raw_os_error() {
                    Some(code) => io::Error::from_raw_os_error(code),
                    None => io::Error::new(source.kind(), source.to_string()),
                },
            },
            Error::InUse(s) => Error::InUse(s.clone()),
            Error::KeyTooLong { len, max } => Error::KeyTooLong {
                len: *len,
                max: *max,
            },
            Error::ValueTooLarge { len, max } => Error::ValueTooLarge {
                len: *len,
                max: *max,
            },
            Error::InvalidArgument(s) => Error::InvalidArgument(s.clone()),
            Error::BadMagic(s) => Error::BadMagic(s.clone()),
            Error::UnsupportedVersion { found, supported } => Error::UnsupportedVersion {
                found: *found,
                supported: *supported,
            },
            Error::Checksum { what, offset } => Error::Checksum {
                what: what.clone(),
                offset: *offset,
            },
            Error::Corrupt(s) => Error::Corrupt(s.clone()),
            Error::Damaged(s) => Error::Damaged(s.clone()),
            Error::TooSmall(s) => Error::TooSmall(s.clone()),
            Error::NoSpace(s) => Error::NoSpace(s.clone()),
            Error::InvalidConfig(s) => Error::InvalidConfig(s.clone()),
            Error::ReadOnly(s) => Error::ReadOnly(s.clone()),
            Error::Closed => Error::Closed,
            Error::GroupTooLarge { group, bytes, max } => Error::GroupTooLarge {
                group: *group,
                bytes: *bytes,
                max: *max,
            },
            Error::GroupExpired(g) => Error::GroupExpired(*g),
            Error::SnapshotExists(s) => Error::SnapshotExists(s.clone()),
            Error::NoSuchSnapshot(s) => Error::NoSuchSnapshot(s.clone()),
        }
    }
}

/// The text of [`Error::UnsupportedVersion`]: an older image names the upgrade command.
fn unsupported_version(found: u32, supported: u32) -> String {
    if found < supported && (1..=2).contains(&found) {
        format!(
            "format {found} image: run `amaranth upgrade IMAGE` (rewrites every node once) or use \
             an older amaranth to read it"
        )
    } else {
        format!("unsupported format version {found} (this build reads version {supported})")
    }
}
