//! File-system errors are `errno` values.

use amaranth_engine::Error;

/// An `errno` value returned to the application.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Errno(pub i32);

/// Result of a file-system operation.
pub type Result<T> = std::result::Result<T, Errno>;

macro_rules! errnos {
    ($($name:ident),*) => {
        impl Errno {
            $(
                #[doc = concat!("`", stringify!($name), "`")]
                pub const $name: Errno = Errno(libc::$name);
            )*
        }
    };
}

errnos!(
    ENOENT,
    EEXIST,
    ENOTDIR,
    EISDIR,
    ENOTEMPTY,
    EINVAL,
    EIO,
    ENOSPC,
    ENAMETOOLONG,
    EPERM,
    EACCES,
    EXDEV,
    ENODATA,
    ERANGE,
    EFBIG,
    EBADF,
    EROFS,
    EOPNOTSUPP,
    ENXIO,
    ENOTSUP,
    EMLINK,
    ELOOP,
    E2BIG,
    ENODEV,
    ESTALE,
    EBUSY,
    ESRCH,
    EMFILE,
    ENFILE,
    ETIMEDOUT,
    ENOTTY
);

impl From<Error> for Errno {
    fn from(e: Error) -> Errno {
        match &e {
            Error::NoSpace(_) => {}
            Error::KeyTooLong { .. } => {}
            Error::GroupExpired(_) | Error::GroupTooLarge { .. } => {}
            Error::SnapshotExists(_) | Error::NoSuchSnapshot(_) | Error::InUse(_) => {}
            _ => log::error!("amaranth: engine error: {e}"),
        }
        Errno(errno_of(&e))
    }
}

/// The closest `errno` for an engine error.
fn errno_of(e: &Error) -> i32 {
    match e {
        Error::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        Error::InUse(_) => libc::EBUSY,
        Error::KeyTooLong { .. } => libc::ENAMETOOLONG,
        Error::ValueTooLarge { .. } => libc::EFBIG,
        Error::InvalidArgument(_) | Error::InvalidConfig(_) => libc::EINVAL,
        Error::NoSpace(_) => libc::ENOSPC,
        Error::ReadOnly(_) => libc::EROFS,
        Error::Closed => libc::ESHUTDOWN,
        Error::GroupTooLarge { .. } => libc::EFBIG,
        Error::GroupExpired(_) => libc::ETIMEDOUT,
        Error::SnapshotExists(_) => libc::EEXIST,
        Error::NoSuchSnapshot(_) => libc::ENOENT,
        Error::BadMagic(_)
        | Error::UnsupportedVersion { .. }
        | Error::Checksum { .. }
        | Error::Corrupt(_)
        | Error::Damaged(_)
        | Error::TooSmall(_) => libc::EIO,
    }
}

impl std::fmt::Display for Errno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", std::io::Error::from_raw_os_error(self.0))
    }
}
