//! Inodes (the value of a metadata key) and their encoding.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{Errno, Result};

/// Encoding version of metadata values.
const VERSION: u8 = 1;
const TAG_INODE: u8 = b'I';
const TAG_REDIRECT: u8 = b'R';
/// Encoded size of an inode without its symlink target.
const FIXED_LEN: usize = 2 + 8 + 1 + 2 + 4 + 4 + 4 + 8 + 4 * 12 + 4 + 4 + 1;

/// What kind of file an inode is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Symbolic link.
    Symlink,
    /// Named pipe.
    Fifo,
    /// Unix socket.
    Socket,
    /// Character device.
    CharDev,
    /// Block device.
    BlockDev,
}

impl Kind {
    fn code(self) -> u8 {
        match self {
            Kind::File => 1,
            Kind::Dir => 2,
            Kind::Symlink => 3,
            Kind::Fifo => 4,
            Kind::Socket => 5,
            Kind::CharDev => 6,
            Kind::BlockDev => 7,
        }
    }
    fn from_code(c: u8) -> Option<Kind> {
        Some(match c {
            1 => Kind::File,
            2 => Kind::Dir,
            3 => Kind::Symlink,
            4 => Kind::Fifo,
            5 => Kind::Socket,
            6 => Kind::CharDev,
            7 => Kind::BlockDev,
            _ => return None,
        })
    }
    /// The `S_IFMT` bits.
    pub fn mode_bits(self) -> u32 {
        match self {
            Kind::File => libc::S_IFREG,
            Kind::Dir => libc::S_IFDIR,
            Kind::Symlink => libc::S_IFLNK,
            Kind::Fifo => libc::S_IFIFO,
            Kind::Socket => libc::S_IFSOCK,
            Kind::CharDev => libc::S_IFCHR,
            Kind::BlockDev => libc::S_IFBLK,
        }
    }
    /// The kind encoded in a mode's `S_IFMT` bits.
    pub fn from_mode(mode: u32) -> Option<Kind> {
        Some(match mode & libc::S_IFMT {
            libc::S_IFREG => Kind::File,
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Symlink,
            libc::S_IFIFO => Kind::Fifo,
            libc::S_IFSOCK => Kind::Socket,
            libc::S_IFCHR => Kind::CharDev,
            libc::S_IFBLK => Kind::BlockDev,
            _ => return None,
        })
    }
}

/// A point in time with nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Time {
    /// Seconds since the epoch (negative before it).
    pub sec: i64,
    /// Nanoseconds, below one billion.
    pub nsec: u32,
}

impl Time {
    /// The current time.
    pub fn now() -> Time {
        match SystemTime::now().duration_since(UNIX_EPOCH) {
            Ok(d) => Time {
                sec: d.as_secs() as i64,
                nsec: d.subsec_nanos(),
            },
            Err(e) => {
                let d = e.duration();
                let (sec, nsec) = if d.subsec_nanos() == 0 {
                    (-(d.as_secs() as i64), 0)
                } else {
                    (-(d.as_secs() as i64) - 1, 1_000_000_000 - d.subsec_nanos())
                };
                Time { sec, nsec }
            }
        }
    }
    /// Converts a `SystemTime`.
    pub fn from_system(t: SystemTime) -> Time {
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => Time {
                sec: d.as_secs() as i64,
                nsec: d.subsec_nanos(),
            },
            Err(e) => {
                let d = e.duration();
                if d.subsec_nanos() == 0 {
                    Time {
                        sec: -(d.as_secs() as i64),
                        nsec: 0,
                    }
                } else {
                    Time {
                        sec: -(d.as_secs() as i64) - 1,
                        nsec: 1_000_000_000 - d.subsec_nanos(),
                    }
                }
            }
        }
    }
    /// Converts to a `SystemTime`.
    pub fn to_system(self) -> SystemTime {
        if self.sec >= 0 {
            UNIX_EPOCH + std::time::Duration::new(self.sec as u64, self.nsec)
        } else {
            UNIX_EPOCH - std::time::Duration::from_secs((-self.sec) as u64)
                + std::time::Duration::from_nanos(self.nsec as u64)
        }
    }
}

/// An inode: everything `stat` reports, plus a symlink's target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inode {
    /// Inode number (FUSE node id).
    pub ino: u64,
    /// File kind.
    pub kind: Kind,
    /// Permission bits (`mode & 0o7777`).
    pub perm: u16,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Link count (2 + subdirectories for a directory).
    pub nlink: u32,
    /// Size in bytes.
    pub size: u64,
    /// Last access.
    pub atime: Time,
    /// Last data change.
    pub mtime: Time,
    /// Last status change.
    pub ctime: Time,
    /// Creation.
    pub crtime: Time,
    /// Device number (character and block devices).
    pub rdev: u32,
    /// Flags (reserved).
    pub flags: u32,
    /// Lives at its inode-keyed home (hard-linked or open after unlink) instead of its path.
    pub homed: bool,
    /// Target of a symbolic link.
    pub target: Vec<u8>,
}

/// What a metadata key holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Meta {
    /// The inode itself.
    Inode(Inode),
    /// A name of a hard-linked file: the inode lives at its home.
    Redirect(u64),
}

impl Inode {
    /// A new inode with all times set to now.
    pub fn new(ino: u64, kind: Kind, perm: u16, uid: u32, gid: u32) -> Inode {
        let now = Time::now();
        Inode {
            ino,
            kind,
            perm: perm & 0o7777,
            uid,
            gid,
            nlink: if kind == Kind::Dir { 2 } else { 1 },
            size: 0,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            rdev: 0,
            flags: 0,
            homed: false,
            target: Vec::new(),
        }
    }

    /// `st_mode`.
    pub fn mode(&self) -> u32 {
        self.kind.mode_bits() | self.perm as u32
    }

    /// 512-byte blocks reported by `stat`: every 4 KiB block up to the size (holes are not tracked
    /// without reading, so sparse files report their apparent size).
    pub fn blocks(&self) -> u64 {
        self.size.div_ceil(4096) * 8
    }

    /// Encodes the inode as a metadata value.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(FIXED_LEN + self.target.len());
        v.push(VERSION);
        v.push(TAG_INODE);
        v.extend_from_slice(&self.ino.to_le_bytes());
        v.push(self.kind.code());
        v.extend_from_slice(&self.perm.to_le_bytes());
        v.extend_from_slice(&self.uid.to_le_bytes());
        v.extend_from_slice(&self.gid.to_le_bytes());
        v.extend_from_slice(&self.nlink.to_le_bytes());
        v.extend_from_slice(&self.size.to_le_bytes());
        for t in [self.atime, self.mtime, self.ctime, self.crtime] {
            v.extend_from_slice(&t.sec.to_le_bytes());
            v.extend_from_slice(&t.nsec.to_le_bytes());
        }
        v.extend_from_slice(&self.rdev.to_le_bytes());
        v.extend_from_slice(&self.flags.to_le_bytes());
        v.push(self.homed as u8);
        assert_eq!(v.len(), FIXED_LEN);
        v.extend_from_slice(&self.target);
        v
    }
}

impl Meta {
    /// Encodes a redirect.
    pub fn redirect(ino: u64) -> Vec<u8> {
        let mut v = vec![VERSION, TAG_REDIRECT];
        v.extend_from_slice(&ino.to_le_bytes());
        v
    }

    /// Decodes a metadata value; damage is `EIO` (and logged).
    pub fn decode(v: &[u8]) -> Result<Meta> {
        let bad = |why: &str| {
            log::error!("amaranth: undecodable metadata value ({why})");
            Errno::EIO
        };
        if v.len() < 2 || v[0] != VERSION {
            return Err(bad("unknown version"));
        }
        match v[1] {
            TAG_REDIRECT => {
                let ino = u64::from_le_bytes(
                    v.get(2..10)
                        .ok_or_else(|| bad("short redirect"))?
                        .try_into()
                        .expect("8 bytes"),
                );
                if v.len() != 10 {
                    return Err(bad("long redirect"));
                }
                Ok(Meta::Redirect(ino))
            }
            TAG_INODE => {
                if v.len() < FIXED_LEN {
                    return Err(bad("short inode"));
                }
                let u64_at =
                    |o: usize| u64::from_le_bytes(v[o..o + 8].try_into().expect("8 bytes"));
                let u32_at =
                    |o: usize| u32::from_le_bytes(v[o..o + 4].try_into().expect("4 bytes"));
                let time_at = |o: usize| Time {
                    sec: u64_at(o) as i64,
                    nsec: u32_at(o + 8),
                };
                let kind = Kind::from_code(v[10]).ok_or_else(|| bad("unknown kind"))?;
                let t = 11 + 2 + 12 + 8;
                let inode = Inode {
                    ino: u64_at(2),
                    kind,
                    perm: u16::from_le_bytes([v[11], v[12]]),
                    uid: u32_at(13),
                    gid: u32_at(17),
                    nlink: u32_at(21),
                    size: u64_at(25),
                    atime: time_at(t),
                    mtime: time_at(t + 12),
                    ctime: time_at(t + 24),
                    crtime: time_at(t + 36),
                    rdev: u32_at(t + 48),
                    flags: u32_at(t + 52),
                    homed: v[t + 56] != 0,
                    target: v[FIXED_LEN..].to_vec(),
                };
                if inode.atime.nsec >= 1_000_000_000 || inode.mtime.nsec >= 1_000_000_000 {
                    return Err(bad("bad timestamp"));
                }
                Ok(Meta::Inode(inode))
            }
            _ => Err(bad("unknown tag")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut i = Inode::new(42, Kind::Symlink, 0o777, 1000, 100);
        i.size = 1 << 40;
        i.target = b"/some/where".to_vec();
        i.mtime = Time {
            sec: -5,
            nsec: 999_999_999,
        };
        i.homed = true;
        assert_eq!(Meta::decode(&i.encode()).unwrap(), Meta::Inode(i));
        assert_eq!(Meta::decode(&Meta::redirect(7)).unwrap(), Meta::Redirect(7));
        assert!(Meta::decode(b"").is_err());
        assert!(Meta::decode(&[VERSION, TAG_INODE, 1]).is_err());
        let t = Time { sec: -3, nsec: 250 };
        assert_eq!(Time::from_system(t.to_system()), t);
    }
}
