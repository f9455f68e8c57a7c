//! `amaranth snapshot create|delete NAME MOUNTPOINT`, `amaranth snapshot list MOUNTPOINT`:
//! read-only, point-in-time snapshots of a whole mounted file system (docs/SURGERY.md §4.7,
//! §5.5), taken in the time of one root-node copy while the file system is in use.
//!
//! Each request is one ioctl on the mount's root directory (`amaranth_fuse::snapshot_ioctl`);
//! the daemon checks everything (root only for create and delete) and refuses with nothing
//! changed. The name is checked here first, for a clear message.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use amaranth_fuse::snapshot_ioctl::{self, Args, SnapOp};
use clap::Subcommand;
use serde_json::json;

use crate::util::{CliResult, Failure};

/// `amaranth snapshot ...`.
#[derive(Subcommand, Debug)]
pub enum SnapshotCommand {
    /// Take a snapshot of the whole file system mounted at MOUNTPOINT (root only): it holds
    /// every change acknowledged before it and none after, and is kept until deleted.
    Create {
        /// The snapshot's name: 1 to 255 bytes, no '/'.
        name: String,
        /// The mount point of an Amaranth file system.
        mountpoint: std::path::PathBuf,
    },
    /// Delete a snapshot (root only); the space only it held comes back in the background.
    Delete {
        /// The snapshot's name.
        name: String,
        /// The mount point of an Amaranth file system.
        mountpoint: std::path::PathBuf,
    },
    /// Mount a snapshot read-only on DIR (root only), beside the live tree: the daemon of
    /// MOUNTPOINT serves it as a second mount with its own device number until `amaranth umount
    /// DIR` (or until MOUNTPOINT is unmounted). A mounted snapshot cannot be deleted.
    Mount {
        /// The snapshot's name.
        name: String,
        /// The mount point of the Amaranth file system that holds it.
        mountpoint: std::path::PathBuf,
        /// An empty directory to mount it on.
        dir: std::path::PathBuf,
    },
    /// List the snapshots of the file system mounted at MOUNTPOINT, with the time each was
    /// taken (and with --sizes, what each holds alone and shares).
    List {
        /// The mount point of an Amaranth file system.
        mountpoint: std::path::PathBuf,
        /// Print a JSON array.
        #[arg(long)]
        json: bool,
        /// Also what each snapshot holds alone (what deleting it gives back: its nodes that
        /// nothing else reaches and the file data only they name) and the bytes of the nodes it
        /// shares; walks each snapshot's nodes.
        #[arg(long)]
        sizes: bool,
    },
}

/// Runs `amaranth snapshot ...`.
pub fn run(cmd: SnapshotCommand) -> CliResult<i32> {
    match cmd {
        SnapshotCommand::Create { name, mountpoint } => {
            let root = open_root(&mountpoint, true)?;
            let t = std::time::Instant::now();
            // What applications wrote before this command and the kernel still caches goes to
            // the daemon first, so that the snapshot holds it (a failure only loses that).
            // SAFETY: a valid descriptor.
            if unsafe { libc::syncfs(root.as_raw_fd()) } != 0 {
                note!(
                    "amaranth: syncfs {}: {} (writes still cached by the kernel may be missing \
                     from the snapshot)",
                    mountpoint.display(),
                    io::Error::last_os_error()
                );
            }
            let synced = t.elapsed();
            let a = request(
                &root,
                &mountpoint,
                Args::new(SnapOp::Create, name.as_bytes()),
            )?;
            let taken = t.elapsed() - synced;
            say!(
                "snapshot {name:?} of {} taken at {} in {:.1} ms (after {:.1} ms of syncfs; {} \
                 snapshots)",
                mountpoint.display(),
                utc(a.time_ns),
                taken.as_secs_f64() * 1e3,
                synced.as_secs_f64() * 1e3,
                a.count
            );
            Ok(0)
        }
        SnapshotCommand::Delete { name, mountpoint } => {
            let root = open_root(&mountpoint, true)?;
            let a = request(
                &root,
                &mountpoint,
                Args::new(SnapOp::Delete, name.as_bytes()),
            )?;
            say!(
                "snapshot {name:?} of {} deleted ({} left)",
                mountpoint.display(),
                a.count
            );
            Ok(0)
        }
        SnapshotCommand::Mount {
            name,
            mountpoint,
            dir,
        } => {
            let root = open_root(&mountpoint, true)?;
            let at = dir.canonicalize().map_err(|e| {
                Failure::new(format!("{}: {e} (nothing was changed)", dir.display()))
            })?;
            if !at.is_dir() {
                return Err(Failure::new(format!(
                    "{}: not a directory (nothing was changed)",
                    dir.display()
                )));
            }
            let mut args = Args::new(SnapOp::Mount, name.as_bytes());
            args.dir = at.as_os_str().as_bytes().to_vec();
            let a = request(&root, &mountpoint, args)?;
            say!(
                "snapshot {name:?} (taken at {}) mounted read-only on {}; unmount it with \
                 `amaranth umount {}`",
                utc(a.time_ns),
                at.display(),
                at.display()
            );
            Ok(0)
        }
        SnapshotCommand::List {
            mountpoint,
            json,
            sizes,
        } => {
            let root = open_root(&mountpoint, false)?;
            let op = if sizes {
                SnapOp::ListSizes
            } else {
                SnapOp::List
            };
            let mut all = Vec::new();
            loop {
                let mut a = Args::new(op, b"");
                a.index = all.len() as u32;
                match request(&root, &mountpoint, a) {
                    Ok(a) => all.push(a),
                    // Past the last one (or one deleted meanwhile).
                    Err(f) if f.message.contains("no snapshot") => break,
                    Err(f) => return Err(f),
                }
            }
            if json {
                let v: Vec<_> = all
                    .iter()
                    .map(|a| {
                        let mut o = json!({
                            "name": String::from_utf8_lossy(&a.name),
                            "time_ns": a.time_ns,
                            "msn": a.msn,
                        });
                        if sizes {
                            o["exclusive_bytes"] = json!(a.exclusive);
                            o["shared_bytes"] = json!(a.shared);
                        }
                        o
                    })
                    .collect();
                say!("{}", serde_json::Value::Array(v));
                return Ok(0);
            }
            let sized = |a: &Args| {
                if sizes {
                    format!(
                        " {:>10} {:>10}",
                        crate::util::human(a.exclusive),
                        crate::util::human(a.shared)
                    )
                } else {
                    String::new()
                }
            };
            if !all.is_empty() {
                let head = if sizes {
                    format!(" {:>10} {:>10}", "EXCLUSIVE", "SHARED")
                } else {
                    String::new()
                };
                say!("{:<32} {:<20} {:>12}{head}", "NAME", "TAKEN (UTC)", "MSN");
            }
            for a in &all {
                say!(
                    "{:<32} {:<20} {:>12}{}",
                    String::from_utf8_lossy(&a.name),
                    utc(a.time_ns),
                    a.msn,
                    sized(a)
                );
            }
            Ok(0)
        }
    }
}

/// The mount point's root directory, open, on an Amaranth (FUSE) mount.
fn open_root(mp: &Path, changes: bool) -> CliResult<File> {
    let suffix = if changes {
        " (nothing was changed)"
    } else {
        ""
    };
    let fail = |m: String| Failure::new(format!("{m}{suffix}"));
    let f = File::open(mp).map_err(|e| fail(format!("{}: {e}", mp.display())))?;
    if !crate::clone::on_fuse(&f) {
        return Err(fail(format!("{}: not an Amaranth mount", mp.display())));
    }
    Ok(f)
}

/// Sends one request; the daemon's refusal explained.
fn request(root: &File, mp: &Path, args: Args) -> CliResult<Args> {
    let name = String::from_utf8_lossy(&args.name).into_owned();
    let changes = !matches!(args.op, SnapOp::List | SnapOp::ListSizes);
    let fail = |m: String| {
        Failure::new(if changes {
            format!("{m} (nothing was changed)")
        } else {
            m
        })
    };
    if changes {
        amaranth_engine::check_snapshot_name(&name).map_err(|e| {
            fail(
                e.to_string()
                    .trim_start_matches("invalid argument: ")
                    .to_string(),
            )
        })?;
    }
    let mut buf = args
        .encode()
        .ok_or_else(|| fail(format!("snapshot name {name:?} too long")))?;
    // SAFETY: the request's argument is a buffer of the size its number says, which we own.
    let r = unsafe {
        libc::ioctl(
            root.as_raw_fd(),
            snapshot_ioctl::number() as _,
            buf.as_mut_ptr(),
        )
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        let m = mp.display();
        return Err(fail(match e.raw_os_error() {
            Some(libc::ENOTTY) => {
                format!("{m}: not an Amaranth mount (or its daemon is older than snapshots)")
            }
            Some(libc::EPERM) => "only root may create, delete or mount snapshots".into(),
            Some(libc::EEXIST) => format!("a snapshot named {name:?} exists already on {m}"),
            Some(libc::ENOENT) if changes => format!("no snapshot named {name:?} on {m}"),
            Some(libc::ENOENT) => "no snapshot with that number".into(),
            Some(libc::EINVAL) => {
                format!("{m} is not the root of an Amaranth mount (or the name is refused)")
            }
            Some(libc::EBUSY) => format!("snapshot {name:?} is mounted: unmount it first"),
            Some(libc::EROFS) => format!("{m} is mounted read-only"),
            Some(libc::ENOSPC) => format!("{m}: no space left for the snapshot's root"),
            _ => format!("{m}: {e}"),
        }));
    }
    Args::decode(&buf).ok_or_else(|| fail("the daemon's answer does not decode".into()))
}

/// A time in nanoseconds since the epoch as `YYYY-MM-DD HH:MM:SS` (UTC).
fn utc(ns: u64) -> String {
    let secs = ns / 1_000_000_000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::utc;

    #[test]
    fn times_are_utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(1_795_766_400 * 1_000_000_000), "2026-11-27 08:00:00");
        assert_eq!(utc(951_782_400 * 1_000_000_000), "2000-02-29 00:00:00");
    }
}
