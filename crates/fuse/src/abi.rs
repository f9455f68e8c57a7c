//! The FUSE kernel ABI (include/uapi/linux/fuse.h, protocol 7.45) as far as Amaranth speaks it:
//! opcodes, INIT flags, and the fixed-size structures of requests and replies. Everything is
//! native-endian `repr(C)` and read or written as plain bytes.

#![allow(dead_code)]

/// Protocol major version.
pub(crate) const KERNEL_VERSION: u32 = 7;
/// Highest protocol minor version this crate speaks.
pub(crate) const KERNEL_MINOR: u32 = 45;

/// Opcodes.
pub(crate) mod op {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const GETLK: u32 = 31;
    pub const SETLK: u32 = 32;
    pub const SETLKW: u32 = 33;
    pub const ACCESS: u32 = 34;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const BMAP: u32 = 37;
    pub const DESTROY: u32 = 38;
    pub const IOCTL: u32 = 39;
    pub const POLL: u32 = 40;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
    pub const READDIRPLUS: u32 = 44;
    pub const RENAME2: u32 = 45;
    pub const LSEEK: u32 = 46;
    pub const COPY_FILE_RANGE: u32 = 47;
    pub const SYNCFS: u32 = 50;
}

/// INIT flags (`flags | flags2 << 32`).
pub(crate) mod init {
    pub const ASYNC_READ: u64 = 1 << 0;
    pub const ATOMIC_O_TRUNC: u64 = 1 << 3;
    pub const EXPORT_SUPPORT: u64 = 1 << 4;
    pub const BIG_WRITES: u64 = 1 << 5;
    pub const DO_READDIRPLUS: u64 = 1 << 13;
    pub const READDIRPLUS_AUTO: u64 = 1 << 14;
    pub const PARALLEL_DIROPS: u64 = 1 << 18;
    pub const MAX_PAGES: u64 = 1 << 22;
    pub const CACHE_SYMLINKS: u64 = 1 << 23;
    pub const HANDLE_KILLPRIV_V2: u64 = 1 << 28;
    pub const INIT_EXT: u64 = 1 << 30;
    pub const OVER_IO_URING: u64 = 1 << 41;
}

/// `fuse_setattr_in.valid` bits.
pub(crate) mod fattr {
    pub const MODE: u32 = 1 << 0;
    pub const UID: u32 = 1 << 1;
    pub const GID: u32 = 1 << 2;
    pub const SIZE: u32 = 1 << 3;
    pub const ATIME: u32 = 1 << 4;
    pub const MTIME: u32 = 1 << 5;
    pub const FH: u32 = 1 << 6;
    pub const ATIME_NOW: u32 = 1 << 7;
    pub const MTIME_NOW: u32 = 1 << 8;
    pub const CTIME: u32 = 1 << 10;
    pub const KILL_SUIDGID: u32 = 1 << 11;
}

/// `fuse_open_out.open_flags`.
pub(crate) const FOPEN_KEEP_CACHE: u32 = 1 << 1;
/// The kernel need not send FLUSH on close for this open file.
pub(crate) const FOPEN_NOFLUSH: u32 = 1 << 5;
/// `fuse_write_in.write_flags`: clear set-id bits (HANDLE_KILLPRIV_V2).
pub(crate) const WRITE_KILL_SUIDGID: u32 = 1 << 2;
/// `fuse_getattr_in.getattr_flags`: `fh` is valid.
pub(crate) const GETATTR_FH: u32 = 1 << 0;
/// Notification code of `FUSE_NOTIFY_INVAL_INODE`.
pub(crate) const NOTIFY_INVAL_INODE: i32 = 2;
/// Notification code of `FUSE_NOTIFY_INVAL_ENTRY`.
pub(crate) const NOTIFY_INVAL_ENTRY: i32 = 3;

/// Plain old data: any byte pattern is a valid value, no padding reads matter.
///
/// # Safety
/// Implement only for `repr(C)` structs of integers.
pub(crate) unsafe trait Pod: Copy + Default {}

/// Reads a `T` from the start of `b` (`None` when `b` is too short).
pub(crate) fn read<T: Pod>(b: &[u8]) -> Option<T> {
    if b.len() < std::mem::size_of::<T>() {
        return None;
    }
    // SAFETY: T is Pod and b holds at least size_of::<T>() bytes; read_unaligned has no
    // alignment requirement.
    Some(unsafe { std::ptr::read_unaligned(b.as_ptr().cast::<T>()) })
}

/// The bytes of `t`.
pub(crate) fn bytes<T: Pod>(t: &T) -> &[u8] {
    // SAFETY: T is Pod (repr(C) integers), so all size_of::<T>() bytes are initialized.
    unsafe { std::slice::from_raw_parts((t as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
}

macro_rules! pod {
    ($($(#[$m:meta])* struct $name:ident { $($f:ident: $t:ty),* $(,)? })*) => {$(
        $(#[$m])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default)]
        pub(crate) struct $name { $(pub(crate) $f: $t),* }
        // SAFETY: repr(C) struct of integers.
        unsafe impl Pod for $name {}
    )*};
}

pod! {
    struct InHeader { len: u32, opcode: u32, unique: u64, nodeid: u64, uid: u32, gid: u32,
        pid: u32, total_extlen: u16, padding: u16 }
    struct OutHeader { len: u32, error: i32, unique: u64 }
    struct InitIn { major: u32, minor: u32, max_readahead: u32, flags: u32, flags2: u32 }
    struct InitOut { major: u32, minor: u32, max_readahead: u32, flags: u32, max_background: u16,
        congestion_threshold: u16, max_write: u32, time_gran: u32, max_pages: u16,
        map_alignment: u16, flags2: u32, max_stack_depth: u32, request_timeout: u16,
        unused0: u16, unused1: u32, unused2: u64, unused3: u64 }
    struct Attr { ino: u64, size: u64, blocks: u64, atime: u64, mtime: u64, ctime: u64,
        atimensec: u32, mtimensec: u32, ctimensec: u32, mode: u32, nlink: u32, uid: u32,
        gid: u32, rdev: u32, blksize: u32, flags: u32 }
    struct EntryOut { nodeid: u64, generation: u64, entry_valid: u64, attr_valid: u64,
        entry_valid_nsec: u32, attr_valid_nsec: u32, attr: Attr }
    struct AttrOut { attr_valid: u64, attr_valid_nsec: u32, dummy: u32, attr: Attr }
    struct GetattrIn { getattr_flags: u32, dummy: u32, fh: u64 }
    struct SetattrIn { valid: u32, padding: u32, fh: u64, size: u64, lock_owner: u64,
        atime: u64, mtime: u64, ctime: u64, atimensec: u32, mtimensec: u32, ctimensec: u32,
        mode: u32, unused4: u32, uid: u32, gid: u32, unused5: u32 }
    struct ForgetIn { nlookup: u64 }
    struct BatchForgetIn { count: u32, dummy: u32 }
    struct ForgetOne { nodeid: u64, nlookup: u64 }
    struct MknodIn { mode: u32, rdev: u32, umask: u32, padding: u32 }
    struct MkdirIn { mode: u32, umask: u32 }
    struct RenameIn { newdir: u64 }
    struct Rename2In { newdir: u64, flags: u32, padding: u32 }
    struct LinkIn { oldnodeid: u64 }
    struct OpenIn { flags: u32, open_flags: u32 }
    struct CreateIn { flags: u32, mode: u32, umask: u32, open_flags: u32 }
    struct OpenOut { fh: u64, open_flags: u32, backing_id: i32 }
    struct ReleaseIn { fh: u64, flags: u32, release_flags: u32, lock_owner: u64 }
    struct ReadIn { fh: u64, offset: u64, size: u32, read_flags: u32, lock_owner: u64,
        flags: u32, padding: u32 }
    struct WriteIn { fh: u64, offset: u64, size: u32, write_flags: u32, lock_owner: u64,
        flags: u32, padding: u32 }
    struct WriteOut { size: u32, padding: u32 }
    struct StatfsOut { blocks: u64, bfree: u64, bavail: u64, files: u64, ffree: u64,
        bsize: u32, namelen: u32, frsize: u32, padding: u32, spare0: u64, spare1: u64,
        spare2: u64 }
    struct FsyncIn { fh: u64, fsync_flags: u32, padding: u32 }
    struct SetxattrIn { size: u32, flags: u32 }
    struct GetxattrIn { size: u32, padding: u32 }
    struct GetxattrOut { size: u32, padding: u32 }
    struct AccessIn { mask: u32, padding: u32 }
    struct FallocateIn { fh: u64, offset: u64, length: u64, mode: u32, padding: u32 }
    struct LseekIn { fh: u64, offset: u64, whence: u32, padding: u32 }
    struct LseekOut { offset: u64 }
    struct CopyFileRangeIn { fh_in: u64, off_in: u64, nodeid_out: u64, fh_out: u64,
        off_out: u64, len: u64, flags: u64 }
    struct IoctlIn { fh: u64, flags: u32, cmd: u32, arg: u64, in_size: u32, out_size: u32 }
    struct IoctlOut { result: i32, flags: u32, in_iovs: u32, out_iovs: u32 }
    struct Dirent { ino: u64, off: u64, namelen: u32, typ: u32 }
    struct NotifyInvalInodeOut { ino: u64, off: i64, len: i64 }
    struct NotifyInvalEntryOut { parent: u64, namelen: u32, flags: u32 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::size_of;

    /// Sizes from include/uapi/linux/fuse.h: a wrong field shifts every later one.
    #[test]
    fn struct_sizes_match_the_kernel() {
        assert_eq!(size_of::<InHeader>(), 40);
        assert_eq!(size_of::<OutHeader>(), 16);
        assert_eq!(size_of::<IoctlIn>(), 32);
        assert_eq!(size_of::<IoctlOut>(), 16);
        assert_eq!(size_of::<NotifyInvalEntryOut>(), 16);
        assert_eq!(size_of::<InitOut>(), 64);
        assert_eq!(size_of::<Attr>(), 88);
        assert_eq!(size_of::<EntryOut>(), 128);
        assert_eq!(size_of::<AttrOut>(), 104);
        assert_eq!(size_of::<SetattrIn>(), 88);
        assert_eq!(size_of::<OpenOut>(), 16);
        assert_eq!(size_of::<ReleaseIn>(), 24);
        assert_eq!(size_of::<ReadIn>(), 40);
        assert_eq!(size_of::<WriteIn>(), 40);
        assert_eq!(size_of::<StatfsOut>(), 80);
        assert_eq!(size_of::<FallocateIn>(), 32);
        assert_eq!(size_of::<CopyFileRangeIn>(), 56);
        assert_eq!(size_of::<Dirent>(), 24);
    }

    #[test]
    fn read_needs_enough_bytes() {
        let h = OutHeader {
            len: 16,
            error: -2,
            unique: 7,
        };
        let b = bytes(&h).to_vec();
        let back: OutHeader = read(&b).unwrap();
        assert_eq!((back.len, back.error, back.unique), (16, -2, 7));
        assert!(read::<OutHeader>(&b[..15]).is_none());
    }
}
