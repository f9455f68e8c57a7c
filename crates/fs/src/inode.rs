//! Inodes (the value of a metadata key) and their encoding.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{Errno, Result};

/// Encoding version of metadata values: 2 adds block counts and reserved ranges to inodes.
const VERSION: u8 = 2;
/// The previous version (read, never written): inodes without block counts.
const VERSION_1: u8 = 1;
const TAG_INODE: u8 = b'I';
const TAG_REDIRECT: u8 = b'R';
/// Encoded size of a version-1 inode without its symlink target.
const FIXED_LEN_1: usize = 2 + 8 + 1 + 2 + 4 + 4 + 4 + 8 + 4 * 12 + 4 + 4 + 1;
/// Encoded size of an inode without its reserved ranges and symlink target: version 1 plus
/// `blocks` and the number of ranges.
const FIXED_LEN: usize = FIXED_LEN_1 + 8 + 1;
/// Most reserved ranges a file keeps (`fallocate` of one more joins the two closest).
pub const MAX_RESERVED_RANGES: usize = 4;
/// Bytes of a 4 KiB block.
const BLOCK: u64 = 4096;

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
    /// Data blocks the file has (keys in the data space; each counts as 4 KiB, the tail too).
    pub blocks: u64,
    /// Space reserved by `fallocate` for the holes of ranges of blocks: sorted, disjoint, not
    /// adjacent, none empty, at most [`MAX_RESERVED_RANGES`].
    pub reserved: Vec<Reserved>,
    /// Target of a symbolic link; for a regular file whose last name was removed while the kernel
    /// held it (link count 0, at its home), the path key where its data still is ("parked").
    pub target: Vec<u8>,
}

/// Blocks `fallocate` reserved in a file: the range `[lo, hi)` of block numbers, of which `holes`
/// blocks are holes whose space is reserved (every hole in the range is). Writes inside the range
/// fill reserved holes and never fail for lack of space; truncate, punch and unlink release what
/// they remove.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reserved {
    /// First block of the range.
    pub lo: u64,
    /// End of the range (exclusive); `lo == hi`: nothing reserved.
    pub hi: u64,
    /// Holes in the range (the blocks whose space is reserved).
    pub holes: u64,
}

impl Reserved {
    /// Whether nothing is reserved.
    pub fn is_empty(&self) -> bool {
        self.lo >= self.hi
    }

    /// Whether block range `[a, b)` lies inside the reserved range.
    pub fn covers(&self, a: u64, b: u64) -> bool {
        !self.is_empty() && self.lo <= a && b <= self.hi
    }
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
            blocks: 0,
            reserved: Vec::new(),
            target: Vec::new(),
        }
    }

    /// Its record is gone: no name and no home holds it (link count 0, not homed). What the
    /// daemon still remembers of a deleted inode that the kernel knows; nothing opens, changes or
    /// deletes it again.
    pub(crate) fn is_deleted(&self) -> bool {
        self.nlink == 0 && !self.homed
    }

    /// `st_mode`.
    pub fn mode(&self) -> u32 {
        self.kind.mode_bits() | self.perm as u32
    }

    /// 512-byte blocks reported by `stat`: for a file, its data blocks plus the holes `fallocate`
    /// reserved, 4 KiB each (exact: see `blocks`); for other kinds the size in 4 KiB blocks.
    pub fn st_blocks(&self) -> u64 {
        match self.kind {
            Kind::File => (self.blocks + self.reserved_holes()) * 8,
            _ => self.size.div_ceil(BLOCK) * 8,
        }
    }

    /// Holes reserved by `fallocate` in all of the file's ranges.
    pub fn reserved_holes(&self) -> u64 {
        self.reserved.iter().map(|r| r.holes).sum()
    }

    /// Whether blocks `[a, b)` lie inside one reserved range.
    pub fn reservation_covers(&self, a: u64, b: u64) -> bool {
        self.reserved.iter().any(|r| r.covers(a, b))
    }

    /// Whether `ranges` are valid reserved ranges (see [`Inode::reserved`]).
    pub fn valid_reserved(ranges: &[Reserved]) -> bool {
        ranges.len() <= MAX_RESERVED_RANGES
            && ranges.iter().all(|r| r.lo < r.hi && r.holes <= r.hi - r.lo)
            && ranges.windows(2).all(|w| w[0].hi < w[1].lo)
    }

    /// Whether every block below the size exists (no hole): then which blocks a write, punch or
    /// truncate below the size touches is known without reading.
    pub fn is_dense(&self) -> bool {
        self.blocks == self.size.div_ceil(BLOCK)
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
        v.extend_from_slice(&self.blocks.to_le_bytes());
        assert!(
            Inode::valid_reserved(&self.reserved),
            "inode {}: bad reserved ranges {:?}",
            self.ino,
            self.reserved
        );
        assert!(
            self.kind == Kind::File || self.blocks == 0 && self.reserved.is_empty(),
            "inode {}: blocks in a non-file",
            self.ino
        );
        v.push(self.reserved.len() as u8);
        assert_eq!(v.len(), FIXED_LEN);
        for r in &self.reserved {
            for x in [r.lo, r.hi, r.holes] {
                v.extend_from_slice(&x.to_le_bytes());
            }
        }
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
        if v.len() < 2 || (v[0] != VERSION && v[0] != VERSION_1) {
            return Err(bad("unknown version"));
        }
        let fixed_len = if v[0] == VERSION {
            FIXED_LEN
        } else {
            FIXED_LEN_1
        };
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
                if v.len() < fixed_len {
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
                let size = u64_at(25);
                let mut target_at = fixed_len;
                let (blocks, reserved) = if v[0] == VERSION {
                    let n = v[FIXED_LEN - 1] as usize;
                    target_at += n * 24;
                    if v.len() < target_at {
                        return Err(bad("short reserved ranges"));
                    }
                    let at = |i: usize| u64_at(FIXED_LEN + i * 8);
                    let ranges: Vec<Reserved> = (0..n)
                        .map(|k| Reserved {
                            lo: at(3 * k),
                            hi: at(3 * k + 1),
                            holes: at(3 * k + 2),
                        })
                        .collect();
                    if !Inode::valid_reserved(&ranges) {
                        return Err(bad("bad reserved ranges"));
                    }
                    (u64_at(FIXED_LEN_1), ranges)
                } else if kind == Kind::File {
                    // Version 1 kept no count: every block up to the size, an upper bound
                    // (`fsck --repair` makes it exact).
                    (size.div_ceil(BLOCK), Vec::new())
                } else {
                    (0, Vec::new())
                };
                if kind != Kind::File && (blocks != 0 || !reserved.is_empty()) {
                    return Err(bad("blocks in a non-file"));
                }
                let inode = Inode {
                    ino: u64_at(2),
                    kind,
                    perm: u16::from_le_bytes([v[11], v[12]]),
                    uid: u32_at(13),
                    gid: u32_at(17),
                    nlink: u32_at(21),
                    size,
                    atime: time_at(t),
                    mtime: time_at(t + 12),
                    ctime: time_at(t + 24),
                    crtime: time_at(t + 36),
                    rdev: u32_at(t + 48),
                    flags: u32_at(t + 52),
                    homed: v[t + 56] != 0,
                    blocks,
                    reserved,
                    target: v[target_at..].to_vec(),
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
        let mut f = Inode::new(43, Kind::File, 0o644, 1, 2);
        f.size = 10 * 4096 + 1;
        f.blocks = 3;
        f.reserved = vec![
            Reserved {
                lo: 2,
                hi: 20,
                holes: 15,
            },
            Reserved {
                lo: 30,
                hi: 31,
                holes: 1,
            },
        ];
        f.target = b"ignored".to_vec();
        assert_eq!(f.st_blocks(), 19 * 8);
        assert!(f.reservation_covers(2, 20) && !f.reservation_covers(19, 21));
        assert!(!f.is_dense());
        assert_eq!(Meta::decode(&f.encode()).unwrap(), Meta::Inode(f.clone()));
        // A version-1 inode (no counts) reads as dense.
        let mut v1 = f.encode();
        v1.truncate(FIXED_LEN_1);
        v1[0] = VERSION_1;
        let mut bad = f.encode();
        bad[FIXED_LEN + 8] = 50; // a range ending before it starts
        assert!(Meta::decode(&bad).is_err());
        let Meta::Inode(old) = Meta::decode(&v1).unwrap() else {
            panic!("not an inode")
        };
        assert_eq!(old.blocks, 11);
        assert!(old.reserved.is_empty() && old.is_dense());
        assert_eq!(Meta::decode(&Meta::redirect(7)).unwrap(), Meta::Redirect(7));
        assert!(Meta::decode(b"").is_err());
        assert!(Meta::decode(&[VERSION, TAG_INODE, 1]).is_err());
        let t = Time { sec: -3, nsec: 250 };
        assert_eq!(Time::from_system(t.to_system()), t);
    }
}
