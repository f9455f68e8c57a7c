//! Directory offsets at the file-system layer: an offset handed out with an entry, passed back
//! (by the same handle or another, after the directory changed, after a remount), resumes right
//! after that entry. This is what `telldir`/`seekdir`, `lseek` on a directory and NFS cookies need.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;

use amaranth_device::MemDevice;
use amaranth_engine::Engine;
use amaranth_fs::{Ctx, Fs, ROOT_INO};
use common::{engine_options, format, fs_options};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn new_fs(dev: &Arc<MemDevice>) -> Fs {
    let engine = Engine::create(dev.clone(), format(), engine_options()).unwrap();
    Fs::mkfs(&engine, 0, 0).unwrap();
    Fs::new(Arc::new(engine), fs_options()).unwrap()
}

fn remount(fs: Fs, dev: &Arc<MemDevice>) -> Fs {
    let engine = fs.engine().clone();
    drop(fs);
    Arc::try_unwrap(engine)
        .unwrap_or_else(|_| panic!("engine still shared"))
        .close()
        .unwrap();
    let engine = Engine::open(dev.clone(), engine_options()).unwrap();
    Fs::new(Arc::new(engine), fs_options()).unwrap()
}

fn touch(fs: &Fs, dir: u64, name: &str) {
    fs.mknod(
        dir,
        name.as_bytes(),
        libc::S_IFREG | 0o644,
        0,
        Ctx::default(),
    )
    .unwrap();
}

/// Lists `dir` through handle `fh` from `offset` to the end, `per_call` entries per call (as a
/// small getdents buffer would), returning (name, offset) pairs without `.` and `..`.
fn list_from(fs: &Fs, dir: u64, fh: u64, mut offset: u64, per_call: usize) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    loop {
        let mut batch = Vec::new();
        fs.readdir(dir, fh, offset, false, |e| {
            if batch.len() == per_call {
                return false;
            }
            batch.push((String::from_utf8(e.name.clone()).unwrap(), e.offset));
            true
        })
        .unwrap();
        let Some(&(_, last)) = batch.last() else {
            return out;
        };
        offset = last;
        out.extend(batch.into_iter().filter(|(n, _)| n != "." && n != ".."));
        assert!(out.len() < 100_000, "listing does not end");
    }
}

/// A fresh handle's listing from `offset`.
fn fresh_list(fs: &Fs, dir: u64, offset: u64, per_call: usize) -> Vec<(String, u64)> {
    let fh = fs.opendir(dir).unwrap();
    let l = list_from(fs, dir, fh, offset, per_call);
    fs.releasedir(fh);
    l
}

fn names(l: &[(String, u64)]) -> Vec<String> {
    l.iter().map(|(n, _)| n.clone()).collect()
}

fn make_dir(fs: &Fs, n: usize) -> u64 {
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, Ctx::default()).unwrap().ino;
    for i in 0..n {
        touch(fs, d, &format!("entry-{i:04}"));
    }
    d
}

#[test]
fn every_offset_resumes_after_its_entry_in_any_handle() {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let fs = new_fs(&dev);
    let d = make_dir(&fs, 300);
    let fh = fs.opendir(d).unwrap();
    let full = list_from(&fs, d, fh, 0, 7);
    assert_eq!(full.len(), 300);
    let offsets: BTreeSet<u64> = full.iter().map(|(_, o)| *o).collect();
    assert_eq!(offsets.len(), 300, "offsets are distinct");
    assert!(full.iter().all(|(_, o)| *o > 2 && *o < 1 << 63));
    // Seek back and forth on the same handle (telldir/seekdir), then on new handles.
    let mut rng = SmallRng::seed_from_u64(7);
    for round in 0..60 {
        let i = rng.gen_range(0..full.len());
        let same = round % 2 == 0;
        let got = if same {
            list_from(&fs, d, fh, full[i].1, 5)
        } else {
            fresh_list(&fs, d, full[i].1, 5)
        };
        assert_eq!(
            names(&got),
            names(&full[i + 1..]),
            "resume after entry {i} ({:?}, offset {}, same handle: {same})",
            full[i].0,
            full[i].1
        );
        assert!(
            got == full[i + 1..],
            "offsets are stable (resume after {i})"
        );
    }
    // A rewind lists the same entries with the same offsets.
    assert_eq!(list_from(&fs, d, fh, 0, 300), full);
    fs.releasedir(fh);
    // After a remount, the same offsets resume at the same places.
    let fs = remount(fs, &dev);
    assert_eq!(fs.lookup(ROOT_INO, b"d").unwrap().ino, d);
    assert_eq!(fresh_list(&fs, d, 0, 11), full);
    for i in [0, 49, 50, 51, 150, 298, 299] {
        assert_eq!(fresh_list(&fs, d, full[i].1, 3), full[i + 1..].to_vec());
    }
}

#[test]
fn offsets_stay_valid_while_the_directory_changes() {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let fs = new_fs(&dev);
    let d = make_dir(&fs, 200);
    let full = fresh_list(&fs, d, 0, 13);
    let mut rng = SmallRng::seed_from_u64(11);
    let mut removed = BTreeSet::new();
    for round in 0..8 {
        // Add some entries and remove some (also the ones whose offsets are reused below).
        for j in 0..25 {
            touch(&fs, d, &format!("new-{round}-{j}"));
        }
        for _ in 0..10 {
            let (n, _) = &full[rng.gen_range(0..full.len())];
            if removed.insert(n.clone()) {
                fs.unlink(d, n.as_bytes()).unwrap();
            }
        }
        for _ in 0..10 {
            let i = rng.gen_range(0..full.len());
            let got = names(&fresh_list(&fs, d, full[i].1, 9));
            let got_set: BTreeSet<&String> = got.iter().collect();
            assert_eq!(got.len(), got_set.len(), "round {round}: duplicates");
            // Every original entry after i that still exists comes back; none at or before i.
            for (k, (n, _)) in full.iter().enumerate() {
                let present = got_set.contains(n);
                let want = k > i && !removed.contains(n);
                assert_eq!(
                    present,
                    want,
                    "round {round}: resume after {:?} (removed: {}): entry {k} {n:?}",
                    full[i].0,
                    removed.contains(&full[i].0)
                );
            }
        }
    }
}

#[test]
fn dot_entries_and_the_end() {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let fs = new_fs(&dev);
    let d = make_dir(&fs, 3);
    let fh = fs.opendir(d).unwrap();
    let mut all = Vec::new();
    fs.readdir(d, fh, 0, false, |e| {
        all.push((String::from_utf8(e.name.clone()).unwrap(), e.offset));
        true
    })
    .unwrap();
    assert_eq!(all.len(), 5);
    assert_eq!((all[0].0.as_str(), all[0].1), (".", 1));
    assert_eq!((all[1].0.as_str(), all[1].1), ("..", 2));
    // From `.`'s offset: `..` then the children; from `..`'s offset: the children.
    assert_eq!(names(&fresh_list(&fs, d, 2, 10)), names(&all[2..]));
    let mut after_dot = Vec::new();
    fs.readdir(d, fh, 1, false, |e| {
        after_dot.push(String::from_utf8(e.name.clone()).unwrap());
        true
    })
    .unwrap();
    assert_eq!(after_dot[0], "..");
    assert_eq!(after_dot.len(), 4);
    // The last entry's offset is the end: nothing follows, on any handle.
    let last = all.last().unwrap().1;
    assert!(fresh_list(&fs, d, last, 10).is_empty());
    assert!(list_from(&fs, d, fh, last, 10).is_empty());
    fs.releasedir(fh);
}
