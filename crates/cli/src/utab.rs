//! An entry in util-linux's `/run/mount/utab` for each mount made through `mount(8)`, so that a
//! plain `umount DIR` runs our umount helper (which waits for the daemon's final checkpoint).
//!
//! `umount(8)` (libmount 2.38) decides from `statfs` alone that a FUSE mount needs no helper,
//! unless utab holds an entry for the mount point; with one, it reads the mount's type
//! (`fuse.amaranth`) and runs `umount.fuse.amaranth`. The entry is written the way libmount writes
//! its own (under `flock` of `utab.lock`), names the mount by its id, and is removed again by
//! libmount after the helper ran, or by our unmount when something else unmounted.

use std::fs::OpenOptions;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// utab itself: `LIBMOUNT_UTAB` if set (libmount honours it too), else `/run/mount/utab`.
fn utab_path() -> PathBuf {
    std::env::var_os("LIBMOUNT_UTAB")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/mount/utab"))
}

/// Octal escapes for the bytes utab (like `/proc/mounts`) cannot hold raw.
fn escape(p: &[u8]) -> String {
    let mut s = String::new();
    for &b in p {
        match b {
            b' ' | b'\t' | b'\n' | b'\\' => s.push_str(&format!("\\{b:03o}")),
            _ => s.push(b as char),
        }
    }
    s
}

/// Opens (creating it, mode 0644) a file of utab's for reading and writing, never through a link.
fn open_rw(path: impl AsRef<Path>) -> io::Result<std::fs::File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(path)
}

/// Runs `f` on utab's contents under libmount's lock and writes back what it returns.
fn edit(f: impl FnOnce(String) -> String) -> io::Result<()> {
    let path = utab_path();
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    let mut lock_path = path.clone().into_os_string();
    lock_path.push(".lock");
    let lock = open_rw(&lock_path)?;
    // SAFETY: flock on a descriptor we own; released when it is closed.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut utab = open_rw(&path)?;
    let mut text = String::new();
    utab.read_to_string(&mut text)?;
    let next = f(text);
    utab.seek(SeekFrom::Start(0))?;
    utab.set_len(0)?;
    utab.write_all(next.as_bytes())?;
    Ok(())
}

/// Records the mount at `target` (id `id`, source `source`) so that `umount(8)` runs our helper.
pub fn add(id: u32, source: &Path, target: &Path) -> io::Result<()> {
    let line = format!(
        "ID={id} SRC={} TARGET={} ROOT=/ ATTRS=x-amaranth\n",
        escape(source.as_os_str().as_bytes()),
        escape(target.as_os_str().as_bytes())
    );
    let target_field = format!("TARGET={} ", escape(target.as_os_str().as_bytes()));
    edit(|text| {
        let mut out: String = text
            .lines()
            .filter(|l| !l.contains(&target_field))
            .map(|l| format!("{l}\n"))
            .collect();
        out.push_str(&line);
        out
    })
}

/// Removes our entries for `target` (after an unmount that libmount did not see).
pub fn remove(target: &Path) {
    let target_field = format!("TARGET={} ", escape(target.as_os_str().as_bytes()));
    if !utab_path().exists() {
        return;
    }
    let _ = edit(|text| {
        text.lines()
            .filter(|l| !(l.contains(&target_field) && l.contains("ATTRS=x-amaranth")))
            .map(|l| format!("{l}\n"))
            .collect()
    });
}

/// The mount id of the mount on top at `target`, from `/proc/self/mountinfo`.
pub fn mount_id(target: &Path) -> Option<u32> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = escape(target.as_os_str().as_bytes());
    text.lines().rev().find_map(|l| {
        let mut f = l.split(' ');
        let id = f.next()?.parse().ok()?;
        (f.nth(3)? == want).then_some(id)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_like_mountinfo() {
        assert_eq!(escape(b"/mnt/a b\\c"), "/mnt/a\\040b\\134c");
        assert!(mount_id(Path::new("/")).is_some());
    }
}
