//! Files the kernel forgot after their last name went, with deletion deferred (`Fs::defer_deletions`,
//! as the FUSE session runs): they wait, then go in batches, and nothing about a path, a counter
//! or another file's data may tell the difference.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use amaranth_device::MemDevice;
use amaranth_engine::Engine;
use amaranth_fs::check::Class;
use amaranth_fs::{Ctx, Errno, Fs, DOOMED_MAX, ROOT_INO};
use common::{
    engine_options, fs_options, held_file as file, problem_classes as problems, set_size,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn new_fs() -> (Arc<MemDevice>, Fs) {
    let (dev, fs) = common::new_mem_fs();
    fs.defer_deletions(true);
    (dev, fs)
}

/// Inodes the counter says are used (read without `statfs`, which deletes doomed files first).
fn counted_inodes(fs: &Fs) -> u64 {
    let v = fs
        .engine()
        .get(&amaranth_fs::keys::system_key("inodes"))
        .unwrap()
        .unwrap();
    u64::from_le_bytes(v.try_into().unwrap())
}

#[test]
fn a_forgotten_file_waits_then_goes_with_its_data() {
    let (_dev, fs) = new_fs();
    let ino = file(&fs, ROOT_INO, b"f", &[7u8; 20_000]);
    fs.setxattr(ino, b"user.k", b"v", 0).unwrap();
    let before = counted_inodes(&fs);
    fs.unlink(ROOT_INO, b"f").unwrap();
    fs.forget(ino, 1);
    // Doomed: still on disk (a home with link count 0, its data parked), not yet deleted.
    assert_eq!(fs.forgotten_waiting(), 1);
    assert_eq!(counted_inodes(&fs), before);
    assert_eq!(problems(&fs), vec![Class::OrphanInode]);
    assert_eq!(fs.getattr(ino).unwrap_err(), Errno::ENOENT);
    assert_eq!(fs.reap_forgotten(), 1);
    assert_eq!(fs.forgotten_waiting(), 0);
    assert_eq!(counted_inodes(&fs), before - 1);
    assert_eq!(problems(&fs), vec![], "after the deletion");
    assert_eq!(fs.reap_forgotten(), 0);
}

#[test]
fn statfs_the_end_of_a_session_and_read_only_delete_what_waits() {
    let (_dev, fs) = new_fs();
    let before = fs.statfs();
    let a = file(&fs, ROOT_INO, b"a", &[1u8; 8192]);
    fs.unlink(ROOT_INO, b"a").unwrap();
    fs.forget(a, 1);
    assert_eq!(fs.forgotten_waiting(), 1);
    // `df` counts what is left, at once.
    let s = fs.statfs();
    assert_eq!(fs.forgotten_waiting(), 0);
    assert_eq!(s.files - s.ffree, before.files - before.ffree);

    let b = file(&fs, ROOT_INO, b"b", &[2u8; 100]);
    fs.unlink(ROOT_INO, b"b").unwrap();
    fs.forget(b, 1);
    fs.set_read_only(true).unwrap();
    assert_eq!(
        fs.forgotten_waiting(),
        0,
        "a remount read-only deletes first"
    );
    fs.set_read_only(false).unwrap();
    assert_eq!(problems(&fs), vec![]);

    let c = file(&fs, ROOT_INO, b"c", &[3u8; 100]);
    fs.unlink(ROOT_INO, b"c").unwrap();
    fs.forget(c, 1);
    fs.end_session().unwrap();
    assert_eq!(fs.forgotten_waiting(), 0);
    assert_eq!(problems(&fs), vec![]);
}

#[test]
fn turning_deferral_off_deletes_what_waits_and_later_forgets_delete_at_once() {
    let (_dev, fs) = new_fs();
    let a = file(&fs, ROOT_INO, b"a", b"x");
    fs.unlink(ROOT_INO, b"a").unwrap();
    fs.forget(a, 1);
    fs.defer_deletions(false);
    assert_eq!(fs.forgotten_waiting(), 0);
    let b = file(&fs, ROOT_INO, b"b", b"y");
    fs.unlink(ROOT_INO, b"b").unwrap();
    fs.forget(b, 1);
    assert_eq!(fs.forgotten_waiting(), 0);
    assert_eq!(problems(&fs), vec![]);
}

#[test]
fn a_name_made_or_renamed_where_a_doomed_file_is_parked_sees_none_of_its_data() {
    let (_dev, fs) = new_fs();
    // A make at the parked path (under the shared namespace lock).
    let old = file(&fs, ROOT_INO, b"f", &[1u8; 9000]);
    fs.setxattr(old, b"user.old", b"1", 0).unwrap();
    fs.unlink(ROOT_INO, b"f").unwrap();
    fs.forget(old, 1);
    let new = file(&fs, ROOT_INO, b"f", b"");
    assert_eq!(
        fs.forgotten_waiting(),
        0,
        "the make deleted the doomed file first"
    );
    set_size(&fs, new, 9000);
    assert_eq!(fs.read(new, 0, 9000).unwrap(), vec![0u8; 9000]);
    assert_eq!(fs.listxattr(new).unwrap(), b"");
    // A file renamed onto the parked path.
    let g = file(&fs, ROOT_INO, b"g", &[2u8; 7000]);
    let h = file(&fs, ROOT_INO, b"h", &[3u8; 7000]);
    fs.unlink(ROOT_INO, b"h").unwrap();
    fs.forget(h, 1);
    fs.rename(ROOT_INO, b"g", ROOT_INO, b"h", 0).unwrap();
    assert_eq!(fs.forgotten_waiting(), 0);
    assert_eq!(fs.read(g, 0, 9000).unwrap(), vec![2u8; 7000]);
    // A directory made at the parked path.
    let k = file(&fs, ROOT_INO, b"k", &[4u8; 5000]);
    fs.unlink(ROOT_INO, b"k").unwrap();
    fs.forget(k, 1);
    let kd = fs.mkdir(ROOT_INO, b"k", 0o755, Ctx::default()).unwrap().ino;
    let inner = file(&fs, kd, b"i", b"");
    assert_eq!(fs.read(inner, 0, 100).unwrap(), b"");
    assert_eq!(problems(&fs), vec![]);
}

#[test]
fn a_directory_renamed_over_doomed_files_deletes_them_in_its_own_batch() {
    let (_dev, fs) = new_fs();
    let ctx = Ctx::default();
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, ctx).unwrap().ino;
    let a = file(&fs, d, b"a", &[5u8; 6000]);
    let b = file(&fs, d, b"b", &[6u8; 6000]);
    let held = file(&fs, d, b"c", &[8u8; 6000]);
    fs.unlink(d, b"a").unwrap();
    fs.unlink(d, b"b").unwrap();
    fs.unlink(d, b"c").unwrap();
    fs.forget(a, 1);
    fs.forget(b, 1);
    assert_eq!(fs.forgotten_waiting(), 2);
    let before = counted_inodes(&fs);
    // The subtree's keys move: the doomed files below are deleted, the held one moves home.
    fs.rename(ROOT_INO, b"d", ROOT_INO, b"e", 0).unwrap();
    assert_eq!(fs.forgotten_waiting(), 0);
    assert_eq!(counted_inodes(&fs), before - 2);
    assert_eq!(fs.read(held, 0, 9000).unwrap(), vec![8u8; 6000]);
    for n in [b"a", b"b", b"c"] {
        let f = file(&fs, d, n, b"");
        set_size(&fs, f, 6000);
        assert_eq!(fs.read(f, 0, 6000).unwrap(), vec![0u8; 6000]);
    }
    assert_eq!(problems(&fs), vec![Class::OrphanInode], "the held file");
    fs.forget(held, 1);
    fs.reap_forgotten();
    assert_eq!(problems(&fs), vec![]);
}

#[test]
fn the_forget_that_fills_the_set_deletes_them_all() {
    let (_dev, fs) = new_fs();
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, Ctx::default()).unwrap().ino;
    for i in 0..DOOMED_MAX {
        let name = format!("f{i}");
        let ino = file(&fs, d, name.as_bytes(), b"z");
        fs.unlink(d, name.as_bytes()).unwrap();
        fs.forget(ino, 1);
        assert!(fs.forgotten_waiting() < DOOMED_MAX, "{i}");
    }
    assert_eq!(fs.forgotten_waiting(), 0);
    assert_eq!(problems(&fs), vec![]);
}

#[test]
fn a_crash_with_files_waiting_leaves_them_to_the_next_mount() {
    let (dev, fs) = new_fs();
    let keep = file(&fs, ROOT_INO, b"keep", &[4u8; 3000]);
    let gone = file(&fs, ROOT_INO, b"gone", &[5u8; 20_000]);
    fs.unlink(ROOT_INO, b"gone").unwrap();
    fs.forget(gone, 1);
    fs.fsync().unwrap();
    let used = counted_inodes(&fs);
    // A crash: nothing after the sync reaches the image (the engine is not closed, the
    // file system not dropped: its drop would delete what waits).
    let image = MemDevice::from_bytes(dev.to_bytes());
    std::mem::forget(fs);
    let dev = Arc::new(image);
    let engine = Engine::open(dev, engine_options()).unwrap();
    let fs = Fs::new(Arc::new(engine), fs_options()).unwrap();
    assert_eq!(counted_inodes(&fs), used - 1);
    assert_eq!(problems(&fs), vec![]);
    let k = fs.lookup(ROOT_INO, b"keep").unwrap();
    assert_eq!(k.ino, keep);
    assert_eq!(fs.read(k.ino, 0, 3000).unwrap(), vec![4u8; 3000]);
}

/// Random creates, unlinks, FORGETs (at once or later), renames of files and directories,
/// names made again where doomed files are parked, and deletions at random moments, against a
/// model of what each file holds; fsck clean at the end and the counter exact.
#[test]
fn random_unlinks_and_forgets_with_deferral_match_the_model() {
    let seed: u64 = std::env::var("AMARANTH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("seed {seed} (replay with AMARANTH_SEED={seed})");
    let mut rng = SmallRng::seed_from_u64(seed);
    let (_dev, fs) = new_fs();
    let ctx = Ctx::default();
    // Directory name → inode; (directory name, file name) → (inode, data).
    let mut dirs: BTreeMap<u8, u64> = BTreeMap::new();
    for d in 0..3u8 {
        let ino = fs
            .mkdir(ROOT_INO, &[b'd', b'0' + d], 0o755, ctx)
            .unwrap()
            .ino;
        dirs.insert(d, ino);
    }
    let mut files: BTreeMap<(u8, u8), (u64, Vec<u8>)> = BTreeMap::new();
    // Unlinked, still held by the "kernel": inode → data.
    let mut held: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let name = |f: u8| [b'n', b'0' + f];
    for step in 0..1500 {
        let what = format!("seed {seed} step {step}");
        let d = *dirs.keys().nth(rng.gen_range(0..dirs.len())).unwrap();
        let f = rng.gen_range(0..5u8);
        let dino = dirs[&d];
        match rng.gen_range(0..100) {
            0..=29 => {
                if let std::collections::btree_map::Entry::Vacant(e) = files.entry((d, f)) {
                    let data: Vec<u8> = vec![rng.gen(); rng.gen_range(0..12_000)];
                    let ino = file(&fs, dino, name(f), &data);
                    e.insert((ino, data));
                }
            }
            30..=54 => {
                if let Some((ino, data)) = files.remove(&(d, f)) {
                    fs.unlink(dino, &name(f)).unwrap();
                    if rng.gen_bool(0.7) {
                        fs.forget(ino, 1);
                    } else {
                        held.insert(ino, data);
                    }
                }
            }
            55..=64 => {
                if let Some(&ino) = held.keys().nth(rng.gen_range(0..held.len().max(1))) {
                    let data = held.remove(&ino).unwrap();
                    assert_eq!(fs.read(ino, 0, 20_000).unwrap(), data, "{what}: held {ino}");
                    fs.forget(ino, 1);
                }
            }
            65..=74 => {
                // A file renamed within or across directories, maybe over another.
                let d2 = *dirs.keys().nth(rng.gen_range(0..dirs.len())).unwrap();
                let f2 = rng.gen_range(0..5u8);
                if (d, f) != (d2, f2) {
                    if let Some(src) = files.remove(&(d, f)) {
                        fs.rename(dino, &name(f), dirs[&d2], &name(f2), 0).unwrap();
                        if let Some((victim, data)) = files.insert((d2, f2), src) {
                            held.insert(victim, data);
                        }
                    }
                }
            }
            75..=79 => {
                // A directory renamed to a free name: its subtree's keys move.
                let free: Vec<u8> = (0..5u8).filter(|x| !dirs.contains_key(x)).collect();
                let to = free[rng.gen_range(0..free.len())];
                fs.rename(ROOT_INO, &[b'd', b'0' + d], ROOT_INO, &[b'd', b'0' + to], 0)
                    .unwrap();
                let ino = dirs.remove(&d).unwrap();
                dirs.insert(to, ino);
                let moved: Vec<(u8, u8)> = files.keys().filter(|k| k.0 == d).copied().collect();
                for k in moved {
                    let v = files.remove(&k).unwrap();
                    files.insert((to, k.1), v);
                }
            }
            80..=89 => {
                fs.reap_forgotten();
            }
            _ => {
                if let Some((&(d, f), (ino, data))) =
                    files.iter().nth(rng.gen_range(0..files.len().max(1)))
                {
                    let got = fs.lookup(dirs[&d], &name(f)).unwrap();
                    assert_eq!(got.ino, *ino, "{what}");
                    assert_eq!(fs.read(*ino, 0, 20_000).unwrap(), *data, "{what}: {d}/{f}");
                    fs.forget(*ino, 1);
                }
            }
        }
        if step % 250 == 249 {
            let p = problems(&fs);
            assert!(p.iter().all(|c| *c == Class::OrphanInode), "{what}: {p:?}");
        }
    }
    for (&(d, f), (ino, data)) in &files {
        let got = fs.lookup(dirs[&d], &name(f)).unwrap();
        assert_eq!(got.ino, *ino);
        assert_eq!(
            fs.read(*ino, 0, 20_000).unwrap(),
            *data,
            "seed {seed}: {d}/{f}"
        );
        fs.forget(*ino, 1);
    }
    for (&ino, data) in &held {
        assert_eq!(
            fs.read(ino, 0, 20_000).unwrap(),
            *data,
            "seed {seed}: held {ino}"
        );
        fs.forget(ino, 1);
    }
    fs.reap_forgotten();
    assert_eq!(problems(&fs), vec![], "seed {seed}");
    // Root, the directories and the live files.
    assert_eq!(
        counted_inodes(&fs),
        1 + dirs.len() as u64 + files.len() as u64,
        "seed {seed}"
    );
}
