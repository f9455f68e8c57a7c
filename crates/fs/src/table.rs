//! The in-memory inode table: which inodes the kernel knows (FUSE node ids), where each lives in
//! the key space, and their attributes.
//!
//! A path-keyed inode remembers its parent and name, not its full path, so renaming a directory
//! changes one entry no matter how many descendants are cached; the key is rebuilt by walking up
//! the parents. Every entry's parent stays in the table while the entry does (`children` counts).

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use hashbrown::HashTable;
use parking_lot::Mutex;

use amaranth_engine::Engine;

use crate::inode::Inode;
use crate::keys;

/// Inode number of the root directory (FUSE's root node id).
pub const ROOT_INO: u64 = 1;

/// A cached inode. Kept small: the table holds one per inode the kernel knows, which can be
/// millions (see `Table::mem_bytes`).
#[derive(Debug)]
pub struct Node {
    /// Parent directory (path-keyed inodes only; 0 when the inode has no path: homed).
    pub parent: u64,
    /// Kernel lookup count (FUSE `nlookup`).
    pub lookups: u64,
    /// The attributes: authoritative (only this daemon changes them). Lock to change them and
    /// hold the lock until the change is submitted to the engine, so changes land in order.
    pub inode: Arc<Mutex<Inode>>,
    /// Name in the parent (raw bytes; empty when detached).
    name: Box<[u8]>,
    /// Table entries whose parent is this node.
    pub children: u32,
    /// When the kernel last looked this inode up or was asked to forget it (a table tick): the
    /// least recent are asked to be forgotten first when the table is over its share.
    touched: u32,
    /// Heap bytes of the symlink target counted when the entry was made (taken back at removal
    /// without locking the inode: the table never takes an inode lock).
    target_heap: u16,
    /// Kind (never changes for an inode).
    pub kind: crate::inode::Kind,
    /// Lives at its home: its key is the home key, not a path. (Mirrors `inode.homed` so that the
    /// table never locks an inode: locks are taken inode first, table second.)
    pub homed: bool,
    /// Known to have no extended attributes: made in this session and given none since (false:
    /// not known either way). Spares the engine lookups of the kernel's `security.capability`
    /// probes and of a mode change's access ACL.
    no_xattrs: bool,
}

/// The table: inodes by number, plus an index by (parent, name) holding only inode numbers (the
/// name is the node's own, so each name is stored once).
pub struct Table {
    nodes: HashMap<u64, Node>,
    names: HashTable<u64>,
    hasher: RandomState,
    /// Heap bytes held by the entries themselves (names, shared attributes), beyond the two maps.
    heap: usize,
    /// Logical clock of `Node::touched`.
    tick: u32,
    /// Where the table's bytes are charged (the engine's cache bound), and how many of them are
    /// not charged (the part of the daemon's documented overhead set aside for the table).
    charge: Option<(Arc<Engine>, usize)>,
    /// The bytes last charged.
    charged: usize,
}

/// The table's bytes are charged again when they moved by this much.
const CHARGE_STEP: usize = 256 << 10;

/// Heap bytes glibc's malloc takes for a request of `n` bytes (16-byte granules, 8 bytes of
/// header, 32 bytes at least).
fn malloc_bytes(n: usize) -> usize {
    if n == 0 {
        0
    } else {
        (n + 8).div_ceil(16).max(2) * 16
    }
}

/// Heap bytes of one entry's own allocations besides a symlink target: its name and its shared
/// attributes.
fn entry_heap(name: &[u8]) -> usize {
    // The Arc's allocation: two counts and the mutex-wrapped inode.
    let arc = 2 * std::mem::size_of::<usize>() + std::mem::size_of::<Mutex<Inode>>();
    malloc_bytes(name.len()) + malloc_bytes(arc)
}

/// Heap bytes of a symlink target, as counted in a node.
fn target_heap(inode: &Inode) -> u16 {
    malloc_bytes(inode.target.capacity()).min(u16::MAX as usize) as u16
}

/// Bytes of a hash table with room for `cap` entries of `slot` bytes (hashbrown: a power-of-two
/// number of buckets, 7/8 of them usable, one control byte each).
fn table_bytes(cap: usize, slot: usize) -> usize {
    if cap == 0 {
        return 0;
    }
    let buckets = (cap * 8).div_ceil(7).next_power_of_two();
    buckets * (slot + 1) + 16
}

impl Table {
    /// A table holding the root.
    pub fn new(root: Inode) -> Table {
        let mut t = Table {
            nodes: HashMap::new(),
            names: HashTable::new(),
            hasher: RandomState::new(),
            heap: 0,
            tick: 0,
            charge: None,
            charged: 0,
        };
        t.heap += entry_heap(&[]);
        let kind = root.kind;
        t.nodes.insert(
            ROOT_INO,
            Node {
                parent: 0,
                name: Box::default(),
                lookups: 1,
                children: 0,
                touched: 0,
                target_heap: 0,
                kind,
                homed: false,
                no_xattrs: false,
                inode: Arc::new(Mutex::new(root)),
            },
        );
        t
    }

    /// Charges the table's bytes beyond `uncharged` to `engine`'s cache bound from now on.
    pub fn charge_to(&mut self, engine: Arc<Engine>, uncharged: usize) {
        self.charge = Some((engine, uncharged));
        self.charged = usize::MAX;
        self.recharge();
    }

    /// Tells the engine the table's size when it moved by a step since it was last told.
    fn recharge(&mut self) {
        let Some((engine, uncharged)) = &self.charge else {
            return;
        };
        let bytes = self.mem_bytes().saturating_sub(*uncharged);
        if bytes.abs_diff(self.charged) >= CHARGE_STEP || (bytes == 0) != (self.charged == 0) {
            engine.set_external_memory(bytes);
            self.charged = bytes;
        }
    }

    fn name_hash(&self, parent: u64, name: &[u8]) -> u64 {
        self.hasher.hash_one((parent, name))
    }

    /// Adds `ino` (whose node has `parent` and `name`) to the name index.
    fn index(&mut self, ino: u64) {
        let n = &self.nodes[&ino];
        let hash = self.name_hash(n.parent, &n.name);
        let nodes = &self.nodes;
        self.names.insert_unique(hash, ino, |i| {
            let n = &nodes[i];
            hash_of(&self.hasher, n.parent, &n.name)
        });
    }

    /// Removes `ino` (at `parent`/`name`) from the name index.
    fn unindex(&mut self, ino: u64, parent: u64, name: &[u8]) {
        let hash = self.name_hash(parent, name);
        if let Ok(e) = self.names.find_entry(hash, |&i| i == ino) {
            e.remove();
        }
    }

    /// The node for `ino`.
    pub fn get(&self, ino: u64) -> Option<&Node> {
        self.nodes.get(&ino)
    }

    /// The node for `ino`, mutably.
    pub fn get_mut(&mut self, ino: u64) -> Option<&mut Node> {
        self.nodes.get_mut(&ino)
    }

    /// The cached child `name` of `parent`, if any.
    pub fn child(&self, parent: u64, name: &[u8]) -> Option<u64> {
        let hash = self.name_hash(parent, name);
        self.names
            .find(hash, |i| {
                let n = &self.nodes[i];
                n.parent == parent && *n.name == *name
            })
            .copied()
    }

    /// Number of cached inodes.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Heap bytes the table holds: both maps at their capacity plus every entry's own allocations.
    /// What the memory bound charges for the inodes the kernel knows.
    pub fn mem_bytes(&self) -> usize {
        table_bytes(self.nodes.capacity(), std::mem::size_of::<(u64, Node)>())
            + table_bytes(self.names.capacity(), std::mem::size_of::<u64>())
            + self.heap
    }

    /// Average heap bytes of one entry's own allocations: what forgetting one gives back.
    pub fn entry_bytes(&self) -> usize {
        self.heap / self.nodes.len().max(1)
    }

    /// The file key of `ino`: its home if homed, else its path key.
    pub fn file_key(&self, ino: u64) -> Option<Vec<u8>> {
        let n = self.nodes.get(&ino)?;
        if n.homed {
            return Some(keys::home_key(ino));
        }
        let mut comps: Vec<&[u8]> = Vec::new();
        let mut cur = ino;
        while cur != ROOT_INO {
            let n = self.nodes.get(&cur)?;
            if n.parent == 0 {
                return None;
            }
            comps.push(&n.name);
            cur = n.parent;
        }
        comps.reverse();
        Some(keys::path_key(&comps))
    }

    /// Whether `ancestor` is `ino` or one of its ancestors.
    pub fn is_ancestor(&self, ancestor: u64, ino: u64) -> bool {
        let mut cur = ino;
        loop {
            if cur == ancestor {
                return true;
            }
            match self.nodes.get(&cur) {
                Some(n) if n.parent != 0 => cur = n.parent,
                _ => return false,
            }
        }
    }

    fn next_tick(&mut self) -> u32 {
        self.tick = self.tick.wrapping_add(1);
        self.tick
    }

    /// Records a kernel lookup of `ino` reached as `parent/name` (for path-keyed inodes), inserting
    /// it with `inode` if new. Returns the (shared) inode.
    pub fn remember(
        &mut self,
        parent: u64,
        name: &[u8],
        inode: Inode,
        count_lookup: bool,
    ) -> Arc<Mutex<Inode>> {
        let ino = inode.ino;
        let homed = inode.homed;
        let kind = inode.kind;
        let tick = self.next_tick();
        if let Some(n) = self.nodes.get_mut(&ino) {
            if count_lookup {
                n.lookups += 1;
                n.touched = tick;
            }
            return n.inode.clone();
        }
        let (p, nm): (u64, Box<[u8]>) = if homed {
            (0, Box::default())
        } else {
            (parent, name.into())
        };
        if p != 0 {
            if let Some(pn) = self.nodes.get_mut(&p) {
                pn.children += 1;
            }
        }
        let target_heap = target_heap(&inode);
        self.heap += entry_heap(&nm) + target_heap as usize;
        let shared = Arc::new(Mutex::new(inode));
        self.nodes.insert(
            ino,
            Node {
                parent: p,
                name: nm,
                lookups: count_lookup as u64,
                children: 0,
                touched: tick,
                target_heap,
                kind,
                homed,
                no_xattrs: false,
                inode: shared.clone(),
            },
        );
        if p != 0 {
            self.index(ino);
        }
        self.recharge();
        shared
    }

    /// Whether `ino` is known to have no extended attributes (see `Node::no_xattrs`).
    pub fn has_no_xattrs(&self, ino: u64) -> bool {
        self.nodes.get(&ino).is_some_and(|n| n.no_xattrs)
    }

    /// Records whether `ino` is known to have no extended attributes: true for an inode just
    /// made or one a lookup found none of (under its lock); false before anything may give it one.
    pub fn set_no_xattrs(&mut self, ino: u64, none: bool) {
        if let Some(n) = self.nodes.get_mut(&ino) {
            n.no_xattrs = none;
        }
    }

    /// Replaces the name of `ino` (its heap accounting follows).
    fn set_name(&mut self, ino: u64, parent: u64, name: &[u8]) -> Option<(u64, Box<[u8]>)> {
        let n = self.nodes.get_mut(&ino)?;
        let old_name = std::mem::replace(&mut n.name, name.into());
        let old_parent = std::mem::replace(&mut n.parent, parent);
        self.heap = self.heap + malloc_bytes(name.len()) - malloc_bytes(old_name.len());
        Some((old_parent, old_name))
    }

    /// Moves a path-keyed inode to a new parent and name.
    pub fn rename(&mut self, ino: u64, new_parent: u64, new_name: &[u8]) {
        let Some(n) = self.nodes.get(&ino) else {
            return;
        };
        if n.homed || n.parent == 0 {
            return;
        }
        let (old_parent, old_name) = self.set_name(ino, new_parent, new_name).expect("present");
        self.unindex(ino, old_parent, &old_name);
        self.index(ino);
        if old_parent != new_parent {
            if let Some(p) = self.nodes.get_mut(&old_parent) {
                p.children -= 1;
            }
            if let Some(p) = self.nodes.get_mut(&new_parent) {
                p.children += 1;
            }
            self.reap(old_parent);
        }
    }

    /// Gives a detached, path-keyed inode a place in the namespace again (rename exchange).
    pub fn attach(&mut self, ino: u64, parent: u64, name: &[u8]) {
        let Some(n) = self.nodes.get(&ino) else {
            return;
        };
        if n.homed || n.parent != 0 {
            return;
        }
        self.set_name(ino, parent, name);
        self.index(ino);
        if let Some(p) = self.nodes.get_mut(&parent) {
            p.children += 1;
        }
    }

    /// Marks an inode as living at its home (hard-linked, or unlinked while open) and detaches it.
    pub fn set_homed(&mut self, ino: u64) {
        if let Some(n) = self.nodes.get_mut(&ino) {
            n.homed = true;
        }
        self.detach(ino);
    }

    /// The directory and name of a path-keyed inode (`None` if homed, detached or unknown).
    pub fn place(&self, ino: u64) -> Option<(u64, Vec<u8>)> {
        let n = self.nodes.get(&ino)?;
        (!n.homed && n.parent != 0).then(|| (n.parent, n.name.to_vec()))
    }

    /// Marks a homed inode as living at `parent/name` again (its link count returned to one and
    /// it moved back from its home). The caller checked that the table holds `parent`.
    pub fn unhome(&mut self, ino: u64, parent: u64, name: &[u8]) {
        let Some(n) = self.nodes.get_mut(&ino) else {
            return;
        };
        assert!(n.homed && n.parent == 0, "inode {ino} is not homed");
        n.homed = false;
        self.attach(ino, parent, name);
    }

    /// Marks an inode whose record was deleted (its last name removed, or its last close after
    /// that) and detaches it: it has no key any more, so nothing reads or writes it, and it keeps
    /// its entry only while the kernel knows it.
    pub fn set_deleted(&mut self, ino: u64) {
        if let Some(n) = self.nodes.get_mut(&ino) {
            n.homed = false;
        }
        self.detach(ino);
    }

    /// The shared attributes of a cached inode.
    pub fn inode(&self, ino: u64) -> Option<Arc<Mutex<Inode>>> {
        self.nodes.get(&ino).map(|n| n.inode.clone())
    }

    /// Detaches an inode from the namespace (it became homed, or was removed): it keeps its table
    /// entry while the kernel knows it, without a parent.
    pub fn detach(&mut self, ino: u64) {
        let Some(n) = self.nodes.get(&ino) else {
            return;
        };
        if n.parent == 0 {
            return;
        }
        let (p, name) = self.set_name(ino, 0, &[]).expect("present");
        self.unindex(ino, p, &name);
        if let Some(pn) = self.nodes.get_mut(&p) {
            pn.children -= 1;
        }
        self.reap(p);
    }

    /// Drops `n` lookups; removes the entry (and parents left unused) when nothing holds it.
    #[cfg(test)]
    pub fn forget(&mut self, ino: u64, n: u64) {
        self.drop_lookups(ino, n);
        self.reap(ino);
    }

    /// Takes `n` of the kernel's lookups of `ino` off its entry (which stays, even at none, until
    /// [`Table::reap`]); returns the lookups left (0 when there is no entry).
    pub fn drop_lookups(&mut self, ino: u64, n: u64) -> u64 {
        match self.nodes.get_mut(&ino) {
            Some(node) => {
                node.lookups = node.lookups.saturating_sub(n);
                node.lookups
            }
            None => 0,
        }
    }

    /// Removes `ino` if the kernel no longer knows it and nothing depends on it.
    pub fn reap(&mut self, ino: u64) {
        let mut cur = ino;
        let mut removed = false;
        while cur != ROOT_INO {
            let Some(n) = self.nodes.get(&cur) else {
                break;
            };
            if n.lookups > 0 || n.children > 0 {
                break;
            }
            removed = true;
            let n = self.nodes.remove(&cur).expect("present");
            self.heap -= entry_heap(&n.name) + n.target_heap as usize;
            if n.parent != 0 {
                self.unindex(cur, n.parent, &n.name);
                if let Some(p) = self.nodes.get_mut(&n.parent) {
                    p.children -= 1;
                }
            }
            cur = n.parent;
            if cur == 0 {
                break;
            }
        }
        if removed {
            self.shrink();
            self.recharge();
        }
    }

    /// Gives memory back once the maps are mostly empty (a table that held millions of inodes
    /// would otherwise keep their buckets).
    fn shrink(&mut self) {
        let len = self.nodes.len();
        // Half the buckets would still leave a quarter free: take them back (growth doubles
        // again only once the table is full, so this cannot alternate with it).
        let room = len + len / 4;
        if self.nodes.capacity() > 1024 && room < self.nodes.capacity() / 2 {
            self.nodes.shrink_to(room);
            let nodes = &self.nodes;
            let hasher = &self.hasher;
            self.names.shrink_to(room, |i| {
                let n = &nodes[i];
                hash_of(hasher, n.parent, &n.name)
            });
        }
    }

    /// Up to `max` entries the kernel could be asked to forget, least recently looked up first:
    /// named files and empty directories that no open handle holds, as (parent, name). Each is
    /// marked as just touched, so a name the kernel keeps (a process's working directory) is not
    /// asked for again at once.
    pub fn forget_candidates(&mut self, max: usize) -> Vec<(u64, Vec<u8>)> {
        let mut v: Vec<(u32, u64)> = self
            .nodes
            .iter()
            .filter(|(&ino, n)| {
                ino != ROOT_INO && n.parent != 0 && n.children == 0 && n.lookups > 0
            })
            .map(|(&ino, n)| (self.tick.wrapping_sub(n.touched), ino))
            .collect();
        if v.len() > max {
            // Oldest (largest age) first.
            v.select_nth_unstable_by(max, |a, b| b.0.cmp(&a.0));
            v.truncate(max);
        }
        let tick = self.next_tick();
        v.into_iter()
            .map(|(_, ino)| {
                let n = self.nodes.get_mut(&ino).expect("present");
                n.touched = tick;
                (n.parent, n.name.to_vec())
            })
            .collect()
    }
}

fn hash_of(hasher: &RandomState, parent: u64, name: &[u8]) -> u64 {
    hasher.hash_one((parent, name))
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::inode::Kind;

    /// Counts the heap bytes this thread holds, as glibc's malloc takes them, so the table's
    /// own accounting can be checked against the allocator.
    #[global_allocator]
    static ALLOC: amaranth_device::counting::Counting = amaranth_device::counting::Counting;

    fn held() -> isize {
        amaranth_device::counting::held()
    }

    fn file(ino: u64) -> Inode {
        Inode::new(ino, Kind::File, 0o644, 0, 0)
    }

    fn dir(ino: u64) -> Inode {
        Inode::new(ino, Kind::Dir, 0o755, 0, 0)
    }

    /// 120 directories of 1,000 files each, as the memory-bound test on a mount makes.
    fn fill(t: &mut Table) {
        for d in 0..120u64 {
            let dino = 2 + d;
            t.remember(ROOT_INO, format!("d{d:03}").as_bytes(), dir(dino), true);
            for f in 0..1000u64 {
                let ino = 1000 + d * 1000 + f;
                let name = format!("f{:06}", d * 1000 + f);
                t.remember(dino, name.as_bytes(), file(ino), true);
            }
        }
    }

    #[test]
    fn entries_are_small_and_their_bytes_counted() {
        let before = held();
        let mut t = Table::new(dir(ROOT_INO));
        fill(&mut t);
        let measured = (held() - before) as usize;
        let per_entry = measured / t.len();
        let counted = t.mem_bytes();
        eprintln!(
            "{} entries: {measured} bytes held ({per_entry} per entry), {counted} counted",
            t.len()
        );
        // Before the compact table: ~479 bytes per entry (two maps, each with its own copy of the
        // name). Now ~353: the node map (142 at this count, just past a doubling), the name
        // index (20), the name (32) and the shared attributes (160).
        assert!(per_entry <= 400, "{per_entry} bytes per table entry");
        let diff = measured.abs_diff(counted);
        assert!(
            diff <= measured / 20,
            "the table counts {counted} bytes but holds {measured}"
        );
    }

    #[test]
    fn forgetting_everything_gives_the_memory_back() {
        let before = held();
        let mut t = Table::new(dir(ROOT_INO));
        let empty = t.mem_bytes();
        fill(&mut t);
        for d in 0..120u64 {
            for f in 0..1000u64 {
                t.forget(1000 + d * 1000 + f, 1);
            }
            t.forget(2 + d, 1);
        }
        assert_eq!(t.len(), 1);
        let left = (held() - before) as usize;
        assert!(
            left < 128 << 10,
            "{left} bytes still held by an empty table"
        );
        assert!(t.mem_bytes() < empty + (128 << 10));
    }

    #[test]
    fn names_resolve_after_renames_and_detaches() {
        let mut t = Table::new(dir(ROOT_INO));
        t.remember(ROOT_INO, b"a", dir(2), true);
        t.remember(2, b"x", file(3), true);
        assert_eq!(t.child(2, b"x"), Some(3));
        t.rename(3, ROOT_INO, b"a-much-longer-name-than-inline");
        assert_eq!(t.child(2, b"x"), None);
        assert_eq!(
            t.child(ROOT_INO, b"a-much-longer-name-than-inline"),
            Some(3)
        );
        assert_eq!(t.get(2).unwrap().children, 0);
        t.detach(3);
        assert_eq!(t.child(ROOT_INO, b"a-much-longer-name-than-inline"), None);
        t.attach(3, 2, b"y");
        assert_eq!(t.child(2, b"y"), Some(3));
        assert_eq!(t.file_key(3), Some(keys::path_key(&[b"a", b"y"])));
        t.forget(3, 1);
        assert_eq!(t.child(2, b"y"), None);
        t.forget(2, 1);
        assert_eq!(t.len(), 1);
        assert_eq!(t.heap, Table::new(dir(ROOT_INO)).heap);
    }

    #[test]
    fn forget_candidates_are_the_least_recent_leaves() {
        let mut t = Table::new(dir(ROOT_INO));
        t.remember(ROOT_INO, b"d", dir(2), true);
        for i in 0..10u64 {
            t.remember(2, format!("f{i}").as_bytes(), file(10 + i), true);
        }
        // Looked up again: now the most recent.
        t.remember(2, b"f0", file(10), true);
        t.remember(2, b"f1", file(11), true);
        let c = t.forget_candidates(3);
        let names: Vec<&[u8]> = c.iter().map(|(_, n)| n.as_slice()).collect();
        assert_eq!(c.len(), 3);
        assert!(c.iter().all(|(p, _)| *p == 2), "{c:?}");
        // f0 and f1 were just looked up, d has children.
        for n in [&b"f2"[..], b"f3", b"f4"] {
            assert!(names.contains(&n), "{names:?}");
        }
        // Asked once: not asked again before the others.
        let again = t.forget_candidates(3);
        assert!(again.iter().all(|(_, n)| !names.contains(&n.as_slice())));
    }
}
