//! The file-system operations: each one becomes one atomic engine batch.
//!
//! This file holds the `Fs` struct, its construction, the commit path and the helpers every
//! operation shares (finding names and inodes, counters), and open files. The operations, each an
//! `impl Fs` of its own, are in `fs/`: `namespace.rs` (lookup, create, mknod, mkdir, symlink, link,
//! unlink, rmdir), `rename.rs`, `data.rs` (read, write, truncate, fallocate, lseek,
//! copy_file_range and the batch builders `write_ops`/`zero_ops`), `attr.rs` (getattr, setattr,
//! xattrs), `limits.rs` (the space and key-length policies, statfs), `readdir.rs` (opendir,
//! readdir, releasedir), `times.rs` (access times), `orphans.rs` (files unlinked while held),
//! `doomed.rs` (those the kernel forgot, deleted together later),
//! `handles.rs` (inodes by number), `links.rs` (the names of hard-linked files, and moving a file
//! back from its home), `clone_dir.rs` (`amaranth clone`: a directory tree or a file cloned under
//! a new name) and `upgrade.rs` (schema upgrades).
//!
//! Locking: `ns` (the namespace lock) is taken shared by operations that do not change names
//! (read, write, setattr, xattrs), by those that only add one (create, mknod, mkdir, symlink:
//! these hold their directory's attribute lock from the check that the name is free until the
//! table knows it, see `Fs::make`) and by the common removals (the unlink of a file the kernel
//! holds with one name, the rmdir of a directory the table holds: they also hold the removed
//! inode's lock), by the common renames of files (`fs/rename_shared.rs`: they hold the parents'
//! and the files' locks, and readers that use a key without the file's lock check `moves`), and
//! exclusive by the other name changes (the other renames, link, the other unlinks and rmdirs,
//! clones), so a path's key cannot change under an operation that uses it unnoticed. An inode's
//! attribute lock is held from reading its attributes until the batch that changes them is
//! submitted, so changes to one inode reach the log in the order they were made; its key is read
//! under that lock too, because the last release of an unlinked file deletes it under the shared
//! namespace lock, holding the inode lock, and a deleted inode has no key. The table lock is
//! innermost and brief.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use amaranth_engine::{Batch, Engine, Op};
use parking_lot::{Mutex, RwLock};

use crate::error::{Errno, Result};
use crate::inode::{Inode, Kind, Meta, Time};
use crate::keys;
use crate::patchgroup::{CallerScope, Patchgroups, ProcessModel};
use crate::table::{Table, ROOT_INO};

mod attr;
mod clone_dir;
mod data;
mod doomed;
mod handles;
mod limits;
mod links;
mod namespace;

pub(crate) use handles::{Place, INDEX_SCHEMA};
pub(crate) use links::NAMES_SCHEMA;
mod orphans;
#[cfg(test)]
mod race_tests;
mod readdir;
mod rename;
mod rename_shared;
mod test_points;
mod times;
mod upgrade;

pub use clone_dir::{Caller, Cloned};
pub use data::{write_ops, zero_ops};
pub use doomed::DOOMED_MAX;
pub use times::Modes;

pub(crate) use orphans::parked_path;

/// Version of the file-system schema stored in `s/format` (2: names carry their hash, so a
/// directory's children are in hash order; 3: the inode index, see `fs/handles.rs`; 4: inodes
/// count their blocks and reservations; 5: a regular file's home with link count 0 may name, in its
/// target field, the path where its data still is, see `fs/orphans.rs`; 6: the names index of
/// hard-linked files, see `fs/links.rs`). Version-1 images are refused; versions 2 to 5 are
/// upgraded at their first writable mount or remount (`fs/upgrade.rs`).
pub const SCHEMA_VERSION: u32 = 6;
/// Longest file name.
pub const NAME_MAX: usize = 255;
/// Longest symlink target.
pub const SYMLINK_MAX: usize = 4095;
/// Largest extended attribute value.
pub const XATTR_VALUE_MAX: usize = 65536;
/// Largest file size.
pub const MAX_FILE_SIZE: u64 = i64::MAX as u64;
/// The most bytes one `copy_file_range` call copies (as much as the largest write request).
pub const COPY_MAX: u64 = 1 << 20;
/// Inode numbers reserved per record of the counter.
const INO_BATCH: u64 = 1024;
/// `renameat2` flags.
pub const RENAME_NOREPLACE: u32 = 1;
/// Swap the two names.
pub const RENAME_EXCHANGE: u32 = 2;
/// `fallocate` modes.
pub const FALLOC_FL_KEEP_SIZE: i32 = 1;
/// Deallocate the range.
pub const FALLOC_FL_PUNCH_HOLE: i32 = 2;
/// Zero the range.
pub const FALLOC_FL_ZERO_RANGE: i32 = 0x10;

/// Who is asking.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ctx {
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
    /// Process id.
    pub pid: u32,
}

/// A time to set.
#[derive(Clone, Copy, Debug)]
pub enum SetTime {
    /// The current time.
    Now,
    /// This time.
    At(Time),
}

/// Attribute changes requested by `setattr`.
#[derive(Clone, Debug, Default)]
pub struct SetAttr {
    /// New mode (permission bits are used).
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New size (truncate or extend).
    pub size: Option<u64>,
    /// New access time.
    pub atime: Option<SetTime>,
    /// New modification time.
    pub mtime: Option<SetTime>,
    /// New change time.
    pub ctime: Option<Time>,
    /// New creation time.
    pub crtime: Option<Time>,
}

/// One directory entry handed to a readdir consumer.
#[derive(Clone, Debug)]
pub struct DirEntry {
    /// Inode number.
    pub ino: u64,
    /// Offset to resume after this entry.
    pub offset: u64,
    /// Kind.
    pub kind: Kind,
    /// Name.
    pub name: Vec<u8>,
    /// Attributes (readdirplus only; `.` and `..` have none).
    pub attr: Option<Inode>,
}

/// File-system statistics for `statfs`.
#[derive(Clone, Copy, Debug)]
pub struct StatFs {
    /// Total 4 KiB blocks.
    pub blocks: u64,
    /// Free blocks.
    pub bfree: u64,
    /// Blocks available to users.
    pub bavail: u64,
    /// Total inodes (used + free).
    pub files: u64,
    /// Free inodes.
    pub ffree: u64,
    /// Block size.
    pub bsize: u32,
    /// Longest name.
    pub namelen: u32,
}

/// Options of a mounted file system.
#[derive(Clone, Debug)]
pub struct FsOptions {
    /// Free space kept back so that checkpoints can always complete (writes get `ENOSPC` below it).
    pub reserve_bytes: u64,
    /// Update access times on read: by relatime rules, or on every read with `strictatime`
    /// (false: `noatime`).
    pub relatime: bool,
    /// Update the access time on every read (`strictatime`; needs `relatime`).
    pub strictatime: bool,
    /// Access-time updates stay in memory until the inode is written for another reason, synced,
    /// forgotten by the kernel, or the file system is unmounted or made read-only (`lazytime`).
    pub lazytime: bool,
    /// Every change is durable before the call that made it returns (`sync`, `dirsync`).
    pub sync: bool,
    /// `fsync`, `fdatasync` and `fsyncdir` make everything before them durable before they return
    /// (the default). Off: they are ordering points that return at once, durable with the next
    /// background log flush (about a second); the order of operations is kept either way.
    pub durable_fsync: bool,
    /// How patchgroup callers are identified (real processes through `/proc`, or declared).
    pub processes: ProcessModel,
    /// A write's run of whole 4 KiB blocks at least this long (bytes) is stored out of line:
    /// written once to its own place, the log and the tree holding 12-byte references
    /// (docs/WRITEONCE.md). 0: every block stays in the tree.
    pub out_of_line_min: usize,
    /// A rename copies a range of keys (a file's data, a directory's subtree, extended
    /// attributes) holding at most this many bytes, and moves a larger one by tree surgery, at a
    /// cost that does not depend on its size ([`amaranth_engine::Op::RangeMove`]). The default
    /// is the measured crossover ([`RENAME_COPY_MAX`]).
    pub rename_copy_max: u32,
}

/// The default [`FsOptions::rename_copy_max`]: below it, copying a renamed range costs less than
/// cutting it out of the tree (docs/SURGERY.md §5.6).
pub const RENAME_COPY_MAX: u32 = 128 << 10;

/// The default [`FsOptions::out_of_line_min`]: 64 KiB (docs/WRITEONCE.md, Q1).
pub const OUT_OF_LINE_MIN: usize = 64 << 10;

impl Default for FsOptions {
    fn default() -> FsOptions {
        FsOptions {
            reserve_bytes: 64 << 20,
            relatime: true,
            strictatime: false,
            lazytime: false,
            sync: false,
            durable_fsync: true,
            processes: ProcessModel::Linux,
            out_of_line_min: OUT_OF_LINE_MIN,
            rename_copy_max: RENAME_COPY_MAX,
        }
    }
}

/// What to create.
#[derive(Clone, Copy)]
struct NewNode<'a> {
    kind: Kind,
    mode: u32,
    rdev: u32,
    target: &'a [u8],
}

/// What an open file handle remembers.
#[derive(Debug)]
struct FileHandle {
    ino: u64,
    append: bool,
}

/// Counters of file-system activity.
#[derive(Debug, Default)]
pub struct FsCounters {
    /// Operations that changed something.
    pub writes: AtomicU64,
    /// Bytes written by applications.
    pub bytes_written: AtomicU64,
    /// Bytes read by applications.
    pub bytes_read: AtomicU64,
}

/// Inode number allocation.
#[derive(Debug)]
struct InoAlloc {
    next: u64,
    reserved_end: u64,
}

/// A resolved name.
struct Found {
    /// Path key of the name.
    key: Vec<u8>,
    /// The inode (shared with the table when cached).
    inode: Inode,
    /// The name holds a redirect to a home.
    redirect: bool,
}

/// The file system.
pub struct Fs {
    engine: Arc<Engine>,
    opts: FsOptions,
    ns: RwLock<()>,
    /// Taken shared by renames under the shared namespace lock, exclusive by the readers that
    /// do not check [`Fs::moves`] (`fs/rename_shared.rs`).
    moving: RwLock<()>,
    /// Renames under the shared namespace lock so far (each adds one before its batch is
    /// committed): readers check it to notice keys that moved under them.
    moves: AtomicU64,
    pub(crate) table: Mutex<Table>,
    alloc: Mutex<InoAlloc>,
    inodes_used: AtomicU64,
    /// Holes reserved by `fallocate` in all files (`s/reserved`).
    reserved_blocks: AtomicU64,
    /// Orders the commits that change the counters (see `count_inodes`).
    count_lock: Mutex<()>,
    files: Mutex<HashMap<u64, FileHandle>>,
    /// Regular files unlinked while the kernel held them, whose data stays at their last path
    /// until the kernel forgets them (see `fs/orphans.rs`), and how many there are.
    parked: Mutex<orphans::Parked>,
    parked_count: std::sync::atomic::AtomicUsize,
    /// Files the kernel forgot after their last name went, waiting to be deleted together
    /// (see `fs/doomed.rs`).
    doomed: doomed::Doomed,
    next_fh: AtomicU64,
    /// When space was last reclaimed, the deletion count then, and the bytes it freed.
    last_reclaim: Mutex<(Option<Instant>, u64, u64)>,
    /// Operations that freed space (unlink, rmdir, truncate, punch) so far.
    deletions: AtomicU64,
    /// Inodes whose access time changed in memory only (`lazytime`).
    lazy_atimes: Mutex<std::collections::HashSet<u64>>,
    /// Access-time and sync settings (changed by a remount).
    modes: Mutex<times::Modes>,
    /// The image's schema (older ones until the first writable mount or remount upgrades it).
    schema: AtomicU32,
    /// Counters.
    pub counters: FsCounters,
    /// Patchgroups (patchgroup.rs): every batch is logged through them.
    pg: Arc<Patchgroups>,
    /// Where unit tests force interleavings (nothing outside them).
    test_points: test_points::TestPoints,
}

fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return Err(Errno::EINVAL);
    }
    if name.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    Ok(())
}

fn u64_value(v: Option<Vec<u8>>) -> Option<u64> {
    v.and_then(|b| b.try_into().ok()).map(u64::from_le_bytes)
}

impl Fs {
    /// Writes a new, empty file system (root directory owned by `uid:gid`) into `engine`.
    pub fn mkfs(engine: &Engine, uid: u32, gid: u32) -> Result<()> {
        let mut root = Inode::new(ROOT_INO, Kind::Dir, 0o755, uid, gid);
        root.nlink = 2;
        let mut b = Batch::new();
        b.put(
            keys::system_key("format"),
            SCHEMA_VERSION.to_le_bytes().to_vec(),
        );
        b.put(keys::meta_key(&[]), root.encode());
        b.put(
            keys::system_key("next_ino"),
            (ROOT_INO + 1 + INO_BATCH).to_le_bytes().to_vec(),
        );
        b.put(keys::system_key("inodes"), 1u64.to_le_bytes().to_vec());
        b.put(keys::system_key("reserved"), 0u64.to_le_bytes().to_vec());
        engine.write(&b)?;
        engine.sync()?;
        Ok(())
    }

    /// Opens the file system stored in `engine`, removing files that were unlinked while in use
    /// when the previous session ended.
    pub fn new(engine: Arc<Engine>, opts: FsOptions) -> Result<Fs> {
        // Leaves split at path-component and file boundaries where they can: a renamed directory
        // or file then often starts and ends at pivots already (docs/SURGERY.md §3.5).
        engine.set_split_boundaries(&[keys::SEP, keys::END]);
        let version = engine.get(&keys::system_key("format"))?;
        let schema = handles::schema_of(version.clone());
        match version.as_deref() {
            Some(_) if schema.is_some() => {}
            Some(v) => {
                log::error!(
                    "amaranth: unsupported file-system schema {v:?} (this version reads schema \
                     {SCHEMA_VERSION}: make a new image with mkfs and copy the files over)"
                );
                return Err(Errno::EINVAL);
            }
            None => {
                log::error!("amaranth: the image holds no file system (run mkfs)");
                return Err(Errno::EINVAL);
            }
        }
        let root = match engine.get(&keys::meta_key(&[]))? {
            Some(v) => match Meta::decode(&v)? {
                Meta::Inode(i) if i.kind == Kind::Dir && i.ino == ROOT_INO => i,
                _ => return Err(Errno::EIO),
            },
            None => return Err(Errno::EIO),
        };
        let next = u64_value(engine.get(&keys::system_key("next_ino"))?).ok_or(Errno::EIO)?;
        let used = u64_value(engine.get(&keys::system_key("inodes"))?).unwrap_or(1);
        let modes = Mutex::new(times::Modes::from_options(&opts));
        let reserved = u64_value(engine.get(&keys::system_key("reserved"))?).unwrap_or(0);
        let fs = Fs {
            pg: Patchgroups::new(engine.clone(), opts.processes),
            engine,
            opts,
            ns: RwLock::new(()),
            moving: RwLock::new(()),
            moves: AtomicU64::new(0),
            table: Mutex::new(Table::new(root)),
            alloc: Mutex::new(InoAlloc {
                next,
                reserved_end: next,
            }),
            inodes_used: AtomicU64::new(used),
            reserved_blocks: AtomicU64::new(reserved),
            count_lock: Mutex::new(()),
            files: Mutex::new(HashMap::new()),
            parked: Mutex::new(orphans::Parked::default()),
            parked_count: std::sync::atomic::AtomicUsize::new(0),
            doomed: Default::default(),
            next_fh: AtomicU64::new(1),
            last_reclaim: Mutex::new((None, 0, 0)),
            deletions: AtomicU64::new(0),
            lazy_atimes: Mutex::new(std::collections::HashSet::new()),
            modes,
            schema: AtomicU32::new(schema.expect("checked above")),
            counters: FsCounters::default(),
            test_points: Default::default(),
        };
        let charged = fs.engine.clone();
        fs.table
            .lock()
            .charge_to(charged, crate::memory::TABLE_UNCHARGED);
        if fs.engine.is_read_only() {
            // Orphans stay, and the schema, until the file system is writable again.
            if !fs.has_index() {
                log::warn!(
                    "amaranth: this image has no inode index yet (schema {}); file handles of \
                     inodes the kernel forgot are stale until a writable mount builds it",
                    fs.schema()
                );
            }
        } else {
            let _ns = fs.ns.write();
            fs.prepare_writes()?;
        }
        Ok(fs)
    }

    /// The engine underneath.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// The patchgroups (docs/PATCHGROUPS.md).
    pub fn patchgroups(&self) -> &Patchgroups {
        &self.pg
    }

    /// Attributes the operations this thread calls while the scope lives to the caller `pid` (a
    /// FUSE request's pid: a thread id), so that they join its process's patchgroups.
    pub fn caller(&self, pid: u32) -> CallerScope {
        CallerScope::enter(pid)
    }

    /// Number of inodes the kernel knows (cached in the table).
    pub fn cached_inodes(&self) -> usize {
        self.table.lock().len()
    }

    // ----- helpers ------------------------------------------------------------------------

    /// Writes `b` as one atomic engine batch (taking its operations: `b` is left empty).
    fn commit(&self, b: &mut Batch) -> Result<()> {
        let mut b = std::mem::take(b);
        let deletes = b
            .ops()
            .iter()
            .any(|o| matches!(o, Op::RangeDelete { .. } | Op::Delete { .. }));
        let counters = [
            (keys::system_key("inodes"), &self.inodes_used),
            (keys::system_key("reserved"), &self.reserved_blocks),
        ];
        let counted = counters.iter().any(|(k, _)| b.put_value_mut(k).is_some());
        if counted {
            // The deltas left by `count_inodes` and `count_reserved` (one put per counter) become
            // the counters' new values, and values reach the log in the order they are computed.
            let _order = self.count_lock.lock();
            let mut now = Vec::new();
            for (k, counter) in &counters {
                let Some(value) = b.put_value_mut(k) else {
                    continue;
                };
                let delta = i64::from_le_bytes(value[..8].try_into().expect("a delta"));
                // Saturating: an image whose counter is already off (fsck reports it) must not
                // stop the file system.
                let v = counter.load(Ordering::Relaxed).saturating_add_signed(delta);
                *value = v.to_le_bytes().to_vec();
                now.push((*counter, v));
            }
            let lsn = self.pg.write(b)?;
            for (counter, v) in now {
                counter.store(v, Ordering::Relaxed);
            }
            self.sync_if_wanted(lsn)?;
        } else {
            let lsn = self.pg.write(b)?;
            self.sync_if_wanted(lsn)?;
        }
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        if deletes {
            self.deletions.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    fn node_inode(&self, ino: u64) -> Result<Arc<Mutex<Inode>>> {
        self.table
            .lock()
            .get(ino)
            .map(|n| n.inode.clone())
            .ok_or(Errno::ENOENT)
    }

    /// Where the data blocks and extended attributes of `ino` are (its parked path, home or
    /// path key).
    fn file_key(&self, ino: u64) -> Result<Vec<u8>> {
        self.data_key_of(ino).ok_or(Errno::ENOENT)
    }

    /// The metadata key of `ino` (at its home or path).
    fn meta_of(&self, ino: u64) -> Result<Vec<u8>> {
        let fk = self.table.lock().file_key(ino).ok_or(Errno::ENOENT)?;
        Ok(keys::meta_key(&fk))
    }

    /// Where `ino`'s data and extended attributes are (as [`Fs::file_key`]) and its metadata key
    /// (as [`Fs::meta_of`]), building its path once.
    fn locate(&self, ino: u64) -> Result<(Vec<u8>, Vec<u8>)> {
        let fk = self.table.lock().file_key(ino).ok_or(Errno::ENOENT)?;
        let meta = keys::meta_key(&fk);
        Ok((self.parked_data_key(ino).unwrap_or(fk), meta))
    }

    /// Reads what `key` (a meta key of a path) holds, following a redirect.
    fn load(&self, key: &[u8]) -> Result<Option<(Inode, bool)>> {
        let Some(v) = self.engine.get(&keys::meta_key(key))? else {
            return Ok(None);
        };
        match Meta::decode(&v)? {
            Meta::Inode(i) => Ok(Some((i, false))),
            Meta::Redirect(ino) => {
                let v = self
                    .engine
                    .get(&keys::meta_key(&keys::home_key(ino)))?
                    .ok_or_else(|| {
                        log::error!("amaranth: a name redirects to inode {ino}, which has no home");
                        Errno::EIO
                    })?;
                match Meta::decode(&v)? {
                    Meta::Inode(i) => Ok(Some((i, true))),
                    Meta::Redirect(_) => Err(Errno::EIO),
                }
            }
        }
    }

    /// Resolves `name` in directory `parent` (table first, then the engine).
    fn find(&self, parent: u64, dir_key: &[u8], name: &[u8]) -> Result<Option<Found>> {
        let key = keys::child_key(dir_key, name);
        loop {
            let cached = {
                let t = self.table.lock();
                t.child(parent, name)
                    .and_then(|ino| Some((ino, t.inode(ino)?)))
            };
            let Some((ino, shared)) = cached else {
                break;
            };
            let inode = shared.lock().clone();
            // A caller without the directory's lock (a lookup) may have waited for the inode's
            // lock while an unlink or a rename under the shared namespace lock removed the name:
            // look again rather than return the file under a name it no longer has.
            if self.table.lock().child(parent, name) != Some(ino) {
                continue;
            }
            return Ok(Some(Found {
                key,
                redirect: inode.homed,
                inode,
            }));
        }
        Ok(self.load(&key)?.map(|(inode, redirect)| Found {
            key,
            inode,
            redirect,
        }))
    }

    /// The directory `ino`: its key and attributes; `ENOTDIR` if it is not one.
    fn dir(&self, ino: u64) -> Result<(Vec<u8>, Arc<Mutex<Inode>>)> {
        let t = self.table.lock();
        let n = t.get(ino).ok_or(Errno::ENOENT)?;
        if n.kind != Kind::Dir {
            return Err(Errno::ENOTDIR);
        }
        let inode = n.inode.clone();
        let key = t.file_key(ino).ok_or(Errno::ENOENT)?;
        Ok((key, inode))
    }

    fn alloc_ino(&self, b: &mut Batch) -> u64 {
        let mut a = self.alloc.lock();
        if a.next >= a.reserved_end {
            a.reserved_end = a.next + INO_BATCH;
            b.put(
                keys::system_key("next_ino"),
                a.reserved_end.to_le_bytes().to_vec(),
            );
        }
        let ino = a.next;
        a.next += 1;
        ino
    }

    /// Changes the used-inode counter by `delta` in `b`. The batch holds the delta until
    /// [`Fs::commit`] turns it into the new value, under `count_lock`: operations that run
    /// concurrently (last releases of unlinked files hold the namespace lock shared) would
    /// otherwise log their values in another order than they computed them, leaving the stored
    /// counter wrong.
    fn count_inodes(&self, b: &mut Batch, delta: i64) {
        Self::count(b, "inodes", delta);
    }

    /// Changes the counter of reserved holes by `delta` in `b` (see `count_inodes`).
    fn count_reserved(&self, b: &mut Batch, delta: i64) {
        if delta != 0 {
            Self::count(b, "reserved", delta);
        }
    }

    fn count(b: &mut Batch, name: &str, delta: i64) {
        let key = keys::system_key(name);
        if let Some(value) = b.put_value_mut(&key) {
            let before = i64::from_le_bytes(value[..8].try_into().expect("a delta"));
            *value = (before + delta).to_le_bytes().to_vec();
            return;
        }
        b.put(key, delta.to_le_bytes().to_vec());
    }

    /// Operations deleting the file `inode`'s metadata, data and xattrs at `file_key` and its
    /// reservation.
    fn delete_file_ops(&self, b: &mut Batch, file_key: &[u8], inode: &Inode) {
        self.count_reserved(b, -(inode.reserved_holes() as i64));
        b.delete(keys::meta_key(file_key));
        self.delete_data_ops(b, file_key);
    }

    fn touch_dir(dir: &mut Inode, now: Time) {
        dir.mtime = now;
        dir.ctime = now;
    }

    // ----- open files ---------------------------------------------------------------------

    /// A file handle remembering `O_APPEND`. The lifetime of an unlinked file is the kernel's
    /// lookup count, not its handles (`fs/orphans.rs`); a deleted inode (its last name went while
    /// the kernel did not hold it, or the kernel forgot it since) is never opened: `ESTALE` (the
    /// kernel retries a path open with a fresh lookup).
    fn open_handle(&self, ino: u64, flags: i32) -> Result<u64> {
        let _ns = self.ns.read();
        let shared = self.node_inode(ino)?;
        if shared.lock().is_deleted() {
            return Err(Errno::ESTALE);
        }
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.files.lock().insert(
            fh,
            FileHandle {
                ino,
                append: flags & libc::O_APPEND != 0,
            },
        );
        Ok(fh)
    }

    /// Opens a file (with `O_TRUNC`, truncates it). Returns a file handle.
    pub fn open(&self, ino: u64, flags: i32, ctx: Ctx) -> Result<u64> {
        let inode = self.getattr(ino)?;
        if inode.is_deleted() {
            // As in `open_handle`, before an `O_TRUNC` finds no key to truncate.
            return Err(Errno::ESTALE);
        }
        let kind = inode.kind;
        if kind == Kind::Dir && flags & libc::O_ACCMODE != libc::O_RDONLY {
            return Err(Errno::EISDIR);
        }
        if flags & libc::O_TRUNC != 0
            && kind == Kind::File
            && flags & libc::O_ACCMODE != libc::O_RDONLY
        {
            self.setattr(
                ino,
                &SetAttr {
                    size: Some(0),
                    ..SetAttr::default()
                },
                ctx,
            )?;
        }
        self.open_handle(ino, flags)
    }

    /// Closes a file handle. (A file whose last name is gone is deleted when the kernel forgets
    /// it, not at a close: [`Fs::forget`].)
    pub fn release(&self, ino: u64, fh: u64) -> Result<()> {
        if self.files.lock().remove(&fh).is_none() {
            log::warn!("amaranth: release of an unknown file handle {fh} (inode {ino})");
        }
        Ok(())
    }

    /// Makes everything acknowledged so far durable (the log is global: any fsync syncs all).
    /// Without `durable_fsync`, an ordering point that returns at once. Inside an atomic
    /// patchgroup, everything before the group (the group itself becomes durable with its
    /// commit).
    pub fn fsync(&self) -> Result<()> {
        self.write_lazy_atimes();
        if !self.opts.durable_fsync {
            return Ok(());
        }
        self.pg.fsync()
    }

    /// `syncfs`: like a durable `fsync` in every mode (an explicit request for the whole file
    /// system, not the per-file habit `fsync=ordered` is for).
    pub fn syncfs(&self) -> Result<()> {
        self.pg.fsync()
    }
}
