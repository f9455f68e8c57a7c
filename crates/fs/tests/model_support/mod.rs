//! The model of `tests/model.rs`: a file tree as inodes by model id and names in directories,
//! and the names the random operations pick from.

use std::collections::BTreeMap;

use rand::rngs::SmallRng;
use rand::Rng;

#[derive(Clone, Debug)]
pub enum MInode {
    File { data: Vec<u8>, nlink: u32 },
    Dir { children: BTreeMap<Vec<u8>, u64> },
    Symlink { target: Vec<u8> },
}

/// The model: inodes by model id, names in directories.
#[derive(Clone, Debug)]
pub struct Model {
    pub inodes: BTreeMap<u64, MInode>,
    pub xattrs: BTreeMap<u64, BTreeMap<Vec<u8>, Vec<u8>>>,
    pub next: u64,
}

pub const ROOT: u64 = 0;

impl Model {
    pub fn new() -> Model {
        let mut inodes = BTreeMap::new();
        inodes.insert(
            ROOT,
            MInode::Dir {
                children: BTreeMap::new(),
            },
        );
        Model {
            inodes,
            xattrs: BTreeMap::new(),
            next: 1,
        }
    }
    pub fn children(&self, dir: u64) -> &BTreeMap<Vec<u8>, u64> {
        match &self.inodes[&dir] {
            MInode::Dir { children } => children,
            _ => panic!("not a dir"),
        }
    }
    pub fn children_mut(&mut self, dir: u64) -> &mut BTreeMap<Vec<u8>, u64> {
        match self.inodes.get_mut(&dir).unwrap() {
            MInode::Dir { children } => children,
            _ => panic!("not a dir"),
        }
    }
    pub fn resolve(&self, path: &[Vec<u8>]) -> Option<u64> {
        let mut cur = ROOT;
        for c in path {
            cur = *self.children(cur).get(c)?;
        }
        Some(cur)
    }
    pub fn is_dir(&self, id: u64) -> bool {
        matches!(self.inodes[&id], MInode::Dir { .. })
    }
    /// Every path in the tree (directories included), for picking targets.
    pub fn paths(&self) -> Vec<Vec<Vec<u8>>> {
        let mut out = vec![];
        let mut stack = vec![(ROOT, vec![])];
        while let Some((id, p)) = stack.pop() {
            if let MInode::Dir { children } = &self.inodes[&id] {
                for (n, c) in children {
                    let mut q: Vec<Vec<u8>> = p.clone();
                    q.push(n.clone());
                    out.push(q.clone());
                    stack.push((*c, q));
                }
            }
        }
        out
    }
    /// Copies the file or tree at `id` as new inodes, as a clone does (`amaranth clone`): every
    /// name of a hard-linked file becomes a file of its own. Returns the copy's id.
    pub fn deep_copy(&mut self, id: u64) -> u64 {
        let new = self.next;
        self.next += 1;
        let node = match self.inodes[&id].clone() {
            MInode::File { data, .. } => MInode::File { data, nlink: 1 },
            MInode::Symlink { target } => MInode::Symlink { target },
            MInode::Dir { children } => MInode::Dir {
                children: children
                    .into_iter()
                    .map(|(n, c)| (n, self.deep_copy(c)))
                    .collect(),
            },
        };
        self.inodes.insert(new, node);
        if let Some(x) = self.xattrs.get(&id).cloned() {
            self.xattrs.insert(new, x);
        }
        new
    }
    pub fn drop_name(&mut self, id: u64) {
        if let Some(MInode::File { nlink, .. }) = self.inodes.get_mut(&id) {
            *nlink -= 1;
            if *nlink > 0 {
                return;
            }
        }
        self.inodes.remove(&id);
        self.xattrs.remove(&id);
    }
}

pub fn name(rng: &mut SmallRng) -> Vec<u8> {
    let pool: [&[u8]; 10] = [
        b"a",
        b"b",
        b"c",
        b"dir",
        b"file",
        b"\x01odd",
        b"\xffhigh",
        b"x y",
        b"long-name-here",
        b"z",
    ];
    let mut n = pool[rng.gen_range(0..pool.len())].to_vec();
    if rng.gen_bool(0.3) {
        n.push(b'0' + rng.gen_range(0..5));
    }
    n
}
