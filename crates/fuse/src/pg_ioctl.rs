//! The patchgroup ioctls: the transport for [`amaranth_fs::patchgroup`]
//! (`clients/libamaranth_pg/amaranth_pg.h` is the C side, docs/PATCHGROUPS.md the description).
//!
//! FUSE passes only *restricted* ioctls to a daemon: the kernel copies `_IOC_SIZE(cmd)` bytes in
//! and out, so every command is `_IOWR(0xA7, nr, struct amaranth_pg_args)` with a 24-byte
//! argument (`group u64, other u64, flags u32, zero u32`, native byte order). They work on any
//! file or directory of the mount, for any user who can open one; the request's pid (a thread
//! id) says whose groups are meant. This file knows nothing of the transport: [`handle`] takes
//! the pid, the command and the input bytes, so any FUSE layer calls it as it is.

use amaranth_fs::{Errno, Fs};

/// The ioctl "type" byte of every patchgroup command.
pub const MAGIC: u32 = 0xA7;
/// Size of `struct amaranth_pg_args`.
pub const ARGS_SIZE: usize = 24;

/// The commands (their `nr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cmd {
    /// Create a group (`flags`); the new id comes back in `group`.
    Create = 1,
    /// `group` depends on `other`.
    Depend = 2,
    /// Release `group`.
    Release = 3,
    /// Engage `group`.
    Engage = 4,
    /// Disengage `group`.
    Disengage = 5,
    /// Sync `group` (0: everything).
    Sync = 6,
    /// Abandon `group`.
    Abandon = 7,
}

impl Cmd {
    const ALL: [Cmd; 7] = [
        Cmd::Create,
        Cmd::Depend,
        Cmd::Release,
        Cmd::Engage,
        Cmd::Disengage,
        Cmd::Sync,
        Cmd::Abandon,
    ];

    /// The ioctl request number: `_IOWR(MAGIC, nr, struct amaranth_pg_args)`.
    pub fn number(self) -> u32 {
        const READ_WRITE: u32 = 3;
        READ_WRITE << 30 | (ARGS_SIZE as u32) << 16 | MAGIC << 8 | self as u32
    }

    /// The command with request number `n`.
    pub fn from_number(n: u32) -> Option<Cmd> {
        Cmd::ALL.into_iter().find(|c| c.number() == n)
    }
}

/// `struct amaranth_pg_args`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Args {
    /// The group (create: the new one; sync: 0 for everything).
    pub group: u64,
    /// Depend: the group `group` depends on.
    pub other: u64,
    /// Create: 0 or `PG_ATOMIC`.
    pub flags: u32,
}

impl Args {
    /// The argument's bytes.
    pub fn encode(&self) -> [u8; ARGS_SIZE] {
        let mut b = [0u8; ARGS_SIZE];
        b[..8].copy_from_slice(&self.group.to_ne_bytes());
        b[8..16].copy_from_slice(&self.other.to_ne_bytes());
        b[16..20].copy_from_slice(&self.flags.to_ne_bytes());
        b
    }

    /// Parses an argument (`None` unless exactly 24 bytes with the reserved word zero).
    pub fn decode(b: &[u8]) -> Option<Args> {
        let b: &[u8; ARGS_SIZE] = b.try_into().ok()?;
        let u64_at = |i: usize| u64::from_ne_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let u32_at = |i: usize| u32::from_ne_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        (u32_at(20) == 0).then(|| Args {
            group: u64_at(0),
            other: u64_at(8),
            flags: u32_at(16),
        })
    }
}

/// Whether `cmd` is a patchgroup ioctl (the caller answers `ENOTTY` to anything else).
pub fn is_patchgroup(cmd: u32) -> bool {
    Cmd::from_number(cmd).is_some()
}

/// Carries out patchgroup ioctl `cmd` for the caller `pid` (a thread id) with the argument
/// `input`; returns the argument to copy back.
pub fn handle(fs: &Fs, pid: u32, cmd: u32, input: &[u8]) -> Result<[u8; ARGS_SIZE], Errno> {
    let cmd = Cmd::from_number(cmd).ok_or(Errno::ENOTTY)?;
    let mut a = Args::decode(input).ok_or(Errno::EINVAL)?;
    if pid == 0 {
        // A request without a process (the kernel's own): nobody's groups.
        return Err(Errno::ESRCH);
    }
    let pg = fs.patchgroups();
    match cmd {
        Cmd::Create => a.group = pg.create(pid, a.flags)?,
        Cmd::Depend => pg.add_depend(pid, a.group, a.other)?,
        Cmd::Release => pg.release(pid, a.group)?,
        Cmd::Engage => pg.engage(pid, a.group)?,
        Cmd::Disengage => pg.disengage(pid, a.group)?,
        Cmd::Sync => pg.sync(pid, a.group)?,
        Cmd::Abandon => pg.abandon(pid, a.group)?,
    }
    Ok(a.encode())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_match_the_c_header() {
        // _IOWR(0xA7, 1, 24 bytes) and _IOWR(0xA7, 7, ...), as gcc computes them.
        assert_eq!(Cmd::Create.number(), 0xc018_a701);
        assert_eq!(Cmd::Abandon.number(), 0xc018_a707);
        assert_eq!(Cmd::from_number(0xc018_a704), Some(Cmd::Engage));
        assert_eq!(Cmd::from_number(0xc018_a708), None);
        assert!(!is_patchgroup(0x8008_6601)); // FS_IOC_GETFLAGS
    }

    #[test]
    fn arguments_round_trip_and_the_reserved_word_must_be_zero() {
        let a = Args {
            group: 7,
            other: 3,
            flags: 1,
        };
        assert_eq!(Args::decode(&a.encode()), Some(a));
        let mut b = a.encode();
        b[23] = 1;
        assert_eq!(Args::decode(&b), None);
        assert_eq!(Args::decode(&b[..20]), None);
    }
}
