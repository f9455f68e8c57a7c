//! `amaranth clone SRC DST`: clones a directory tree (or a regular file) into a new name on the
//! same Amaranth mount, atomically, sharing the data until either side is written
//! (docs/SURGERY.md §5.4).
//!
//! The request is one ioctl on an open descriptor of SRC (`amaranth_fuse::clone_ioctl`), naming
//! DST's parent by inode number (held open meanwhile) and DST by name. What can be told here is
//! checked first, for clear messages (DST exists, another file system, DST inside SRC, SRC neither
//! a directory nor a regular file); the daemon checks everything again, permissions included,
//! and refuses with nothing changed.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use amaranth_fuse::clone_ioctl::{self, Args};

use crate::util::{CliResult, Failure};

/// `FUSE_SUPER_MAGIC`: what `statfs` says of every FUSE mount.
const FUSE_MAGIC: i64 = 0x6573_5546;

/// Runs `amaranth clone SRC DST`; with `verbose`, says what it made and how long each part took.
pub fn run(src: &Path, dst: &Path, verbose: bool) -> CliResult<i32> {
    let fail = |m: String| Failure::new(format!("{m} (nothing was changed)"));
    let name = match dst.file_name() {
        Some(n) => n.to_os_string(),
        _ => return Err(fail(format!("{}: not a name to create", dst.display()))),
    };
    let parent = match dst.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if dst.symlink_metadata().is_ok() {
        return Err(fail(format!("{}: already exists", dst.display())));
    }
    // Non-blocking: opening a FIFO would wait for a writer (it is refused below).
    let s = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(src)
        .map_err(|e| fail(format!("{}: {e}", src.display())))?;
    let sm = s
        .metadata()
        .map_err(|e| fail(format!("{}: {e}", src.display())))?;
    if !sm.is_dir() && !sm.is_file() {
        return Err(fail(format!(
            "{}: not a directory or a regular file",
            src.display()
        )));
    }
    let p = File::open(&parent).map_err(|e| fail(format!("{}: {e}", parent.display())))?;
    let pm = p
        .metadata()
        .map_err(|e| fail(format!("{}: {e}", parent.display())))?;
    if !pm.is_dir() {
        return Err(fail(format!("{}: not a directory", parent.display())));
    }
    if !on_fuse(&s) {
        return Err(fail(format!("{}: not on an Amaranth mount", src.display())));
    }
    if sm.dev() != pm.dev() {
        return Err(fail(format!(
            "{} and {} are on different mounts (a clone stays on one Amaranth mount)",
            src.display(),
            dst.display()
        )));
    }
    if sm.is_dir() {
        if let (Ok(a), Ok(b)) = (src.canonicalize(), parent.canonicalize()) {
            if b.starts_with(&a) {
                return Err(fail(format!(
                    "cannot clone {} into itself ({} would be inside it)",
                    src.display(),
                    dst.display()
                )));
            }
        }
    }
    let mut args = Args {
        parent: pm.ino(),
        name: name.as_bytes().to_vec(),
        ..Args::default()
    };
    let mut buf = args
        .encode()
        .ok_or_else(|| fail(format!("{}: name too long", dst.display())))?;
    let t = Instant::now();
    // SAFETY: the request's argument is a buffer of the size its number says, which we own.
    let r = unsafe { libc::ioctl(s.as_raw_fd(), clone_ioctl::number() as _, buf.as_mut_ptr()) };
    if r != 0 {
        let e = io::Error::last_os_error();
        return Err(fail(explain(&e, src, dst, &parent)));
    }
    let took = t.elapsed();
    args = Args::decode(&buf).unwrap_or(args);
    // The daemon drops the kernel's cached miss of the name, if any, from another thread: wait
    // until the name is seen, so that what follows this command finds it.
    let until = Instant::now() + Duration::from_secs(5);
    let seen = loop {
        match dst.symlink_metadata() {
            Ok(m) if m.ino() == args.ino => break true,
            _ if Instant::now() >= until => break false,
            _ => std::thread::sleep(Duration::from_millis(5)),
        }
    };
    if !seen {
        note!(
            "amaranth: {} was cloned (inode {}), but the kernel still shows its old entry; it \
             appears when the kernel's cache lets go of it",
            dst.display(),
            args.ino
        );
    }
    if verbose {
        say!(
            "cloned {} to {}: {} inodes in {:.1} ms (metadata read and batch built {:.1} ms, \
             logged and applied {:.1} ms)",
            src.display(),
            dst.display(),
            args.inodes,
            took.as_secs_f64() * 1e3,
            f64::from(args.prepare_us) / 1e3,
            f64::from(args.commit_us) / 1e3
        );
    }
    Ok(0)
}

/// Whether `f` is on a FUSE mount.
pub(crate) fn on_fuse(f: &File) -> bool {
    // SAFETY: an all-zero statfs is a valid buffer for fstatfs to fill.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and buffer.
    let r = unsafe { libc::fstatfs(f.as_raw_fd(), &mut st) };
    r == 0 && st.f_type as i64 == FUSE_MAGIC
}

/// What the daemon's refusal means.
fn explain(e: &io::Error, src: &Path, dst: &Path, parent: &Path) -> String {
    let (s, d, p) = (src.display(), dst.display(), parent.display());
    match e.raw_os_error() {
        Some(libc::ENOTTY) => {
            format!("{s}: not on an Amaranth mount (or its daemon is older than clones)")
        }
        Some(libc::EEXIST) => format!("{d}: already exists"),
        Some(libc::EINVAL) => format!("cannot clone {s} to {d}: {d} would be inside {s}"),
        Some(libc::EACCES) | Some(libc::EPERM) => format!(
            "permission denied: cloning {s} to {d} needs write and search permission on {p}, \
             and read permission on {s} and everything under it (search too on directories)"
        ),
        Some(libc::EFBIG) => format!(
            "{s} holds more entries than one atomic log record of this image takes; clone its \
             subdirectories one at a time, or use a larger image (its log grows with it)"
        ),
        Some(libc::ENAMETOOLONG) => {
            format!("cannot clone {s} to {d}: a path under {d} would be too long")
        }
        Some(libc::ENOENT) => format!("{s} or {p} is gone"),
        _ => format!("cannot clone {s} to {d}: {e}"),
    }
}
