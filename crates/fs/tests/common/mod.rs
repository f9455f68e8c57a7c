//! Power-cut simulation through the whole file system (the operation layer, without the kernel).
//!
//! A workload runs on an [`Fs`] over a [`FaultDevice`]. After each operation the harness records
//! the device trace position and a snapshot of the whole tree (the reference state after that
//! prefix of operations). Then, for every flush and many points in between, it rebuilds the image a
//! power cut would have left (nothing, everything, or a random torn subset of the unflushed writes),
//! mounts it, runs the checker, and compares the tree with the references. The executable guarantee:
//! the recovered tree equals the state after some prefix of the operations, and that prefix includes
//! every operation completed before a completed sync.

#![allow(dead_code)]

pub mod pg;

use std::collections::BTreeMap;
use std::sync::Arc;

use amaranth_device::{CrashPlan, FaultDevice, MemDevice};
use amaranth_engine::{Engine, Format, Options};
use amaranth_fs::check::{self, Class};
use amaranth_fs::{Caller, Ctx, Errno, Fs, FsOptions, Kind, SetAttr, RENAME_EXCHANGE, ROOT_INO};

/// Everything visible about one name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub kind: Kind,
    pub perm: u16,
    pub size: u64,
    pub nlink: u32,
    pub ino_group: u64,
    pub data: Vec<u8>,
    pub target: Vec<u8>,
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

/// The whole tree: path → what is seen there. Hard links are compared by grouping (names sharing an
/// inode get the same `ino_group`: the smallest path index among them), since inode numbers may
/// legitimately differ between runs.
pub type Snapshot = BTreeMap<Vec<Vec<u8>>, Seen>;

pub fn format() -> Format {
    Format {
        max_key_len: 1024,
        max_value_len: 4096 + 64,
        partition_size: 8 << 10,
        node_size: 32 << 10,
        ..Format::small_for_tests()
    }
}

/// The crash format with a 12 MiB log: its largest record (1.5 MiB) holds a 1 MiB request, and
/// it wraps (with checkpoints) within a few such requests. Its images are 52 MiB: the log must
/// fit in the first quarter of the device (the first backup superblock follows it).
pub fn twelve_mib_log() -> Format {
    Format {
        log_size: Some(12 << 20),
        ..format()
    }
}

pub fn engine_options() -> Options {
    Options {
        cache_size: 256 << 10,
        background_threads: false,
        check_invariants: true,
        ..Options::default()
    }
}

/// Closes the engine of `fs` (nobody else may hold either), opens the image on `dev` read-only
/// and asserts that the checker finds nothing (`what` says which run failed).
pub fn close_and_check(fs: Arc<Fs>, dev: Arc<MemDevice>, what: &str) {
    let report = check::close_and_check(fs, dev, engine_options());
    assert_eq!(report.exit_code(), 0, "{what}: checker: {report:?}");
}

/// Makes directories `d0`, `d1`, ... in the root; returns their inode numbers.
pub fn root_dirs(fs: &Fs, n: usize) -> Vec<u64> {
    (0..n)
        .map(|d| {
            fs.mkdir(ROOT_INO, format!("d{d}").as_bytes(), 0o755, Ctx::default())
                .unwrap()
                .ino
        })
        .collect()
}

/// Drops `fs` and closes its engine (which nothing else may still hold).
pub fn close_engine(fs: Fs) {
    let engine = fs.engine().clone();
    drop(fs);
    Arc::try_unwrap(engine)
        .unwrap_or_else(|_| panic!("engine still shared"))
        .close()
        .unwrap();
}

/// The test options: no reserve, no access times, and every rename's ranges moved by tree
/// surgery (the default crossover would copy all of this format's small ranges).
/// A new file system on a 64 MiB memory device.
pub fn new_mem_fs() -> (Arc<MemDevice>, Fs) {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let engine = Engine::create(dev.clone(), format(), engine_options()).unwrap();
    Fs::mkfs(&engine, 0, 0).unwrap();
    (dev, Fs::new(Arc::new(engine), fs_options()).unwrap())
}

/// Creates `name` in `dir` holding `data`; the creation's lookup stays held (as the kernel's).
pub fn held_file(fs: &Fs, dir: u64, name: impl AsRef<[u8]>, data: &[u8]) -> u64 {
    let (i, fh) = fs
        .create(dir, name.as_ref(), 0o644, libc::O_RDWR, Ctx::default())
        .unwrap();
    fs.write(i.ino, fh, 0, data, false).unwrap();
    fs.release(i.ino, fh).unwrap();
    i.ino
}

/// Sets the size of `ino` (truncating or extending with zeros).
pub fn set_size(fs: &Fs, ino: u64, size: u64) {
    let a = SetAttr {
        size: Some(size),
        ..Default::default()
    };
    fs.setattr(ino, &a, Ctx::default()).unwrap();
}

/// The classes of the problems fsck finds in the mounted file system.
pub fn problem_classes(fs: &Fs) -> Vec<Class> {
    check::check(fs.engine(), false, |_| {})
        .problems
        .into_iter()
        .map(|p| p.class)
        .collect()
}

pub fn fs_options() -> FsOptions {
    FsOptions {
        reserve_bytes: 0,
        relatime: false,
        rename_copy_max: 0,
        ..FsOptions::default()
    }
}

/// Walks the tree through the file-system API (as a user would through the mount).
pub fn snapshot(fs: &Fs) -> Snapshot {
    let mut out = Snapshot::new();
    let mut inos: BTreeMap<u64, u64> = BTreeMap::new();
    let mut stack: Vec<(u64, Vec<Vec<u8>>)> = vec![(ROOT_INO, vec![])];
    let mut counter = 0u64;
    let mut looked_up = Vec::new();
    while let Some((ino, path)) = stack.pop() {
        let fh = fs.opendir(ino).expect("opendir");
        let mut names = Vec::new();
        let mut offset = 0;
        loop {
            let before = names.len();
            let mut last = offset;
            fs.readdir(ino, fh, offset, false, |e| {
                last = e.offset;
                if e.name != b"." && e.name != b".." {
                    names.push(e.name.clone());
                }
                true
            })
            .expect("readdir");
            if last == offset || (names.len() == before && offset >= 2) {
                break;
            }
            offset = last;
        }
        fs.releasedir(fh);
        for name in names {
            let a = fs.lookup(ino, &name).expect("lookup of a listed name");
            let mut p = path.clone();
            p.push(name.clone());
            let data = if a.kind == Kind::File {
                fs.read(a.ino, 0, a.size as u32 + 1).expect("read")
            } else {
                vec![]
            };
            let target = if a.kind == Kind::Symlink {
                fs.readlink(a.ino).expect("readlink")
            } else {
                vec![]
            };
            let list = fs.listxattr(a.ino).expect("listxattr");
            let mut xattrs = BTreeMap::new();
            for n in list.split(|&b| b == 0).filter(|s| !s.is_empty()) {
                xattrs.insert(n.to_vec(), fs.getxattr(a.ino, n).expect("getxattr"));
            }
            counter += 1;
            let group = *inos.entry(a.ino).or_insert(counter);
            out.insert(
                p.clone(),
                Seen {
                    kind: a.kind,
                    perm: a.perm,
                    size: a.size,
                    nlink: a.nlink,
                    ino_group: group,
                    data,
                    target,
                    xattrs,
                },
            );
            if a.kind == Kind::Dir {
                stack.push((a.ino, p));
            }
            looked_up.push(a.ino);
        }
    }
    for ino in looked_up.into_iter().rev() {
        fs.forget(ino, 1);
    }
    out
}

/// Writes all of `data` at `offset`, calling again after a short count as an application does
/// (a request larger than one log record is written in part).
pub fn write_all(fs: &Fs, ino: u64, fh: u64, offset: u64, data: &[u8]) -> Result<(), Errno> {
    let mut done = 0;
    while done < data.len() {
        let n = fs.write(ino, fh, offset + done as u64, &data[done..], false)?;
        assert!(n > 0, "a write made no progress");
        done += n;
    }
    Ok(())
}

/// Normalizes link groups so that snapshots from different runs compare: each group is renamed to
/// the first path (in order) that holds it.
pub fn normalize(s: &Snapshot) -> Snapshot {
    let mut first: BTreeMap<u64, u64> = BTreeMap::new();
    let mut out = Snapshot::new();
    for (i, (p, seen)) in s.iter().enumerate() {
        let g = *first.entry(seen.ino_group).or_insert(i as u64);
        let mut v = seen.clone();
        v.ino_group = g;
        out.insert(p.clone(), v);
    }
    out
}

/// A file-system operation of a crash workload.
#[derive(Clone, Debug)]
pub enum FsOp {
    Creat(&'static str),
    Mkdir(&'static str),
    Write {
        path: &'static str,
        offset: u64,
        len: usize,
        fill: u8,
    },
    Append {
        path: &'static str,
        len: usize,
        fill: u8,
    },
    Falloc {
        path: &'static str,
        offset: u64,
        len: u64,
        keep: bool,
    },
    Punch {
        path: &'static str,
        offset: u64,
        len: u64,
    },
    Truncate {
        path: &'static str,
        size: u64,
    },
    Link(&'static str, &'static str),
    Unlink(&'static str),
    Rmdir(&'static str),
    Rename(&'static str, &'static str),
    Exchange(&'static str, &'static str),
    Symlink(&'static str, &'static str),
    SetXattr {
        path: &'static str,
        name: &'static str,
        len: usize,
    },
    RemoveXattr {
        path: &'static str,
        name: &'static str,
    },
    Chmod {
        path: &'static str,
        mode: u32,
    },
    /// One `copy_file_range` call (it may copy less than asked: the count is the operation).
    Copy {
        from: &'static str,
        off_in: u64,
        to: &'static str,
        off_out: u64,
        len: u64,
    },
    /// `amaranth clone SRC DST` (as root): a directory tree or a file cloned to a new name.
    CloneTree(&'static str, &'static str),
    /// fsync, fdatasync, fsyncdir and syncfs are one call at this layer: the engine's `sync`.
    Sync,
    /// An engine checkpoint (what the daemon does every minute): crash windows inside checkpoints.
    Checkpoint,
}

fn split(path: &str) -> Vec<Vec<u8>> {
    path.split('/')
        .filter(|s| !s.is_empty())
        .map(|s| s.as_bytes().to_vec())
        .collect()
}

/// Resolves a path to (parent ino, name) and the inode if it exists. Every inode looked up is
/// added to `held`: the caller forgets them once its operation is done (the table drops an inode
/// the kernel no longer knows, so forgetting the parent before using it would make the operation
/// fail with `ENOENT`, as it did in this harness before).
fn resolve(fs: &Fs, path: &str, held: &mut Vec<u64>) -> Result<(u64, Vec<u8>, Option<u64>), Errno> {
    let comps = split(path);
    let mut cur = ROOT_INO;
    for c in &comps[..comps.len() - 1] {
        let a = fs.lookup(cur, c)?;
        held.push(a.ino);
        cur = a.ino;
    }
    let last = comps.last().expect("non-empty path").clone();
    let target = fs.lookup(cur, &last).ok().map(|a| {
        held.push(a.ino);
        a.ino
    });
    Ok((cur, last, target))
}

/// Applies an operation; errors (EEXIST, ENOENT...) are part of the workload and ignored.
pub fn apply(fs: &Fs, op: &FsOp) {
    let ctx = Ctx::default();
    let mut held = Vec::new();
    let _ = (|| -> Result<(), Errno> {
        match op {
            FsOp::Creat(p) => {
                let (d, n, _) = resolve(fs, p, &mut held)?;
                let (a, fh) = fs.create(d, &n, 0o644, libc::O_RDWR, ctx)?;
                fs.release(a.ino, fh)?;
                fs.forget(a.ino, 1);
            }
            FsOp::Mkdir(p) => {
                let (d, n, _) = resolve(fs, p, &mut held)?;
                let a = fs.mkdir(d, &n, 0o755, ctx)?;
                fs.forget(a.ino, 1);
            }
            FsOp::Write {
                path,
                offset,
                len,
                fill,
            } => {
                let (_, _, Some(i)) = resolve(fs, path, &mut held)? else {
                    return Err(Errno::ENOENT);
                };
                let fh = fs.open(i, libc::O_RDWR, ctx)?;
                let data: Vec<u8> = (0..*len).map(|k| fill.wrapping_add(k as u8)).collect();
                let r = fs.write(i, fh, *offset, &data, false);
                fs.release(i, fh)?;
                r?;
            }
            FsOp::Append { path, len, fill } => {
                let (_, _, Some(i)) = resolve(fs, path, &mut held)? else {
                    return Err(Errno::ENOENT);
                };
                let fh = fs.open(i, libc::O_RDWR | libc::O_APPEND, ctx)?;
                let data = vec![*fill; *len];
                let r = fs.write(i, fh, 0, &data, false);
                fs.release(i, fh)?;
                r?;
            }
            FsOp::Falloc {
                path,
                offset,
                len,
                keep,
            } => {
                let (_, _, Some(i)) = resolve(fs, path, &mut held)? else {
                    return Err(Errno::ENOENT);
                };
                fs.fallocate(
                    i,
                    *offset,
                    *len,
                    if *keep {
                        amaranth_fs::FALLOC_FL_KEEP_SIZE
                    } else {
                        0
                    },
                )?;
            }
            FsOp::Punch { path, offset, len } => {
                let (_, _, Some(i)) = resolve(fs, path, &mut held)? else {
                    return Err(Errno::ENOENT);
                };
                fs.fallocate(
                    i,
                    *offset,
                    *len,
                    amaranth_fs::FALLOC_FL_PUNCH_HOLE | amaranth_fs::FALLOC_FL_KEEP_SIZE,
                )?;
            }
            FsOp::Truncate { path, size } => {
                let (_, _, Some(i)) = resolve(fs, path, &mut held)? else {
                    return Err(Errno::ENOENT);
                };
                fs.setattr(
                    i,
                    &SetAttr {
                        size: Some(*size),
                        ..SetAttr::default()
                    },
                    ctx,
                )?;
            }
            FsOp::Link(a, b) => {
                let (_, _, Some(i)) = resolve(fs, a, &mut held)? else {
                    return Err(Errno::ENOENT);
                };
                let (d, n, _) = resolve(fs, b, &mut held)?;
                let r = fs.link(i, d, &n)?;
                fs.forget(r.ino, 1);
            }
            FsOp::Unlink(p) => {
                let (d, n, _) = resolve(fs, p, &mut held)?;
                fs.unlink(d, &n)?;
            }
            FsOp::Rmdir(p) => {
                let (d, n, _) = resolve(fs, p, &mut held)?;
                fs.rmdir(d, &n)?;
            }
            FsOp::Rename(a, b) | FsOp::Exchange(a, b) => {
                let (da, na, _) = resolve(fs, a, &mut held)?;
                let (db, nb, _) = resolve(fs, b, &mut held)?;
                let flags = if matches!(op, FsOp::Exchange(..)) {
                    RENAME_EXCHANGE
                } else {
                    0
                };
                fs.rename(da, &na, db, &nb, flags)?;
            }
            FsOp::Symlink(target, p) => {
                let (d, n, _) = resolve(fs, p, &mut held)?;
                let a = fs.symlink(d, &n, target.as_bytes(), ctx)?;
                fs.forget(a.ino, 1);
            }
            FsOp::SetXattr { path, name, len } => {
                let (_, _, Some(i)) = resolve(fs, path, &mut held)? else {
                    return Err(Errno::ENOENT);
                };
                fs.setxattr(i, name.as_bytes(), &vec![b'v'; *len], 0)?;
            }
            FsOp::RemoveXattr { path, name } => {
                let (_, _, Some(i)) = resolve(fs, path, &mut held)? else {
                    return Err(Errno::ENOENT);
                };
                fs.removexattr(i, name.as_bytes())?;
            }
            FsOp::Chmod { path, mode } => {
                let (_, _, Some(i)) = resolve(fs, path, &mut held)? else {
                    return Err(Errno::ENOENT);
                };
                fs.setattr(
                    i,
                    &SetAttr {
                        mode: Some(*mode),
                        ..SetAttr::default()
                    },
                    ctx,
                )?;
            }
            FsOp::Copy {
                from,
                off_in,
                to,
                off_out,
                len,
            } => {
                let (_, _, Some(i)) = resolve(fs, from, &mut held)? else {
                    return Err(Errno::ENOENT);
                };
                let (_, _, Some(o)) = resolve(fs, to, &mut held)? else {
                    return Err(Errno::ENOENT);
                };
                fs.copy_file_range(i, *off_in, o, *off_out, *len)?;
            }
            FsOp::CloneTree(from, to) => {
                let (_, _, Some(i)) = resolve(fs, from, &mut held)? else {
                    return Err(Errno::ENOENT);
                };
                let (d, n, _) = resolve(fs, to, &mut held)?;
                fs.clone_entry(i, d, &n, &Caller::root())?;
            }
            FsOp::Sync => fs.fsync()?,
            FsOp::Checkpoint => fs.engine().checkpoint().map_err(Errno::from)?,
        }
        Ok(())
    })();
    for ino in held {
        fs.forget(ino, 1);
    }
}

/// The starting tree of every ACE-style workload: two directories with a few files in each.
pub fn setup_ops() -> Vec<FsOp> {
    vec![
        FsOp::Mkdir("A"),
        FsOp::Mkdir("B"),
        FsOp::Mkdir("A/C"),
        FsOp::Creat("A/foo"),
        FsOp::Write {
            path: "A/foo",
            offset: 0,
            len: 9000,
            fill: 1,
        },
        FsOp::Creat("B/bar"),
        FsOp::Write {
            path: "B/bar",
            offset: 0,
            len: 100,
            fill: 2,
        },
        FsOp::Creat("A/C/baz"),
        FsOp::SetXattr {
            path: "A/foo",
            name: "user.a",
            len: 20,
        },
        FsOp::Sync,
    ]
}

/// The recorded run of a workload.
pub struct Run {
    pub dev: Arc<FaultDevice>,
    /// Normalized snapshot after each prefix of the workload's operations (index = count).
    pub states: Vec<Snapshot>,
    /// (trace position right after a completed sync, operations completed before it).
    pub syncs: Vec<(usize, usize)>,
    /// Trace position after each operation.
    pub after_op: Vec<usize>,
    /// Range clones the workload made by surgery (whole files copied into empty ones).
    pub clones: u64,
}

/// Runs `ops` (after the setup) and records everything needed to judge crash states.
pub fn record(ops: &[FsOp]) -> Run {
    record_with(ops, format(), 16 << 20)
}

/// [`record`] on an image of `dev_bytes` bytes with format `f`.
pub fn record_with(ops: &[FsOp], f: Format, dev_bytes: u64) -> Run {
    let dev = Arc::new(FaultDevice::new(dev_bytes));
    let engine = Engine::create(dev.clone(), f, engine_options()).expect("create");
    Fs::mkfs(&engine, 0, 0).expect("mkfs");
    let fs = Fs::new(Arc::new(engine), fs_options()).expect("mount");
    for op in setup_ops() {
        apply(&fs, &op);
    }
    fs.fsync().expect("sync");
    // Operations' errors are part of workloads: make sure the starting tree is really there.
    let start = snapshot(&fs);
    for (path, size) in [("A/foo", 9000), ("B/bar", 100), ("A/C/baz", 0)] {
        let p: Vec<Vec<u8>> = path.split('/').map(|c| c.as_bytes().to_vec()).collect();
        assert_eq!(start.get(&p).map(|s| s.size), Some(size), "setup: {path}");
    }
    dev.restart_recording();
    let mut states = vec![normalize(&snapshot(&fs))];
    let mut syncs = vec![(0, 0)];
    let mut after_op = vec![0];
    for (i, op) in ops.iter().enumerate() {
        apply(&fs, op);
        if matches!(op, FsOp::Sync) {
            syncs.push((dev.trace_len(), i + 1));
        }
        after_op.push(dev.trace_len());
        states.push(normalize(&snapshot(&fs)));
    }
    let clones = fs.engine().stats().range_clones;
    drop(fs);
    Run {
        dev,
        states,
        syncs,
        after_op,
        clones,
    }
}

/// Opens the image `img` a power cut left with `engine` options, checks it (no problem but orphan
/// inodes, files unlinked while open that the next mount deletes) and mounts it with `fs`: the
/// tree it holds, normalized. Panics, naming `what`, if any step fails.
pub fn recovered_tree(img: Vec<u8>, engine: Options, fs: FsOptions, what: &str) -> Snapshot {
    let engine = Engine::open(Arc::new(MemDevice::from_bytes(img)), engine)
        .unwrap_or_else(|e| panic!("{what}: the engine does not recover: {e}"));
    let rep = check::check(&engine, false, |_| {});
    let bad: Vec<_> = rep
        .problems
        .iter()
        .filter(|p| p.class != Class::OrphanInode)
        .collect();
    assert!(bad.is_empty(), "{what}: fsck after the crash: {bad:?}");
    let fs = Fs::new(Arc::new(engine), fs)
        .unwrap_or_else(|e| panic!("{what}: mount after the crash: {e}"));
    normalize(&snapshot(&fs))
}

/// How many operations (or steps) a crash at trace position `pos` must keep: those acknowledged
/// before the last sync that completed by then (`syncs`: trace position right after a sync,
/// operations acknowledged before it).
pub fn synced_by(syncs: &[(usize, usize)], pos: usize) -> usize {
    syncs
        .iter()
        .filter(|(p, _)| *p <= pos)
        .map(|(_, k)| *k)
        .max()
        .unwrap_or(0)
}

/// Mounts the image a power cut at `pos` under `plan` leaves and checks it. Returns the prefix found.
pub fn check_state(run: &Run, pos: usize, plan: &CrashPlan, what: &str) -> usize {
    let img = run.dev.crash_image(pos, plan);
    let got = recovered_tree(img, engine_options(), fs_options(), what);
    let min = synced_by(&run.syncs, pos);
    match (min..run.states.len())
        .rev()
        .find(|&k| run.states[k] == got)
    {
        Some(k) => k,
        None => {
            let any = run.states.iter().position(|s| *s == got);
            panic!("{what}: the recovered tree is not the state after a prefix of at least {min} operations (matches {any:?})\n got: {:?}", got.keys().collect::<Vec<_>>())
        }
    }
}

/// Crash points: every flush, every operation boundary, and `random` points in between.
pub fn points(run: &Run, seed: u64, random: usize) -> Vec<usize> {
    let mut p = run.dev.flush_points();
    p.extend(run.after_op.iter().copied());
    let len = run.dev.trace_len();
    let mut x = seed | 1;
    for _ in 0..random {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p.push((x % (len as u64 + 1)) as usize);
    }
    p.push(len);
    p.sort();
    p.dedup();
    p
}

/// The three ways a power cut at the `i`th crash point of a run is simulated: every unflushed write
/// lost, every one kept, and a random torn subset (seeded by `seed` and `i`).
pub fn crash_plans(seed: u64, i: usize) -> [CrashPlan; 3] {
    [
        CrashPlan::DropAll,
        CrashPlan::KeepAll,
        CrashPlan::Random {
            seed: seed ^ (i as u64) << 8,
            keep: 0.5,
            tear: 0.5,
        },
    ]
}

/// Checks every crash point of a run under three plans; returns the number of states checked.
pub fn check_run(run: &Run, seed: u64, random: usize, what: &str) -> usize {
    let mut n = 0;
    for (i, pos) in points(run, seed, random).into_iter().enumerate() {
        for plan in crash_plans(seed, i) {
            check_state(
                run,
                pos,
                &plan,
                &format!("{what}, crash at {pos} with {plan:?}"),
            );
            n += 1;
        }
    }
    n
}

/// The operation alphabet of the ACE-style bounded workloads.
pub fn alphabet() -> Vec<FsOp> {
    vec![
        FsOp::Creat("A/new"),
        FsOp::Mkdir("B/D"),
        FsOp::Write {
            path: "A/foo",
            offset: 4096,
            len: 4096,
            fill: 7,
        },
        FsOp::Write {
            path: "A/foo",
            offset: 100,
            len: 50,
            fill: 9,
        },
        FsOp::Append {
            path: "B/bar",
            len: 5000,
            fill: 3,
        },
        FsOp::Falloc {
            path: "B/bar",
            offset: 0,
            len: 20000,
            keep: false,
        },
        FsOp::Punch {
            path: "A/foo",
            offset: 1000,
            len: 6000,
        },
        FsOp::Truncate {
            path: "A/foo",
            size: 10,
        },
        FsOp::Link("A/foo", "B/foo2"),
        FsOp::Unlink("A/foo"),
        FsOp::Rename("A/foo", "B/moved"),
        FsOp::Rename("A/foo", "B/bar"),
        FsOp::Rename("A/C", "B/C"),
        FsOp::Exchange("A/foo", "B/bar"),
        FsOp::Symlink("../A/foo", "B/sym"),
        FsOp::SetXattr {
            path: "B/bar",
            name: "user.b",
            len: 300,
        },
        FsOp::RemoveXattr {
            path: "A/foo",
            name: "user.a",
        },
        FsOp::Rmdir("A/C"),
        // Into the empty file of the setup: a clone (docs/SURGERY.md §5.3).
        FsOp::Copy {
            from: "A/foo",
            off_in: 0,
            to: "A/C/baz",
            off_out: 0,
            len: 1 << 20,
        },
    ]
}

/// A random long workload over a small namespace.
pub fn random_ops(seed: u64, n: usize) -> Vec<FsOp> {
    const FILES: [&str; 8] = [
        "A/f1", "A/f2", "B/f1", "B/f2", "A/C/f3", "B/D/f4", "A/foo", "B/bar",
    ];
    const DIRS: [&str; 4] = ["A/C", "B/D", "A/E", "B/D/F"];
    let mut x = seed.wrapping_mul(0x9e3779b97f4a7c15) | 1;
    let mut r = move |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    };
    let mut ops = Vec::with_capacity(n);
    while ops.len() < n {
        let f = FILES[r(8) as usize];
        let g = FILES[r(8) as usize];
        // `cp f g`: a whole file copied into a new one (or truncated to nothing), which clones
        // it; writes, truncates and unlinks of either side follow at random.
        if r(12) == 0 {
            if r(2) == 0 {
                ops.push(FsOp::Creat(g));
            } else {
                ops.push(FsOp::Truncate { path: g, size: 0 });
            }
            ops.push(FsOp::Copy {
                from: f,
                off_in: 0,
                to: g,
                off_out: 0,
                len: 1 << 20,
            });
            continue;
        }
        let op = {
            match r(20) {
                0..=2 => FsOp::Creat(f),
                3 => FsOp::Mkdir(DIRS[r(4) as usize]),
                4..=7 => FsOp::Write {
                    path: f,
                    offset: r(20000),
                    len: 1 + r(9000) as usize,
                    fill: r(255) as u8,
                },
                8 => FsOp::Append {
                    path: f,
                    len: 1 + r(3000) as usize,
                    fill: r(255) as u8,
                },
                9 => FsOp::Truncate {
                    path: f,
                    size: r(15000),
                },
                10 => FsOp::Punch {
                    path: f,
                    offset: r(10000),
                    len: 1 + r(9000),
                },
                11 => FsOp::Link(f, g),
                12 => FsOp::Unlink(f),
                13 => FsOp::Rename(f, g),
                14 => FsOp::Rename(DIRS[r(4) as usize], DIRS[r(4) as usize]),
                15 => FsOp::Exchange(f, g),
                16 => FsOp::SetXattr {
                    path: f,
                    name: ["user.x", "user.y"][r(2) as usize],
                    len: r(400) as usize,
                },
                17 => FsOp::Rmdir(DIRS[r(4) as usize]),
                18 => FsOp::Symlink("target", g),
                _ if r(4) == 0 => FsOp::Checkpoint,
                _ => FsOp::Sync,
            }
        };
        ops.push(op);
    }
    ops.truncate(n);
    ops
}
