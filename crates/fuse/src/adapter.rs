//! `fuser::Filesystem` for [`Fs`]: every request becomes one call on [`Fs`] and one reply. Nothing
//! here knows about keys, the engine or caching beyond the kernel's TTLs.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::counters::{op, RequestCounts};
use amaranth_fs::{Ctx, Errno, Fs, Inode, Kind, SetAttr, SetTime, Time};
use fuser::{
    AccessFlags, BsdFileFlags, CopyFileRangeFlags, FileAttr, FileHandle, FileType, FopenFlags,
    Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags,
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry,
    ReplyIoctl, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};

/// Largest request we negotiate (the kernel's `max_pages_limit` caps it at 1 MiB anyway).
pub(crate) const MAX_REQUEST: u32 = 1 << 20;
/// `st_blksize`: the I/O size `stdio`, `cp` and friends use, so each `write()` is a big request.
const BLKSIZE: u32 = 128 << 10;
/// Requests that go to the kernel in the background (read-ahead); above fuser's default of 16.
const MAX_BACKGROUND: u16 = 64;

/// The adapter: an [`Fs`] plus the kernel cache lifetimes.
pub(crate) struct Adapter {
    pub(crate) fs: Arc<Fs>,
    /// Entry and attribute lifetime (only the daemon changes anything, so long).
    pub(crate) ttl: Duration,
    /// Lifetime of a negative entry (a name that does not exist); zero disables them.
    pub(crate) negative_ttl: Duration,
    /// Notifications to the kernel, set once the session exists.
    pub(crate) notifier: Arc<OnceLock<fuser::Notifier>>,
    /// Requests served, by opcode.
    pub(crate) counts: Arc<RequestCounts>,
}

fn errno(e: Errno) -> fuser::Errno {
    fuser::Errno::from_i32(e.0)
}

fn ctx(req: &Request) -> Ctx {
    Ctx {
        uid: req.uid(),
        gid: req.gid(),
        pid: req.pid(),
    }
}

fn file_type(kind: Kind) -> FileType {
    match kind {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::NamedPipe,
        Kind::Socket => FileType::Socket,
        Kind::CharDev => FileType::CharDevice,
        Kind::BlockDev => FileType::BlockDevice,
    }
}

/// A time the kernel sent (setattr), as fuser 0.18.0 (pinned in the workspace) hands it over.
///
/// fuser decodes the kernel's `(sec, nsec)` before 1970 as `epoch - (-sec s + nsec ns)` instead
/// of `epoch + sec s + nsec ns`, so `(-1, 500)` arrives as 1.000000500 s before the epoch. The
/// kernel's `nsec` is always below one billion, so that decoding is one-to-one and is inverted
/// here exactly: whole seconds before the epoch give `-sec`, the remaining nanoseconds `nsec`.
/// Times after the epoch are decoded correctly and pass through.
pub(crate) fn time_of(t: SystemTime) -> Time {
    match t.duration_since(UNIX_EPOCH) {
        Ok(_) => Time::from_system(t),
        Err(e) => {
            let d = e.duration();
            Time {
                sec: (d.as_secs() as i64).wrapping_neg(),
                nsec: d.subsec_nanos(),
            }
        }
    }
}

/// The kernel's view of an inode.
pub(crate) fn attr(i: &Inode) -> FileAttr {
    FileAttr {
        ino: INodeNo(i.ino),
        size: i.size,
        blocks: i.blocks(),
        atime: i.atime.to_system(),
        mtime: i.mtime.to_system(),
        ctime: i.ctime.to_system(),
        crtime: i.crtime.to_system(),
        kind: file_type(i.kind),
        perm: i.perm,
        nlink: i.nlink,
        uid: i.uid,
        gid: i.gid,
        rdev: i.rdev,
        blksize: BLKSIZE,
        flags: 0,
    }
}

/// Attributes for an entry the kernel ignores (`.`/`..` in readdirplus, negative entries).
fn placeholder_attr(ino: u64, kind: FileType) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: BLKSIZE,
        flags: 0,
    }
}

fn to_set_time(t: TimeOrNow) -> SetTime {
    match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(t) => SetTime::At(time_of(t)),
    }
}

impl Adapter {
    fn entry(&self, reply: ReplyEntry, r: amaranth_fs::Result<Inode>) {
        match r {
            Ok(i) => reply.entry(&self.ttl, &attr(&i), Generation(0)),
            Err(e) => reply.error(errno(e)),
        }
    }

    /// Adds capabilities one at a time, so one the kernel lacks does not drop the others.
    fn want(config: &mut KernelConfig, flags: InitFlags) {
        for flag in flags.iter() {
            if let Err(missing) = config.add_capabilities(flag) {
                log::info!("amaranth: the kernel does not offer {missing:?}");
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
impl fuser::Filesystem for Adapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        self.counts.count(op::INIT);
        // Not wanted: FUSE_WRITEBACK_CACHE (operations must reach us in application order and
        // small writes must stay small), FUSE_AUTO_INVAL_DATA (would drop the page cache after our
        // own writes), FUSE_POSIX_LOCKS/FLOCK_LOCKS (the kernel handles locks locally),
        // FUSE_SETXATTR_EXT (fuser 0.18.0 cannot parse it).
        let wanted = InitFlags::FUSE_HANDLE_KILLPRIV_V2
            | InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_ATOMIC_O_TRUNC
            | InitFlags::FUSE_CACHE_SYMLINKS
            | InitFlags::FUSE_MAX_PAGES;
        Self::want(config, wanted);
        if let Err(max) = config.set_max_write(MAX_REQUEST) {
            let _ = config.set_max_write(max);
        }
        let _ = config.set_max_background(MAX_BACKGROUND);
        log::debug!("amaranth: the kernel offers {:?}", config.capabilities());
        log::info!(
            "amaranth: FUSE protocol {}.{}, enabled {:?}",
            config.kernel_abi().0,
            config.kernel_abi().1,
            config.capabilities() & wanted
        );
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.counts.count(op::LOOKUP);
        match self.fs.lookup(parent.0, name.as_bytes()) {
            Ok(i) => reply.entry(&self.ttl, &attr(&i), Generation(0)),
            Err(Errno::ENOENT) if !self.negative_ttl.is_zero() => {
                // Node id 0 with a lifetime: the kernel caches the miss (a negative dentry).
                reply.entry(
                    &self.negative_ttl,
                    &placeholder_attr(0, FileType::RegularFile),
                    Generation(0),
                )
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.counts.count(op::FORGET);
        self.fs.forget(ino.0, nlookup);
    }

    // batch_forget: fuser 0.18.0 does not export `ForgetOne`, so its default (one `forget` per
    // node, which is exactly what we want) stays.

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.counts.count(op::GETATTR);
        match self.fs.getattr(ino.0) {
            Ok(i) => reply.attr(&self.ttl, &attr(&i)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.counts.count(op::SETATTR);
        // fuser 0.18.0 does not pass FATTR_KILL_SUIDGID; Fs::setattr clears set-id bits on a
        // truncate by a non-root caller and on a change of owner, which is what the flag asks.
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(to_set_time),
            mtime: mtime.map(to_set_time),
            ctime: ctime.map(time_of),
            crtime: crtime.map(time_of),
        };
        match self.fs.setattr(ino.0, &set, ctx(req)) {
            Ok(i) => reply.attr(&self.ttl, &attr(&i)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.counts.count(op::READLINK);
        match self.fs.readlink(ino.0) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.counts.count(op::MKNOD);
        self.entry(
            reply,
            self.fs
                .mknod(parent.0, name.as_bytes(), mode, rdev, ctx(req)),
        );
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        self.counts.count(op::MKDIR);
        self.entry(
            reply,
            self.fs.mkdir(parent.0, name.as_bytes(), mode, ctx(req)),
        );
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.counts.count(op::UNLINK);
        match self.fs.unlink(parent.0, name.as_bytes()) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.counts.count(op::RMDIR);
        match self.fs.rmdir(parent.0, name.as_bytes()) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.counts.count(op::SYMLINK);
        self.entry(
            reply,
            self.fs.symlink(
                parent.0,
                link_name.as_bytes(),
                target.as_os_str().as_bytes(),
                ctx(req),
            ),
        );
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.counts.count(op::RENAME);
        match self.fs.rename(
            parent.0,
            name.as_bytes(),
            newparent.0,
            newname.as_bytes(),
            flags.bits(),
        ) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.counts.count(op::LINK);
        self.entry(reply, self.fs.link(ino.0, newparent.0, newname.as_bytes()));
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.counts.count(op::OPEN);
        // FUSE_OPEN_KILL_SUIDGID is not passed by fuser 0.18.0; with FUSE_ATOMIC_O_TRUNC an
        // O_TRUNC open truncates through Fs::setattr, which clears set-id bits for non-root.
        match self.fs.open(ino.0, flags.0, ctx(req)) {
            // Keep the page cache across opens: only this daemon changes data, and every change
            // goes through the kernel, which updates or drops the cached pages itself.
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.counts.count(op::READ);
        match self.fs.read(ino.0, offset, size) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.counts.count(op::WRITE);
        // With FUSE_HANDLE_KILLPRIV_V2 the kernel leaves clearing set-id bits to us and says so.
        let kill = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        match self.fs.write(ino.0, fh.0, offset, data, kill) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.counts.count(op::FLUSH);
        // Every write is already in the engine when it is acknowledged: nothing to do.
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.counts.count(op::RELEASE);
        match self.fs.release(ino.0, fh.0) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.counts.count(op::FSYNC);
        match self.fs.fsync() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.counts.count(op::OPENDIR);
        match self.fs.opendir(ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.counts.count(op::READDIR);
        let r = self.fs.readdir(ino.0, fh.0, offset, false, |e| {
            // `add` returns true when the buffer is full (the entry was not added).
            !reply.add(
                INodeNo(e.ino),
                e.offset,
                file_type(e.kind),
                OsStr::from_bytes(&e.name),
            )
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        self.counts.count(op::READDIRPLUS);
        let r = self.fs.readdir(ino.0, fh.0, offset, true, |e| {
            // `.` and `..` come without attributes; the kernel skips them when linking entries.
            let a = match &e.attr {
                Some(i) => attr(i),
                None => placeholder_attr(e.ino, file_type(e.kind)),
            };
            !reply.add(
                INodeNo(e.ino),
                e.offset,
                OsStr::from_bytes(&e.name),
                &self.ttl,
                &a,
                Generation(0),
            )
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.counts.count(op::RELEASEDIR);
        self.fs.releasedir(fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.counts.count(op::FSYNCDIR);
        match self.fs.fsync() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.counts.count(op::STATFS);
        let s = self.fs.statfs();
        reply.statfs(
            s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.bsize,
        );
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        position: u32,
        reply: ReplyEmpty,
    ) {
        self.counts.count(op::SETXATTR);
        if position != 0 {
            return reply.error(fuser::Errno::EINVAL);
        }
        match self.fs.setxattr(ino.0, name.as_bytes(), value, flags) {
            Ok(()) => {
                if name.as_bytes() == amaranth_fs::acl::ACCESS {
                    // An access ACL sets the mode, and the kernel (without FUSE_POSIX_ACL) keeps
                    // its cached attributes: drop them (attributes only, not pages).
                    if let Some(n) = self.notifier.get() {
                        if let Err(e) = n.inval_inode(ino, -1, 0) {
                            log::debug!("amaranth: invalidating {}: {e}", ino.0);
                        }
                    }
                }
                reply.ok()
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.counts.count(op::GETXATTR);
        sized_reply(reply, size, self.fs.getxattr(ino.0, name.as_bytes()));
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.counts.count(op::LISTXATTR);
        sized_reply(reply, size, self.fs.listxattr(ino.0));
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.counts.count(op::REMOVEXATTR);
        match self.fs.removexattr(ino.0, name.as_bytes()) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        self.counts.count(op::ACCESS);
        // Only reached without `default_permissions` (the kernel checks otherwise): mode bits,
        // primary group only.
        let i = match self.fs.getattr(ino.0) {
            Ok(i) => i,
            Err(e) => return reply.error(errno(e)),
        };
        let want = mask.bits() as u16 & 0o7;
        let allowed = if req.uid() == 0 {
            // Root may do anything except execute a file nobody may execute.
            if want & 1 != 0 && i.kind != Kind::Dir && i.perm & 0o111 == 0 {
                0o6
            } else {
                0o7
            }
        } else if req.uid() == i.uid {
            (i.perm >> 6) & 7
        } else if req.gid() == i.gid {
            (i.perm >> 3) & 7
        } else {
            i.perm & 7
        };
        if want & !allowed == 0 {
            reply.ok()
        } else {
            reply.error(fuser::Errno::EACCES)
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.counts.count(op::CREATE);
        match self
            .fs
            .create(parent.0, name.as_bytes(), mode, flags, ctx(req))
        {
            Ok((i, fh)) => reply.created(
                &self.ttl,
                &attr(&i),
                Generation(0),
                FileHandle(fh),
                FopenFlags::FOPEN_KEEP_CACHE,
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    // getlk/setlk: FUSE_POSIX_LOCKS and FUSE_FLOCK_LOCKS are not negotiated, so the kernel keeps
    // locks locally and never sends these requests (fuser's defaults stay unused).

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        self.counts.count(op::IOCTL);
        reply.error(fuser::Errno::ENOTTY);
    }

    // poll: fuser's default ENOSYS makes the kernel treat files as always ready (DEFAULT_POLLMASK)
    // without asking again, which is right for a file system whose data is always available.

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.counts.count(op::FALLOCATE);
        match self.fs.fallocate(ino.0, offset, length, mode) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        self.counts.count(op::LSEEK);
        // The kernel handles SEEK_SET/CUR/END itself; only SEEK_DATA/SEEK_HOLE reach us.
        if whence != libc::SEEK_DATA && whence != libc::SEEK_HOLE {
            return reply.error(fuser::Errno::EINVAL);
        }
        if offset < 0 {
            return reply.error(fuser::Errno::ENXIO);
        }
        match self.fs.lseek(ino.0, offset as u64, whence) {
            Ok(off) => reply.offset(off as i64),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        ino_in: INodeNo,
        _fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        _fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        self.counts.count(op::COPY_FILE_RANGE);
        // The reply carries a 32-bit count: copy at most that much (the caller loops).
        let len = len.min(u64::from(u32::MAX) & !0xfff);
        match self
            .fs
            .copy_file_range(ino_in.0, offset_in, ino_out.0, offset_out, len)
        {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(e)),
        }
    }
}

/// Replies to a getxattr/listxattr: the size for a size-0 probe, `ERANGE` when the buffer is small.
fn sized_reply(reply: ReplyXattr, size: u32, r: amaranth_fs::Result<Vec<u8>>) {
    match r {
        Ok(v) if size == 0 => reply.size(v.len() as u32),
        Ok(v) if v.len() > size as usize => reply.error(fuser::Errno::ERANGE),
        Ok(v) => reply.data(&v),
        Err(e) => reply.error(errno(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What fuser 0.18.0 makes of the kernel's `(sec, nsec)` (see `time_of`).
    fn as_fuser_decodes(sec: i64, nsec: u32) -> SystemTime {
        if sec >= 0 {
            UNIX_EPOCH + Duration::new(sec as u64, nsec)
        } else {
            UNIX_EPOCH - Duration::new(sec.unsigned_abs(), nsec)
        }
    }

    #[test]
    fn kernel_times_round_trip_through_fusers_decoding() {
        for (sec, nsec) in [
            (0, 0),
            (1, 1),
            (1_700_000_000, 999_999_999),
            (-1, 0),
            (-1, 500),
            (-1, 999_999_999),
            (-1_000_000, 999_999_999),
            (-2_208_988_800, 123_456_789),
        ] {
            assert_eq!(
                time_of(as_fuser_decodes(sec, nsec)),
                Time { sec, nsec },
                "({sec}, {nsec})"
            );
        }
    }
}
