//! The snapshot ioctl: the transport of `amaranth snapshot create|delete|list`
//! (docs/SURGERY.md §5.5).
//!
//! A restricted ioctl, `_IOWR(0xA7, 17, struct amaranth_snapshot_args)`, on an open descriptor
//! of the mount's root directory (a snapshot is of the whole file system: the root says so). The
//! argument (4,400 bytes, native byte order):
//!
//! ```text
//! u32 op            in: 1 create, 2 delete, 3 list, 4 mount, 5 list with sizes
//! u32 index         in: list: which snapshot (0 first, in name order)
//! u64 count         out: snapshots the image keeps (after the request)
//! u64 time_ns       out: create, list, mount: when the snapshot was taken (ns since the epoch)
//! u64 msn           out: create, list, mount: its record's message number
//! u64 exclusive     out: list with sizes: bytes only the snapshot holds (Engine::snapshot_sizes)
//! u64 shared        out: list with sizes: bytes of the nodes it shares
//! u8  name[256]     in: create, delete, mount; out: list. NUL-terminated
//! u8  dir[4096]     in: mount: the absolute path to mount the snapshot on. NUL-terminated
//! ```
//!
//! Creating, deleting and mounting need the request's uid to be 0 (`EPERM` otherwise); listing
//! is open to every user. Refusals change nothing: `EEXIST` (the name is taken), `ENOENT` (no
//! such snapshot; for a list, an index past the last), `EINVAL` (a bad name, or not the root),
//! `EBUSY` (the snapshot is mounted), `EROFS` (a read-only mount).
//!
//! A mount is a second FUSE session of the same daemon (the image is open once): a read-only
//! file system over the snapshot's engine handle (`Engine::snapshot_engine`), with its own
//! device number, served until it is unmounted (`amaranth umount DIR`, `fusermount -u DIR`),
//! and unmounted when the daemon's own mount ends ([`unmount_snapshots`]).

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use amaranth_fs::{Errno, Fs, FsOptions};

use crate::{MountOptions, Unmounter};

use crate::pg_ioctl::MAGIC;

/// Size of `struct amaranth_snapshot_args`.
pub const ARGS_SIZE: usize = DIR_AT + DIR_MAX;
/// Bytes of the mount directory's field.
const DIR_MAX: usize = 4096;
/// Offset of the mount directory.
const DIR_AT: usize = NAME_AT + 256;
/// The command's `nr` (the patchgroup commands use 1–7, the clone 16).
const NR: u32 = 17;
/// Offset of the name in the argument.
const NAME_AT: usize = 48;
/// The FUSE node id of a mount's root.
const ROOT_NODE: u64 = 1;

/// What a request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SnapOp {
    /// Take a snapshot named `name`.
    Create = 1,
    /// Delete snapshot `name`.
    Delete = 2,
    /// Describe snapshot number `index`.
    List = 3,
    /// Mount snapshot `name` read-only on `dir`.
    Mount = 4,
    /// Describe snapshot number `index` with its sizes (a walk of its nodes).
    ListSizes = 5,
}

/// The ioctl request number: `_IOWR(0xA7, 17, struct amaranth_snapshot_args)`.
pub fn number() -> u32 {
    const READ_WRITE: u32 = 3;
    READ_WRITE << 30 | (ARGS_SIZE as u32) << 16 | MAGIC << 8 | NR
}

/// Whether `cmd` is the snapshot ioctl.
pub fn is_snapshot(cmd: u32) -> bool {
    cmd == number()
}

/// `struct amaranth_snapshot_args`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Args {
    /// The request.
    pub op: SnapOp,
    /// List: which snapshot.
    pub index: u32,
    /// Out: snapshots kept.
    pub count: u64,
    /// Out: the snapshot's time.
    pub time_ns: u64,
    /// Out: its record's message number.
    pub msn: u64,
    /// Out (list with sizes): bytes only the snapshot holds.
    pub exclusive: u64,
    /// Out (list with sizes): bytes of the nodes it shares.
    pub shared: u64,
    /// The snapshot's name (at most 255 bytes).
    pub name: Vec<u8>,
    /// Mount: where (an absolute path, at most 4,095 bytes).
    pub dir: Vec<u8>,
}

impl Args {
    /// A request for `op` on `name`.
    pub fn new(op: SnapOp, name: &[u8]) -> Args {
        Args {
            op,
            index: 0,
            count: 0,
            time_ns: 0,
            msn: 0,
            exclusive: 0,
            shared: 0,
            name: name.to_vec(),
            dir: Vec::new(),
        }
    }

    /// The argument's bytes (`None` if the name does not fit).
    pub fn encode(&self) -> Option<[u8; ARGS_SIZE]> {
        if self.name.len() >= DIR_AT - NAME_AT || self.dir.len() >= DIR_MAX {
            return None;
        }
        let mut b = [0u8; ARGS_SIZE];
        b[..4].copy_from_slice(&(self.op as u32).to_ne_bytes());
        b[4..8].copy_from_slice(&self.index.to_ne_bytes());
        b[8..16].copy_from_slice(&self.count.to_ne_bytes());
        b[16..24].copy_from_slice(&self.time_ns.to_ne_bytes());
        b[24..32].copy_from_slice(&self.msn.to_ne_bytes());
        b[32..40].copy_from_slice(&self.exclusive.to_ne_bytes());
        b[40..48].copy_from_slice(&self.shared.to_ne_bytes());
        b[NAME_AT..NAME_AT + self.name.len()].copy_from_slice(&self.name);
        b[DIR_AT..DIR_AT + self.dir.len()].copy_from_slice(&self.dir);
        Some(b)
    }

    /// Parses an argument (`None` unless exactly [`ARGS_SIZE`] bytes, a known request and a
    /// NUL-terminated name).
    pub fn decode(b: &[u8]) -> Option<Args> {
        let b: &[u8; ARGS_SIZE] = b.try_into().ok()?;
        let u64_at = |i: usize| u64::from_ne_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let u32_at = |i: usize| u32::from_ne_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let op = match u32_at(0) {
            1 => SnapOp::Create,
            2 => SnapOp::Delete,
            3 => SnapOp::List,
            4 => SnapOp::Mount,
            5 => SnapOp::ListSizes,
            _ => return None,
        };
        let name = &b[NAME_AT..DIR_AT];
        let len = name.iter().position(|&c| c == 0)?;
        let dir = &b[DIR_AT..];
        let dir_len = dir.iter().position(|&c| c == 0)?;
        Some(Args {
            op,
            index: u32_at(4),
            count: u64_at(8),
            time_ns: u64_at(16),
            msn: u64_at(24),
            exclusive: u64_at(32),
            shared: u64_at(40),
            name: name[..len].to_vec(),
            dir: dir[..dir_len].to_vec(),
        })
    }
}

/// Carries out the snapshot ioctl on node `node` for the caller `uid` with the argument
/// `input`: the argument to copy back.
pub fn handle(fs: &Fs, node: u64, uid: u32, input: &[u8]) -> Result<[u8; ARGS_SIZE], Errno> {
    let mut a = Args::decode(input).ok_or(Errno::EINVAL)?;
    if node != ROOT_NODE {
        return Err(Errno::EINVAL);
    }
    let engine = fs.engine();
    let name = || std::str::from_utf8(&a.name).map_err(|_| Errno::EINVAL);
    match a.op {
        SnapOp::Create | SnapOp::Delete | SnapOp::Mount if uid != 0 => return Err(Errno::EPERM),
        SnapOp::Create => {
            let name = name()?;
            engine.snapshot_create(name)?;
            log::info!("amaranth: snapshot {name:?} taken");
        }
        SnapOp::Delete => {
            let name = name()?;
            engine.snapshot_delete(name)?;
            log::info!("amaranth: snapshot {name:?} deleted");
        }
        SnapOp::Mount => {
            let name = name()?;
            let dir = std::ffi::OsStr::from_bytes(&a.dir);
            mount_snapshot(fs, name, Path::new(dir))?;
        }
        SnapOp::List | SnapOp::ListSizes => {}
    }
    let all = engine.snapshots();
    a.count = all.len() as u64;
    let described = match a.op {
        SnapOp::List | SnapOp::ListSizes => Some(all.get(a.index as usize).ok_or(Errno::ENOENT)?),
        SnapOp::Create | SnapOp::Mount => all.iter().find(|s| s.name.as_bytes() == a.name),
        SnapOp::Delete => None,
    };
    if let Some(s) = described {
        a.name = s.name.as_bytes().to_vec();
        a.time_ns = s.time_ns;
        a.msn = s.msn;
        if a.op == SnapOp::ListSizes {
            let sizes = engine.snapshot_sizes(&s.name)?;
            a.exclusive = sizes.exclusive_bytes;
            a.shared = sizes.shared_bytes;
        }
    }
    a.encode().ok_or(Errno::EINVAL)
}

/// The snapshots this daemon serves: their mount points, how to unmount each, and the sessions'
/// count (each session's thread takes itself out when its mount ends).
static MOUNTED: Mutex<Vec<(PathBuf, Unmounter)>> = Mutex::new(Vec::new());

/// The list of served snapshots (a panic while it was held leaves it as it was).
fn mounted() -> MutexGuard<'static, Vec<(PathBuf, Unmounter)>> {
    MOUNTED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Mounts snapshot `name` of the file system `live` read-only on `dir`: a second FUSE session of this daemon,
/// served by a thread until it is unmounted. The snapshot cannot be deleted meanwhile.
fn mount_snapshot(live: &Fs, name: &str, dir: &Path) -> Result<(), Errno> {
    if !dir.is_absolute() {
        return Err(Errno::EINVAL);
    }
    let snap = Arc::new(live.engine().snapshot_engine(name)?);
    let fs = Arc::new(Fs::new(snap, FsOptions::default())?);
    let options = MountOptions {
        fsname: format!("snapshot:{name}"),
        read_only: true,
        noatime: true,
        threads: 1,
        ring_threads: 2,
        transport: crate::Transport::Dev,
        ..MountOptions::default()
    };
    let handle = crate::mount(fs, dir, &options).map_err(|e| {
        log::warn!(
            "amaranth: cannot mount snapshot {name:?} on {}: {e}",
            dir.display()
        );
        Errno(e.raw_os_error().unwrap_or(libc::EIO))
    })?;
    let at = handle.mountpoint().to_path_buf();
    mounted().push((at.clone(), handle.unmounter()));
    log::info!("amaranth: snapshot {name:?} mounted on {}", at.display());
    let name = name.to_string();
    let served = std::thread::Builder::new()
        .name("amaranth-snapshot".into())
        .spawn(move || {
            if let Err(e) = handle.join() {
                log::warn!("amaranth: the session of snapshot {name:?} ended with: {e}");
            }
            mounted().retain(|(p, _)| *p != at);
            log::info!(
                "amaranth: snapshot {name:?} unmounted from {}",
                at.display()
            );
        });
    if let Err(e) = served {
        log::error!("amaranth: no thread to serve a snapshot: {e}");
        return Err(Errno(libc::EAGAIN));
    }
    Ok(())
}

/// Unmounts every snapshot this daemon serves (lazily: a busy one goes once its last user
/// leaves) and waits up to `limit` for their sessions to end. Call when the daemon's own mount
/// has ended, before closing the engine. Returns how many were still served at the limit.
pub fn unmount_snapshots(limit: Duration) -> usize {
    let served: Vec<(PathBuf, Unmounter)> = mounted().clone();
    for (p, u) in &served {
        if let Err(e) = u.unmount(true) {
            log::warn!(
                "amaranth: cannot unmount the snapshot on {}: {e}",
                p.display()
            );
        }
    }
    let until = Instant::now() + limit;
    loop {
        let left = mounted().len();
        if left == 0 || Instant::now() >= until {
            return left;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_number_and_the_argument() {
        assert_eq!(number(), 0xD130_A711);
        assert!(is_snapshot(number()));
        assert!(!crate::clone_ioctl::is_clone(number()));
        let a = Args {
            op: SnapOp::List,
            index: 3,
            count: 7,
            time_ns: 1 << 60,
            msn: 42,
            exclusive: 1 << 40,
            shared: 3,
            name: b"nightly".to_vec(),
            dir: b"/mnt/x".to_vec(),
        };
        let b = a.encode().unwrap();
        assert_eq!(Args::decode(&b), Some(a));
        let mut bad = b;
        bad[0] = 9;
        assert_eq!(Args::decode(&bad), None);
        assert_eq!(Args::decode(&b[1..]), None);
        assert!(Args::new(SnapOp::Create, &[b'x'; 256]).encode().is_none());
    }
}
