//! The clone ioctl: the transport of `amaranth clone SRC DST` ([`amaranth_fs::Fs::clone_entry`],
//! docs/SURGERY.md §5.4).
//!
//! A restricted ioctl (FUSE passes only those to a daemon: the kernel copies `_IOC_SIZE(cmd)`
//! bytes in and out), `_IOWR(0xA7, 16, struct amaranth_clone_args)`, on an open descriptor of SRC
//! (a directory or a regular file): the kernel resolved SRC's path with the caller's permissions
//! and opened it, and the request names it by its node id. The argument (296 bytes, native byte
//! order):
//!
//! ```text
//! u64 parent        in: DST's parent directory (its st_ino; the CLI holds it open)
//! u64 ino           out: DST's inode number
//! u64 inodes        out: inodes made
//! u32 prepare_us    out: metadata read and batch built (microseconds)
//! u32 commit_us     out: batch logged and applied (microseconds)
//! u32 flags         in: 0
//! u32 zero          in: 0
//! u8  name[256]     in: DST's name, NUL-terminated
//! ```
//!
//! The caller is the request's uid and gid, and the supplementary groups of its thread
//! (`/proc/PID/status`). This file knows nothing of the transport.

use amaranth_fs::{Caller, Cloned, Errno, Fs};

use crate::pg_ioctl::MAGIC;

/// Size of `struct amaranth_clone_args`.
pub const ARGS_SIZE: usize = 296;
/// The command's `nr` (the patchgroup commands use 1–7).
const NR: u32 = 16;
/// Offset of the name in the argument.
const NAME_AT: usize = 40;

/// The ioctl request number: `_IOWR(0xA7, 16, struct amaranth_clone_args)`.
pub fn number() -> u32 {
    const READ_WRITE: u32 = 3;
    READ_WRITE << 30 | (ARGS_SIZE as u32) << 16 | MAGIC << 8 | NR
}

/// Whether `cmd` is the clone ioctl.
pub fn is_clone(cmd: u32) -> bool {
    cmd == number()
}

/// `struct amaranth_clone_args`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Args {
    /// DST's parent directory.
    pub parent: u64,
    /// DST's name (1 to 255 bytes, no NUL).
    pub name: Vec<u8>,
    /// Out: DST's inode number.
    pub ino: u64,
    /// Out: inodes made.
    pub inodes: u64,
    /// Out: microseconds spent reading the metadata and building the batch.
    pub prepare_us: u32,
    /// Out: microseconds spent logging and applying it.
    pub commit_us: u32,
}

impl Args {
    /// The argument's bytes (`None` if the name does not fit).
    pub fn encode(&self) -> Option<[u8; ARGS_SIZE]> {
        if self.name.len() >= ARGS_SIZE - NAME_AT {
            return None;
        }
        let mut b = [0u8; ARGS_SIZE];
        b[..8].copy_from_slice(&self.parent.to_ne_bytes());
        b[8..16].copy_from_slice(&self.ino.to_ne_bytes());
        b[16..24].copy_from_slice(&self.inodes.to_ne_bytes());
        b[24..28].copy_from_slice(&self.prepare_us.to_ne_bytes());
        b[28..32].copy_from_slice(&self.commit_us.to_ne_bytes());
        b[NAME_AT..NAME_AT + self.name.len()].copy_from_slice(&self.name);
        Some(b)
    }

    /// Parses an argument (`None` unless exactly [`ARGS_SIZE`] bytes, flags and the reserved
    /// word zero, and a NUL-terminated name).
    pub fn decode(b: &[u8]) -> Option<Args> {
        let b: &[u8; ARGS_SIZE] = b.try_into().ok()?;
        let u64_at = |i: usize| u64::from_ne_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let u32_at = |i: usize| u32::from_ne_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        if u32_at(32) != 0 || u32_at(36) != 0 {
            return None;
        }
        let name = &b[NAME_AT..];
        let len = name.iter().position(|&c| c == 0)?;
        Some(Args {
            parent: u64_at(0),
            name: name[..len].to_vec(),
            ino: u64_at(8),
            inodes: u64_at(16),
            prepare_us: u32_at(24),
            commit_us: u32_at(28),
        })
    }
}

/// The supplementary groups of thread `pid` (none if `/proc` does not say).
fn groups(pid: u32) -> Vec<u32> {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return Vec::new();
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|g| {
            g.split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Carries out the clone ioctl on `src` for the caller (`uid`, `gid`, thread `pid`) with the
/// argument `input`: the argument to copy back, and what was made.
pub fn handle(
    fs: &Fs,
    src: u64,
    (uid, gid, pid): (u32, u32, u32),
    input: &[u8],
) -> Result<([u8; ARGS_SIZE], Args, Cloned), Errno> {
    let mut a = Args::decode(input).ok_or(Errno::EINVAL)?;
    let who = Caller {
        uid,
        gid,
        groups: if uid == 0 || pid == 0 {
            Vec::new()
        } else {
            groups(pid)
        },
    };
    let made = fs.clone_entry(src, a.parent, &a.name, &who)?;
    a.ino = made.inode.ino;
    a.inodes = made.inodes;
    let us = |d: std::time::Duration| d.as_micros().min(u128::from(u32::MAX)) as u32;
    a.prepare_us = us(made.prepare);
    a.commit_us = us(made.commit);
    let out = a.encode().ok_or(Errno::EINVAL)?;
    Ok((out, a, made))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_number_and_the_argument() {
        // _IOWR(0xA7, 16, 296 bytes), as gcc computes it.
        assert_eq!(number(), 0xc128_a710);
        assert!(!crate::pg_ioctl::is_patchgroup(number()));
        let a = Args {
            parent: 7,
            name: b"copy".to_vec(),
            ino: 9,
            inodes: 3,
            prepare_us: 5,
            commit_us: 6,
        };
        let b = a.encode().unwrap();
        assert_eq!(Args::decode(&b), Some(a.clone()));
        let mut bad = b;
        bad[36] = 1;
        assert_eq!(Args::decode(&bad), None, "the reserved word");
        let mut long = a;
        long.name = vec![b'x'; 256];
        assert_eq!(long.encode(), None);
        long.name.truncate(255);
        assert!(long.encode().is_some());
        assert_eq!(Args::decode(&b[..200]), None);
    }
}
