//! Waiting for a daemon that is still releasing an image.
//!
//! After `umount DIR` the kernel detaches the mount at once, but the daemon still writes its final
//! checkpoint before it lets go of the image (seconds after a large write). An unmount through our
//! helpers (`amaranth umount`, `umount.fuse.amaranth`) waits for that; an unmount that did not (a
//! plain `umount2`, `fusermount3 -u`, `umount -i`) would make the next `mount` or `fsck` of the
//! image fail with "in use". So they wait instead, bounded and with a message, when the image's
//! lock is held by an Amaranth process whose mount is gone.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long `mount` and `fsck` wait for a daemon that is releasing the image.
pub const RELEASE_WAIT: Duration = Duration::from_secs(60);

/// Runs `open` until it stops failing with "in use" because of a releasing Amaranth daemon, for at
/// most [`RELEASE_WAIT`]; says once on stderr that it waits and for whom (`who`: the command).
pub fn wait_while_released<T>(
    image: &Path,
    who: &str,
    mut open: impl FnMut() -> io::Result<T>,
) -> io::Result<T> {
    let start = Instant::now();
    let mut told = false;
    loop {
        let e = match open() {
            Err(e) if e.kind() == io::ErrorKind::ResourceBusy => e,
            r => return r,
        };
        let Some(pid) = releasing_daemon(image) else {
            return Err(io::Error::new(e.kind(), format!("{e}{}", held_by(image))));
        };
        if start.elapsed() > RELEASE_WAIT {
            return Err(io::Error::new(
                io::ErrorKind::ResourceBusy,
                format!(
                    "{} is still held {} s after its unmount (by the Amaranth daemon, pid {pid})",
                    image.display(),
                    RELEASE_WAIT.as_secs()
                ),
            ));
        }
        if !told {
            let whom = if pid > 0 {
                format!(" (pid {pid})")
            } else {
                String::new()
            };
            note!(
                "{who}: waiting for the Amaranth daemon{whom} to finish releasing {} (its final \
                 checkpoint)",
                image.display()
            );
            told = true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The pid of an Amaranth process that has `image` open while no mount shows it: a daemon
/// finishing after an unmount (0 if the holder cannot be seen). (`/proc/locks` would name the process that took the lock, which is
/// the mount command that forked the daemon and has exited since.)
fn releasing_daemon(image: &Path) -> Option<i32> {
    let src = image.display().to_string();
    if amaranth_fuse::mounts().iter().any(|m| m.source == src) {
        return None;
    }
    let meta = std::fs::metadata(image).ok()?;
    let holders = holders(meta.dev(), meta.ino());
    if holders.is_empty() {
        // Nobody we can see: a daemon whose last threads are still closing (its main thread is
        // a zombie already, and a zombie's descriptors cannot be seen).
        return Some(0);
    }
    holders.into_iter().find(|&pid| is_amaranth(pid))
}

/// `" (held by pid N: COMMAND, ...)"` for the processes that have `image` open, or nothing.
fn held_by(image: &Path) -> String {
    let Ok(meta) = std::fs::metadata(image) else {
        return String::new();
    };
    let who: Vec<String> = holders(meta.dev(), meta.ino())
        .into_iter()
        .map(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmd: Vec<String> = cmd
                .split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .take(4)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            format!("pid {pid}: {}", cmd.join(" "))
        })
        .collect();
    if who.is_empty() {
        String::new()
    } else {
        format!(" (held by {})", who.join(", "))
    }
}

/// The processes that have the file `(dev, ino)` open (those whose descriptors we may see).
fn holders(dev: u64, ino: u64) -> Vec<i32> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        let open = fds
            .flatten()
            .any(|fd| std::fs::metadata(fd.path()).is_ok_and(|m| m.dev() == dev && m.ino() == ino));
        if open {
            out.push(pid);
        }
    }
    out
}

/// Whether `pid` runs this program (by any of its names: `amaranth`, `mount.fuse.amaranth`...),
/// or is exiting: a process that is exiting has released its memory, and its command line with
/// it, before it closes its files.
fn is_amaranth(pid: i32) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    if cmdline.is_empty() {
        return true;
    }
    let argv0 = cmdline.split(|&b| b == 0).next().unwrap_or_default();
    let name = argv0.rsplit(|&b| b == b'/').next().unwrap_or_default();
    String::from_utf8_lossy(name).contains("amaranth")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_processes_that_hold_a_file() {
        let dir = std::env::temp_dir().join(format!("amaranth-release-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("img");
        std::fs::write(&path, b"x").unwrap();
        let m = std::fs::metadata(&path).unwrap();
        assert!(holders(m.dev(), m.ino()).is_empty());
        let f = std::fs::File::open(&path).unwrap();
        assert_eq!(holders(m.dev(), m.ino()), vec![std::process::id() as i32]);
        drop(f);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
