//! `amaranth clone SRC DST`: a directory tree, or a regular file, cloned under a new name on the
//! same file system in one batch (docs/SURGERY.md §5.4).
//!
//! Inode numbers must stay unique and every inode's record carries its number, so the metadata
//! under SRC is *copied*: one record per inode with a fresh number, and its inode-index entry
//! (O(inodes), small records). The bytes are *cloned*: the data (`d`) and extended-attribute
//! (`x`) subtree ranges of SRC become the same ranges under DST by the engine's range clone
//! (O(height) each; the two sides share nodes until either is written). The batch holds, in
//! order:
//! 1. the eviction of files parked at DST's path, below it and below SRC (`orphans.rs`): a path
//!    never holds two files' data, and data no name owns is not cloned;
//! 2. DST's record, its index entry and its parent's record;
//! 3. the range clones of SRC's own extended attributes and of its `d` and `x` subtrees (of a
//!    file: its data and extended attributes);
//! 4. each inode under SRC at its new key, with its new number and index entry; a name of a
//!    hard-linked file (a redirect to its home) becomes a file of its own whose data and extended
//!    attributes are cloned from the home: the clone keeps no links, as `cp -r`;
//! 5. for a caller other than root, the deletion of the file capabilities of the inodes it does
//!    not own (Q14, with the set-id bits);
//! 6. the inode counter.
//!
//! All or nothing: one log record. A batch larger than the largest record is refused with `EFBIG`
//! before anything changes (an atomic group would not hold more: the engine bounds a group by the
//! same size, `engine/atomic.rs`).
//!
//! Permissions (Q14). An ioctl is checked by nobody else, so the clone checks the mode bits as the
//! kernel's `default_permissions` does: write and search on DST's parent and search on each of
//! its ancestors; read on SRC and on every inode under it and search on every directory
//! (symbolic links need nothing). For a caller other than root, every inode it does not own
//! loses its set-user-id and set-group-id bits and its `security.capability`; root's clone keeps
//! them. Owners, modes and access and modification times are kept; the change and creation
//! times are the clone's. Reservations of `fallocate` are not (a clone is a copy, and `cp` does
//! not keep them either).
//!
//! Locking: the namespace lock exclusive from the first lookup to the commit, as a rename: no
//! name changes meanwhile, nor writes or attribute changes (they hold it shared), so the metadata
//! copied and the data cloned are one state. DST's parent's attribute lock from the check that
//! the name is free until its new record is in memory.

use std::collections::{HashMap, HashSet};
use std::ops::Bound;
use std::time::{Duration, Instant};

use amaranth_engine::Batch;

use super::{check_name, handles, Found, Fs, INO_BATCH};
use crate::error::{Errno, Result};
use crate::inode::{Inode, Kind, Meta, Time};
use crate::keys;
use crate::table::ROOT_INO;

/// The extended attribute holding a file's capabilities.
const CAPABILITY: &[u8] = b"security.capability";
/// The set-user-id and set-group-id bits.
const SET_ID: u16 = (libc::S_ISUID | libc::S_ISGID) as u16;
/// Permission bits asked for.
const READ: u16 = 4;
const WRITE: u16 = 2;
const SEARCH: u16 = 1;

/// Who asks for a clone (an ioctl: the kernel checked only that the caller could open SRC).
#[derive(Clone, Debug, Default)]
pub struct Caller {
    /// User id (0: root, who may read everything and whose clones keep every bit).
    pub uid: u32,
    /// Primary group.
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

impl Caller {
    /// Root.
    pub fn root() -> Caller {
        Caller::default()
    }

    fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// Whether the mode bits of `i` give the caller every bit of `want` (4 read, 2 write, 1
    /// search or execute), as the kernel checks them: root may do anything but execute a file
    /// nobody may execute.
    pub fn may(&self, i: &Inode, want: u16) -> bool {
        if self.is_root() {
            return want & 1 == 0 || i.kind == Kind::Dir || i.perm & 0o111 != 0;
        }
        let bits = if self.uid == i.uid {
            i.perm >> 6
        } else if self.gid == i.gid || self.groups.contains(&i.gid) {
            i.perm >> 3
        } else {
            i.perm
        } & 7;
        want & !bits == 0
    }
}

/// What a clone made, and what it took.
#[derive(Clone, Debug)]
pub struct Cloned {
    /// The new directory (or file), DST.
    pub inode: Inode,
    /// Inodes made (DST and everything under it).
    pub inodes: u64,
    /// Names of hard-linked files under SRC that became files of their own.
    pub unlinked: u64,
    /// Reading SRC's metadata and building the batch (under the namespace lock).
    pub prepare: Duration,
    /// Logging and applying the batch: the metadata records and the range clones.
    pub commit: Duration,
    /// Bytes of the batch's log record.
    pub batch_bytes: usize,
}

/// One name under SRC, as the clone writes it.
struct Entry {
    /// Its path key relative to SRC's subtree prefix (the same under DST's).
    rel: Vec<u8>,
    /// Its inode (a hard-linked file's, read from its home).
    inode: Inode,
    /// Its directory: 0 for SRC itself, else the index of the directory's entry plus one.
    parent: u64,
    /// Its name.
    name: Vec<u8>,
    /// The home its data and extended attributes come from (a name of a hard-linked file).
    home: Option<u64>,
}

impl Fs {
    /// Clones the directory tree or regular file `src` to `name` in directory `parent` (which
    /// must not hold it yet), as one batch: the new tree holds what `src` holds now, and the two
    /// share their data until either is written. For `who` (checked by mode bits; see the
    /// module). Errors change nothing: `EEXIST` (the name is taken), `EINVAL` (DST would be inside
    /// SRC, or SRC is neither a directory nor a regular file), `EACCES`, `ENAMETOOLONG` (a key
    /// under DST would be too long), `EFBIG` (more metadata than one log record holds),
    /// `ENOSPC`, `EROFS`, `ENOENT` (an inode the daemon does not hold).
    pub fn clone_entry(&self, src: u64, parent: u64, name: &[u8], who: &Caller) -> Result<Cloned> {
        check_name(name)?;
        if self.engine.is_read_only() {
            return Err(Errno::EROFS);
        }
        self.write_lazy_atimes();
        let _ns = self.ns.write();
        let started = Instant::now();
        let (dkey, dir_shared) = self.dir(parent)?;
        let dst_key = keys::child_key(&dkey, name);
        let src_inode = self.node_inode(src)?.lock().clone();
        let is_dir = match src_inode.kind {
            _ if src_inode.nlink == 0 => return Err(Errno::ENOENT),
            Kind::Dir => true,
            Kind::File => false,
            _ => return Err(Errno::EINVAL),
        };
        let src_key = self.table.lock().file_key(src).ok_or(Errno::ENOENT)?;
        if is_dir && self.table.lock().is_ancestor(src, parent) {
            return Err(Errno::EINVAL);
        }
        self.check_clone_access(parent, who)?;
        if !who.may(&src_inode, if is_dir { READ | SEARCH } else { READ }) {
            return Err(Errno::EACCES);
        }
        let mut pdir = dir_shared.lock();
        if self.find(parent, &dkey, name)?.is_some() {
            return Err(Errno::EEXIST);
        }
        let found = Found {
            key: src_key.clone(),
            inode: src_inode.clone(),
            redirect: false,
        };
        self.check_move_fits(&found, &dst_key)?;
        let entries = if is_dir {
            self.clone_entries(&src_key, who)?
        } else {
            Vec::new()
        };
        let dst_sub = keys::subtree_prefix(&dst_key);
        for e in entries.iter().filter(|e| e.home.is_some()) {
            self.check_home_fits(e, &[&dst_sub[..], &e.rel].concat())?;
        }

        let mut b = Batch::new();
        let mut evicted = self.evict_parked_ops(&mut b, &dst_key, false);
        evicted.extend(self.evict_parked_ops(&mut b, &dst_key, true));
        if is_dir {
            evicted.extend(self.evict_parked_ops(&mut b, &src_key, true));
        }
        // Fresh numbers for DST and every entry, in order (nothing else allocates meanwhile:
        // creations hold the namespace lock); given back if the batch is not committed.
        let count = entries.len() as u64 + 1;
        let mut alloc = self.alloc.lock();
        let saved = (alloc.next, alloc.reserved_end);
        let base = alloc.next;
        alloc.next += count;
        if alloc.next > alloc.reserved_end {
            alloc.reserved_end = alloc.next + INO_BATCH;
            b.put(
                keys::system_key("next_ino"),
                alloc.reserved_end.to_le_bytes().to_vec(),
            );
        }
        let now = Time::now();
        let fresh = |mut i: Inode, ino: u64| -> Inode {
            i.ino = ino;
            i.ctime = now;
            i.crtime = now;
            i.homed = false;
            i.reserved.clear();
            if i.kind != Kind::Symlink {
                i.target.clear();
            }
            if i.kind != Kind::Dir {
                i.nlink = 1;
            }
            if !who.is_root() && i.uid != who.uid {
                i.perm &= !SET_ID;
            }
            i
        };
        let dst = fresh(src_inode.clone(), base);
        let mut next_dir = pdir.clone();
        Self::touch_dir(&mut next_dir, now);
        if is_dir {
            next_dir.nlink += 1;
        }
        b.put(keys::meta_key(&dst_key), dst.encode());
        b.put(keys::meta_key(&dkey), next_dir.encode());
        handles::index_at(&mut b, base, parent, name);
        let copy_max = self.opts.rename_copy_max;
        b.range_clone(
            keys::xattr_prefix(&src_key),
            keys::xattr_prefix(&dst_key),
            copy_max,
        );
        if is_dir {
            let [_, d, x] = keys::subtree_prefixes(&src_key);
            let [_, d_to, x_to] = keys::subtree_prefixes(&dst_key);
            b.range_clone(d, d_to, copy_max);
            b.range_clone(x, x_to, copy_max);
        } else {
            b.range_clone(
                keys::data_prefix(&src_key),
                keys::data_prefix(&dst_key),
                copy_max,
            );
        }
        let mut unlinked = 0;
        let mut homes = Vec::new();
        for (k, e) in entries.iter().enumerate() {
            let ino = base + 1 + k as u64;
            let path = [&dst_sub[..], &e.rel].concat();
            b.put(keys::meta_key(&path), fresh(e.inode.clone(), ino).encode());
            handles::index_at(&mut b, ino, base + e.parent, &e.name);
            if let Some(h) = e.home {
                homes.push((keys::home_key(h), path, e.inode.uid));
            }
        }
        for (home, path, _) in &homes {
            b.range_clone(keys::data_prefix(home), keys::data_prefix(path), copy_max);
            b.range_clone(keys::xattr_prefix(home), keys::xattr_prefix(path), copy_max);
            unlinked += 1;
        }
        if !who.is_root() {
            self.drop_capabilities(&mut b, who, &src_key, &dst_key, &src_inode, &entries)?;
            for (home, path, uid) in &homes {
                self.drop_capability(&mut b, who, *uid, home, path)?;
            }
        }
        self.count_inodes(&mut b, count as i64);

        let batch_bytes = b.log_bytes();
        let result = (|| {
            if batch_bytes > self.engine.max_batch_bytes() {
                log::warn!(
                    "amaranth: a clone of {count} inodes needs a log record of {batch_bytes} \
                     bytes; this image's largest is {} (refused: EFBIG)",
                    self.engine.max_batch_bytes()
                );
                return Err(Errno::EFBIG);
            }
            self.check_space(batch_bytes as u64)?;
            let prepare = started.elapsed();
            let t = Instant::now();
            self.commit(&mut b)?;
            Ok((prepare, t.elapsed()))
        })();
        let (prepare, commit) = match result {
            Ok(times) => times,
            Err(e) => {
                (alloc.next, alloc.reserved_end) = saved;
                return Err(e);
            }
        };
        drop(alloc);
        log::info!(
            "amaranth: cloned {count} inodes ({unlinked} hard-linked names made files of their \
             own) in a record of {batch_bytes} bytes: {:.1} ms to read the metadata and build it, \
             {:.1} ms to log and apply it",
            prepare.as_secs_f64() * 1e3,
            commit.as_secs_f64() * 1e3
        );
        self.note_evicted(&evicted);
        *pdir = next_dir;
        drop(pdir);
        Ok(Cloned {
            inode: dst,
            inodes: count,
            unlinked,
            prepare,
            commit,
            batch_bytes,
        })
    }

    /// Refuses a clone into `parent` unless `who` may write and search it and search every
    /// directory above it (the kernel resolved no path to it: the ioctl names it by number).
    fn check_clone_access(&self, parent: u64, who: &Caller) -> Result<()> {
        if who.is_root() {
            return Ok(());
        }
        let mut chain = Vec::new();
        {
            let t = self.table.lock();
            let mut cur = parent;
            loop {
                let n = t.get(cur).ok_or(Errno::ENOENT)?;
                chain.push(n.inode.clone());
                if cur == ROOT_INO {
                    break;
                }
                if n.parent == 0 {
                    return Err(Errno::ENOENT);
                }
                cur = n.parent;
            }
        }
        for (k, dir) in chain.iter().enumerate() {
            let want = if k == 0 { WRITE | SEARCH } else { SEARCH };
            if !who.may(&dir.lock(), want) {
                return Err(Errno::EACCES);
            }
        }
        Ok(())
    }

    /// Every name under the directory at `src_key`, in key order (a directory before what it
    /// holds), each with its inode; `EACCES` if `who` may not read one (or search a directory).
    fn clone_entries(&self, src_key: &[u8], who: &Caller) -> Result<Vec<Entry>> {
        let [m, _, _] = keys::subtree_prefixes(src_key);
        let end = amaranth_engine::prefix_end(&m, self.max_key());
        let mut raw = Vec::new();
        self.engine
            .scan(Bound::Included(&m), Bound::Excluded(&end), |k, v| {
                raw.push((k[m.len()..].to_vec(), v.to_vec()));
                true
            })?;
        let src_sub = keys::subtree_prefix(src_key);
        // Directories by their subtree prefix relative to SRC's, to their entry's place.
        let mut dirs: HashMap<Vec<u8>, u64> = HashMap::new();
        dirs.insert(Vec::new(), 0);
        let mut out: Vec<Entry> = Vec::with_capacity(raw.len());
        for (rel, v) in raw {
            // The name follows the doubled separator; what precedes it (with one separator) is
            // its directory's subtree prefix.
            let at = rel
                .windows(2)
                .position(|w| w == [keys::SEP, keys::SEP])
                .map(|p| p + 1)
                .or_else(|| (rel.first() == Some(&keys::SEP)).then_some(0));
            let Some(at) = at else {
                log::error!("amaranth: clone: a metadata key under the source is not a path");
                return Err(Errno::EIO);
            };
            let (dir_rel, comp) = (&rel[..at], &rel[at + 1..]);
            let (Some(&parent), Some(name)) = (dirs.get(dir_rel), keys::decode_component(comp))
            else {
                log::error!("amaranth: clone: a name under the source has no directory");
                return Err(Errno::EIO);
            };
            let (inode, home) = match Meta::decode(&v)? {
                Meta::Inode(i) => (i, None),
                Meta::Redirect(h) => match self.load(&keys::home_key(h))? {
                    Some((i, _)) => (i, Some(h)),
                    None => {
                        log::error!("amaranth: clone: a name redirects to inode {h}, no home");
                        return Err(Errno::EIO);
                    }
                },
            };
            let want = match inode.kind {
                Kind::Dir => READ | SEARCH,
                Kind::Symlink => 0,
                _ => READ,
            };
            if !who.may(&inode, want) {
                log::info!(
                    "amaranth: clone refused: uid {} may not read inode {} under the source",
                    who.uid,
                    inode.ino
                );
                return Err(Errno::EACCES);
            }
            if inode.kind == Kind::Dir {
                let full = [&src_sub[..], &rel].concat();
                let sub = keys::subtree_prefix(&full);
                dirs.insert(sub[src_sub.len()..].to_vec(), out.len() as u64 + 1);
            }
            out.push(Entry {
                rel,
                inode,
                parent,
                name,
                home,
            });
        }
        Ok(out)
    }

    /// `ENAMETOOLONG` unless the extended attributes of the home of entry `e` fit at `path`.
    fn check_home_fits(&self, e: &Entry, path: &[u8]) -> Result<()> {
        let home = keys::home_key(e.home.expect("a home"));
        self.check_key_len(path)?;
        let x = keys::xattr_prefix(&home);
        let end = amaranth_engine::prefix_end(&x, self.max_key());
        let growth = path.len().saturating_sub(home.len());
        for exact in [false, true] {
            if self.longest_key_in(&x, &end, exact)? + growth <= self.max_key() {
                return Ok(());
            }
        }
        Err(Errno::ENAMETOOLONG)
    }

    /// Adds to `b` the deletion of the capabilities, under DST, of the path-keyed inodes under
    /// SRC (and SRC) that `who` does not own.
    fn drop_capabilities(
        &self,
        b: &mut Batch,
        who: &Caller,
        src_key: &[u8],
        dst_key: &[u8],
        src_inode: &Inode,
        entries: &[Entry],
    ) -> Result<()> {
        self.drop_capability(b, who, src_inode.uid, src_key, dst_key)?;
        if src_inode.kind != Kind::Dir {
            return Ok(());
        }
        let foreign: HashSet<&[u8]> = entries
            .iter()
            .filter(|e| e.home.is_none() && e.inode.uid != who.uid)
            .map(|e| &e.rel[..])
            .collect();
        if foreign.is_empty() {
            return Ok(());
        }
        let [_, _, x] = keys::subtree_prefixes(src_key);
        let [_, _, x_to] = keys::subtree_prefixes(dst_key);
        let end = amaranth_engine::prefix_end(&x, self.max_key());
        let mut gone = Vec::new();
        self.engine
            .scan_stored(Bound::Included(&x), Bound::Excluded(&end), |k, _| {
                let rest = &k[x.len()..];
                if let Some(at) = rest.iter().position(|&c| c == keys::END) {
                    if &rest[at + 1..] == CAPABILITY && foreign.contains(&rest[..at]) {
                        gone.push([&x_to[..], rest].concat());
                    }
                }
                true
            })?;
        for k in gone {
            b.delete(k);
        }
        Ok(())
    }

    /// Adds to `b` the deletion of the capabilities of the clone at `to` of the file at `from`,
    /// owned by `uid`, if `who` is not its owner and it has some.
    fn drop_capability(
        &self,
        b: &mut Batch,
        who: &Caller,
        uid: u32,
        from: &[u8],
        to: &[u8],
    ) -> Result<()> {
        if uid != who.uid
            && self
                .engine
                .get(&keys::xattr_key(from, CAPABILITY))?
                .is_some()
        {
            b.delete(keys::xattr_key(to, CAPABILITY));
        }
        Ok(())
    }
}
