//! From FUSE requests to [`Fs`] calls: every request becomes one call on [`Fs`] and one reply.
//! Nothing here knows about keys, the engine or caching beyond the kernel's TTLs, and nothing
//! here knows which transport carried the request.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use amaranth_fs::{Ctx, Errno, Fs, Inode, Kind, SetAttr, SetTime, Time};

use crate::abi::{self, fattr, op, *};
use crate::counters::RequestCounts;
use crate::reply::Reply;

/// `st_blksize`: the I/O size `stdio`, `cp` and friends use, so each `write()` is a big request.
const BLKSIZE: u32 = 128 << 10;

/// The adapter: an [`Fs`] plus the kernel cache lifetimes.
pub(crate) struct Adapter {
    pub(crate) fs: Arc<Fs>,
    /// Entry and attribute lifetime (only the daemon changes anything, so long).
    pub(crate) ttl: Duration,
    /// Lifetime of a negative entry (a name that does not exist); zero disables them.
    pub(crate) negative_ttl: Duration,
    /// The session's `/dev/fuse` descriptor, for notifications.
    pub(crate) dev: Arc<OwnedFd>,
    /// Requests served, by opcode.
    pub(crate) counts: Arc<RequestCounts>,
    /// The generation of every inode of the image (file handles: see `amaranth_fs` handles).
    pub(crate) generation: u64,
    /// Test hook ([`crate::HOLD_FSYNC_ENV`]): syncs wait while this path exists.
    pub(crate) hold_fsync: Option<std::path::PathBuf>,
}

type R<T> = Result<T, i32>;

fn err(e: Errno) -> i32 {
    e.0
}

/// A NUL-terminated name at the start of `b`, and what follows it.
fn name(b: &[u8]) -> R<(&[u8], &[u8])> {
    let end = b.iter().position(|&c| c == 0).ok_or(libc::EINVAL)?;
    Ok((&b[..end], &b[end + 1..]))
}

fn arg<T: Pod>(b: &[u8]) -> R<T> {
    abi::read(b).ok_or(libc::EINVAL)
}

fn type_bits(kind: Kind) -> u32 {
    match kind {
        Kind::File => libc::S_IFREG,
        Kind::Dir => libc::S_IFDIR,
        Kind::Symlink => libc::S_IFLNK,
        Kind::Fifo => libc::S_IFIFO,
        Kind::Socket => libc::S_IFSOCK,
        Kind::CharDev => libc::S_IFCHR,
        Kind::BlockDev => libc::S_IFBLK,
    }
}

/// The kernel's view of an inode.
pub(crate) fn attr(i: &Inode) -> Attr {
    Attr {
        ino: i.ino,
        size: i.size,
        blocks: i.st_blocks(),
        atime: i.atime.sec as u64,
        mtime: i.mtime.sec as u64,
        ctime: i.ctime.sec as u64,
        atimensec: i.atime.nsec,
        mtimensec: i.mtime.nsec,
        ctimensec: i.ctime.nsec,
        mode: type_bits(i.kind) | u32::from(i.perm),
        nlink: i.nlink,
        uid: i.uid,
        gid: i.gid,
        rdev: i.rdev,
        blksize: BLKSIZE,
        flags: 0,
    }
}

/// A time the kernel sent: seconds (two's complement before the epoch) and nanoseconds.
fn time(sec: u64, nsec: u32) -> Time {
    Time {
        sec: sec as i64,
        nsec,
    }
}

fn ctx(h: &InHeader) -> Ctx {
    Ctx {
        uid: h.uid,
        gid: h.gid,
        pid: h.pid,
    }
}

/// Rounds a directory entry's length up to 8 bytes, as the kernel expects.
fn align8(n: usize) -> usize {
    (n + 7) & !7
}

impl Adapter {
    fn entry_out(&self, i: &Inode) -> EntryOut {
        EntryOut {
            nodeid: i.ino,
            generation: self.generation,
            entry_valid: self.ttl.as_secs(),
            attr_valid: self.ttl.as_secs(),
            entry_valid_nsec: self.ttl.subsec_nanos(),
            attr_valid_nsec: self.ttl.subsec_nanos(),
            attr: attr(i),
        }
    }

    fn attr_out(&self, i: &Inode) -> AttrOut {
        AttrOut {
            attr_valid: self.ttl.as_secs(),
            attr_valid_nsec: self.ttl.subsec_nanos(),
            dummy: 0,
            attr: attr(i),
        }
    }

    fn entry(&self, r: &mut Reply, i: amaranth_fs::Result<Inode>) -> R<()> {
        r.push(&self.entry_out(&i.map_err(err)?));
        Ok(())
    }

    /// Serves one request: `arg` is the operation's fixed header, `payload` what follows it
    /// (names, data). Fills `r` (or marks it as needing no reply).
    pub(crate) fn handle(&self, h: &InHeader, arg: &[u8], payload: &[u8], r: &mut Reply) {
        self.handle_into(h, arg, payload, None, r)
    }

    /// [`Adapter::handle`], with `out`: the transport's own reply buffer, into which a READ writes
    /// its data directly (the reply then counts it as an external payload: no copy out of `r`).
    pub(crate) fn handle_into(
        &self,
        h: &InHeader,
        arg: &[u8],
        payload: &[u8],
        out: Option<&mut [u8]>,
        r: &mut Reply,
    ) {
        let started = std::time::Instant::now();
        self.counts.count(h.opcode);
        r.start(h.unique);
        // Patchgroups: every change this request makes is its caller's (a thread id).
        let _caller = self.fs.caller(h.pid);
        let result = match (h.opcode, out) {
            (op::READ, Some(out)) => self.read_direct(h.nodeid, arg, out, r),
            _ => self.dispatch(h, arg, payload, r),
        };
        if let Err(e) = result {
            r.error(e);
        }
        self.counts
            .add_time(h.opcode, started.elapsed().as_nanos() as u64);
    }

    /// A READ answered straight into `out` (at most `size` bytes, at most `out`'s length).
    fn read_direct(&self, ino: u64, a: &[u8], out: &mut [u8], r: &mut Reply) -> R<()> {
        let x: ReadIn = arg(a)?;
        let len = (x.size as usize).min(out.len());
        let n = self
            .fs
            .read_to_slice(ino, x.offset, &mut out[..len])
            .map_err(err)?;
        r.external_payload(n);
        Ok(())
    }

    fn dispatch(&self, h: &InHeader, a: &[u8], p: &[u8], r: &mut Reply) -> R<()> {
        let fs = &*self.fs;
        let ino = h.nodeid;
        match h.opcode {
            op::LOOKUP => self.lookup(ino, name(p)?.0, r),
            op::FORGET => {
                let f: ForgetIn = arg(a)?;
                fs.forget(ino, f.nlookup);
                r.none();
                Ok(())
            }
            op::BATCH_FORGET => {
                let b: BatchForgetIn = arg(a)?;
                let one = std::mem::size_of::<ForgetOne>();
                for k in 0..b.count as usize {
                    let f: ForgetOne = arg(p.get(k * one..).unwrap_or(&[]))?;
                    fs.forget(f.nodeid, f.nlookup);
                }
                r.none();
                Ok(())
            }
            op::INTERRUPT => {
                // Every request is served to completion quickly; nothing to interrupt.
                r.none();
                Ok(())
            }
            op::GETATTR => {
                let i = fs.getattr(ino).map_err(err)?;
                r.push(&self.attr_out(&i));
                Ok(())
            }
            op::SETATTR => self.setattr(h, arg(a)?, r),
            op::READLINK => {
                r.extend(&fs.readlink(ino).map_err(err)?);
                Ok(())
            }
            op::MKNOD => {
                let m: MknodIn = arg(a)?;
                let n = name(p)?.0;
                self.entry(r, fs.mknod(ino, n, m.mode, m.rdev, ctx(h)))
            }
            op::MKDIR => {
                let m: MkdirIn = arg(a)?;
                self.entry(r, fs.mkdir(ino, name(p)?.0, m.mode, ctx(h)))
            }
            op::SYMLINK => {
                let (n, rest) = name(p)?;
                let target = name(rest)?.0;
                self.entry(r, fs.symlink(ino, n, target, ctx(h)))
            }
            op::UNLINK => fs.unlink(ino, name(p)?.0).map_err(err),
            op::RMDIR => fs.rmdir(ino, name(p)?.0).map_err(err),
            op::RENAME | op::RENAME2 => {
                let (newdir, flags) = if h.opcode == op::RENAME {
                    (arg::<RenameIn>(a)?.newdir, 0)
                } else {
                    let x: Rename2In = arg(a)?;
                    (x.newdir, x.flags)
                };
                let (from, rest) = name(p)?;
                let to = name(rest)?.0;
                fs.rename(ino, from, newdir, to, flags).map_err(err)
            }
            op::LINK => {
                let l: LinkIn = arg(a)?;
                self.entry(r, fs.link(l.oldnodeid, ino, name(p)?.0))
            }
            // No OPEN or RELEASE round trips: `ENOSYS` makes the kernel open files by itself for
            // the rest of the mount (`no_open`), with handle 0 and the page cache kept. Nothing
            // needs a handle: O_APPEND comes with every WRITE, an O_TRUNC open truncates with a
            // SETATTR (FUSE_ATOMIC_O_TRUNC is not negotiated), and a file unlinked while open
            // lives until the kernel forgets its inode (Fs::forget).
            op::OPEN => Err(libc::ENOSYS),
            op::READ => {
                let x: ReadIn = arg(a)?;
                // The data goes straight into the reply buffer (no intermediate copy).
                fs.read_into(ino, x.offset, x.size, r.payload_buf())
                    .map_err(err)?;
                Ok(())
            }
            op::WRITE => {
                let w: WriteIn = arg(a)?;
                let data = p.get(..w.size as usize).ok_or(libc::EINVAL)?;
                // With FUSE_HANDLE_KILLPRIV_V2 the kernel leaves clearing set-id bits to us.
                let kill = w.write_flags & WRITE_KILL_SUIDGID != 0;
                let append = w.flags as i32 & libc::O_APPEND != 0;
                let n = fs
                    .write_at(ino, w.offset, data, append, kill)
                    .map_err(err)?;
                r.push(&WriteOut {
                    size: n as u32,
                    padding: 0,
                });
                Ok(())
            }
            // Every write is in the engine when acknowledged, so a flush has nothing to do;
            // `ENOSYS` tells the kernel to send no more (`no_flush`: files opened without OPEN
            // do not carry FOPEN_NOFLUSH).
            op::FLUSH => Err(libc::ENOSYS),
            // Only from kernels that still release files made by CREATE under `no_open`.
            op::RELEASE => Ok(()),
            op::FSYNC | op::FSYNCDIR => {
                self.test_hold();
                fs.fsync().map_err(err)
            }
            op::SYNCFS => {
                self.test_hold();
                fs.syncfs().map_err(err)
            }
            // Served, with handle 0 (an offset says where a listing is, so nothing is kept per
            // handle) and without FOPEN_CACHE_DIR. Answering `ENOSYS` would spare OPENDIR and
            // RELEASEDIR, but the kernel then keeps every listing in its readdir cache, and that
            // cache lost entries under concurrent changes (cli test concurrency::many_clients:
            // a client's listing missed a file it had just made, 6 runs of 6).
            op::OPENDIR => {
                r.push(&OpenOut {
                    fh: fs.opendir(ino).map_err(err)?,
                    open_flags: 0,
                    backing_id: 0,
                });
                Ok(())
            }
            op::READDIR | op::READDIRPLUS => {
                self.readdir(ino, arg(a)?, h.opcode == op::READDIRPLUS, r)
            }
            op::RELEASEDIR => Ok(()),
            op::STATFS => {
                let s = fs.statfs();
                r.push(&StatfsOut {
                    blocks: s.blocks,
                    bfree: s.bfree,
                    bavail: s.bavail,
                    files: s.files,
                    ffree: s.ffree,
                    bsize: s.bsize,
                    namelen: s.namelen,
                    frsize: s.bsize,
                    ..StatfsOut::default()
                });
                Ok(())
            }
            op::SETXATTR => self.setxattr(ino, arg(a)?, p),
            op::GETXATTR => {
                let g: GetxattrIn = arg(a)?;
                sized(r, g.size, fs.getxattr(ino, name(p)?.0))
            }
            op::LISTXATTR => sized(r, arg::<GetxattrIn>(a)?.size, fs.listxattr(ino)),
            op::REMOVEXATTR => fs.removexattr(ino, name(p)?.0).map_err(err),
            op::ACCESS => self.access(h, arg::<AccessIn>(a)?.mask),
            // `ENOSYS` once: the kernel then makes files with MKNOD for the rest of the mount
            // (`no_create`) and opens them by itself as it opens every file (`no_open`, see
            // OPEN above). A file made by CREATE carries a handle, so its close costs a RELEASE
            // round trip as long as the kernel has not learnt `no_open` (an untar on a fresh
            // mount: one per file); a file made by MKNOD never does. The requests of an
            // `open(O_CREAT)` are otherwise the same (LOOKUP, then MKNOD instead of CREATE).
            op::CREATE => Err(libc::ENOSYS),
            op::IOCTL => self.ioctl(h, arg(a)?, p, r),
            op::FALLOCATE => {
                let f: FallocateIn = arg(a)?;
                fs.fallocate(ino, f.offset, f.length, f.mode as i32)
                    .map_err(err)
            }
            op::LSEEK => self.lseek(ino, arg(a)?, r),
            op::COPY_FILE_RANGE => {
                let c: CopyFileRangeIn = arg(a)?;
                // The reply carries a 32-bit count: copy at most that much (the caller loops).
                let len = c.len.min(u64::from(u32::MAX) & !0xfff);
                let n = fs
                    .copy_file_range(ino, c.off_in, c.nodeid_out, c.off_out, len)
                    .map_err(err)?;
                r.push(&WriteOut {
                    size: n as u32,
                    padding: 0,
                });
                Ok(())
            }
            op::DESTROY => Ok(()),
            // GETLK/SETLK (locks stay in the kernel: not negotiated), POLL (ENOSYS makes files
            // always ready), BMAP, TMPFILE, STATX and anything newer: not implemented, and the
            // kernel remembers that for the rest of the mount.
            _ => Err(libc::ENOSYS),
        }
    }

    /// The test hook of [`crate::HOLD_FSYNC_ENV`].
    fn test_hold(&self) {
        let Some(p) = &self.hold_fsync else {
            return;
        };
        let until = std::time::Instant::now() + Duration::from_secs(60);
        while p.exists() && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn lookup(&self, parent: u64, n: &[u8], r: &mut Reply) -> R<()> {
        match self.fs.lookup(parent, n) {
            Ok(i) => {
                r.push(&self.entry_out(&i));
                Ok(())
            }
            Err(Errno::ENOENT) if !self.negative_ttl.is_zero() => {
                // Node id 0 with a lifetime: the kernel caches the miss (a negative dentry).
                r.push(&EntryOut {
                    entry_valid: self.negative_ttl.as_secs(),
                    entry_valid_nsec: self.negative_ttl.subsec_nanos(),
                    ..EntryOut::default()
                });
                Ok(())
            }
            Err(e) => Err(err(e)),
        }
    }

    fn setattr(&self, h: &InHeader, s: SetattrIn, r: &mut Reply) -> R<()> {
        let v = s.valid;
        let has = |bit: u32| v & bit != 0;
        let when = |at: u32, now: u32, sec: u64, nsec: u32| {
            if has(now) {
                Some(SetTime::Now)
            } else if has(at) {
                Some(SetTime::At(time(sec, nsec)))
            } else {
                None
            }
        };
        // FATTR_KILL_SUIDGID: Fs::setattr clears set-id bits on a truncate by a non-root caller
        // and on a change of owner, which is what the flag asks.
        let set = SetAttr {
            mode: has(fattr::MODE).then_some(s.mode),
            uid: has(fattr::UID).then_some(s.uid),
            gid: has(fattr::GID).then_some(s.gid),
            size: has(fattr::SIZE).then_some(s.size),
            atime: when(fattr::ATIME, fattr::ATIME_NOW, s.atime, s.atimensec),
            mtime: when(fattr::MTIME, fattr::MTIME_NOW, s.mtime, s.mtimensec),
            ctime: has(fattr::CTIME).then(|| time(s.ctime, s.ctimensec)),
            crtime: None,
        };
        let i = self.fs.setattr(h.nodeid, &set, ctx(h)).map_err(err)?;
        r.push(&self.attr_out(&i));
        Ok(())
    }

    fn readdir(&self, ino: u64, x: ReadIn, plus: bool, r: &mut Reply) -> R<()> {
        let limit = x.size as usize;
        let res = self.fs.readdir(ino, x.fh, x.offset, plus, |e| {
            let dirent = Dirent {
                ino: e.ino,
                off: e.offset,
                namelen: e.name.len() as u32,
                typ: type_bits(e.kind) >> 12,
            };
            let base = std::mem::size_of::<Dirent>() + e.name.len();
            let need = align8(base + if plus { 128 } else { 0 });
            if r.payload_len() + need > limit {
                return false;
            }
            if plus {
                // `.` and `..` come without attributes; node id 0 tells the kernel to skip them.
                let entry = match &e.attr {
                    Some(i) => self.entry_out(i),
                    None => EntryOut::default(),
                };
                r.push(&entry);
            }
            r.push(&dirent);
            r.extend(&e.name);
            let pad = need - base - if plus { 128 } else { 0 };
            r.extend(&[0u8; 8][..pad]);
            true
        });
        res.map_err(err)
    }

    fn setxattr(&self, ino: u64, s: SetxattrIn, p: &[u8]) -> R<()> {
        let (n, rest) = name(p)?;
        let value = rest.get(..s.size as usize).ok_or(libc::EINVAL)?;
        self.fs
            .setxattr(ino, n, value, s.flags as i32)
            .map_err(err)?;
        if n == amaranth_fs::acl::ACCESS {
            // An access ACL sets the mode, and the kernel (without FUSE_POSIX_ACL) keeps its
            // cached attributes: drop them (attributes only, not pages).
            self.inval_attributes(ino);
        }
        Ok(())
    }

    /// Tells the kernel to forget the cached attributes of `ino` (a notification on /dev/fuse).
    fn inval_attributes(&self, ino: u64) {
        let body = NotifyInvalInodeOut {
            ino,
            off: -1,
            len: 0,
        };
        let h = OutHeader {
            len: (std::mem::size_of::<OutHeader>() + std::mem::size_of_val(&body)) as u32,
            error: NOTIFY_INVAL_INODE,
            unique: 0,
        };
        let mut msg = abi::bytes(&h).to_vec();
        msg.extend_from_slice(abi::bytes(&body));
        // SAFETY: writes a valid buffer to our own descriptor.
        let n = unsafe { libc::write(self.dev.as_raw_fd(), msg.as_ptr().cast(), msg.len()) };
        if n < 0 {
            log::debug!(
                "amaranth: invalidating {ino}: {}",
                std::io::Error::last_os_error()
            );
        }
    }

    fn access(&self, h: &InHeader, mask: u32) -> R<()> {
        // Only reached without `default_permissions` (the kernel checks otherwise): mode bits,
        // primary group only.
        let i = self.fs.getattr(h.nodeid).map_err(err)?;
        let want = mask as u16 & 0o7;
        let allowed = if h.uid == 0 {
            // Root may do anything except execute a file nobody may execute.
            if want & 1 != 0 && i.kind != Kind::Dir && i.perm & 0o111 == 0 {
                0o6
            } else {
                0o7
            }
        } else if h.uid == i.uid {
            (i.perm >> 6) & 7
        } else if h.gid == i.gid {
            (i.perm >> 3) & 7
        } else {
            i.perm & 7
        };
        if want & !allowed == 0 {
            Ok(())
        } else {
            Err(libc::EACCES)
        }
    }

    /// Restricted ioctls on any file or directory: the patchgroup commands (pg_ioctl.rs), the
    /// clone (clone_ioctl.rs) and, on the mount's root, snapshots (snapshot_ioctl.rs).
    fn ioctl(&self, h: &InHeader, x: IoctlIn, p: &[u8], r: &mut Reply) -> R<()> {
        let clone = crate::clone_ioctl::is_clone(x.cmd);
        let snapshot = crate::snapshot_ioctl::is_snapshot(x.cmd);
        if !clone && !snapshot && !crate::pg_ioctl::is_patchgroup(x.cmd) {
            return Err(libc::ENOTTY);
        }
        let input = p.get(..x.in_size as usize).ok_or(libc::EINVAL)?;
        let out = if snapshot {
            crate::snapshot_ioctl::handle(&self.fs, h.nodeid, h.uid, input)
                .map_err(err)?
                .to_vec()
        } else if clone {
            let (out, a, _) =
                crate::clone_ioctl::handle(&self.fs, h.nodeid, (h.uid, h.gid, h.pid), input)
                    .map_err(err)?;
            self.clone_made(a.parent, a.name);
            out.to_vec()
        } else {
            crate::pg_ioctl::handle(&self.fs, h.pid, x.cmd, input)
                .map_err(err)?
                .to_vec()
        };
        r.push(&IoctlOut::default());
        r.extend(&out[..(x.out_size as usize).min(out.len())]);
        Ok(())
    }

    /// A clone made `parent/name` behind the kernel's back: its cached attributes of `parent`
    /// (link count, times) go at once, and a negative entry it may hold for the name (kept for
    /// `negative_ttl`) from another thread, since the kernel takes the directory's lock to drop
    /// it (see `forget.rs`).
    fn clone_made(&self, parent: u64, name: Vec<u8>) {
        self.inval_attributes(parent);
        let dev = self.dev.clone();
        let sent = std::thread::Builder::new()
            .name("amaranth-inval".into())
            .spawn(move || {
                if let Err(e) = crate::forget::inval_entry(&dev, parent, &name) {
                    log::debug!("amaranth: invalidating a cloned name in {parent}: {e}");
                }
            });
        if let Err(e) = sent {
            log::warn!("amaranth: no thread to invalidate a cloned name: {e}");
        }
    }

    fn lseek(&self, ino: u64, l: LseekIn, r: &mut Reply) -> R<()> {
        // The kernel handles SEEK_SET/CUR/END itself; only SEEK_DATA/SEEK_HOLE reach us.
        let whence = l.whence as i32;
        if whence != libc::SEEK_DATA && whence != libc::SEEK_HOLE {
            return Err(libc::EINVAL);
        }
        if (l.offset as i64) < 0 {
            return Err(libc::ENXIO);
        }
        let off = self.fs.lseek(ino, l.offset, whence).map_err(err)?;
        r.push(&LseekOut { offset: off });
        Ok(())
    }
}

/// Replies to a getxattr/listxattr: the size for a size-0 probe, `ERANGE` when the buffer is small.
fn sized(r: &mut Reply, size: u32, v: amaranth_fs::Result<Vec<u8>>) -> R<()> {
    let v = v.map_err(err)?;
    if size == 0 {
        r.push(&GetxattrOut {
            size: v.len() as u32,
            padding: 0,
        });
    } else if v.len() > size as usize {
        return Err(libc::ERANGE);
    } else {
        r.extend(&v);
    }
    Ok(())
}

/// The size of the fixed header of each request (what the io_uring transport finds in the
/// entry's `op_in` area; on /dev/fuse it precedes the payload).
pub(crate) fn arg_size(opcode: u32) -> usize {
    use std::mem::size_of;
    match opcode {
        op::FORGET => size_of::<ForgetIn>(),
        op::BATCH_FORGET => size_of::<BatchForgetIn>(),
        op::INTERRUPT => 8,
        op::GETATTR => size_of::<GetattrIn>(),
        op::SETATTR => size_of::<SetattrIn>(),
        op::MKNOD => size_of::<MknodIn>(),
        op::MKDIR => size_of::<MkdirIn>(),
        op::RENAME => size_of::<RenameIn>(),
        op::RENAME2 => size_of::<Rename2In>(),
        op::LINK => size_of::<LinkIn>(),
        op::OPEN | op::OPENDIR => size_of::<OpenIn>(),
        op::CREATE => size_of::<CreateIn>(),
        op::READ | op::READDIR | op::READDIRPLUS => size_of::<ReadIn>(),
        op::WRITE => size_of::<WriteIn>(),
        op::RELEASE | op::RELEASEDIR | op::FLUSH => size_of::<ReleaseIn>(),
        op::FSYNC | op::FSYNCDIR => size_of::<FsyncIn>(),
        op::SYNCFS => 8,
        op::SETXATTR => size_of::<SetxattrIn>(),
        op::GETXATTR | op::LISTXATTR => size_of::<GetxattrIn>(),
        op::ACCESS => size_of::<AccessIn>(),
        op::IOCTL => 32,
        op::FALLOCATE => size_of::<FallocateIn>(),
        op::LSEEK => size_of::<LseekIn>(),
        op::COPY_FILE_RANGE => size_of::<CopyFileRangeIn>(),
        op::GETLK | op::SETLK | op::SETLKW => 48,
        op::POLL => 24,
        op::BMAP => 16,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_nul_terminated() {
        assert_eq!(name(b"a\0b\0").unwrap(), (&b"a"[..], &b"b\0"[..]));
        assert_eq!(name(b"abc"), Err(libc::EINVAL));
    }

    #[test]
    fn kernel_times_before_the_epoch() {
        assert_eq!(time((-1i64) as u64, 500), Time { sec: -1, nsec: 500 });
        assert_eq!(
            time(1_700_000_000, 1),
            Time {
                sec: 1_700_000_000,
                nsec: 1
            }
        );
    }
}
