//! Renames that would push keys past the engine's key limit: a deep subtree moved under a longer
//! path, a file whose extended attributes have long names, an exchange whose one side grows. Each
//! rename either works (everything readable at the new place) or fails with `ENAMETOOLONG` having
//! changed nothing; the checker stays clean and the image remounts. The boundary is exact: the
//! longest target name that works is one byte shorter than the shortest that fails.

mod common;

use std::sync::Arc;

use amaranth_device::MemDevice;
use amaranth_engine::{Engine, Options};
use amaranth_fs::{check, Ctx, Errno, Fs, Kind, RENAME_EXCHANGE, ROOT_INO};
use common::{engine_options, format, fs_options, normalize, snapshot, Snapshot};

struct Img {
    dev: Arc<MemDevice>,
    fs: Option<Fs>,
}

impl Img {
    fn new() -> Img {
        let dev = Arc::new(MemDevice::new(64 << 20));
        let engine = Engine::create(dev.clone(), format(), engine_options()).unwrap();
        Fs::mkfs(&engine, 0, 0).unwrap();
        let fs = Fs::new(Arc::new(engine), fs_options()).unwrap();
        Img { dev, fs: Some(fs) }
    }
    fn fs(&self) -> &Fs {
        self.fs.as_ref().unwrap()
    }
    /// Closes the engine, runs the checker on the image and opens it again.
    fn remount_checked(&mut self) {
        let fs = self.fs.take().unwrap();
        let engine = fs.engine().clone();
        drop(fs);
        Arc::try_unwrap(engine)
            .unwrap_or_else(|_| panic!("engine still shared"))
            .close()
            .unwrap();
        let ro = Options {
            read_only: true,
            ..engine_options()
        };
        let engine = Engine::open(self.dev.clone(), ro).unwrap();
        let report = check::check(&engine, false, |_| {});
        assert_eq!(report.exit_code(), 0, "checker: {report:?}");
        drop(engine);
        let engine = Engine::open(self.dev.clone(), engine_options()).unwrap();
        self.fs = Some(Fs::new(Arc::new(engine), fs_options()).unwrap());
    }
    fn mkdir(&self, parent: u64, name: &[u8]) -> u64 {
        self.fs()
            .mkdir(parent, name, 0o755, Ctx::default())
            .unwrap()
            .ino
    }
    fn file(&self, parent: u64, name: &[u8], data: &[u8]) -> u64 {
        let (i, fh) = self
            .fs()
            .create(parent, name, 0o644, libc::O_RDWR, Ctx::default())
            .unwrap();
        assert_eq!(
            self.fs().write(i.ino, fh, 0, data, false).unwrap(),
            data.len()
        );
        self.fs().release(i.ino, fh).unwrap();
        i.ino
    }
    fn state(&self) -> Snapshot {
        normalize(&snapshot(self.fs()))
    }
}

fn max_key() -> usize {
    format().max_key_len
}

/// `/top/<n1>/<n2>/...` with 100-byte names, one level less deep than creation allows (so that
/// there is room for a file), a file with data at the bottom and an xattr on the deepest
/// directory.
fn deep_tree(img: &Img, top: u64) {
    let mut path = vec![(top, Vec::new())];
    loop {
        let name = vec![b'a' + (path.len() % 26) as u8; 100];
        let dir = path.last().unwrap().0;
        match img.fs().mkdir(dir, &name, 0o755, Ctx::default()) {
            Ok(i) => path.push((i.ino, name)),
            Err(e) => {
                assert_eq!(e, Errno::ENAMETOOLONG);
                break;
            }
        }
    }
    let (_, last) = path.pop().unwrap();
    let dir = path.last().unwrap().0;
    img.fs().rmdir(dir, &last).unwrap();
    assert!(path.len() >= 4, "depth {}", path.len());
    img.file(dir, b"f", &vec![7u8; 9000]);
    img.fs().setxattr(dir, b"user.x", b"v", 0).unwrap();
}

#[test]
fn a_deep_subtree_moves_only_while_every_key_fits() {
    let mut img = Img::new();
    let top = img.mkdir(ROOT_INO, b"top");
    deep_tree(&img, top);
    let dest = img.mkdir(ROOT_INO, b"dest");
    let before = img.state();
    // Longer and longer names for the moved top: find where it stops fitting.
    let mut fits = None;
    for len in 1..=255usize {
        let name = vec![b'n'; len];
        match img.fs().rename(ROOT_INO, b"top", dest, &name, 0) {
            Ok(()) => {
                fits = Some(len);
                img.fs().rename(dest, &name, ROOT_INO, b"top", 0).unwrap();
                assert_eq!(img.state(), before, "moved there and back (len {len})");
            }
            Err(e) => {
                assert_eq!(e, Errno::ENAMETOOLONG, "len {len}");
                assert_eq!(img.state(), before, "a failed rename changed something");
                // Monotonic: every longer name fails too.
                for longer in [len + 1, 255] {
                    let n = vec![b'n'; longer.min(255)];
                    assert_eq!(
                        img.fs().rename(ROOT_INO, b"top", dest, &n, 0),
                        Err(Errno::ENAMETOOLONG)
                    );
                }
                break;
            }
        }
    }
    let fits = fits.expect("short names fit");
    assert!(fits < 255, "the deep tree never reached the key limit");
    img.remount_checked();
    assert_eq!(img.state(), before);
    // The longest name that fits works across a remount, contents and all.
    let dest = img.fs().lookup(ROOT_INO, b"dest").unwrap().ino;
    let name = vec![b'n'; fits];
    img.fs().rename(ROOT_INO, b"top", dest, &name, 0).unwrap();
    img.remount_checked();
    let after = img.state();
    assert_eq!(after.len(), before.len());
    let moved: Vec<_> = after
        .iter()
        .filter(|(p, _)| p.len() > 2 && p[0] == b"dest" && p[1] == name)
        .collect();
    assert_eq!(moved.len(), before.len() - 2, "everything below top moved");
    let file = moved
        .iter()
        .find(|(p, _)| p.last().unwrap() == b"f")
        .expect("the file moved");
    assert_eq!(file.1.data, vec![7u8; 9000]);
    assert_eq!(file.1.kind, Kind::File);
}

/// The longest name (up to 255 bytes) that `/top` can be renamed to under `dest` and back.
fn longest_fitting_name(img: &Img, dest: u64) -> usize {
    (1..=255usize)
        .take_while(|&len| {
            let name = vec![b'n'; len];
            match img.fs().rename(ROOT_INO, b"top", dest, &name, 0) {
                Ok(()) => {
                    img.fs().rename(dest, &name, ROOT_INO, b"top", 0).unwrap();
                    true
                }
                Err(e) => {
                    assert_eq!(e, Errno::ENAMETOOLONG, "len {len}");
                    false
                }
            }
        })
        .last()
        .expect("short names fit")
}

/// The engine's key-length bounds stay as high as the longest keys a subtree ever held (deletes
/// leave them high): once the deepest directory of a deep tree is gone, renames to names as much
/// longer as the removed level was are refused by the bounds and then allowed by the keys.
#[test]
fn keys_removed_from_a_deep_tree_no_longer_hold_its_renames_back() {
    let mut img = Img::new();
    let top = img.mkdir(ROOT_INO, b"top");
    deep_tree(&img, top);
    let dest = img.mkdir(ROOT_INO, b"dest");
    let before = longest_fitting_name(&img, dest);
    // Down the chain to the directory holding the file; remove both.
    let (mut parent, mut dir) = (ROOT_INO, top);
    let mut name = b"top".to_vec();
    loop {
        if let Ok(f) = img.fs().lookup(dir, b"f") {
            // Not held by the kernel (its creation and this lookup each counted one): the
            // unlink below removes it.
            img.fs().forget(f.ino, 2);
            break;
        }
        let child = (b'a'..=b'z')
            .map(|c| vec![c; 100])
            .find_map(|n| img.fs().lookup(dir, &n).ok().map(|i| (i.ino, n)))
            .expect("a chain of directories");
        (parent, dir, name) = (dir, child.0, child.1);
    }
    img.fs().unlink(dir, b"f").unwrap();
    img.fs().rmdir(parent, &name).unwrap();
    let after = longest_fitting_name(&img, dest);
    assert!(
        after >= (before + 100).min(255),
        "{before} before the deepest level went, {after} after"
    );
    img.remount_checked();
}

#[test]
fn a_file_with_long_xattr_names_moves_only_while_they_fit() {
    let mut img = Img::new();
    // A directory chain that leaves little room, a file with a 255-byte xattr name in it.
    let mut dir = ROOT_INO;
    for i in 0..6u8 {
        dir = img.mkdir(dir, &[b'd' + i; 100]);
    }
    img.file(dir, b"f", b"data");
    let long = [b"user.".as_slice(), &[b'x'; 250]].concat();
    let f = img.fs().lookup(dir, b"f").unwrap().ino;
    img.fs().setxattr(f, &long, b"value", 0).unwrap();
    let before = img.state();
    let mut failed_at = None;
    for len in 1..=255usize {
        let name = vec![b'g'; len];
        match img.fs().rename(dir, b"f", dir, &name, 0) {
            Ok(()) => img.fs().rename(dir, &name, dir, b"f", 0).unwrap(),
            Err(e) => {
                assert_eq!(e, Errno::ENAMETOOLONG, "len {len}");
                failed_at = Some(len);
                break;
            }
        }
    }
    assert_eq!(img.state(), before);
    let failed_at = failed_at.expect("the xattr key reaches the limit");
    // The file key alone (plus room for data keys) would have allowed longer names.
    let dkey_len = 6 * 101 + 1;
    assert!(
        dkey_len + 2 + failed_at + 10 <= max_key(),
        "failed at {failed_at}: the xattr, not the name, was the limit"
    );
    img.remount_checked();
    assert_eq!(img.state(), before);
    let after = snapshot(img.fs());
    let f = after
        .iter()
        .find(|(p, _)| p.last().unwrap() == b"f")
        .expect("the file");
    assert_eq!(f.1.xattrs[&long], b"value");
}

#[test]
fn an_exchange_fails_whole_when_one_side_does_not_fit() {
    let mut img = Img::new();
    let top = img.mkdir(ROOT_INO, b"t");
    deep_tree(&img, top);
    // A long-named place to swap with: the deep tree would grow by far more than it can.
    let mut dir = ROOT_INO;
    for i in 0..3u8 {
        dir = img.mkdir(dir, &[b'p' + i; 200]);
    }
    img.file(dir, b"other", b"other file");
    let before = img.state();
    assert_eq!(
        img.fs()
            .rename(ROOT_INO, b"t", dir, b"other", RENAME_EXCHANGE),
        Err(Errno::ENAMETOOLONG)
    );
    assert_eq!(
        img.fs()
            .rename(dir, b"other", ROOT_INO, b"t", RENAME_EXCHANGE),
        Err(Errno::ENAMETOOLONG)
    );
    assert_eq!(img.state(), before);
    // A short swap partner works both ways.
    img.file(ROOT_INO, b"s", b"short");
    img.fs()
        .rename(ROOT_INO, b"t", ROOT_INO, b"s", RENAME_EXCHANGE)
        .unwrap();
    img.fs()
        .rename(ROOT_INO, b"s", ROOT_INO, b"t", RENAME_EXCHANGE)
        .unwrap();
    img.remount_checked();
    let after = img.state();
    assert_eq!(after.len(), before.len() + 1);
    assert!(before.keys().all(|p| after.contains_key(p)));
    assert_eq!(after[&vec![b"s".to_vec()]].data, b"short");
}

/// The reproduction at this format's scale: under `/a` a chain of 200-byte directory
/// names as deep as creation allows, files with the longest accepted names at the bottom, an
/// empty `/b`, and `/a` and `/b` exchanged. The final names are as long as before, so the
/// exchange must work (it used to pass the tree through a longer temporary name, writing keys
/// past the limit); everything is in its new place after a remount, and the checker is clean.
#[test]
fn an_exchange_of_a_deep_tree_with_a_name_as_short_works() {
    let mut img = Img::new();
    let a = img.mkdir(ROOT_INO, b"a");
    let mut bottom = a;
    let mut depth = 0;
    while let Ok(i) = img
        .fs()
        .mkdir(bottom, &[b'n' + depth % 8; 200], 0o755, Ctx::default())
    {
        bottom = i.ino;
        depth += 1;
    }
    assert!(depth >= 3, "depth {depth}");
    // The longest name a file accepts there, then more files with names as long.
    let longest = (1..=255usize)
        .rev()
        .find(|&n| {
            let name = vec![b'f'; n];
            match img
                .fs()
                .create(bottom, &name, 0o644, libc::O_RDWR, Ctx::default())
            {
                Ok((i, fh)) => {
                    img.fs().release(i.ino, fh).unwrap();
                    true
                }
                Err(e) => {
                    assert_eq!(e, Errno::ENAMETOOLONG);
                    false
                }
            }
        })
        .expect("some name fits");
    for i in 0..40u8 {
        let mut name = vec![b'g'; longest];
        name[0] = b'A' + i;
        img.file(bottom, &name, &[i; 5000]);
    }
    img.fs().setxattr(bottom, b"user.deep", b"x", 0).unwrap();
    let b = img.mkdir(ROOT_INO, b"b");
    let before = img.state();
    img.fs()
        .rename(ROOT_INO, b"a", ROOT_INO, b"b", RENAME_EXCHANGE)
        .expect("the exchange of names of one length works");
    img.fs().fsync().unwrap();
    img.remount_checked();
    let after = img.state();
    // Every path under a/ is now under b/ and the other way around.
    let swapped: Snapshot = before
        .iter()
        .map(|(p, s)| {
            let mut p = p.clone();
            p[0] = if p[0] == b"a" {
                b"b".to_vec()
            } else {
                b"a".to_vec()
            };
            (p, s.clone())
        })
        .collect();
    assert_eq!(after, normalize(&swapped));
    assert_eq!(after.len(), depth as usize + 2 + 41);
    assert_eq!(img.fs().lookup(ROOT_INO, b"a").unwrap().ino, b);
    assert_eq!(img.fs().lookup(ROOT_INO, b"b").unwrap().ino, a);
}
