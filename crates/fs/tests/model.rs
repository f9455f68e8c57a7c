//! The file-system operation layer against an in-memory model of a file tree: random sequences of
//! creates, writes, truncates, holes, renames (with NOREPLACE and EXCHANGE), hard links, symlinks,
//! xattrs, copies, clones of directory trees and files (`amaranth clone`) and remounts, with tiny
//! engine nodes and a tiny cache. Seeds are printed;
//! replay one with `AMARANTH_SEED=<seed> cargo test -p amaranth-fs --test model replay`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use amaranth_device::MemDevice;
use amaranth_engine::{Engine, Format, Options};
use amaranth_fs::{
    check, Caller, Ctx, Errno, Fs, FsOptions, Kind, SetAttr, RENAME_COPY_MAX, RENAME_EXCHANGE,
    RENAME_NOREPLACE, ROOT_INO,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

mod model_support;

use model_support::{name, MInode, Model, ROOT};

struct Harness {
    dev: Arc<MemDevice>,
    fs: Fs,
    seed: u64,
}

fn engine_options() -> Options {
    Options {
        cache_size: 384 << 10,
        background_threads: false,
        check_invariants: true,
        ..Options::default()
    }
}

fn format() -> Format {
    Format {
        max_key_len: 1024,
        max_value_len: 4096 + 64,
        partition_size: 8 << 10,
        node_size: 32 << 10,
        ..Format::small_for_tests()
    }
}

/// Every other seed stores any run of whole blocks out of line (docs/WRITEONCE.md): the model's
/// writes (up to 9,000 bytes) then meet references everywhere (partial writes patch them,
/// truncates, holes, renames and links move or drop them). Independently, renames go by tree
/// surgery (every range moved) for half the seeds, by the default crossover (the small ranges of
/// this test copied) for the other half.
fn fs_options(seed: u64) -> FsOptions {
    FsOptions {
        reserve_bytes: 0,
        relatime: false,
        out_of_line_min: if seed.is_multiple_of(2) { 4096 } else { 0 },
        rename_copy_max: if (seed / 2).is_multiple_of(2) {
            0
        } else {
            RENAME_COPY_MAX
        },
        ..FsOptions::default()
    }
}

impl Harness {
    fn new(seed: u64) -> Harness {
        let dev = Arc::new(MemDevice::new(64 << 20));
        let engine = Engine::create(dev.clone(), format(), engine_options()).unwrap();
        Fs::mkfs(&engine, 0, 0).unwrap();
        let fs = Fs::new(Arc::new(engine), fs_options(seed)).unwrap();
        Harness { dev, fs, seed }
    }

    fn remount(&mut self) {
        // Unmounted: the kernel holds nothing any more.
        self.fs.end_session().unwrap();
        let fs = std::mem::replace(&mut self.fs, Harness::new(0).fs);
        let engine = fs_engine(fs);
        Arc::try_unwrap(engine)
            .ok()
            .expect("sole engine owner")
            .close()
            .unwrap();
        let engine = Engine::open(self.dev.clone(), engine_options()).unwrap();
        // The full checks (engine: every node read and checked; schema) after every recovery.
        let rep = check::check(&engine, false, |_| {});
        assert!(
            rep.problems.is_empty(),
            "seed {}: fsck after a remount found {:?}",
            self.seed,
            rep.problems
        );
        self.fs = Fs::new(Arc::new(engine), fs_options(self.seed)).unwrap();
    }

    /// Looks a path up like the kernel would (counting lookups, then forgetting them).
    fn ino(&self, path: &[Vec<u8>]) -> Result<u64, Errno> {
        let mut cur = ROOT_INO;
        let mut seen = vec![];
        for c in path {
            let r = self.fs.lookup(cur, c);
            match r {
                Ok(i) => {
                    seen.push(i.ino);
                    cur = i.ino;
                }
                Err(e) => {
                    for s in seen.iter().rev() {
                        self.fs.forget(*s, 1);
                    }
                    return Err(e);
                }
            }
        }
        // Keep the lookups alive: callers forget via `release_path`.
        Ok(cur)
    }

    fn parent_ino(&self, path: &[Vec<u8>]) -> Result<u64, Errno> {
        self.ino(&path[..path.len() - 1])
    }

    fn check_all(&self, m: &Model, step: usize) {
        let seed = self.seed;
        // Walk both trees and compare names, kinds, sizes, contents, links and xattrs.
        let mut stack = vec![(ROOT, ROOT_INO, vec![])];
        while let Some((id, ino, path)) = stack.pop() {
            let got = self.fs.getattr(ino).unwrap();
            match &m.inodes[&id] {
                MInode::Dir { children } => {
                    assert_eq!(
                        got.kind,
                        Kind::Dir,
                        "seed {seed} step {step}: {path:?} kind"
                    );
                    let subdirs = children.values().filter(|c| m.is_dir(**c)).count() as u32;
                    assert_eq!(
                        got.nlink,
                        2 + subdirs,
                        "seed {seed} step {step}: {path:?} dir nlink"
                    );
                    let fh = self.fs.opendir(ino).unwrap();
                    let mut names = BTreeSet::new();
                    let mut offset = 0;
                    loop {
                        let mut batch = vec![];
                        self.fs
                            .readdir(ino, fh, offset, false, |e| {
                                // A consumer with room for six entries per call.
                                if batch.len() == 6 {
                                    return false;
                                }
                                batch.push(e.clone());
                                true
                            })
                            .unwrap();
                        if batch.is_empty() {
                            break;
                        }
                        offset = batch.last().unwrap().offset;
                        for e in batch {
                            if e.name != b"." && e.name != b".." {
                                assert!(
                                    names.insert(e.name.clone()),
                                    "seed {seed} step {step}: duplicate entry {:?}",
                                    e.name
                                );
                            }
                        }
                    }
                    self.fs.releasedir(fh);
                    let expect: BTreeSet<Vec<u8>> = children.keys().cloned().collect();
                    assert_eq!(
                        names, expect,
                        "seed {seed} step {step}: listing of {path:?}"
                    );
                    for (n, c) in children {
                        let child = self.fs.lookup(ino, n).unwrap();
                        let mut p = path.clone();
                        p.push(n.clone());
                        stack.push((*c, child.ino, p));
                    }
                }
                MInode::File { data, nlink } => {
                    assert_eq!(
                        got.kind,
                        Kind::File,
                        "seed {seed} step {step}: {path:?} kind"
                    );
                    assert_eq!(
                        got.size,
                        data.len() as u64,
                        "seed {seed} step {step}: {path:?} size"
                    );
                    assert_eq!(got.nlink, *nlink, "seed {seed} step {step}: {path:?} nlink");
                    let back = self.fs.read(ino, 0, data.len() as u32 + 10).unwrap();
                    assert!(
                        back == *data,
                        "seed {seed} step {step}: {path:?} contents differ"
                    );
                }
                MInode::Symlink { target } => {
                    assert_eq!(got.kind, Kind::Symlink);
                    assert_eq!(&self.fs.readlink(ino).unwrap(), target);
                }
            }
            let xa = m.xattrs.get(&id).cloned().unwrap_or_default();
            let list = self.fs.listxattr(ino).unwrap();
            let names: BTreeSet<Vec<u8>> = list
                .split(|&b| b == 0)
                .filter(|s| !s.is_empty())
                .map(|s| s.to_vec())
                .collect();
            assert_eq!(
                names,
                xa.keys().cloned().collect::<BTreeSet<_>>(),
                "seed {seed} step {step}: xattrs of {path:?}"
            );
            for (k, v) in xa {
                assert_eq!(self.fs.getxattr(ino, &k).unwrap(), v);
            }
        }
    }
}

fn fs_engine(fs: Fs) -> Arc<Engine> {
    let e = fs.engine().clone();
    drop(fs);
    e
}

fn run(seed: u64, steps: usize) {
    let mut h = Harness::new(seed);
    let mut m = Model::new();
    let mut rng = SmallRng::seed_from_u64(seed);
    let ctx = Ctx::default();
    for step in 0..steps {
        let paths = m.paths();
        let pick = |rng: &mut SmallRng| -> Option<Vec<Vec<u8>>> {
            if paths.is_empty() {
                None
            } else {
                Some(paths[rng.gen_range(0..paths.len())].clone())
            }
        };
        let dirs: Vec<Vec<Vec<u8>>> = std::iter::once(vec![])
            .chain(
                paths
                    .iter()
                    .filter(|p| m.is_dir(m.resolve(p).unwrap()))
                    .cloned(),
            )
            .collect();
        let some_dir = |rng: &mut SmallRng| dirs[rng.gen_range(0..dirs.len())].clone();
        let r = rng.gen_range(0..106);
        let what = format!("seed {seed} step {step} op {r}");
        match r {
            0..=14 => {
                // Create a file or directory (or symlink) under a random directory.
                let mut p = some_dir(&mut rng);
                let n = name(&mut rng);
                p.push(n.clone());
                let pid = m.resolve(&p[..p.len() - 1]).unwrap();
                let exists = m.children(pid).contains_key(&n);
                let parent = h.parent_ino(&p).unwrap();
                let kind = rng.gen_range(0..10);
                let res = if kind < 6 {
                    h.fs.create(parent, &n, 0o644, libc::O_RDWR, ctx)
                        .map(|(i, fh)| {
                            h.fs.release(i.ino, fh).unwrap();
                            i
                        })
                } else if kind < 9 {
                    h.fs.mkdir(parent, &n, 0o755, ctx)
                } else {
                    h.fs.symlink(parent, &n, b"../target", ctx)
                };
                if exists {
                    assert_eq!(res.unwrap_err(), Errno::EEXIST, "{what}");
                } else {
                    res.unwrap_or_else(|e| panic!("{what}: create {p:?}: {e}"));
                    let id = m.next;
                    m.next += 1;
                    let node = match kind {
                        0..=5 => MInode::File {
                            data: vec![],
                            nlink: 1,
                        },
                        6..=8 => MInode::Dir {
                            children: BTreeMap::new(),
                        },
                        _ => MInode::Symlink {
                            target: b"../target".to_vec(),
                        },
                    };
                    m.inodes.insert(id, node);
                    m.children_mut(pid).insert(n, id);
                }
            }
            15..=39 => {
                // Write, truncate or punch a file.
                let Some(p) = pick(&mut rng) else { continue };
                let id = m.resolve(&p).unwrap();
                let MInode::File { data, .. } = m.inodes.get_mut(&id).unwrap() else {
                    continue;
                };
                let ino = h.ino(&p).unwrap();
                match rng.gen_range(0..6) {
                    0..=3 => {
                        let off = if rng.gen_bool(0.3) {
                            data.len() as u64
                        } else {
                            rng.gen_range(0..20_000)
                        };
                        let len = if rng.gen_bool(0.2) {
                            rng.gen_range(4000..9000)
                        } else {
                            rng.gen_range(1..300)
                        };
                        let b: u8 = rng.gen();
                        let buf: Vec<u8> = (0..len).map(|i| b.wrapping_add(i as u8)).collect();
                        let fh = h.fs.open(ino, libc::O_RDWR, ctx).unwrap();
                        assert_eq!(
                            h.fs.write(ino, fh, off, &buf, false).unwrap(),
                            buf.len(),
                            "{what}"
                        );
                        h.fs.release(ino, fh).unwrap();
                        let end = off as usize + buf.len();
                        if data.len() < end {
                            data.resize(end, 0);
                        }
                        data[off as usize..end].copy_from_slice(&buf);
                    }
                    4 => {
                        let size = rng.gen_range(0..16_000u64);
                        h.fs.setattr(
                            ino,
                            &SetAttr {
                                size: Some(size),
                                ..SetAttr::default()
                            },
                            ctx,
                        )
                        .unwrap();
                        data.resize(size as usize, 0);
                    }
                    _ => {
                        let off = rng.gen_range(0..12_000u64);
                        let len = rng.gen_range(1..9000u64);
                        // Punch, zero range (with or without keeping the size), reserve
                        // (mode 0 or keeping the size).
                        use amaranth_fs::{
                            FALLOC_FL_KEEP_SIZE as KEEP, FALLOC_FL_PUNCH_HOLE as PUNCH,
                            FALLOC_FL_ZERO_RANGE as ZERO,
                        };
                        let mode = [PUNCH | KEEP, ZERO, ZERO | KEEP, 0, KEEP][rng.gen_range(0..5)];
                        // Reservations far apart (a file keeps a few reserved ranges).
                        let off = if rng.gen_bool(0.5) {
                            rng.gen_range(0..400_000u64)
                        } else {
                            off
                        };
                        h.fs.fallocate(ino, off, len, mode)
                            .unwrap_or_else(|e| panic!("{what}: fallocate: {e}"));
                        if mode & (PUNCH | ZERO) != 0 {
                            let end = ((off + len) as usize).min(data.len());
                            if (off as usize) < end {
                                data[off as usize..end].fill(0);
                            }
                        }
                        if mode & KEEP == 0 && data.len() < (off + len) as usize {
                            data.resize((off + len) as usize, 0);
                        }
                    }
                }
            }
            40..=49 => {
                // Unlink or rmdir.
                let Some(p) = pick(&mut rng) else { continue };
                let id = m.resolve(&p).unwrap();
                let parent = h.parent_ino(&p).unwrap();
                let pid = m.resolve(&p[..p.len() - 1]).unwrap();
                let n = p.last().unwrap().clone();
                if m.is_dir(id) {
                    let res = h.fs.rmdir(parent, &n);
                    if m.children(id).is_empty() {
                        res.unwrap_or_else(|e| panic!("{what}: rmdir {p:?}: {e}"));
                        m.children_mut(pid).remove(&n);
                        m.drop_name(id);
                    } else {
                        assert_eq!(res.unwrap_err(), Errno::ENOTEMPTY, "{what}");
                    }
                } else {
                    h.fs.unlink(parent, &n)
                        .unwrap_or_else(|e| panic!("{what}: unlink {p:?}: {e}"));
                    m.children_mut(pid).remove(&n);
                    m.drop_name(id);
                }
            }
            50..=64 => {
                // Rename (sometimes NOREPLACE or EXCHANGE).
                let Some(src) = pick(&mut rng) else { continue };
                let mut dst = if rng.gen_bool(0.5) {
                    some_dir(&mut rng)
                } else {
                    pick(&mut rng).unwrap()[..].to_vec()
                };
                if rng.gen_bool(0.6) || dst.is_empty() {
                    dst.push(name(&mut rng));
                } else {
                    // Rename onto an existing path.
                }
                let flags = match rng.gen_range(0..10) {
                    0 => RENAME_NOREPLACE,
                    1 => RENAME_EXCHANGE,
                    _ => 0,
                };
                let sid = m.resolve(&src).unwrap();
                let Some(dpid) = m.resolve(&dst[..dst.len() - 1]) else {
                    continue;
                };
                if !m.is_dir(dpid) {
                    continue;
                }
                let spid = m.resolve(&src[..src.len() - 1]).unwrap();
                let (sn, dn) = (src.last().unwrap().clone(), dst.last().unwrap().clone());
                let did = m.children(dpid).get(&dn).copied();
                let sp = h.parent_ino(&src).unwrap();
                let dp = h.parent_ino(&dst).unwrap();
                let res = h.fs.rename(sp, &sn, dp, &dn, flags);
                // Expected outcome.
                let into_self = m.is_dir(sid) && dst.starts_with(&src) && dst.len() > src.len();
                let same = src == dst;
                // The order of checks follows Linux's do_renameat2.
                let expect: Result<(), Errno> = if same {
                    Ok(())
                } else if flags == RENAME_NOREPLACE && did.is_some() {
                    Err(Errno::EEXIST)
                } else if flags == RENAME_EXCHANGE && did.is_none() {
                    Err(Errno::ENOENT)
                } else if into_self {
                    Err(Errno::EINVAL)
                } else if flags == RENAME_EXCHANGE {
                    match did {
                        None => Err(Errno::ENOENT),
                        Some(d)
                            if m.is_dir(d) && src.starts_with(&dst) && src.len() > dst.len() =>
                        {
                            Err(Errno::EINVAL)
                        }
                        Some(_) => Ok(()),
                    }
                } else if let Some(d) = did {
                    if d == sid {
                        Ok(())
                    } else if m.is_dir(sid) && !m.is_dir(d) {
                        Err(Errno::ENOTDIR)
                    } else if !m.is_dir(sid) && m.is_dir(d) {
                        Err(Errno::EISDIR)
                    } else if m.is_dir(d) && !m.children(d).is_empty() {
                        Err(Errno::ENOTEMPTY)
                    } else {
                        Ok(())
                    }
                } else {
                    Ok(())
                };
                match (&expect, &res) {
                    (Ok(()), Ok(())) => {}
                    (Err(a), Err(b)) if a == b => {}
                    _ => panic!("{what}: rename {src:?} -> {dst:?} flags {flags}: expected {expect:?}, got {res:?}"),
                }
                if res.is_ok() && !same && did != Some(sid) {
                    if flags == RENAME_EXCHANGE {
                        let d = did.unwrap();
                        m.children_mut(spid).insert(sn, d);
                        m.children_mut(dpid).insert(dn, sid);
                    } else {
                        m.children_mut(spid).remove(&sn);
                        if let Some(d) = m.children_mut(dpid).insert(dn, sid) {
                            m.drop_name(d);
                        }
                    }
                }
            }
            65..=71 => {
                // Hard link a file.
                let Some(p) = pick(&mut rng) else { continue };
                let id = m.resolve(&p).unwrap();
                if !matches!(m.inodes[&id], MInode::File { .. }) {
                    continue;
                }
                let mut q = some_dir(&mut rng);
                let n = name(&mut rng);
                q.push(n.clone());
                let qpid = m.resolve(&q[..q.len() - 1]).unwrap();
                let ino = h.ino(&p).unwrap();
                let qp = h.parent_ino(&q).unwrap();
                let res = h.fs.link(ino, qp, &n);
                if m.children(qpid).contains_key(&n) {
                    assert_eq!(res.unwrap_err(), Errno::EEXIST, "{what}");
                } else {
                    res.unwrap_or_else(|e| panic!("{what}: link: {e}"));
                    m.children_mut(qpid).insert(n, id);
                    if let MInode::File { nlink, .. } = m.inodes.get_mut(&id).unwrap() {
                        *nlink += 1;
                    }
                }
            }
            72..=79 => {
                // Extended attributes.
                let Some(p) = pick(&mut rng).or(Some(vec![])) else {
                    continue;
                };
                let id = m.resolve(&p).unwrap();
                let ino = h.ino(&p).unwrap();
                let key = format!("user.k{}", rng.gen_range(0..4)).into_bytes();
                let xa = m.xattrs.entry(id).or_default();
                if rng.gen_bool(0.7) {
                    let v: Vec<u8> = (0..rng.gen_range(0..200)).map(|_| rng.gen()).collect();
                    h.fs.setxattr(ino, &key, &v, 0).unwrap();
                    xa.insert(key, v);
                } else {
                    let res = h.fs.removexattr(ino, &key);
                    if xa.remove(&key).is_some() {
                        res.unwrap();
                    } else {
                        assert_eq!(res.unwrap_err(), Errno::ENODATA);
                    }
                }
            }
            80..=84 => {
                // Copy a file range into another file.
                let files: Vec<_> = paths
                    .iter()
                    .filter(|p| matches!(m.inodes[&m.resolve(p).unwrap()], MInode::File { .. }))
                    .cloned()
                    .collect();
                if files.len() < 2 {
                    continue;
                }
                let a = files[rng.gen_range(0..files.len())].clone();
                let b = files[rng.gen_range(0..files.len())].clone();
                let (ia, ib) = (m.resolve(&a).unwrap(), m.resolve(&b).unwrap());
                if ia == ib {
                    continue;
                }
                let aligned = rng.gen_bool(0.5);
                let (off_in, off_out) = if aligned {
                    (rng.gen_range(0..3) * 4096, rng.gen_range(0..3) * 4096)
                } else {
                    (rng.gen_range(0..9000), rng.gen_range(0..9000))
                };
                let len = if aligned {
                    rng.gen_range(1..4) * 4096
                } else {
                    rng.gen_range(1..7000)
                };
                let (ina, inb) = (h.ino(&a).unwrap(), h.ino(&b).unwrap());
                let n =
                    h.fs.copy_file_range(ina, off_in, inb, off_out, len)
                        .unwrap_or_else(|e| panic!("{what}: copy: {e}"));
                let src = match &m.inodes[&ia] {
                    MInode::File { data, .. } => data.clone(),
                    _ => unreachable!(),
                };
                let avail = src.len().saturating_sub(off_in as usize).min(len as usize);
                assert_eq!(n, avail as u64, "{what}: copied length");
                if avail > 0 {
                    if let MInode::File { data, .. } = m.inodes.get_mut(&ib).unwrap() {
                        let end = off_out as usize + avail;
                        if data.len() < end {
                            data.resize(end, 0);
                        }
                        data[off_out as usize..end]
                            .copy_from_slice(&src[off_in as usize..off_in as usize + avail]);
                    }
                }
            }
            85..=89 => {
                // Read a random range.
                let Some(p) = pick(&mut rng) else { continue };
                let id = m.resolve(&p).unwrap();
                let MInode::File { data, .. } = &m.inodes[&id] else {
                    continue;
                };
                let ino = h.ino(&p).unwrap();
                let off = rng.gen_range(0..data.len() as u64 + 100);
                let size = rng.gen_range(0..10_000u32);
                let got = h.fs.read(ino, off, size).unwrap();
                let s = (off as usize).min(data.len());
                let e = (off as usize + size as usize).min(data.len());
                assert!(got == data[s..e], "{what}: read {p:?} at {off}+{size}");
                // The same read into a transport's buffer (dirty, to see holes zero-filled).
                let mut slice = vec![0xa5u8; size as usize];
                let n = h.fs.read_to_slice(ino, off, &mut slice).unwrap();
                assert!(
                    slice[..n] == data[s..e],
                    "{what}: read_to_slice {p:?} at {off}+{size}"
                );
                // SEEK_DATA never lands past the end; SEEK_HOLE never inside written data.
                if off < data.len() as u64 {
                    if let Ok(hole) = h.fs.lseek(ino, off, libc::SEEK_HOLE) {
                        assert!(
                            hole >= off && hole <= data.len() as u64,
                            "{what}: SEEK_HOLE {hole}"
                        );
                    }
                }
            }
            90..=93 => h.remount(),
            100..=105 => {
                // Clone a directory tree or a file to a new name.
                let Some(src) = pick(&mut rng) else { continue };
                let mut dst = some_dir(&mut rng);
                let n = name(&mut rng);
                dst.push(n.clone());
                let sid = m.resolve(&src).unwrap();
                let dpid = m.resolve(&dst[..dst.len() - 1]).unwrap();
                let expect = match &m.inodes[&sid] {
                    MInode::Symlink { .. } => Err(Errno::EINVAL),
                    MInode::Dir { .. } if dst[..dst.len() - 1].starts_with(&src) => {
                        Err(Errno::EINVAL)
                    }
                    _ if m.children(dpid).contains_key(&n) => Err(Errno::EEXIST),
                    _ => Ok(()),
                };
                let (si, dp) = (h.ino(&src).unwrap(), h.parent_ino(&dst).unwrap());
                let res = h.fs.clone_entry(si, dp, &n, &Caller::root());
                match (&expect, &res) {
                    (Ok(()), Ok(_)) => {
                        let copy = m.deep_copy(sid);
                        m.children_mut(dpid).insert(n, copy);
                    }
                    (Err(a), Err(b)) if a == b => {}
                    // A deep tree cloned deeper: refused whole, nothing changed.
                    (Ok(()), Err(Errno::ENAMETOOLONG)) => {}
                    _ => {
                        panic!("{what}: clone {src:?} -> {dst:?}: expected {expect:?}, got {res:?}")
                    }
                }
            }
            _ => {
                if step % 3 == 0 {
                    h.check_all(&m, step);
                }
            }
        }
        if step % 150 == 149 {
            // Counters and block counts too (fsck), not only at the end. Files unlinked while the
            // harness still holds them are orphans to fsck (deleted at their last FORGET or at
            // the end of the session), and they still count: the counter must be exact.
            let rep = check::check(h.fs.engine(), false, |_| {});
            assert!(
                rep.problems
                    .iter()
                    .all(|p| p.class == check::Class::OrphanInode),
                "seed {seed} step {step}: fsck found {:?}",
                rep.problems
            );
        }
    }
    h.check_all(&m, steps);
    // The harness never forgets its lookups, so every unlinked file is still held (parked):
    // fsck sees them as files unlinked while in use until the session ends.
    let rep = check::check(h.fs.engine(), false, |_| {});
    assert!(
        rep.problems
            .iter()
            .all(|p| p.class == check::Class::OrphanInode),
        "seed {seed}: fsck found {:?}",
        rep.problems
    );
    h.fs.end_session().unwrap();
    let rep = check::check(h.fs.engine(), false, |_| {});
    assert!(
        rep.problems.is_empty(),
        "seed {seed}: fsck found {:?}",
        rep.problems
    );
    h.remount();
    h.check_all(&m, steps + 1);
}

#[test]
fn random_file_system_sequences_match_the_model() {
    let n: u64 = std::env::var("AMARANTH_FS_MODEL_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    // `make fuzz-fs` runs many more seeds from a base of its own.
    let base: u64 = std::env::var("AMARANTH_SEED_BASE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0xf5_0000);
    for i in 0..n {
        let seed = base + i;
        eprintln!("fs model seed {seed}");
        run(seed, 600);
    }
}

#[test]
fn replay() {
    if let Some(seed) = std::env::var("AMARANTH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        run(
            seed,
            std::env::var("AMARANTH_STEPS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(600),
        );
    }
}
