//! Renames of files run under the shared namespace lock (`fs/rename_shared.rs`): beside each
//! other in different and in the same directories, beside reads, xattr reads and writes of the
//! files they move, and beside unlinks and makes of the same names. Every file keeps its own
//! bytes wherever it moves, every name exists once, and the checker finds nothing. The random
//! tests print their seeds (`AMARANTH_SEED=n` replays one).

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex, RwLock};

use amaranth_device::MemDevice;
use amaranth_engine::Engine;
use amaranth_fs::{Ctx, Errno, Fs, FsOptions, Kind, RENAME_COPY_MAX, RENAME_NOREPLACE, ROOT_INO};
use common::{close_and_check, engine_options, format, fs_options, root_dirs};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Bytes of each file: large enough that a read spans many blocks.
const FILE_LEN: usize = 48 << 10;

fn seed() -> u64 {
    let seed = std::env::var("AMARANTH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("seed {seed} (replay with AMARANTH_SEED={seed})");
    seed
}

fn new_fs() -> (Arc<Fs>, Arc<MemDevice>) {
    let dev = Arc::new(MemDevice::new(256 << 20));
    let engine = Engine::create(dev.clone(), format(), engine_options()).unwrap();
    Fs::mkfs(&engine, 0, 0).unwrap();
    // The default crossover: these files' ranges are copied when they move (renames that move
    // by tree surgery stay under the exclusive lock).
    let opts = FsOptions {
        rename_copy_max: RENAME_COPY_MAX,
        ..fs_options()
    };
    let fs = Arc::new(Fs::new(Arc::new(engine), opts).unwrap());
    (fs, dev)
}

/// The bytes of file `id`: every byte says which file it belongs to (never zero).
fn content(id: u64) -> Vec<u8> {
    vec![(id % 251 + 1) as u8; FILE_LEN]
}

fn make_file(fs: &Fs, dir: u64, name: &[u8], id: u64) -> u64 {
    let (i, fh) = fs
        .create(dir, name, 0o644, libc::O_RDWR, Ctx::default())
        .unwrap();
    fs.write(i.ino, fh, 0, &content(id), false).unwrap();
    fs.setxattr(i.ino, b"user.id", &id.to_le_bytes(), 0)
        .unwrap();
    fs.release(i.ino, fh).unwrap();
    i.ino
}

/// Mail delivery and flag changes from several clients at once: each thread moves its own files
/// between three shared directories (`tmp` to `new` to `cur`, renamed in place in `cur`, back to
/// `tmp`), and replaces its own lock file over its own index (a rename over a file the kernel
/// holds), while readers read every file and its xattr by inode number and writers rewrite
/// them. A read must return the file's own bytes, never a hole or another file's bytes, wherever
/// the file moved meanwhile; a write lands in the file.
#[test]
fn renames_in_shared_directories_keep_each_file_whole_for_readers_and_writers() {
    let seed = seed();
    let (fs, dev) = new_fs();
    let ctx = Ctx::default();
    let dirs: Vec<u64> = ["tmp", "new", "cur"]
        .iter()
        .map(|n| fs.mkdir(ROOT_INO, n.as_bytes(), 0o755, ctx).unwrap().ino)
        .collect();
    let movers = 3u64;
    let per = 6u64;
    // id -> inode, for the readers and writers (files keep their inode across renames).
    let files: Arc<Mutex<Vec<(u64, u64)>>> = Arc::new(Mutex::new(Vec::new()));
    for t in 0..movers {
        for k in 0..per {
            let id = t * per + k;
            let ino = make_file(&fs, dirs[0], format!("m{id}").as_bytes(), id);
            files.lock().unwrap().push((id, ino));
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let go = Arc::new(Barrier::new(movers as usize + 3));
    let bad_reads = Arc::new(AtomicU64::new(0));
    let mut hs = Vec::new();
    for t in 0..movers {
        let (fs, go, dirs) = (fs.clone(), go.clone(), dirs.clone());
        hs.push(std::thread::spawn(move || {
            let mut rng = SmallRng::seed_from_u64(seed ^ (t + 1).wrapping_mul(0x9e37_79b9));
            // Where each of this thread's files is: (dir index, name).
            let mut at: HashMap<u64, (usize, String)> = (0..per)
                .map(|k| (t * per + k, (0, format!("m{}", t * per + k))))
                .collect();
            let index = format!("index{t}");
            let lock = format!("index{t}.lock");
            let mut generation = 1000 + t * 100_000;
            let mut index_ino = make_file(&fs, dirs[2], index.as_bytes(), generation);
            go.wait();
            for _ in 0..400 {
                if rng.gen_range(0..4) == 0 {
                    // The lock-file pattern: write the new index, rename it over the old one.
                    generation += 1;
                    let ino = make_file(&fs, dirs[2], lock.as_bytes(), generation);
                    fs.rename(dirs[2], lock.as_bytes(), dirs[2], index.as_bytes(), 0)
                        .unwrap();
                    let i = fs.lookup(dirs[2], index.as_bytes()).unwrap();
                    assert_eq!(i.ino, ino, "seed {seed}: the index is the new file");
                    let back = fs.read(ino, 0, FILE_LEN as u32).unwrap();
                    assert!(back == content(generation), "seed {seed}: index {t}");
                    // The kernel lets go of the replaced index (deleted now) and of this lookup.
                    fs.forget(index_ino, 1);
                    fs.forget(ino, 1);
                    index_ino = ino;
                    continue;
                }
                let id = t * per + rng.gen_range(0..per);
                let (d, name) = at[&id].clone();
                let (nd, nname) = match d {
                    0 => (1, format!("m{id}")),
                    1 => (2, format!("m{id}:2,")),
                    _ if rng.gen_bool(0.5) => (2, format!("m{id}:2,{}", rng.gen_range(0..99))),
                    _ => (0, format!("m{id}")),
                };
                if (nd, &nname) == (d, &name) {
                    continue;
                }
                fs.rename(dirs[d], name.as_bytes(), dirs[nd], nname.as_bytes(), 0)
                    .unwrap_or_else(|e| panic!("seed {seed}: rename {name} -> {nname}: {e:?}"));
                at.insert(id, (nd, nname));
            }
            at
        }));
    }
    // Readers: whole files and their xattr, by inode number.
    let mut readers = Vec::new();
    for r in 0..2u64 {
        let (fs, go, files, stop) = (fs.clone(), go.clone(), files.clone(), stop.clone());
        let bad = bad_reads.clone();
        readers.push(std::thread::spawn(move || {
            let mut rng = SmallRng::seed_from_u64(seed ^ (r + 77));
            go.wait();
            let mut reads = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let (id, ino) = {
                    let f = files.lock().unwrap();
                    f[rng.gen_range(0..f.len())]
                };
                let back = fs.read(ino, 0, FILE_LEN as u32).unwrap();
                if back != content(id) {
                    let zeros = back.iter().filter(|&&b| b == 0).count();
                    eprintln!(
                        "seed {seed}: file {id}: {zeros} zero bytes of {}",
                        back.len()
                    );
                    bad.fetch_add(1, Ordering::Relaxed);
                }
                let x = fs.getxattr(ino, b"user.id").unwrap();
                assert_eq!(x, id.to_le_bytes(), "seed {seed}: xattr of file {id}");
                reads += 1;
            }
            reads
        }));
    }
    // A writer rewriting blocks of the files with their own bytes.
    let writer = {
        let (fs, go, files, stop) = (fs.clone(), go.clone(), files.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut rng = SmallRng::seed_from_u64(seed ^ 5);
            go.wait();
            while !stop.load(Ordering::Relaxed) {
                let (id, ino) = {
                    let f = files.lock().unwrap();
                    f[rng.gen_range(0..f.len())]
                };
                let fh = fs.open(ino, libc::O_RDWR, Ctx::default()).unwrap();
                let off = rng.gen_range(0..FILE_LEN / 4096) * 4096;
                fs.write(ino, fh, off as u64, &content(id)[..4096], false)
                    .unwrap();
                fs.release(ino, fh).unwrap();
            }
        })
    };
    let places: Vec<HashMap<u64, (usize, String)>> =
        hs.into_iter().map(|h| h.join().unwrap()).collect();
    stop.store(true, Ordering::Relaxed);
    let reads: u64 = readers.into_iter().map(|h| h.join().unwrap()).sum();
    writer.join().unwrap();
    assert_eq!(
        bad_reads.load(Ordering::Relaxed),
        0,
        "seed {seed}: reads returned other bytes than the file's ({reads} reads)"
    );
    // Every file is where its mover put it, with its own bytes; nothing else is listed.
    let inos: HashMap<u64, u64> = files.lock().unwrap().iter().copied().collect();
    let mut expected = HashMap::new();
    for at in &places {
        for (id, (d, name)) in at {
            let i = fs.lookup(dirs[*d], name.as_bytes()).unwrap();
            assert_eq!(i.ino, inos[id], "seed {seed}: {name}");
            assert!(fs.read(i.ino, 0, FILE_LEN as u32).unwrap() == content(*id));
            expected.insert((*d, name.clone()), i.ino);
        }
    }
    let mut listed = 0;
    for (k, &d) in dirs.iter().enumerate() {
        fs.readdir(d, 0, 0, false, |e| {
            if e.name != b"." && e.name != b".." {
                let n = String::from_utf8(e.name.to_vec()).unwrap();
                assert!(
                    expected.contains_key(&(k, n.clone())) || n.starts_with("index"),
                    "seed {seed}: stray name {n}"
                );
                listed += 1;
            }
            true
        })
        .unwrap();
    }
    assert_eq!(listed, expected.len() + movers as usize, "seed {seed}");
    eprintln!("{reads} reads beside the renames");
    close_and_check(fs, dev, &format!("seed {seed}"));
}

/// Renames racing unlinks and makes of the same few names, in three directories and between
/// them, from several threads: each call holds its directories' locks as the kernel's VFS does
/// (a lookup shared, a change of a name exclusive, a rename both directories; FORGETs without
/// any), so the daemon sees the interleavings a mount gives it. Every call succeeds or fails as it
/// may (ENOENT, EEXIST); makes and removals balance with what the directories list (renames use
/// `RENAME_NOREPLACE`, so none removes a name), every listed name looks up to a file with one
/// link, and the checker finds nothing.
#[test]
fn renames_racing_unlinks_and_makes_of_the_same_names() {
    let seed = seed();
    let (fs, dev) = new_fs();
    let ctx = Ctx::default();
    let dirs = root_dirs(&fs, 3);
    // The VFS's directory locks (i_rwsem).
    let vfs: Arc<Vec<RwLock<()>>> = Arc::new((0..dirs.len()).map(|_| RwLock::new(())).collect());
    let threads = 4u64;
    let go = Arc::new(Barrier::new(threads as usize));
    let made = Arc::new(AtomicU64::new(0));
    let removed = Arc::new(AtomicU64::new(0));
    let renamed = Arc::new(AtomicU64::new(0));
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let (fs, go, dirs, vfs) = (fs.clone(), go.clone(), dirs.clone(), vfs.clone());
            let (made, removed, renamed) = (made.clone(), removed.clone(), renamed.clone());
            std::thread::spawn(move || {
                let mut rng = SmallRng::seed_from_u64(seed ^ (t + 1).wrapping_mul(0x2545_f491));
                let place = |rng: &mut SmallRng| {
                    let d = rng.gen_range(0..dirs.len());
                    (d, format!("n{}", rng.gen_range(0..6)).into_bytes())
                };
                go.wait();
                for _ in 0..3000 {
                    let (d, n) = place(&mut rng);
                    match rng.gen_range(0..4) {
                        0 => {
                            let r = {
                                let _d = vfs[d].write().unwrap();
                                fs.mknod(dirs[d], &n, libc::S_IFREG | 0o644, 0, ctx)
                            };
                            match r {
                                Ok(i) => {
                                    made.fetch_add(1, Ordering::Relaxed);
                                    fs.forget(i.ino, 1);
                                }
                                Err(e) => assert_eq!(e, Errno::EEXIST, "seed {seed}: mknod"),
                            }
                        }
                        1 => {
                            // A lookup, the unlink, the FORGET, as the kernel sends them.
                            let _d = vfs[d].write().unwrap();
                            let Ok(i) = fs.lookup(dirs[d], &n) else {
                                continue;
                            };
                            fs.unlink(dirs[d], &n).unwrap();
                            removed.fetch_add(1, Ordering::Relaxed);
                            drop(_d);
                            fs.forget(i.ino, 1);
                        }
                        _ => {
                            let (nd, nn) = place(&mut rng);
                            let (a, b) = (d.min(nd), d.max(nd));
                            let _a = vfs[a].write().unwrap();
                            let _b = (a != b).then(|| vfs[b].write().unwrap());
                            let Ok(i) = fs.lookup(dirs[d], &n) else {
                                continue;
                            };
                            match fs.rename(dirs[d], &n, dirs[nd], &nn, RENAME_NOREPLACE) {
                                Ok(()) => {
                                    renamed.fetch_add(1, Ordering::Relaxed);
                                }
                                Err(e) => assert_eq!(e, Errno::EEXIST, "seed {seed}: rename"),
                            }
                            drop((_a, _b));
                            fs.forget(i.ino, 1);
                        }
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let mut listed = 0u64;
    for &d in &dirs {
        let mut names = Vec::new();
        fs.readdir(d, 0, 0, false, |e| {
            if e.name != b"." && e.name != b".." {
                names.push(e.name.to_vec());
            }
            true
        })
        .unwrap();
        for n in names {
            let i = fs.lookup(d, &n).unwrap();
            assert_eq!(i.kind, Kind::File, "seed {seed}");
            assert_eq!(i.nlink, 1, "seed {seed}");
            fs.forget(i.ino, 1);
            listed += 1;
        }
    }
    let (made, removed) = (
        made.load(Ordering::Relaxed),
        removed.load(Ordering::Relaxed),
    );
    eprintln!(
        "{made} made, {removed} removed, {} renamed, {listed} listed",
        renamed.load(Ordering::Relaxed)
    );
    assert!(renamed.load(Ordering::Relaxed) > 100, "seed {seed}");
    assert_eq!(listed, made - removed, "seed {seed}: names listed");
    close_and_check(fs, dev, &format!("seed {seed}"));
}

/// A rename whose source or target name is one of the two directories (a directory into itself,
/// a file over its own parent) is decided without locking a parent twice: refused as POSIX says,
/// not deadlocked.
#[test]
fn renames_naming_one_of_their_directories_are_refused() {
    let (fs, dev) = new_fs();
    let ctx = Ctx::default();
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, ctx).unwrap().ino;
    fs.mknod(d, b"f", libc::S_IFREG | 0o644, 0, ctx).unwrap();
    assert_eq!(fs.rename(ROOT_INO, b"d", d, b"x", 0), Err(Errno::EINVAL));
    assert_eq!(fs.rename(d, b"f", ROOT_INO, b"d", 0), Err(Errno::EISDIR));
    fs.rename(d, b"f", ROOT_INO, b"g", 0).unwrap();
    assert_eq!(
        fs.rename(ROOT_INO, b"g", ROOT_INO, b"d", 0),
        Err(Errno::EISDIR)
    );
    close_and_check(fs, dev, "renames naming their directories");
}
