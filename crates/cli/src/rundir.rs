//! The run directory: where a daemon keeps its pid file and control socket (and, for users other
//! than root, its log), created and trusted only when it is private.
//!
//! The directory is made with mode 0700 and used only if it is a real directory (not a symbolic
//! link), owned by the effective user and writable by nobody else; otherwise the command refuses
//! with an error that says why, as ssh-agent and tmux do. The `/tmp/amaranth-<uid>` fallback sits
//! in a world-writable directory: another user can create it first and plant links in it that would
//! make the daemon write into the mounting user's files. A directory of ours that others could only
//! read (0755 from older versions) is tightened to 0700. Files inside are reached through the
//! directory's descriptor, so the checked directory is the one used.

use std::fs::{DirBuilder, File};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::files::{self, Create};
use crate::util::{euid, is_root, CliResult, Failure};

/// Longest mount-point name kept readable in file names; longer ones are cut and hashed.
const NAME_MAX: usize = 80;

/// Where the run directory is: `AMARANTH_RUN_DIR`, `/run/amaranth` for root,
/// `$XDG_RUNTIME_DIR/amaranth`, else `/tmp/amaranth-<uid>`.
pub fn run_dir_path() -> PathBuf {
    if let Some(d) = std::env::var_os("AMARANTH_RUN_DIR") {
        return PathBuf::from(d);
    }
    if is_root() {
        return PathBuf::from("/run/amaranth");
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR") {
        return PathBuf::from(d).join("amaranth");
    }
    PathBuf::from(format!("/tmp/amaranth-{}", euid()))
}

/// The checked run directory, held open.
#[derive(Debug)]
pub struct RunDir {
    path: PathBuf,
    fd: OwnedFd,
}

impl RunDir {
    /// Creates the run directory (mode 0700) if it is missing and checks that it is private.
    pub fn create() -> CliResult<RunDir> {
        let path = run_dir_path();
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&path)
            .map_err(|e| {
                Failure::new(format!(
                    "cannot create the run directory {}: {e}",
                    path.display()
                ))
            })?;
        let fd = open_private(&path).map_err(|e| refusal(&path, e))?;
        let mode = File::from(fd.try_clone().map_err(|e| refusal(&path, e))?)
            .metadata()
            .map_err(|e| refusal(&path, e))?
            .mode();
        if mode & 0o077 != 0 {
            // Only read or search bits for others (checked above): nobody else could have put
            // anything inside, so tightening it is safe.
            // SAFETY: fchmod on a descriptor we own.
            if unsafe { libc::fchmod(fd.as_raw_fd(), 0o700) } != 0 {
                return Err(refusal(&path, io::Error::last_os_error()));
            }
        }
        Ok(RunDir { path, fd })
    }

    /// The run directory if it exists and is private; `None` if it does not exist.
    pub fn existing() -> CliResult<Option<RunDir>> {
        let path = run_dir_path();
        match open_private(&path) {
            Ok(fd) => Ok(Some(RunDir { path, fd })),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(refusal(&path, e)),
        }
    }

    /// The directory's path (for messages).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A path to `name` through the directory's descriptor (`/proc/self/fd/N/name`): short enough
    /// for a socket address whatever the directory's own path is, and always this directory.
    pub fn via_fd(&self, name: &str) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}/{name}", self.fd.as_raw_fd()))
    }

    /// Opens `name` in the directory for writing (see `files::open_for_writing`).
    pub fn open_for_writing(&self, name: &str, how: Create, mode: u32) -> io::Result<File> {
        files::open_at(self.raw(), Path::new(name), how, mode)
    }

    /// The pid in the file `name`, if it is a readable pid file of ours.
    pub fn read_pid(&self, name: &str) -> Option<i32> {
        files::read_pid_at(self.raw(), Path::new(name))
    }

    /// Removes `name` from the directory (a missing file is not an error).
    pub fn remove(&self, name: &str) {
        let _ = files::unlink_at(self.raw(), Path::new(name));
    }

    fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Opens `path` as a directory without following a final symbolic link and checks that it is
/// owned by the effective user and writable by nobody else.
fn open_private(path: &Path) -> io::Result<OwnedFd> {
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    let fd = files::open_raw(libc::AT_FDCWD, path, flags, 0).map_err(|e| {
        let link = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
        match e.raw_os_error() {
            Some(libc::ELOOP | libc::ENOTDIR) if link => {
                io::Error::new(e.kind(), "it is a symbolic link")
            }
            Some(libc::ENOTDIR) => io::Error::new(e.kind(), "it is not a directory"),
            _ => e,
        }
    })?;
    let meta = File::from(fd.try_clone()?).metadata()?;
    if meta.uid() != euid() {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "it is owned by uid {}, not by you (uid {})",
                meta.uid(),
                euid()
            ),
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "others can write into it (mode {:04o})",
                meta.mode() & 0o7777
            ),
        ));
    }
    Ok(fd)
}

fn refusal(path: &Path, e: io::Error) -> Failure {
    Failure::new(format!(
        "refusing to use the run directory {}: {e}; remove it (or set XDG_RUNTIME_DIR or \
         AMARANTH_RUN_DIR to a private directory of yours)",
        path.display()
    ))
}

/// A file name for a mount point, like systemd's unit names: `/mnt/amaranth` → `mnt-amaranth`
/// (other bytes than `[A-Za-z0-9_.]` as `%XX`, slashes as dashes). A name longer than 80 bytes is
/// cut and ends with a hash of the whole path, so any mount point gets a valid, distinct name.
pub fn mount_name(p: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let bytes = p.as_os_str().as_bytes();
    let trimmed: &[u8] = {
        let mut b = bytes;
        while let [b'/', rest @ ..] = b {
            b = rest;
        }
        while let [rest @ .., b'/'] = b {
            b = rest;
        }
        b
    };
    if trimmed.is_empty() {
        return "-".into();
    }
    let mut out = String::new();
    for &c in trimmed {
        match c {
            b'/' => out.push('-'),
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => out.push(c as char),
            b'.' if !out.is_empty() => out.push('.'),
            _ => out.push_str(&format!("%{c:02X}")),
        }
    }
    if out.len() > NAME_MAX {
        // The escaped name is ASCII: any byte index is a character boundary.
        out.truncate(NAME_MAX - 17);
        out.push_str(&format!("~{:016x}", fnv1a(bytes)));
    }
    out
}

/// File name of the pid file of the daemon serving `mountpoint`.
pub fn pid_name(mountpoint: &Path) -> String {
    format!("{}.pid", mount_name(mountpoint))
}

/// File name of the control socket of the daemon serving `mountpoint`.
pub fn socket_name(mountpoint: &Path) -> String {
    format!("{}.sock", mount_name(mountpoint))
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(mount_name(Path::new("/mnt/amaranth")), "mnt-amaranth");
        assert_eq!(mount_name(Path::new("/tmp/a-b c/")), "tmp-a%2Db%20c");
        assert_eq!(mount_name(Path::new("/")), "-");
        assert_eq!(mount_name(Path::new("/.x")), "%2Ex");
        let deep = format!("/{}", ["deep-dir"; 100].join("/"));
        let other = format!("{deep}x");
        let (a, b) = (mount_name(Path::new(&deep)), mount_name(Path::new(&other)));
        assert_eq!(a.len(), NAME_MAX);
        assert_ne!(a, b, "long names stay distinct");
        assert!(a.starts_with("deep%2Ddir-deep"));
    }
}
