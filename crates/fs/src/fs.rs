//! The file-system operations: each one becomes one atomic engine batch.
//!
//! Locking: `ns` (the namespace lock) is taken shared by operations that do not change names
//! (read, write, setattr, xattrs) and exclusive by those that do (create, unlink, rename, link...),
//! so a path's key cannot change under an operation that uses it. An inode's attribute lock is held
//! from reading its attributes until the batch that changes them is submitted, so changes to one
//! inode reach the log in the order they were made; its key is read under that lock too, because
//! the last release of an unlinked file deletes it under the shared namespace lock, holding the
//! inode lock, and a deleted inode has no key. The table lock is innermost and brief.

use std::collections::HashMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use amaranth_engine::{Batch, Engine, Op, Patch, SpaceUse};
use parking_lot::{Mutex, RwLock};

use crate::acl;
use crate::error::{Errno, Result};
use crate::inode::{Inode, Kind, Meta, Time};
use crate::keys::{self, BLOCK};
use crate::patchgroup::{CallerScope, Patchgroups, ProcessModel};
use crate::space::{self, RESERVED_BLOCK_COST};
use crate::table::{Table, ROOT_INO};

mod handles;

pub(crate) use handles::{Place, INDEX_SCHEMA};
mod orphans;
mod readdir;
mod times;
mod upgrade;

pub use times::Modes;

pub(crate) use orphans::parked_path;

/// Version of the file-system schema stored in `s/format` (2: names carry their hash, so a
/// directory's children are in hash order; 3: the inode index, see `fs/handles.rs`; 4: inodes
/// count their blocks and reservations; 5: a regular file's home with link count 0 may name, in its
/// target field, the path where its data still is, see `fs/orphans.rs`). Version-1 images are
/// refused; versions 2 to 4 are upgraded at their first writable mount or remount
/// (`fs/upgrade.rs`).
pub const SCHEMA_VERSION: u32 = 5;
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
}

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
        }
    }
}

/// What to create.
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
            next_fh: AtomicU64::new(1),
            last_reclaim: Mutex::new((None, 0, 0)),
            deletions: AtomicU64::new(0),
            lazy_atimes: Mutex::new(std::collections::HashSet::new()),
            modes,
            schema: AtomicU32::new(schema.expect("checked above")),
            counters: FsCounters::default(),
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
        let b = std::mem::take(b);
        let deletes = b
            .ops
            .iter()
            .any(|o| matches!(o, Op::RangeDelete { .. } | Op::Delete { .. }));
        let mut b = b;
        let counters = [
            (keys::system_key("inodes"), &self.inodes_used),
            (keys::system_key("reserved"), &self.reserved_blocks),
        ];
        let counted = b.ops.iter().any(|o| match o {
            Op::Put { key, .. } => counters.iter().any(|(k, _)| k == key),
            _ => false,
        });
        if counted {
            // The deltas left by `count_inodes` and `count_reserved` become the counters' new
            // values, and values reach the log in the order they are computed.
            let _order = self.count_lock.lock();
            let mut now = Vec::new();
            for o in &mut b.ops {
                let Op::Put { key, value } = o else { continue };
                for (k, counter) in &counters {
                    if k == key {
                        let delta = i64::from_le_bytes(value[..8].try_into().expect("a delta"));
                        // Saturating: an image whose counter is already off (fsck reports it) must
                        // not stop the file system.
                        let v = counter.load(Ordering::Relaxed).saturating_add_signed(delta);
                        *value = v.to_le_bytes().to_vec();
                        now.push((*counter, v));
                    }
                }
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

    /// Space held back from users (`f_bfree - f_bavail`): the configured reserve (at most a
    /// quarter of the data area), or what the next checkpoint needs to rewrite the dirty nodes
    /// when that is more.
    fn reserve(&self, s: &SpaceUse) -> u64 {
        self.opts
            .reserve_bytes
            .min(s.total / 4)
            .max(s.checkpoint_need())
    }

    /// Free bytes now (see `statfs`: the engine's free space less the holes `fallocate`
    /// reserved) and the reserve; available is free less the reserve.
    fn free_and_reserve(&self) -> (u64, u64) {
        let s = self.engine.space_use();
        let free = s.free().saturating_sub(self.reserved_bytes());
        (free, self.reserve(&s))
    }

    /// Space of the holes `fallocate` reserved.
    fn reserved_bytes(&self) -> u64 {
        self.reserved_blocks.load(Ordering::Relaxed) * RESERVED_BLOCK_COST
    }

    /// Refuses growth when free space runs below the reserve (after trying to reclaim deleted space).
    fn check_space(&self, extra: u64) -> Result<()> {
        let (free, reserve) = self.free_and_reserve();
        if free >= reserve + extra {
            return Ok(());
        }
        // Deletes free space only once they reach the leaves and a checkpoint completes: try that
        // when something was deleted since the last attempt, when the last attempt freed something,
        // or after a while.
        let mut last = self.last_reclaim.lock();
        let deleted = self.deletions.load(Ordering::Relaxed);
        let (when, seen, gained) = *last;
        if deleted != seen
            || gained > 0
            || when.is_none_or(|t| t.elapsed() > Duration::from_secs(2))
        {
            // The engine's target is unallocated space: what is free plus the reservations.
            let target = 2 * reserve + extra + self.reserved_bytes();
            let _ = self.engine.reclaim_space(target);
            let (after, reserve) = self.free_and_reserve();
            *last = (Some(Instant::now()), deleted, after.saturating_sub(free));
            drop(last);
            if after >= reserve + extra {
                return Ok(());
            }
        }
        Err(Errno::ENOSPC)
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
        let cached = {
            let t = self.table.lock();
            t.child(parent, name).and_then(|ino| t.inode(ino))
        };
        if let Some(shared) = cached {
            let inode = shared.lock().clone();
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
        for op in &mut b.ops {
            if let Op::Put { key: k, value } = op {
                if *k == key {
                    let before = i64::from_le_bytes(value[..8].try_into().expect("a delta"));
                    *value = (before + delta).to_le_bytes().to_vec();
                    return;
                }
            }
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

    fn max_key(&self) -> usize {
        self.engine.format().max_key_len
    }

    fn touch_dir(dir: &mut Inode, now: Time) {
        dir.mtime = now;
        dir.ctime = now;
    }

    fn check_key_len(&self, key: &[u8]) -> Result<()> {
        // Data keys add a tag, a terminator and a block number to the path key.
        if key.len() + 10 > self.max_key() {
            return Err(Errno::ENAMETOOLONG);
        }
        Ok(())
    }

    /// Longest key in `[lo, hi)` (0 when the range is empty).
    fn longest_key_in(&self, lo: &[u8], hi: &[u8]) -> Result<usize> {
        let mut longest = 0;
        self.engine
            .scan(Bound::Included(lo), Bound::Excluded(hi), |k, _| {
                longest = longest.max(k.len());
                true
            })?;
        Ok(longest)
    }

    /// Checks that moving the entry `found` to the path key `to` keeps every key it moves within
    /// the engine's limit: its own name, its extended attributes and, for a directory, every
    /// descendant's metadata (with room for data keys, as at creation) and extended attributes.
    /// `ENAMETOOLONG` otherwise, before anything is changed. The scan costs what the move costs.
    fn check_move_fits(&self, found: &Found, to: &[u8]) -> Result<()> {
        self.check_key_len(to)?;
        let from = &found.key;
        if found.redirect || to.len() <= from.len() {
            // A redirect moves alone; shorter or equal prefixes only shorten keys.
            return Ok(());
        }
        let growth = to.len() - from.len();
        let limit = self.max_key();
        let x = keys::xattr_prefix(from);
        let mut longest = self.longest_key_in(&x, &amaranth_engine::prefix_end(&x, limit))?;
        if found.inode.kind == Kind::Dir {
            let [m, _, x] = keys::subtree_prefixes(from);
            // Data keys are 9 bytes longer than their file's metadata key.
            let meta = self.longest_key_in(&m, &amaranth_engine::prefix_end(&m, limit))?;
            if meta > 0 {
                longest = longest.max(meta + 9);
            }
            longest =
                longest.max(self.longest_key_in(&x, &amaranth_engine::prefix_end(&x, limit))?);
        }
        if longest + growth > limit {
            return Err(Errno::ENAMETOOLONG);
        }
        Ok(())
    }

    // ----- lookup and attributes ------------------------------------------------------------

    /// Looks up `name` in `parent`, counting one kernel lookup.
    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Inode> {
        let _ns = self.ns.read();
        if name == b"." {
            return self.lookup_by_number(parent);
        }
        if name == b".." {
            let p = self
                .table
                .lock()
                .get(parent)
                .map(|n| n.parent)
                .ok_or(Errno::ENOENT)?;
            return self.lookup_ino(if p == 0 { ROOT_INO } else { p });
        }
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        let (dkey, _) = self.dir(parent)?;
        let found = self.find(parent, &dkey, name)?.ok_or(Errno::ENOENT)?;
        let shared = self.table.lock().remember(parent, name, found.inode, true);
        let out = shared.lock().clone();
        Ok(out)
    }

    fn lookup_ino(&self, ino: u64) -> Result<Inode> {
        let shared = {
            let mut t = self.table.lock();
            let n = t.get_mut(ino).ok_or(Errno::ENOENT)?;
            n.lookups += 1;
            n.inode.clone()
        };
        let out = shared.lock().clone();
        Ok(out)
    }

    /// Attributes of `ino`.
    pub fn getattr(&self, ino: u64) -> Result<Inode> {
        let inode = self.node_inode(ino)?;
        let out = inode.lock().clone();
        Ok(out)
    }

    /// Changes attributes (mode, owner, size, times).
    pub fn setattr(&self, ino: u64, set: &SetAttr, ctx: Ctx) -> Result<Inode> {
        let _ns = self.ns.read();
        let shared = self.node_inode(ino)?;
        let mut inode = shared.lock();
        let (fk, meta) = self.locate(ino)?;
        let mut next = inode.clone();
        let now = Time::now();
        let mut b = Batch::new();
        if let Some(size) = set.size {
            match next.kind {
                Kind::File => {}
                Kind::Dir => return Err(Errno::EISDIR),
                _ => return Err(Errno::EINVAL),
            }
            if size > MAX_FILE_SIZE {
                return Err(Errno::EFBIG);
            }
            if size < next.size {
                self.truncate_ops(&mut b, &fk, size);
                let released = space::account_truncate(&self.engine, &fk, &mut next, size)?;
                self.count_reserved(&mut b, -(released as i64));
            }
            next.size = size;
            next.mtime = now;
            if ctx.uid != 0 {
                Self::kill_suidgid(&mut next);
            }
        }
        if let Some(mode) = set.mode {
            next.perm = (mode & 0o7777) as u16;
            // A stored access ACL follows the mode (its owner, group or mask, other entries).
            let acl_key = keys::xattr_key(&fk, acl::ACCESS);
            if let Some(old) = self.engine.get(&acl_key)? {
                b.put(acl_key, acl::chmod(&old, next.perm)?);
            }
        }
        if set.uid.is_some() || set.gid.is_some() {
            let changes =
                set.uid.is_some_and(|u| u != next.uid) || set.gid.is_some_and(|g| g != next.gid);
            if let Some(u) = set.uid {
                next.uid = u;
            }
            if let Some(g) = set.gid {
                next.gid = g;
            }
            if changes && next.kind != Kind::Dir && set.mode.is_none() {
                Self::kill_suidgid(&mut next);
            }
        }
        match set.atime {
            Some(SetTime::Now) => next.atime = now,
            Some(SetTime::At(t)) => next.atime = t,
            None => {}
        }
        match set.mtime {
            Some(SetTime::Now) => next.mtime = now,
            Some(SetTime::At(t)) => next.mtime = t,
            None => {}
        }
        if let Some(t) = set.crtime {
            next.crtime = t;
        }
        next.ctime = set.ctime.unwrap_or(now);
        b.put(meta, next.encode());
        if set.size.is_some_and(|s| s > inode.size) {
            self.check_space(0)?;
        }
        self.commit(&mut b)?;
        *inode = next.clone();
        Ok(next)
    }

    fn kill_suidgid(i: &mut Inode) {
        i.perm &= !(libc::S_ISUID as u16);
        if i.perm & libc::S_IXGRP as u16 != 0 {
            i.perm &= !(libc::S_ISGID as u16);
        }
    }

    fn truncate_ops(&self, b: &mut Batch, fk: &[u8], size: u64) {
        let keep = size.div_ceil(BLOCK);
        let d = keys::data_prefix(fk);
        b.range_delete(
            keys::data_key(fk, keep),
            amaranth_engine::prefix_end(&d, self.max_key()),
        );
        if !size.is_multiple_of(BLOCK) {
            b.upsert(
                keys::data_key(fk, size / BLOCK),
                Patch::Truncate {
                    len: (size % BLOCK) as u32,
                },
            );
        }
    }

    // ----- creating names --------------------------------------------------------------------

    /// Creates a node of `kind` (file, fifo, socket, device, directory, symlink).
    fn make(&self, parent: u64, name: &[u8], new: NewNode<'_>, ctx: Ctx) -> Result<Inode> {
        check_name(name)?;
        let _ns = self.ns.write();
        let (dkey, dir_shared) = self.dir(parent)?;
        let key = keys::child_key(&dkey, name);
        self.check_key_len(&key)?;
        if self.find(parent, &dkey, name)?.is_some() {
            return Err(Errno::EEXIST);
        }
        self.check_space(0)?;
        let mut dir = dir_shared.lock();
        let mut b = Batch::new();
        let evicted = self.evict_parked_ops(&mut b, &key, false);
        let ino = self.alloc_ino(&mut b);
        let NewNode {
            kind,
            mode,
            rdev,
            target,
        } = new;
        let mut perm = (mode & 0o7777) as u16;
        let mut gid = ctx.gid;
        if dir.perm & libc::S_ISGID as u16 != 0 {
            gid = dir.gid;
            if kind == Kind::Dir {
                perm |= libc::S_ISGID as u16;
            }
        }
        let mut inode = Inode::new(ino, kind, perm, ctx.uid, gid);
        inode.rdev = rdev;
        if kind == Kind::Symlink {
            inode.target = target.to_vec();
            inode.size = target.len() as u64;
        }
        let mut next_dir = dir.clone();
        Self::touch_dir(&mut next_dir, inode.ctime);
        if kind == Kind::Dir {
            next_dir.nlink += 1;
        }
        b.put(keys::meta_key(&key), inode.encode());
        b.put(keys::meta_key(&dkey), next_dir.encode());
        handles::index_at(&mut b, ino, parent, name);
        self.count_inodes(&mut b, 1);
        self.commit(&mut b)?;
        self.note_evicted(&evicted);
        *dir = next_dir;
        drop(dir);
        self.table
            .lock()
            .remember(parent, name, inode.clone(), true);
        Ok(inode)
    }

    /// Creates a special file or a regular file without opening it.
    pub fn mknod(&self, parent: u64, name: &[u8], mode: u32, rdev: u32, ctx: Ctx) -> Result<Inode> {
        let kind = Kind::from_mode(mode).unwrap_or(Kind::File);
        if kind == Kind::Dir || kind == Kind::Symlink {
            return Err(Errno::EINVAL);
        }
        self.make(
            parent,
            name,
            NewNode {
                kind,
                mode,
                rdev,
                target: &[],
            },
            ctx,
        )
    }

    /// Creates a directory.
    pub fn mkdir(&self, parent: u64, name: &[u8], mode: u32, ctx: Ctx) -> Result<Inode> {
        self.make(
            parent,
            name,
            NewNode {
                kind: Kind::Dir,
                mode,
                rdev: 0,
                target: &[],
            },
            ctx,
        )
    }

    /// Creates a symbolic link.
    pub fn symlink(&self, parent: u64, name: &[u8], target: &[u8], ctx: Ctx) -> Result<Inode> {
        if target.is_empty() {
            return Err(Errno::ENOENT);
        }
        if target.len() > SYMLINK_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        self.make(
            parent,
            name,
            NewNode {
                kind: Kind::Symlink,
                mode: 0o777,
                rdev: 0,
                target,
            },
            ctx,
        )
    }

    /// Creates and opens a regular file. Returns its attributes and a file handle.
    pub fn create(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        flags: i32,
        ctx: Ctx,
    ) -> Result<(Inode, u64)> {
        let inode = self.make(
            parent,
            name,
            NewNode {
                kind: Kind::File,
                mode,
                rdev: 0,
                target: &[],
            },
            ctx,
        )?;
        let fh = self.open_handle(inode.ino, flags)?;
        Ok((inode, fh))
    }

    /// The target of a symbolic link.
    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        let i = self.getattr(ino)?;
        if i.kind != Kind::Symlink {
            return Err(Errno::EINVAL);
        }
        Ok(i.target)
    }

    // ----- removing names -----------------------------------------------------------------

    /// Removes the name of a non-directory.
    pub fn unlink(&self, parent: u64, name: &[u8]) -> Result<()> {
        check_name(name)?;
        let _ns = self.ns.write();
        let (dkey, dir_shared) = self.dir(parent)?;
        let found = self.find(parent, &dkey, name)?.ok_or(Errno::ENOENT)?;
        if found.inode.kind == Kind::Dir {
            return Err(Errno::EISDIR);
        }
        let mut dir = dir_shared.lock();
        let mut b = Batch::new();
        let now = Time::now();
        let after = self.remove_file_ops(&mut b, &found, now, false)?;
        let mut next_dir = dir.clone();
        Self::touch_dir(&mut next_dir, now);
        b.put(keys::meta_key(&dkey), next_dir.encode());
        self.commit(&mut b)?;
        *dir = next_dir;
        drop(dir);
        self.apply_removal(&found, after);
        Ok(())
    }

    /// Operations removing the name `found` of a non-directory. Returns the inode's state after.
    /// A file the kernel still holds keeps existing, with link count 0, until the kernel forgets
    /// it (`fs/orphans.rs`): a regular file is parked at its path (nothing moves) or, when
    /// `reused` (a rename puts another file at that path in the same batch), moved to its home.
    fn remove_file_ops(
        &self,
        b: &mut Batch,
        found: &Found,
        now: Time,
        reused: bool,
    ) -> Result<Inode> {
        let ino = found.inode.ino;
        let known = self.kernel_knows(ino);
        let mut after = found.inode.clone();
        after.nlink = after.nlink.saturating_sub(1);
        after.ctime = now;
        if found.redirect {
            b.delete(keys::meta_key(&found.key));
            let home = keys::home_key(ino);
            if after.nlink == 0 && !known {
                self.delete_file_ops(b, &home, &found.inode);
                handles::index_drop(b, ino);
                self.count_inodes(b, -1);
                after.homed = false;
            } else {
                b.put(keys::meta_key(&home), after.encode());
            }
        } else if known && found.inode.kind == Kind::File {
            after.homed = true;
            if reused {
                self.home_ops(b, &found.key, ino);
            } else {
                after.target = found.key.clone();
            }
            b.delete(keys::meta_key(&found.key));
            b.put(keys::meta_key(&keys::home_key(ino)), after.encode());
            handles::index_home(b, ino);
        } else {
            self.delete_file_ops(b, &found.key, &found.inode);
            handles::index_drop(b, ino);
            self.count_inodes(b, -1);
        }
        Ok(after)
    }

    /// Operations moving a file's data and xattrs from its path to its home.
    fn home_ops(&self, b: &mut Batch, path: &[u8], ino: u64) {
        let home = keys::home_key(ino);
        b.move_prefix(keys::data_prefix(path), keys::data_prefix(&home));
        b.move_prefix(keys::xattr_prefix(path), keys::xattr_prefix(&home));
    }

    /// Updates the table after a name of `found` was removed.
    fn apply_removal(&self, found: &Found, after: Inode) {
        let ino = found.inode.ino;
        let Some(shared) = self.table.lock().inode(ino) else {
            return;
        };
        let homed = after.homed;
        if let Some(p) = orphans::parked_path(&after) {
            self.note_parked(ino, p.to_vec());
        }
        *shared.lock() = after;
        let mut t = self.table.lock();
        if homed {
            t.set_homed(ino);
        } else {
            t.set_deleted(ino);
        }
    }

    /// Removes an empty directory.
    pub fn rmdir(&self, parent: u64, name: &[u8]) -> Result<()> {
        check_name(name)?;
        if name == b"." {
            return Err(Errno::EINVAL);
        }
        let _ns = self.ns.write();
        let (dkey, dir_shared) = self.dir(parent)?;
        let found = self.find(parent, &dkey, name)?.ok_or(Errno::ENOENT)?;
        if found.inode.kind != Kind::Dir {
            return Err(Errno::ENOTDIR);
        }
        if !self.dir_is_empty(&found.key)? {
            return Err(Errno::ENOTEMPTY);
        }
        let mut dir = dir_shared.lock();
        let now = Time::now();
        let mut b = Batch::new();
        // Files parked below stay where they are (nothing moves at an `rm -rf`, whose rmdirs
        // often come before the kernel's FORGETs of the files): a name made at a parked path
        // later evicts exactly that file, a directory renamed to this path its whole subtree.
        b.delete(keys::meta_key(&found.key));
        handles::index_drop(&mut b, found.inode.ino);
        let x = keys::xattr_prefix(&found.key);
        b.range_delete(x.clone(), amaranth_engine::prefix_end(&x, self.max_key()));
        let mut next_dir = dir.clone();
        Self::touch_dir(&mut next_dir, now);
        next_dir.nlink = next_dir.nlink.saturating_sub(1);
        b.put(keys::meta_key(&dkey), next_dir.encode());
        self.count_inodes(&mut b, -1);
        self.commit(&mut b)?;
        *dir = next_dir;
        drop(dir);
        let mut after = found.inode.clone();
        after.nlink = 0;
        after.ctime = now;
        self.apply_removal(&found, after);
        Ok(())
    }

    fn dir_is_empty(&self, dir_key: &[u8]) -> Result<bool> {
        let p = keys::meta_key(&keys::children_prefix(dir_key));
        let end = amaranth_engine::prefix_end(&p, self.max_key());
        let mut empty = true;
        self.engine
            .scan(Bound::Included(&p), Bound::Excluded(&end), |_, _| {
                empty = false;
                false
            })?;
        Ok(empty)
    }

    // ----- rename and link ------------------------------------------------------------------

    /// Renames `parent/name` to `new_parent/new_name` (`flags`: [`RENAME_NOREPLACE`],
    /// [`RENAME_EXCHANGE`]). Atomic: one batch.
    pub fn rename(
        &self,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        flags: u32,
    ) -> Result<()> {
        check_name(name)?;
        check_name(new_name)?;
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE) != 0
            || flags & RENAME_NOREPLACE != 0 && flags & RENAME_EXCHANGE != 0
        {
            return Err(Errno::EINVAL);
        }
        let _ns = self.ns.write();
        let (src_dkey, src_dir) = self.dir(parent)?;
        let (dst_dkey, dst_dir) = self.dir(new_parent)?;
        let src = self.find(parent, &src_dkey, name)?.ok_or(Errno::ENOENT)?;
        let dst = self.find(new_parent, &dst_dkey, new_name)?;
        let dst_key = keys::child_key(&dst_dkey, new_name);
        self.check_key_len(&dst_key)?;
        if parent == new_parent && name == new_name {
            return Ok(());
        }
        let exchange = flags & RENAME_EXCHANGE != 0;
        if flags & RENAME_NOREPLACE != 0 && dst.is_some() {
            return Err(Errno::EEXIST);
        }
        if exchange && dst.is_none() {
            return Err(Errno::ENOENT);
        }
        // A directory cannot move into itself or its own subtree.
        {
            let t = self.table.lock();
            if src.inode.kind == Kind::Dir && t.is_ancestor(src.inode.ino, new_parent) {
                return Err(Errno::EINVAL);
            }
            if exchange {
                if let Some(d) = &dst {
                    if d.inode.kind == Kind::Dir && t.is_ancestor(d.inode.ino, parent) {
                        return Err(Errno::EINVAL);
                    }
                }
            }
        }
        if let Some(d) = &dst {
            if d.inode.ino == src.inode.ino {
                // Two names of one file: nothing to do (POSIX).
                return Ok(());
            }
            if !exchange {
                match (src.inode.kind == Kind::Dir, d.inode.kind == Kind::Dir) {
                    (true, false) => return Err(Errno::ENOTDIR),
                    (false, true) => return Err(Errno::EISDIR),
                    (true, true) if !self.dir_is_empty(&d.key)? => return Err(Errno::ENOTEMPTY),
                    _ => {}
                }
            }
        }
        // Every moved key must fit (a deep subtree under a longer path may not).
        if let Some(d) = dst.as_ref().filter(|_| exchange) {
            self.check_move_fits(d, &src.key)?;
        }
        self.check_move_fits(&src, &dst_key)?;
        let now = Time::now();
        let mut b = Batch::new();
        // Parent directories (one or two), locked in inode order.
        let same_parent = parent == new_parent;
        let (mut g1, mut g2) = if same_parent {
            (src_dir.lock(), None)
        } else if parent < new_parent {
            let a = src_dir.lock();
            (a, Some(dst_dir.lock()))
        } else {
            let bg = dst_dir.lock();
            (src_dir.lock(), Some(bg))
        };
        let mut sdir = g1.clone();
        let mut ddir = g2.as_ref().map(|g| (**g).clone());
        // Files parked at the destination, or below either path when a directory moves (its
        // subtree's keys move, and a directory may land where a removed one left parked files),
        // go to their homes first (`fs/orphans.rs`).
        let mut evicted = self.evict_parked_ops(&mut b, &dst_key, false);
        let dirs_move = std::iter::once(&src)
            .chain(dst.as_ref())
            .any(|f| f.inode.kind == Kind::Dir);
        if dirs_move {
            for k in [&src.key, &dst_key] {
                evicted.extend(self.evict_parked_ops(&mut b, k, true));
            }
        }
        Self::touch_dir(&mut sdir, now);
        if let Some(d) = ddir.as_mut() {
            Self::touch_dir(d, now);
        }
        let mut replaced: Option<Inode> = None;
        if exchange {
            let d = dst.as_ref().expect("checked");
            // Through a place whose keys are shorter than any path's: no key of either side is
            // ever longer than it is before or after the exchange.
            let tmp = keys::swap_key();
            self.move_entry_ops(&mut b, &src, &tmp);
            self.move_entry_ops(&mut b, d, &src.key);
            let src_at_tmp = Found {
                key: tmp,
                inode: src.inode.clone(),
                redirect: src.redirect,
            };
            self.move_entry_ops(&mut b, &src_at_tmp, &d.key);
            if !d.redirect {
                handles::index_at(&mut b, d.inode.ino, parent, name);
            }
            if !src.redirect {
                handles::index_at(&mut b, src.inode.ino, new_parent, new_name);
            }
            if !same_parent {
                let (sd, dd) = (src.inode.kind == Kind::Dir, d.inode.kind == Kind::Dir);
                let dd_ref = ddir.as_mut().expect("two parents");
                if sd && !dd {
                    sdir.nlink -= 1;
                    dd_ref.nlink += 1;
                } else if dd && !sd {
                    sdir.nlink += 1;
                    dd_ref.nlink -= 1;
                }
            }
        } else {
            if let Some(d) = &dst {
                if d.inode.kind == Kind::Dir {
                    b.delete(keys::meta_key(&d.key));
                    handles::index_drop(&mut b, d.inode.ino);
                    let x = keys::xattr_prefix(&d.key);
                    b.range_delete(x.clone(), amaranth_engine::prefix_end(&x, self.max_key()));
                    self.count_inodes(&mut b, -1);
                    let target_dir = ddir.as_mut().unwrap_or(&mut sdir);
                    target_dir.nlink -= 1;
                    let mut gone = d.inode.clone();
                    gone.nlink = 0;
                    replaced = Some(gone);
                } else {
                    replaced = Some(self.remove_file_ops(&mut b, d, now, true)?);
                }
            }
            self.move_entry_ops(&mut b, &src, &dst_key);
            if !src.redirect {
                handles::index_at(&mut b, src.inode.ino, new_parent, new_name);
            }
            if src.inode.kind == Kind::Dir && !same_parent {
                sdir.nlink -= 1;
                ddir.as_mut().expect("two parents").nlink += 1;
            }
        }
        b.put(keys::meta_key(&src_dkey), sdir.encode());
        if let Some(d) = &ddir {
            b.put(keys::meta_key(&dst_dkey), d.encode());
        }
        self.check_space(0)?;
        self.commit(&mut b)?;
        self.note_evicted(&evicted);
        *g1 = sdir;
        if let (Some(g), Some(d)) = (g2.as_mut(), ddir) {
            **g = d;
        }
        drop(g1);
        drop(g2);
        // The table follows (attributes first: an inode lock is never taken under the table lock).
        let src_ino = src.inode.ino;
        let src_shared = self.table.lock().inode(src_ino);
        if let Some(shared) = src_shared {
            shared.lock().ctime = now;
        }
        if let Some(d) = &dst {
            let dst_shared = self.table.lock().inode(d.inode.ino);
            if let Some(shared) = dst_shared {
                let mut i = shared.lock();
                match &replaced {
                    Some(r) if !exchange => *i = r.clone(),
                    _ => i.ctime = now,
                }
            }
        }
        let mut t = self.table.lock();
        if let Some(d) = &dst {
            if exchange {
                t.detach(d.inode.ino);
                t.detach(src_ino);
                t.attach(d.inode.ino, parent, name);
            } else if replaced.as_ref().is_some_and(|r| r.homed) {
                t.set_homed(d.inode.ino);
            } else {
                t.set_deleted(d.inode.ino);
            }
        }
        if exchange {
            t.attach(src_ino, new_parent, new_name);
        } else {
            t.rename(src_ino, new_parent, new_name);
        }
        Ok(())
    }

    /// Operations moving the entry `found` (metadata, and for path-keyed inodes their data, xattrs
    /// and subtree) to the path key `to`.
    fn move_entry_ops(&self, b: &mut Batch, found: &Found, to: &[u8]) {
        let from = &found.key;
        b.delete(keys::meta_key(from));
        if found.redirect {
            b.put(keys::meta_key(to), Meta::redirect(found.inode.ino));
            return;
        }
        let mut moved = found.inode.clone();
        moved.ctime = Time::now();
        b.put(keys::meta_key(to), moved.encode());
        b.move_prefix(keys::xattr_prefix(from), keys::xattr_prefix(to));
        match found.inode.kind {
            Kind::Dir => {
                for (f, t) in keys::subtree_prefixes(from)
                    .into_iter()
                    .zip(keys::subtree_prefixes(to))
                {
                    b.move_prefix(f, t);
                }
            }
            Kind::File => {
                b.move_prefix(keys::data_prefix(from), keys::data_prefix(to));
            }
            _ => {}
        }
    }

    /// Adds the name `new_parent/new_name` to inode `ino` (a hard link).
    pub fn link(&self, ino: u64, new_parent: u64, new_name: &[u8]) -> Result<Inode> {
        check_name(new_name)?;
        let _ns = self.ns.write();
        let (dkey, dir_shared) = self.dir(new_parent)?;
        let shared = self.node_inode(ino)?;
        if shared.lock().kind == Kind::Dir {
            return Err(Errno::EPERM);
        }
        if self.find(new_parent, &dkey, new_name)?.is_some() {
            return Err(Errno::EEXIST);
        }
        let new_key = keys::child_key(&dkey, new_name);
        self.check_key_len(&new_key)?;
        self.check_space(0)?;
        let path = self.file_key(ino)?;
        let mut dir = dir_shared.lock();
        let mut inode = shared.lock();
        if inode.nlink == 0 {
            // Unlinked while in use: it cannot get a name again (as `linkat` on Linux).
            return Err(Errno::ENOENT);
        }
        if inode.nlink >= u32::MAX - 1 {
            return Err(Errno::EMLINK);
        }
        let now = Time::now();
        let mut next = inode.clone();
        next.nlink += 1;
        next.ctime = now;
        let mut b = Batch::new();
        let evicted = self.evict_parked_ops(&mut b, &new_key, false);
        let home = keys::home_key(ino);
        if !inode.homed {
            // The first extra name: the file moves to its inode-keyed home and its path becomes a
            // redirect, like every later name.
            next.homed = true;
            self.home_ops(&mut b, &path, ino);
            b.put(keys::meta_key(&path), Meta::redirect(ino));
            handles::index_home(&mut b, ino);
        }
        b.put(keys::meta_key(&home), next.encode());
        b.put(keys::meta_key(&new_key), Meta::redirect(ino));
        let mut next_dir = dir.clone();
        Self::touch_dir(&mut next_dir, now);
        b.put(keys::meta_key(&dkey), next_dir.encode());
        self.commit(&mut b)?;
        self.note_evicted(&evicted);
        let was_homed = inode.homed;
        *inode = next.clone();
        *dir = next_dir;
        drop(inode);
        drop(dir);
        let mut t = self.table.lock();
        if !was_homed {
            t.set_homed(ino);
        }
        if let Some(n) = t.get_mut(ino) {
            n.lookups += 1;
        }
        Ok(next)
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

    /// Reads up to `size` bytes at `offset` (holes read as zeros).
    pub fn read(&self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        let _ns = self.ns.read();
        let shared = self.node_inode(ino)?;
        let (fk, file_size, kind) = {
            let i = shared.lock();
            (self.file_key(ino)?, i.size, i.kind)
        };
        if kind == Kind::Dir {
            return Err(Errno::EISDIR);
        }
        if offset >= file_size || size == 0 {
            return Ok(Vec::new());
        }
        let end = file_size.min(offset + size as u64);
        let buf = self.read_bytes(&fk, offset, end)?;
        self.counters
            .bytes_read
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        self.touch_atime(ino, &shared);
        Ok(buf)
    }

    /// The bytes `[offset, end)` of the file at `fk` (holes and missing tails read as zeros).
    fn read_bytes(&self, fk: &[u8], offset: u64, end: u64) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; (end - offset) as usize];
        if end == offset {
            return Ok(buf);
        }
        let prefix_len = keys::data_prefix(fk).len();
        let lo = keys::data_key(fk, offset / BLOCK);
        let hi = keys::data_key(fk, (end - 1) / BLOCK + 1);
        self.engine
            .scan(Bound::Included(&lo), Bound::Excluded(&hi), |k, v| {
                if let Some(blk) = keys::block_of(k, prefix_len) {
                    let start = blk * BLOCK;
                    let (a, z) = (start.max(offset), (start + v.len() as u64).min(end));
                    if a < z {
                        buf[(a - offset) as usize..(z - offset) as usize]
                            .copy_from_slice(&v[(a - start) as usize..(z - start) as usize]);
                    }
                }
                true
            })?;
        Ok(buf)
    }

    /// Writes `data` at `offset` (at the end for `O_APPEND` handles). `kill_suidgid`: the writer
    /// is not privileged, so set-id bits are cleared. Returns the bytes written.
    pub fn write(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        data: &[u8],
        kill_suidgid: bool,
    ) -> Result<usize> {
        let append = self
            .files
            .lock()
            .get(&fh)
            .is_some_and(|h| h.append && h.ino == ino);
        self.write_at(ino, offset, data, append, kill_suidgid)
    }

    /// Writes `data` at `offset`, or at the end of the file with `append` (the file's open flags
    /// say `O_APPEND`). `kill_suidgid`: the writer is not privileged, so set-id bits are cleared.
    /// Returns the bytes written.
    pub fn write_at(
        &self,
        ino: u64,
        offset: u64,
        data: &[u8],
        append: bool,
        kill_suidgid: bool,
    ) -> Result<usize> {
        let _ns = self.ns.read();
        let shared = self.node_inode(ino)?;
        let mut inode = shared.lock();
        let (fk, meta) = self.locate(ino)?;
        if inode.kind != Kind::File {
            return Err(Errno::EINVAL);
        }
        let offset = if append { inode.size } else { offset };
        let end = offset.checked_add(data.len() as u64).ok_or(Errno::EFBIG)?;
        if end > MAX_FILE_SIZE {
            return Err(Errno::EFBIG);
        }
        if data.is_empty() {
            return Ok(0);
        }
        let (first, last) = space::touched(offset, end);
        // Space `fallocate` reserved is this write's: it needs no more.
        if !inode.reservation_covers(first, last) {
            self.check_space(data.len() as u64)?;
        }
        let mut next = inode.clone();
        let now = Time::now();
        next.mtime = now;
        next.ctime = now;
        if kill_suidgid {
            Self::kill_suidgid(&mut next);
        }
        // One request, one batch: all of it or nothing after a crash.
        let mut b = Batch::new();
        let n = self.write_batch(&mut b, &fk, &meta, offset, data, &next)?;
        let filled = space::account_write(&self.engine, &fk, &mut next, offset, offset + n as u64)?;
        self.count_reserved(&mut b, -(filled as i64));
        next.size = inode.size.max(offset + n as u64);
        b.put(meta, next.encode());
        self.commit(&mut b)?;
        *inode = next;
        self.counters
            .bytes_written
            .fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }

    /// Adds to `b` the operations writing as much of `data` at `offset` as one batch can hold
    /// together with the inode `next`, and returns how many bytes that is: all of them, unless the
    /// batch would be larger than the largest log record (a small log, or a file key long enough
    /// that a request's block keys outweigh its data); then as many whole blocks as fit, at least
    /// one, and the caller returns a short count (the application writes the rest in its next
    /// call). `EFBIG` when not even one block fits.
    fn write_batch(
        &self,
        b: &mut Batch,
        fk: &[u8],
        meta: &[u8],
        offset: u64,
        data: &[u8],
        next: &Inode,
    ) -> Result<usize> {
        write_ops(b, fk, offset, data);
        let mut inode_op = Batch::new();
        inode_op.put(meta.to_vec(), next.encode());
        // The counter of reserved holes may go with it.
        inode_op.put(keys::system_key("reserved"), vec![0; 8]);
        let room = self
            .engine
            .max_batch_bytes()
            .saturating_sub(inode_op.log_bytes());
        if b.log_bytes() <= room {
            return Ok(data.len());
        }
        // The ops are one per block, in order: keep the longest prefix that fits.
        let mut used = Batch::new().log_bytes();
        let mut written = 0usize;
        let mut keep = 0;
        for op in &b.ops {
            used += op.log_bytes();
            if used > room {
                break;
            }
            written += match op {
                Op::Put { value, .. } => value.len(),
                Op::Upsert {
                    patch: Patch::Write { data, .. },
                    ..
                } => data.len(),
                _ => unreachable!("a write is puts and writing upserts"),
            };
            keep += 1;
        }
        if keep == 0 {
            return Err(Errno::EFBIG);
        }
        b.ops.truncate(keep);
        Ok(written)
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

    // ----- directories: opendir, readdir, releasedir are in fs/readdir.rs --------------------

    // ----- whole-file-system operations ---------------------------------------------------

    /// Space and inode counts: the data area's size, what is free once the dirty nodes are
    /// counted at the size they will be written (see DESIGN.md, Space), and what is available
    /// beyond the reserve.
    pub fn statfs(&self) -> StatFs {
        let blocks = self.engine.space_use().total / BLOCK;
        let (free, reserve) = self.free_and_reserve();
        let (bfree, bavail) = (free / BLOCK, free.saturating_sub(reserve) / BLOCK);
        let used = self.inodes_used.load(Ordering::Relaxed);
        StatFs {
            blocks,
            bfree,
            bavail,
            files: used + bavail,
            ffree: bavail,
            bsize: BLOCK as u32,
            namelen: NAME_MAX as u32,
        }
    }

    // ----- extended attributes ------------------------------------------------------------

    /// Sets an extended attribute (`flags`: `XATTR_CREATE`, `XATTR_REPLACE`).
    pub fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], flags: i32) -> Result<()> {
        if name.is_empty() || name.len() > NAME_MAX {
            return Err(Errno::ERANGE);
        }
        if value.len() > XATTR_VALUE_MAX {
            return Err(Errno::E2BIG);
        }
        let _ns = self.ns.read();
        let shared = self.node_inode(ino)?;
        let mut inode = shared.lock();
        let (fk, meta) = self.locate(ino)?;
        let key = keys::xattr_key(&fk, name);
        let exists = self.engine.get(&key)?.is_some();
        if flags & libc::XATTR_CREATE != 0 && exists {
            return Err(Errno::EEXIST);
        }
        if flags & libc::XATTR_REPLACE != 0 && !exists {
            return Err(Errno::ENODATA);
        }
        self.check_space(value.len() as u64)?;
        let mut next = inode.clone();
        next.ctime = Time::now();
        let mut b = Batch::new();
        if name == acl::ACCESS {
            let (perm, store) = acl::apply_access(value, next.perm)?;
            next.perm = perm;
            if store {
                b.put(key, value.to_vec());
            } else if exists {
                b.delete(key);
            }
        } else {
            b.put(key, value.to_vec());
        }
        b.put(meta, next.encode());
        self.commit(&mut b)?;
        *inode = next;
        Ok(())
    }

    /// The value of an extended attribute.
    pub fn getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        if name.is_empty() || name.len() > NAME_MAX {
            return Err(Errno::ERANGE);
        }
        let _ns = self.ns.read();
        let fk = self.file_key(ino)?;
        self.engine
            .get(&keys::xattr_key(&fk, name))?
            .ok_or(Errno::ENODATA)
    }

    /// Names of all extended attributes, each followed by a NUL byte.
    pub fn listxattr(&self, ino: u64) -> Result<Vec<u8>> {
        let _ns = self.ns.read();
        let fk = self.file_key(ino)?;
        let p = keys::xattr_prefix(&fk);
        let end = amaranth_engine::prefix_end(&p, self.max_key());
        let mut out = Vec::new();
        self.engine
            .scan(Bound::Included(&p), Bound::Excluded(&end), |k, _| {
                out.extend_from_slice(&k[p.len()..]);
                out.push(0);
                true
            })?;
        Ok(out)
    }

    /// Removes an extended attribute.
    pub fn removexattr(&self, ino: u64, name: &[u8]) -> Result<()> {
        let _ns = self.ns.read();
        let shared = self.node_inode(ino)?;
        let mut inode = shared.lock();
        let (fk, meta) = self.locate(ino)?;
        let key = keys::xattr_key(&fk, name);
        if self.engine.get(&key)?.is_none() {
            return Err(Errno::ENODATA);
        }
        let mut next = inode.clone();
        next.ctime = Time::now();
        let mut b = Batch::new();
        b.delete(key);
        b.put(meta, next.encode());
        self.commit(&mut b)?;
        *inode = next;
        Ok(())
    }

    // ----- space management ---------------------------------------------------------------

    /// `fallocate`: mode 0 and `KEEP_SIZE` reserve the space of the range's holes (writes inside
    /// it never fail for lack of space; `ENOSPC` and nothing changed if the space is not there);
    /// mode 0 also extends the size. `PUNCH_HOLE` makes the range's whole blocks holes and gives
    /// up its reservation; `ZERO_RANGE` does the same but keeps the range reserved.
    pub fn fallocate(&self, ino: u64, offset: u64, length: u64, mode: i32) -> Result<()> {
        if length == 0 {
            return Err(Errno::EINVAL);
        }
        let supported = FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE;
        if mode & !supported != 0
            || (mode & FALLOC_FL_PUNCH_HOLE != 0 && mode & FALLOC_FL_KEEP_SIZE == 0)
        {
            return Err(Errno::EOPNOTSUPP);
        }
        let end = offset.checked_add(length).ok_or(Errno::EFBIG)?;
        if end > MAX_FILE_SIZE {
            return Err(Errno::EFBIG);
        }
        let _ns = self.ns.read();
        let shared = self.node_inode(ino)?;
        let mut inode = shared.lock();
        let (fk, meta) = self.locate(ino)?;
        if inode.kind != Kind::File {
            return Err(if inode.kind == Kind::Dir {
                Errno::EISDIR
            } else {
                Errno::ENODEV
            });
        }
        let mut next = inode.clone();
        let mut b = Batch::new();
        let zeroing = mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE) != 0;
        let zend = end.min(next.size);
        let punch = if zeroing && offset < zend {
            let p = space::plan_punch(&self.engine, &fk, &next, offset, zend)?;
            zero_ops(&mut b, &fk, offset, zend, |blk| p.edges.contains(&blk));
            Some(p)
        } else {
            None
        };
        let want = space::touched(offset, end);
        if mode & FALLOC_FL_PUNCH_HOLE != 0 {
            let removed = punch.as_ref().map_or(0, |p| p.removed);
            let released = space::account_punch(&self.engine, &fk, &mut next, removed, want)?;
            self.count_reserved(&mut b, -(released as i64));
        } else {
            let added = space::account_reserve(&self.engine, &fk, &mut next, want, punch.as_ref())?;
            if let Some(p) = &punch {
                next.blocks -= p.removed;
            }
            if added > 0 {
                self.check_space(added * RESERVED_BLOCK_COST)?;
            }
            self.count_reserved(&mut b, added as i64);
            if mode & FALLOC_FL_KEEP_SIZE == 0 && end > next.size {
                next.size = end;
            }
        }
        let now = Time::now();
        if mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE) != 0 || next.size != inode.size {
            next.mtime = now;
            next.ctime = now;
        }
        b.put(meta, next.encode());
        self.commit(&mut b)?;
        *inode = next;
        Ok(())
    }

    /// `lseek` with `SEEK_DATA` or `SEEK_HOLE` (others are the kernel's business).
    pub fn lseek(&self, ino: u64, offset: u64, whence: i32) -> Result<u64> {
        let _ns = self.ns.read();
        let shared = self.node_inode(ino)?;
        let size = shared.lock().size;
        let fk = self.file_key(ino)?;
        if whence != libc::SEEK_DATA && whence != libc::SEEK_HOLE {
            return Err(Errno::EINVAL);
        }
        if offset >= size {
            return Err(Errno::ENXIO);
        }
        let prefix_len = keys::data_prefix(&fk).len();
        let lo = keys::data_key(&fk, offset / BLOCK);
        let hi = keys::data_key(&fk, (size - 1) / BLOCK + 1);
        if whence == libc::SEEK_DATA {
            let mut first = None;
            self.engine
                .scan(Bound::Included(&lo), Bound::Excluded(&hi), |k, _| {
                    first = keys::block_of(k, prefix_len);
                    false
                })?;
            match first {
                Some(b) => Ok((b * BLOCK).max(offset)),
                None => Err(Errno::ENXIO),
            }
        } else {
            let mut expect = offset / BLOCK;
            let mut hole = None;
            self.engine
                .scan(
                    Bound::Included(&lo),
                    Bound::Excluded(&hi),
                    |k, _| match keys::block_of(k, prefix_len) {
                        Some(b) if b == expect => {
                            expect += 1;
                            true
                        }
                        _ => {
                            hole = Some(expect);
                            false
                        }
                    },
                )?;
            let at = hole.unwrap_or(expect) * BLOCK;
            Ok(at.max(offset).min(size))
        }
    }

    /// Copies up to `len` bytes between files inside the daemon (no data crosses to the kernel)
    /// as one batch: after a crash, all of what the call reports copied or none of it. One call
    /// copies at most [`COPY_MAX`] bytes (less if a batch that large would not fit in one log
    /// record) and returns the count, short when `len` was larger: the caller (the kernel hands
    /// the count to the application, `cp` loops) asks again for the rest. Block-aligned copies
    /// move whole blocks and keep holes.
    pub fn copy_file_range(
        &self,
        ino_in: u64,
        off_in: u64,
        ino_out: u64,
        off_out: u64,
        len: u64,
    ) -> Result<u64> {
        let _ns = self.ns.read();
        let size_in = self.node_inode(ino_in)?.lock().size;
        let shared = self.node_inode(ino_out)?;
        if shared.lock().kind != Kind::File {
            return Err(Errno::EINVAL);
        }
        if off_in >= size_in || len == 0 {
            return Ok(0);
        }
        let src = self.file_key(ino_in)?;
        let dst = self.file_key(ino_out)?;
        let dst_meta = self.meta_of(ino_out)?;
        let len = len.min(size_in - off_in);
        if ino_in == ino_out && off_in < off_out.saturating_add(len) && off_out < off_in + len {
            return Err(Errno::EINVAL);
        }
        let len = len.min(self.copy_limit(&dst));
        let end = off_out.checked_add(len).ok_or(Errno::EFBIG)?;
        if end > MAX_FILE_SIZE {
            return Err(Errno::EFBIG);
        }
        self.check_space(len)?;
        let mut inode = shared.lock();
        let mut b = Batch::new();
        let mut done = 0;
        // The block copy and the write of the rest touch different blocks: count each against
        // the file as it is, then add up.
        let (mut by_copy, mut by_write) = (inode.clone(), inode.clone());
        let mut reserved_change = 0i64;
        if off_in.is_multiple_of(BLOCK) && off_out.is_multiple_of(BLOCK) {
            done = len / BLOCK * BLOCK;
            let (b_out, count) = (off_out / BLOCK, len / BLOCK);
            let put = self.copy_block_ops(&mut b, &src, off_in / BLOCK, &dst, b_out, count)?;
            let mut copied_in = vec![0u64; inode.reserved.len()];
            for to in &put {
                if let Some(i) = inode.reserved.iter().position(|r| r.covers(*to, to + 1)) {
                    copied_in[i] += 1;
                }
            }
            reserved_change += space::account_copy(
                &self.engine,
                &dst,
                &mut by_copy,
                (b_out, b_out + count),
                put.len() as u64,
                &copied_in,
            )?;
        }
        if done < len {
            let bytes = self.read_bytes(&src, off_in + done, off_in + len)?;
            write_ops(&mut b, &dst, off_out + done, &bytes);
            let filled =
                space::account_write(&self.engine, &dst, &mut by_write, off_out + done, end)?;
            reserved_change -= filled as i64;
        }
        self.count_reserved(&mut b, reserved_change);
        let mut next = inode.clone();
        space::add_counts(&mut next, &by_copy, &by_write);
        next.size = next.size.max(end);
        let now = Time::now();
        next.mtime = now;
        next.ctime = now;
        b.put(dst_meta, next.encode());
        self.commit(&mut b)?;
        *inode = next;
        Ok(len)
    }

    /// The most bytes one `copy_file_range` call copies into the file at `fk`: [`COPY_MAX`], or
    /// fewer when that many block writes (each a data key and up to a block) with the inode
    /// would not fit in one log record.
    fn copy_limit(&self, fk: &[u8]) -> u64 {
        let key = keys::data_key(fk, 0);
        let mut fixed = Batch::new();
        fixed.range_delete(key.clone(), key.clone());
        fixed.put(keys::meta_key(fk), vec![0; 256]);
        let mut one = Batch::new();
        one.upsert(
            key,
            Patch::Write {
                offset: 0,
                data: vec![0; BLOCK as usize],
            },
        );
        let per_block = (one.log_bytes() - Batch::new().log_bytes()) as u64;
        let room = self
            .engine
            .max_batch_bytes()
            .saturating_sub(fixed.log_bytes()) as u64;
        // An unaligned range touches up to two blocks more than its length in blocks.
        let blocks = (room / per_block).saturating_sub(2).max(1);
        (blocks * BLOCK).min(COPY_MAX)
    }

    /// Operations copying `count` whole blocks from block `b_in` of `src` to block `b_out` of
    /// `dst`: the destination's blocks are dropped and the source's existing ones put (holes stay
    /// holes). Returns the destination blocks put.
    fn copy_block_ops(
        &self,
        b: &mut Batch,
        src: &[u8],
        b_in: u64,
        dst: &[u8],
        b_out: u64,
        count: u64,
    ) -> Result<Vec<u64>> {
        let mut put = Vec::new();
        if count == 0 {
            return Ok(put);
        }
        let prefix_len = keys::data_prefix(src).len();
        b.range_delete(
            keys::data_key(dst, b_out),
            keys::data_key(dst, b_out + count),
        );
        let lo = keys::data_key(src, b_in);
        let hi = keys::data_key(src, b_in + count);
        self.engine
            .scan(Bound::Included(&lo), Bound::Excluded(&hi), |k, v| {
                if let Some(blk) = keys::block_of(k, prefix_len) {
                    b.put(keys::data_key(dst, blk - b_in + b_out), v.to_vec());
                    put.push(blk - b_in + b_out);
                }
                true
            })?;
        Ok(put)
    }
}

/// Operations writing `data` at `offset`: whole blocks as puts, partial blocks as upserts (no read).
pub fn write_ops(b: &mut Batch, fk: &[u8], offset: u64, data: &[u8]) {
    let mut pos = 0usize;
    while pos < data.len() {
        let abs = offset + pos as u64;
        let blk = abs / BLOCK;
        let in_blk = (abs % BLOCK) as usize;
        let n = (BLOCK as usize - in_blk).min(data.len() - pos);
        let key = keys::data_key(fk, blk);
        if in_blk == 0 && n == BLOCK as usize {
            b.ops.push(Op::Put {
                key,
                value: data[pos..pos + n].to_vec(),
            });
        } else {
            b.ops.push(Op::Upsert {
                key,
                patch: Patch::Write {
                    offset: in_blk as u32,
                    data: data[pos..pos + n].to_vec(),
                },
            });
        }
        pos += n;
    }
}

/// Operations zeroing `[start, end)`: whole blocks become holes, partial blocks get zeros (those
/// `exists` says are there: a hole needs none, and zeros would make it a block).
pub fn zero_ops(b: &mut Batch, fk: &[u8], start: u64, end: u64, exists: impl Fn(u64) -> bool) {
    let first_full = start.div_ceil(BLOCK);
    let last_full = end / BLOCK; // exclusive
    if first_full < last_full {
        b.range_delete(
            keys::data_key(fk, first_full),
            keys::data_key(fk, last_full),
        );
    }
    let mut zero_range = |a: u64, z: u64| {
        if a < z && exists(a / BLOCK) {
            b.ops.push(Op::Upsert {
                key: keys::data_key(fk, a / BLOCK),
                patch: Patch::Write {
                    offset: (a % BLOCK) as u32,
                    data: vec![0; (z - a) as usize],
                },
            });
        }
    };
    if first_full > last_full {
        // Inside one block.
        zero_range(start, end);
    } else {
        zero_range(start, (first_full * BLOCK).min(end));
        zero_range((last_full * BLOCK).max(start), end);
    }
}
