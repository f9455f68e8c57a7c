//! The used-inode counter stays exact: the checker finds no `InodeCount` problem after many last
//! FORGETs of files unlinked while in use from several threads at once (they run under the shared
//! namespace lock), after a second FORGET or a lookup by number once such a file was deleted, and
//! after several clients create, look up, open, unlink, rename over, link, close and forget at once.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};

use amaranth_device::MemDevice;
use amaranth_engine::Engine;
use amaranth_fs::{Ctx, Errno, Fs, ROOT_INO};
use common::{close_and_check, engine_options, format, fs_options, root_dirs};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

#[test]
fn concurrent_last_forgets_keep_the_inode_counter_exact() {
    let (fs, dev) = new_fs();
    let threads = 8;
    let rounds = 1000;
    for round in 0..rounds {
        // Every thread holds a file that is unlinked while in use (the lookup of its creation)...
        let mut held = Vec::new();
        for t in 0..threads {
            let name = format!("r{round}-t{t}");
            let (i, fh) = fs
                .create(
                    ROOT_INO,
                    name.as_bytes(),
                    0o644,
                    libc::O_RDWR,
                    Ctx::default(),
                )
                .unwrap();
            fs.write(i.ino, fh, 0, b"data", false).unwrap();
            fs.unlink(ROOT_INO, name.as_bytes()).unwrap();
            fs.release(i.ino, fh).unwrap();
            held.push(i.ino);
        }
        // ...and the kernel forgets them all at once: the deletions race.
        let go = Arc::new(Barrier::new(threads));
        let hs: Vec<_> = held
            .into_iter()
            .map(|ino| {
                let (fs, go) = (fs.clone(), go.clone());
                std::thread::spawn(move || {
                    go.wait();
                    fs.forget(ino, 1);
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
    }
    close_and_check(fs, dev, "last forgets");
}

/// Closes `fs` and runs the checker on its image: it must find nothing (the counter exact, no
/// orphan left).
fn new_fs() -> (Arc<Fs>, Arc<MemDevice>) {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let engine = Engine::create(dev.clone(), format(), engine_options()).unwrap();
    Fs::mkfs(&engine, 0, 0).unwrap();
    let fs = Arc::new(Fs::new(Arc::new(engine), fs_options()).unwrap());
    (fs, dev)
}

/// A file whose last name goes while the kernel holds it (unlinked, replaced by a rename, the last
/// of two hard links; open or not) is deleted once, at the FORGET that ends the kernel's hold:
/// until then it opens and reads, and afterwards a stray FORGET or a lookup by number (a file
/// handle) finds nothing and deletes nothing again.
#[test]
fn a_file_unlinked_while_held_is_deleted_once_at_its_last_forget() {
    for how in [
        "unlink",
        "rename over",
        "last of two names",
        "unlink, no handle",
    ] {
        let (fs, dev) = new_fs();
        let ctx = Ctx::default();
        let (i, fh) = fs.create(ROOT_INO, b"f", 0o644, libc::O_RDWR, ctx).unwrap();
        fs.write(i.ino, fh, 0, b"old contents", false).unwrap();
        // Another process's path walk resolves the name (a second kernel lookup)...
        assert_eq!(fs.lookup(ROOT_INO, b"f").unwrap().ino, i.ino);
        let mut lookups = 2;
        // ...and the name goes while the first process holds the file open, or after it closed.
        match how {
            "unlink" => fs.unlink(ROOT_INO, b"f").unwrap(),
            "rename over" => {
                let (n, nfh) = fs
                    .create(ROOT_INO, b"new", 0o644, libc::O_RDWR, ctx)
                    .unwrap();
                fs.release(n.ino, nfh).unwrap();
                fs.rename(ROOT_INO, b"new", ROOT_INO, b"f", 0).unwrap();
            }
            "last of two names" => {
                fs.link(i.ino, ROOT_INO, b"g").unwrap();
                lookups += 1;
                fs.release(i.ino, fh).unwrap();
                fs.unlink(ROOT_INO, b"g").unwrap();
                fs.unlink(ROOT_INO, b"f").unwrap();
            }
            _ => {
                fs.release(i.ino, fh).unwrap();
                fs.unlink(ROOT_INO, b"f").unwrap();
            }
        }
        if matches!(how, "unlink" | "rename over") {
            fs.release(i.ino, fh).unwrap();
        }
        // Closed but still held by the kernel: it opens and reads.
        let late = fs.open(i.ino, libc::O_RDONLY, ctx).unwrap();
        assert_eq!(fs.read(i.ino, 0, 100).unwrap(), b"old contents", "{how}");
        fs.release(i.ino, late).unwrap();
        // The kernel forgets it: deleted; a stray FORGET and a file handle find nothing.
        fs.forget(i.ino, lookups);
        fs.forget(i.ino, 1);
        assert_eq!(fs.lookup(i.ino, b".").err(), Some(Errno::ESTALE), "{how}");
        close_and_check(fs, dev, how);
    }
}

/// Errors a racing operation may legitimately get.
fn racy(r: Result<(), Errno>, what: &str, seed: u64) {
    if let Err(e) = r {
        assert!(
            [
                Errno::ENOENT,
                Errno::EEXIST,
                Errno::ENOTEMPTY,
                Errno::EISDIR,
                Errno::ENOTDIR,
                Errno::ESTALE,
                Errno::EPERM,
            ]
            .contains(&e),
            "seed {seed}: {what}: {e:?}"
        );
    }
}

/// Several clients at once, on shared directories: creates that keep files open, opens of inodes
/// the client still holds a lookup of (some since unlinked or replaced), unlinks, renames over
/// files and empty directories, hard links (homes) and their removal, mkdir/rmdir, closes and
/// FORGETs in any order, the last FORGET of every lookup at the end. The used-inode counter must
/// match the inodes found afterwards, and nothing unlinked may be left.
#[test]
fn concurrent_names_opens_and_last_forgets_keep_the_inode_counter_exact() {
    let seed = std::env::var("AMARANTH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("seed {seed} (replay with AMARANTH_SEED={seed})");
    let (fs, dev) = new_fs();
    let ctx = Ctx::default();
    let dirs = root_dirs(&fs, 2);
    let threads = 4u64;
    let go = Arc::new(Barrier::new(threads as usize));
    // Opens of inodes found deleted (the race this test is about), and successful removals.
    let stale = Arc::new(AtomicU64::new(0));
    let removed = Arc::new(AtomicU64::new(0));
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let (fs, go, dirs) = (fs.clone(), go.clone(), dirs.clone());
            let (stale, removed) = (stale.clone(), removed.clone());
            std::thread::spawn(move || {
                let mut rng = SmallRng::seed_from_u64(seed ^ t.wrapping_mul(0x9e37_79b9_7f4a_7c15));
                let mut held: Vec<(u64, u64)> = Vec::new();
                let mut known: Vec<u64> = Vec::new();
                let place = |rng: &mut SmallRng| {
                    let d = dirs[rng.gen_range(0..dirs.len())];
                    (d, format!("n{}", rng.gen_range(0..12)).into_bytes())
                };
                go.wait();
                for _ in 0..1500 {
                    match rng.gen_range(0..10) {
                        0 | 1 => {
                            let (d, n) = place(&mut rng);
                            match fs.create(d, &n, 0o644, libc::O_RDWR, ctx) {
                                Ok((i, fh)) => {
                                    let r = fs.write(i.ino, fh, 0, &[t as u8; 100], false);
                                    racy(r.map(|_| ()), "write", seed);
                                    held.push((i.ino, fh));
                                    known.push(i.ino);
                                }
                                Err(e) => racy(Err(e), "create", seed),
                            }
                        }
                        2 => {
                            let (d, n) = place(&mut rng);
                            if let Ok(i) = fs.lookup(d, &n) {
                                known.push(i.ino);
                            }
                        }
                        3 if !known.is_empty() => {
                            let ino = known[rng.gen_range(0..known.len())];
                            match fs.open(ino, libc::O_RDONLY, ctx) {
                                Ok(fh) => held.push((ino, fh)),
                                Err(Errno::ESTALE) => {
                                    stale.fetch_add(1, Ordering::Relaxed);
                                }
                                Err(e) => racy(Err(e), "open", seed),
                            }
                        }
                        4 if !held.is_empty() => {
                            let (ino, fh) = held.swap_remove(rng.gen_range(0..held.len()));
                            fs.release(ino, fh).unwrap();
                        }
                        5 if !known.is_empty() => {
                            // The kernel forgets one lookup (never one an open handle needs).
                            let k = rng.gen_range(0..known.len());
                            let ino = known[k];
                            let opens = held.iter().filter(|(i, _)| *i == ino).count();
                            let lookups = known.iter().filter(|i| **i == ino).count();
                            if lookups > opens.min(1) {
                                known.swap_remove(k);
                                fs.forget(ino, 1);
                            }
                        }
                        6 => {
                            let (d, n) = place(&mut rng);
                            let r = fs.unlink(d, &n);
                            removed.fetch_add(r.is_ok() as u64, Ordering::Relaxed);
                            racy(r, "unlink", seed);
                        }
                        7 => {
                            let ((d1, n1), (d2, n2)) = (place(&mut rng), place(&mut rng));
                            let r = fs.rename(d1, &n1, d2, &n2, 0);
                            removed.fetch_add(r.is_ok() as u64, Ordering::Relaxed);
                            racy(r, "rename", seed);
                        }
                        8 if !known.is_empty() => {
                            let ino = known[rng.gen_range(0..known.len())];
                            let (d, n) = place(&mut rng);
                            if fs
                                .link(ino, d, &n)
                                .map_err(|e| racy(Err(e), "link", seed))
                                .is_ok()
                            {
                                known.push(ino);
                            }
                        }
                        _ => {
                            let (d, n) = place(&mut rng);
                            if rng.gen_bool(0.5) {
                                racy(fs.mkdir(d, &n, 0o755, ctx).map(|_| ()), "mkdir", seed);
                            } else {
                                racy(fs.rmdir(d, &n), "rmdir", seed);
                            }
                        }
                    }
                }
                for (ino, fh) in held {
                    fs.release(ino, fh).unwrap();
                }
                for ino in known {
                    fs.forget(ino, 1);
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    eprintln!(
        "{} unlinks and renames, {} opens of deleted inodes refused (none expected: every open is \
         of a held inode)",
        removed.load(Ordering::Relaxed),
        stale.load(Ordering::Relaxed)
    );
    close_and_check(fs, dev, &format!("seed {seed}"));
}

/// Makes (mknod, mkdir, symlink) run under the shared namespace lock, ordered per directory by
/// the directory's lock: threads making the same names in the same directories (and in others at
/// once), with a thread removing some of them meanwhile, succeed exactly once per name while it
/// exists; each directory lists what succeeded and counts its subdirectories in its link count,
/// and the checker finds nothing.
#[test]
fn concurrent_makes_of_one_name_succeed_once() {
    let (fs, dev) = new_fs();
    let ctx = Ctx::default();
    let dirs = root_dirs(&fs, 3);
    let threads = 4u64;
    let go = Arc::new(Barrier::new(threads as usize + 1));
    let made = Arc::new(AtomicU64::new(0));
    let gone = Arc::new(AtomicU64::new(0));
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let (fs, go, dirs, made) = (fs.clone(), go.clone(), dirs.clone(), made.clone());
            let gone = gone.clone();
            std::thread::spawn(move || {
                let mut rng = SmallRng::seed_from_u64(t);
                go.wait();
                // Until the remover has removed enough names (bounded, in case it never runs).
                for _ in 0..200_000 {
                    if gone.load(Ordering::Relaxed) >= 300 {
                        break;
                    }
                    let d = dirs[rng.gen_range(0..dirs.len())];
                    let n = format!("n{}", rng.gen_range(0..40));
                    let r = match rng.gen_range(0..3) {
                        0 => fs.mkdir(d, n.as_bytes(), 0o755, ctx).map(|_| ()),
                        1 => fs.symlink(d, n.as_bytes(), b"target", ctx).map(|_| ()),
                        // As the FUSE adapter makes files (CREATE is answered ENOSYS).
                        _ => fs
                            .mknod(d, n.as_bytes(), libc::S_IFREG | 0o644, 0, ctx)
                            .map(|_| ()),
                    };
                    match r {
                        Ok(()) => {
                            made.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => assert_eq!(e, Errno::EEXIST, "make {n}"),
                    }
                }
            })
        })
        .collect();
    // The remover: unlinks and rmdirs (exclusive) as long as the makes run.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let remover = {
        let (fs, go, dirs, gone) = (fs.clone(), go.clone(), dirs.clone(), gone.clone());
        let done = done.clone();
        std::thread::spawn(move || {
            let mut rng = SmallRng::seed_from_u64(99);
            go.wait();
            while !done.load(Ordering::Relaxed) {
                let d = dirs[rng.gen_range(0..dirs.len())];
                let n = format!("n{}", rng.gen_range(0..40));
                // Only this thread removes names, so the name found is the one removed; then the
                // kernel forgets it (the lookups of its make and of this lookup).
                let Ok(i) = fs.lookup(d, n.as_bytes()) else {
                    continue;
                };
                if i.kind == amaranth_fs::Kind::Dir {
                    fs.rmdir(d, n.as_bytes()).unwrap();
                } else {
                    fs.unlink(d, n.as_bytes()).unwrap();
                }
                fs.forget(i.ino, 2);
                gone.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    for h in hs {
        h.join().unwrap();
    }
    done.store(true, Ordering::Relaxed);
    remover.join().unwrap();
    let mut listed = 0;
    for &d in &dirs {
        let mut subdirs = 0;
        fs.readdir(d, 0, 0, false, |e| {
            if e.name != b"." && e.name != b".." {
                listed += 1;
                subdirs += u32::from(e.kind == amaranth_fs::Kind::Dir);
            }
            true
        })
        .unwrap();
        assert_eq!(fs.getattr(d).unwrap().nlink, 2 + subdirs, "dir {d}");
    }
    let (made, gone) = (made.load(Ordering::Relaxed), gone.load(Ordering::Relaxed));
    assert!(made > 300 && gone >= 300, "made {made}, removed {gone}");
    assert_eq!(listed, made - gone, "listed names");
    close_and_check(fs, dev, "concurrent makes");
}

/// An unlink of a file the kernel holds runs under the shared namespace lock (the file is parked
/// where it is): writes racing it from another thread all land in that file, before or after it
/// lost its name, and none brings the name back; the kernel's FORGET then deletes it, and the
/// checker finds nothing left.
#[test]
fn writes_racing_an_unlink_land_in_the_parked_file() {
    let (fs, dev) = new_fs();
    let ctx = Ctx::default();
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, ctx).unwrap().ino;
    for round in 0..200u64 {
        let name = format!("f{}", round % 7);
        let (i, fh) = fs
            .create(d, name.as_bytes(), 0o644, libc::O_RDWR, ctx)
            .unwrap();
        let go = Arc::new(Barrier::new(2));
        let writer = {
            let (fs, go) = (fs.clone(), go.clone());
            std::thread::spawn(move || {
                go.wait();
                for k in 0..40u64 {
                    let block = [(k as u8).wrapping_add(round as u8); 512];
                    fs.write(i.ino, fh, k * 512, &block, false).unwrap();
                }
            })
        };
        go.wait();
        fs.unlink(d, name.as_bytes()).unwrap();
        writer.join().unwrap();
        assert_eq!(fs.lookup(d, name.as_bytes()).err(), Some(Errno::ENOENT));
        let back = fs.read(i.ino, 0, 40 * 512).unwrap();
        for k in 0..40u64 {
            let at = (k * 512) as usize;
            assert!(
                back[at..at + 512]
                    .iter()
                    .all(|&b| b == (k as u8).wrapping_add(round as u8)),
                "round {round}: block {k} of the unlinked file"
            );
        }
        fs.release(i.ino, fh).unwrap();
        fs.forget(i.ino, 1);
    }
    close_and_check(fs, dev, "writes racing unlinks");
}
