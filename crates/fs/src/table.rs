//! The in-memory inode table: which inodes the kernel knows (FUSE node ids), where each lives in
//! the key space, and their attributes.
//!
//! A path-keyed inode remembers its parent and name, not its full path, so renaming a directory
//! changes one entry no matter how many descendants are cached; the key is rebuilt by walking up
//! the parents. Every entry's parent stays in the table while the entry does (`children` counts).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::inode::Inode;
use crate::keys;

/// Inode number of the root directory (FUSE's root node id).
pub const ROOT_INO: u64 = 1;

/// A cached inode.
#[derive(Debug)]
pub struct Node {
    /// Parent directory (path-keyed inodes only; 0 when the inode has no path: homed).
    pub parent: u64,
    /// Name in the parent (raw bytes).
    pub name: Vec<u8>,
    /// Kernel lookup count (FUSE `nlookup`).
    pub lookups: u64,
    /// Table entries whose parent is this node.
    pub children: u64,
    /// Open file handles.
    pub opens: u32,
    /// Kind (never changes for an inode).
    pub kind: crate::inode::Kind,
    /// Lives at its home: its key is the home key, not a path. (Mirrors `inode.homed` so that the
    /// table never locks an inode: locks are taken inode first, table second.)
    pub homed: bool,
    /// The attributes: authoritative (only this daemon changes them). Lock to change them and
    /// hold the lock until the change is submitted to the engine, so changes land in order.
    pub inode: Arc<Mutex<Inode>>,
}

/// The table.
#[derive(Debug, Default)]
pub struct Table {
    nodes: HashMap<u64, Node>,
    names: HashMap<(u64, Vec<u8>), u64>,
}

impl Table {
    /// A table holding the root.
    pub fn new(root: Inode) -> Table {
        let mut t = Table::default();
        let kind = root.kind;
        t.nodes.insert(
            ROOT_INO,
            Node {
                parent: 0,
                name: Vec::new(),
                lookups: 1,
                children: 0,
                opens: 0,
                kind,
                homed: false,
                inode: Arc::new(Mutex::new(root)),
            },
        );
        t
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
        self.names.get(&(parent, name.to_vec())).copied()
    }

    /// Number of cached inodes.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.nodes.len()
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
        if let Some(n) = self.nodes.get_mut(&ino) {
            if count_lookup {
                n.lookups += 1;
            }
            return n.inode.clone();
        }
        let (p, nm) = if homed {
            (0, Vec::new())
        } else {
            (parent, name.to_vec())
        };
        if p != 0 {
            if let Some(pn) = self.nodes.get_mut(&p) {
                pn.children += 1;
            }
        }
        let shared = Arc::new(Mutex::new(inode));
        self.nodes.insert(
            ino,
            Node {
                parent: p,
                name: nm,
                lookups: count_lookup as u64,
                children: 0,
                opens: 0,
                kind,
                homed,
                inode: shared.clone(),
            },
        );
        if p != 0 {
            self.names.insert((parent, name.to_vec()), ino);
        }
        shared
    }

    /// Moves a path-keyed inode to a new parent and name.
    pub fn rename(&mut self, ino: u64, new_parent: u64, new_name: &[u8]) {
        let Some(n) = self.nodes.get_mut(&ino) else {
            return;
        };
        let old_parent = n.parent;
        if !n.homed && old_parent != 0 {
            let old_name = std::mem::replace(&mut n.name, new_name.to_vec());
            n.parent = new_parent;
            self.names.remove(&(old_parent, old_name));
            self.names.insert((new_parent, new_name.to_vec()), ino);
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
    }

    /// Gives a detached, path-keyed inode a place in the namespace again (rename exchange).
    pub fn attach(&mut self, ino: u64, parent: u64, name: &[u8]) {
        let Some(n) = self.nodes.get_mut(&ino) else {
            return;
        };
        if n.homed || n.parent != 0 {
            return;
        }
        n.parent = parent;
        n.name = name.to_vec();
        self.names.insert((parent, name.to_vec()), ino);
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

    /// The shared attributes of a cached inode.
    pub fn inode(&self, ino: u64) -> Option<Arc<Mutex<Inode>>> {
        self.nodes.get(&ino).map(|n| n.inode.clone())
    }

    /// Detaches an inode from the namespace (it became homed, or was removed): it keeps its table
    /// entry while the kernel knows it, without a parent.
    pub fn detach(&mut self, ino: u64) {
        let Some(n) = self.nodes.get_mut(&ino) else {
            return;
        };
        let p = std::mem::replace(&mut n.parent, 0);
        let name = std::mem::take(&mut n.name);
        if p != 0 {
            self.names.remove(&(p, name));
            if let Some(pn) = self.nodes.get_mut(&p) {
                pn.children -= 1;
            }
            self.reap(p);
        }
    }

    /// Drops `n` lookups; removes the entry (and parents left unused) when nothing holds it.
    pub fn forget(&mut self, ino: u64, n: u64) {
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.lookups = node.lookups.saturating_sub(n);
        }
        self.reap(ino);
    }

    /// Removes `ino` if the kernel no longer knows it and nothing depends on it.
    pub fn reap(&mut self, ino: u64) {
        let mut cur = ino;
        while cur != ROOT_INO {
            let Some(n) = self.nodes.get(&cur) else {
                return;
            };
            if n.lookups > 0 || n.children > 0 || n.opens > 0 {
                return;
            }
            let n = self.nodes.remove(&cur).expect("present");
            if n.parent != 0 {
                self.names.remove(&(n.parent, n.name.clone()));
                if let Some(p) = self.nodes.get_mut(&n.parent) {
                    p.children -= 1;
                }
            }
            cur = n.parent;
            if cur == 0 {
                return;
            }
        }
    }
}
