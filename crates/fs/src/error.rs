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
            _ => log::error!("amaranth: engine error: {e}"),
        }
        Errno(e.errno())
    }
}

impl std::fmt::Display for Errno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", std::io::Error::from_raw_os_error(self.0))
    }
}
