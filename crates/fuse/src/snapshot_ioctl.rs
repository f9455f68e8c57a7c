//! The snapshot ioctl: the transport of `amaranth snapshot create|delete|list`
//! (docs/SURGERY.md §5.5).
//!
//! A restricted ioctl, `_IOWR(0xA7, 17, struct amaranth_snapshot_args)`, on an open descriptor
//! of the mount's root directory (a snapshot is of the whole file system: the root says so). The
//! argument (288 bytes, native byte order):
//!
//! ```text
//! u32 op            in: 1 create, 2 delete, 3 list
//! u32 index         in: list: which snapshot (0 first, in name order)
//! u64 count         out: snapshots the image keeps (after the request)
//! u64 time_ns       out: create, list: when the snapshot was taken (ns since the epoch)
//! u64 msn           out: create, list: its record's message number
//! u8  name[256]     in: create, delete; out: list. NUL-terminated
//! ```
//!
//! Creating and deleting need the request's uid to be 0 (`EPERM` otherwise); listing is open to
//! every user. Refusals change nothing: `EEXIST` (the name is taken), `ENOENT` (no such
//! snapshot; for a list, an index past the last), `EINVAL` (a bad name, or not the root),
//! `EBUSY` (a view of the snapshot is open), `EROFS` (a read-only mount).

use amaranth_fs::{Errno, Fs};

use crate::pg_ioctl::MAGIC;

/// Size of `struct amaranth_snapshot_args`.
pub const ARGS_SIZE: usize = 288;
/// The command's `nr` (the patchgroup commands use 1–7, the clone 16).
const NR: u32 = 17;
/// Offset of the name in the argument.
const NAME_AT: usize = 32;
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
    /// The snapshot's name (at most 255 bytes).
    pub name: Vec<u8>,
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
            name: name.to_vec(),
        }
    }

    /// The argument's bytes (`None` if the name does not fit).
    pub fn encode(&self) -> Option<[u8; ARGS_SIZE]> {
        if self.name.len() >= ARGS_SIZE - NAME_AT {
            return None;
        }
        let mut b = [0u8; ARGS_SIZE];
        b[..4].copy_from_slice(&(self.op as u32).to_ne_bytes());
        b[4..8].copy_from_slice(&self.index.to_ne_bytes());
        b[8..16].copy_from_slice(&self.count.to_ne_bytes());
        b[16..24].copy_from_slice(&self.time_ns.to_ne_bytes());
        b[24..32].copy_from_slice(&self.msn.to_ne_bytes());
        b[NAME_AT..NAME_AT + self.name.len()].copy_from_slice(&self.name);
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
            _ => return None,
        };
        let name = &b[NAME_AT..];
        let len = name.iter().position(|&c| c == 0)?;
        Some(Args {
            op,
            index: u32_at(4),
            count: u64_at(8),
            time_ns: u64_at(16),
            msn: u64_at(24),
            name: name[..len].to_vec(),
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
        SnapOp::Create | SnapOp::Delete if uid != 0 => return Err(Errno::EPERM),
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
        SnapOp::List => {}
    }
    let all = engine.snapshots();
    a.count = all.len() as u64;
    let described = match a.op {
        SnapOp::List => Some(all.get(a.index as usize).ok_or(Errno::ENOENT)?),
        SnapOp::Create => all.iter().find(|s| s.name.as_bytes() == a.name),
        SnapOp::Delete => None,
    };
    if let Some(s) = described {
        a.name = s.name.as_bytes().to_vec();
        a.time_ns = s.time_ns;
        a.msn = s.msn;
    }
    a.encode().ok_or(Errno::EINVAL)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_number_and_the_argument() {
        assert_eq!(number(), 0xC120_A711);
        assert!(is_snapshot(number()));
        assert!(!crate::clone_ioctl::is_clone(number()));
        let a = Args {
            op: SnapOp::List,
            index: 3,
            count: 7,
            time_ns: 1 << 60,
            msn: 42,
            name: b"nightly".to_vec(),
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
