//! Opening the files the CLI writes (logs, pid files) so that a planted link cannot redirect the
//! writes, and the credentials check of the control socket.
//!
//! A file to write is opened with `O_NOFOLLOW | O_CLOEXEC` (a symbolic link as the last component
//! is refused, dangling or not), `O_NONBLOCK` (a planted FIFO cannot block the open) and without
//! `O_TRUNC`; it is then used only if it is a regular file with one link, owned by the effective
//! user, and only then truncated when it is to be replaced.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::util::euid;

/// How a file is opened for writing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Create {
    /// Keep the contents and append (a log).
    Append,
    /// Replace the contents (a pid file).
    Replace,
}

fn cpath(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: the path holds a NUL byte", path.display()),
        )
    })
}

/// `openat(dir, path, flags, mode)` as an owned descriptor.
pub(crate) fn open_raw(dir: RawFd, path: &Path, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let c = cpath(path)?;
    // SAFETY: a valid NUL-terminated path; the result is checked.
    let fd = unsafe { libc::openat(dir, c.as_ptr(), flags, mode as libc::c_uint) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens `path` (relative to the directory `dir`, or `AT_FDCWD`) for writing; see the module
/// documentation. `mode` is the mode of a file created now.
pub(crate) fn open_at(dir: RawFd, path: &Path, how: Create, mode: u32) -> io::Result<File> {
    let mut flags = libc::O_WRONLY
        | libc::O_CREAT
        | libc::O_NOFOLLOW
        | libc::O_CLOEXEC
        | libc::O_NONBLOCK
        | libc::O_NOCTTY;
    if how == Create::Append {
        flags |= libc::O_APPEND;
    }
    let fd = open_raw(dir, path, flags, mode).map_err(|e| match e.raw_os_error() {
        Some(libc::ELOOP) => io::Error::new(e.kind(), LINK),
        // O_NONBLOCK: a FIFO without a reader.
        Some(libc::ENXIO) => io::Error::new(e.kind(), "it is not a regular file"),
        _ => e,
    })?;
    let file = File::from(fd);
    check_ours(&file.metadata()?)?;
    // O_NONBLOCK only kept a FIFO from blocking the open; a regular file ignores it.
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        let fl = libc::fcntl(file.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(file.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK);
    }
    if how == Create::Replace {
        file.set_len(0)?;
    }
    Ok(file)
}

/// Opens `path` for writing (see the module documentation).
pub fn open_for_writing(path: &Path, how: Create, mode: u32) -> io::Result<File> {
    open_at(libc::AT_FDCWD, path, how, mode)
}

const LINK: &str = "it is a symbolic link: refusing to write through it";

/// Whether `path` could be opened for writing: missing, or a regular file of ours with one link
/// (checked before the daemon starts, so the refusal reaches the terminal; the open checks again).
pub fn check_writable(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => {
            Err(io::Error::new(io::ErrorKind::PermissionDenied, LINK))
        }
        Ok(m) => check_ours(&m),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

fn check_ours(m: &std::fs::Metadata) -> io::Result<()> {
    let why = if !m.file_type().is_file() {
        "it is not a regular file".to_string()
    } else if m.nlink() != 1 {
        format!("it has {} hard links", m.nlink())
    } else if m.uid() != euid() {
        format!("it is owned by uid {}, not by uid {}", m.uid(), euid())
    } else {
        return Ok(());
    };
    Err(io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!("refusing to write it: {why}"),
    ))
}

/// Writes `pid` and a newline into a pid file opened with `Create::Replace`.
pub fn write_pid(mut f: &File, pid: u32) -> io::Result<()> {
    f.write_all(format!("{pid}\n").as_bytes())
}

/// The pid in the file `path` (relative to `dir`), if it is a pid file of ours: not followed
/// through a symbolic link, a regular file owned by the effective user.
pub(crate) fn read_pid_at(dir: RawFd, path: &Path) -> Option<i32> {
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK;
    let f = File::from(open_raw(dir, path, flags, 0).ok()?);
    let m = f.metadata().ok()?;
    if !m.file_type().is_file() || m.uid() != euid() {
        return None;
    }
    let mut s = String::new();
    f.take(64).read_to_string(&mut s).ok()?;
    s.trim().parse().ok().filter(|&p: &i32| p > 0)
}

/// The pid in the pid file `path` (see `read_pid_at`).
pub fn read_pid(path: &Path) -> Option<i32> {
    read_pid_at(libc::AT_FDCWD, path)
}

/// `unlinkat(dir, path)`: removes a name (a link itself, never what it points to).
pub(crate) fn unlink_at(dir: RawFd, path: &Path) -> io::Result<()> {
    let c = cpath(path)?;
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::unlinkat(dir, c.as_ptr(), 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The user id of the process at the other end of a Unix socket (`SO_PEERCRED`).
pub fn peer_uid(sock: &impl AsRawFd) -> io::Result<u32> {
    // SAFETY: ucred is plain data.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut libc::ucred as *mut libc::c_void,
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.uid)
}

/// Whether a process of user `peer` may talk to a daemon run by user `owner` (or the reverse):
/// the same user, or root.
pub fn may_talk(peer: u32, owner: u32) -> bool {
    peer == owner || peer == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_owner_and_root_may_talk() {
        assert!(may_talk(1000, 1000));
        assert!(may_talk(0, 1000));
        assert!(may_talk(0, 0));
        assert!(!may_talk(1001, 1000));
        assert!(!may_talk(1000, 0));
    }
}
