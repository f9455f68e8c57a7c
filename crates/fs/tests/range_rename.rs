//! Renames by tree surgery (docs/SURGERY.md §5.1, §6.3): a directory of 100,000 entries, a
//! sparse file past 4 GiB, hard links inside a moved directory, a file written while its
//! directory moves, an exchange of two directories; and a whole-file `copy_file_range` as a
//! range clone (§5.3). Each ends with the checker clean and the
//! contents where they belong, after a remount too.

mod common;

use std::sync::Arc;

use amaranth_device::MemDevice;
use amaranth_engine::{Engine, Options};
use amaranth_fs::{check, Ctx, Fs, RENAME_EXCHANGE, ROOT_INO};
use common::{format, fs_options};

struct Img {
    dev: Arc<MemDevice>,
    fs: Option<Fs>,
}

fn options() -> Options {
    Options {
        cache_size: 64 << 20,
        background_threads: false,
        check_invariants: true,
        ..Options::default()
    }
}

impl Img {
    fn new(bytes: u64) -> Img {
        let dev = Arc::new(MemDevice::new(bytes));
        let engine = Engine::create(dev.clone(), format(), options()).unwrap();
        Fs::mkfs(&engine, 0, 0).unwrap();
        let fs = Fs::new(Arc::new(engine), fs_options()).unwrap();
        Img { dev, fs: Some(fs) }
    }
    fn fs(&self) -> &Fs {
        self.fs.as_ref().unwrap()
    }
    fn range_moves(&self) -> u64 {
        self.fs().engine().stats().range_moves
    }
    /// Closes the engine, runs the checker (it must find nothing) and mounts again.
    fn remount_checked(&mut self) {
        let fs = self.fs.take().unwrap();
        fs.end_session().unwrap();
        common::close_engine(fs);
        let engine = Engine::open(self.dev.clone(), options()).unwrap();
        let report = check::check(&engine, false, |_| {});
        assert_eq!(report.exit_code(), 0, "checker: {report:?}");
        self.fs = Some(Fs::new(Arc::new(engine), fs_options()).unwrap());
    }
    fn mkdir(&self, parent: u64, name: &[u8]) -> u64 {
        let i = self
            .fs()
            .mkdir(parent, name, 0o755, Ctx::default())
            .unwrap();
        i.ino
    }
    fn file(&self, parent: u64, name: &[u8], data: &[u8]) -> u64 {
        let (i, fh) = self
            .fs()
            .create(parent, name, 0o644, libc::O_RDWR, Ctx::default())
            .unwrap();
        if !data.is_empty() {
            common::write_all(self.fs(), i.ino, fh, 0, data).unwrap();
        }
        self.fs().release(i.ino, fh).unwrap();
        i.ino
    }
    fn lookup(&self, parent: u64, name: &[u8]) -> u64 {
        self.fs().lookup(parent, name).unwrap().ino
    }
    fn read(&self, ino: u64, offset: u64, len: u32) -> Vec<u8> {
        self.fs().read(ino, offset, len).unwrap()
    }
    /// Every name in directory `dir` (read call after call, as the kernel asks).
    fn names(&self, dir: u64) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut offset = 0;
        loop {
            let mut emitted = 0;
            self.fs()
                .readdir(dir, 0, offset, false, |e| {
                    offset = e.offset;
                    if e.name != b"." && e.name != b".." {
                        out.push(e.name.clone());
                    }
                    emitted += 1;
                    true
                })
                .unwrap();
            if emitted == 0 {
                return out;
            }
        }
    }
}

#[test]
fn a_directory_of_100k_entries_moves_whole() {
    let mut img = Img::new(512 << 20);
    let big = img.mkdir(ROOT_INO, b"big");
    let sub = img.mkdir(big, b"sub");
    for i in 0..100_000u32 {
        let name = format!("entry-{i:06}");
        // Every hundredth entry has data, and some live one level down.
        let data = if i % 100 == 0 {
            vec![(i % 251) as u8; 5000]
        } else {
            Vec::new()
        };
        let dir = if i % 10 == 0 { sub } else { big };
        img.file(dir, name.as_bytes(), &data);
        if i % 1000 == 0 {
            img.fs().fsync().unwrap();
        }
    }
    let dest = img.mkdir(ROOT_INO, b"dest");
    let before = img.range_moves();
    img.fs()
        .rename(ROOT_INO, b"big", dest, b"moved", 0)
        .unwrap();
    assert!(
        img.range_moves() - before >= 2,
        "the subtree's ranges moved by surgery"
    );
    img.remount_checked();
    let moved = img.lookup(img.lookup(ROOT_INO, b"dest"), b"moved");
    let sub = img.lookup(moved, b"sub");
    assert_eq!(img.names(moved).len(), 90_000 + 1);
    assert_eq!(img.names(sub).len(), 10_000);
    for i in [0u32, 1, 100, 4_321, 55_500, 99_999] {
        let dir = if i % 10 == 0 { sub } else { moved };
        let f = img.lookup(dir, format!("entry-{i:06}").as_bytes());
        let want = if i % 100 == 0 { 5000 } else { 0 };
        let data = img.read(f, 0, 8192);
        assert_eq!(data.len(), want, "entry {i}");
        assert!(data.iter().all(|&b| b == (i % 251) as u8));
    }
    assert!(img.fs().lookup(ROOT_INO, b"big").is_err());
}

#[test]
fn a_sparse_file_past_4_gib_moves_with_its_blocks() {
    let mut img = Img::new(256 << 20);
    let a = img.mkdir(ROOT_INO, b"a");
    let b = img.mkdir(ROOT_INO, b"b");
    let f = img.file(a, b"sparse", b"");
    let fh = img.fs().open(f, libc::O_RDWR, Ctx::default()).unwrap();
    // One block every 16 MiB to 4.5 GiB: past 32-bit offsets, over many leaves.
    let end = 9u64 << 29;
    let mut offset = 0;
    while offset < end {
        let block = vec![(offset >> 24) as u8; 4096];
        common::write_all(img.fs(), f, fh, offset, &block).unwrap();
        offset += 16 << 20;
    }
    img.fs().release(f, fh).unwrap();
    let before = img.range_moves();
    img.fs().rename(a, b"sparse", b, b"moved", 0).unwrap();
    assert_eq!(img.range_moves() - before, 1, "the data moved by surgery");
    img.remount_checked();
    let b = img.lookup(ROOT_INO, b"b");
    let f = img.lookup(b, b"moved");
    assert_eq!(img.fs().getattr(f).unwrap().size, end - (16 << 20) + 4096);
    for offset in [
        0u64,
        16 << 20,
        1 << 32,
        (1 << 32) + (16 << 20),
        end - (16 << 20),
    ] {
        let data = img.read(f, offset, 4096);
        assert_eq!(data, vec![(offset >> 24) as u8; 4096], "block at {offset}");
    }
    assert!(img.read(f, 8 << 20, 4096).iter().all(|&x| x == 0), "a hole");
}

#[test]
fn hard_links_inside_a_moved_directory_stay_links() {
    let mut img = Img::new(64 << 20);
    let d = img.mkdir(ROOT_INO, b"d");
    let e = img.mkdir(ROOT_INO, b"e");
    let f = img.file(d, b"f", &[7u8; 20_000]);
    img.fs().link(f, e, b"g").unwrap();
    for i in 0..200u32 {
        img.file(d, format!("other{i}").as_bytes(), &[1u8; 3000]);
    }
    let x = img.mkdir(ROOT_INO, b"x");
    img.fs().rename(ROOT_INO, b"d", x, b"d2", 0).unwrap();
    img.remount_checked();
    let d2 = img.lookup(img.lookup(ROOT_INO, b"x"), b"d2");
    let f1 = img.lookup(d2, b"f");
    let f2 = img.lookup(img.lookup(ROOT_INO, b"e"), b"g");
    assert_eq!(f1, f2, "one inode under both names");
    assert_eq!(img.fs().getattr(f1).unwrap().nlink, 2);
    assert_eq!(img.read(f1, 0, 30_000), vec![7u8; 20_000]);
    assert_eq!(img.names(d2).len(), 201);
    // A large file with two names goes home, and back to its path when one name goes, by
    // surgery whatever its size (it used to stay at its home past 4 MiB).
    let big = img.file(d2, b"big", &vec![9u8; 6 << 20]);
    let e = img.lookup(ROOT_INO, b"e");
    img.fs().link(big, e, b"big-link").unwrap();
    assert!(img.fs().getattr(big).unwrap().homed);
    let before = img.range_moves();
    img.fs().unlink(e, b"big-link").unwrap();
    assert!(!img.fs().getattr(big).unwrap().homed, "back at its path");
    assert!(img.range_moves() > before);
    img.remount_checked();
    let d2 = img.lookup(img.lookup(ROOT_INO, b"x"), b"d2");
    let big = img.lookup(d2, b"big");
    assert_eq!(img.read(big, (6 << 20) - 10, 100), vec![9u8; 10]);
}

#[test]
fn a_file_written_while_its_directory_moves_keeps_every_write() {
    let mut img = Img::new(128 << 20);
    let d = img.mkdir(ROOT_INO, b"d");
    for i in 0..100u32 {
        img.file(d, format!("pad{i}").as_bytes(), &[2u8; 8000]);
    }
    let f = img.file(d, b"log", b"");
    let fh = img.fs().open(f, libc::O_RDWR, Ctx::default()).unwrap();
    let blocks = 400u64;
    std::thread::scope(|s| {
        let fs = img.fs();
        s.spawn(move || {
            for i in 0..blocks {
                common::write_all(fs, f, fh, i * 4096, &[(i % 251) as u8; 4096]).unwrap();
            }
        });
        s.spawn(move || {
            for i in 0..100 {
                let (from, to): (&[u8], &[u8]) = if i % 2 == 0 {
                    (b"d", b"d-moved")
                } else {
                    (b"d-moved", b"d")
                };
                fs.rename(ROOT_INO, from, ROOT_INO, to, 0).unwrap();
            }
        });
    });
    img.fs().release(f, fh).unwrap();
    img.fs().forget(f, 1);
    img.remount_checked();
    let d = img.lookup(ROOT_INO, b"d");
    let f = img.lookup(d, b"log");
    let data = img.read(f, 0, (blocks * 4096) as u32);
    assert_eq!(data.len() as u64, blocks * 4096);
    for (i, block) in data.chunks(4096).enumerate() {
        assert!(block.iter().all(|&b| b == (i % 251) as u8), "block {i}");
    }
}

#[test]
fn two_directories_exchange_their_subtrees() {
    let mut img = Img::new(64 << 20);
    let a = img.mkdir(ROOT_INO, b"a");
    let b = img.mkdir(ROOT_INO, b"b");
    let asub = img.mkdir(a, b"deep");
    for i in 0..300u32 {
        img.file(a, format!("a{i}").as_bytes(), &[1u8; 2000]);
        img.file(asub, format!("s{i}").as_bytes(), &[3u8; 100]);
    }
    for i in 0..50u32 {
        img.file(b, format!("b{i}").as_bytes(), &[2u8; 9000]);
    }
    img.fs().setxattr(a, b"user.side", b"a", 0).unwrap();
    let before = img.range_moves();
    img.fs()
        .rename(ROOT_INO, b"a", ROOT_INO, b"b", RENAME_EXCHANGE)
        .unwrap();
    assert!(
        img.range_moves() - before >= 4,
        "both subtrees moved by surgery"
    );
    img.remount_checked();
    let (a, b) = (img.lookup(ROOT_INO, b"a"), img.lookup(ROOT_INO, b"b"));
    assert_eq!(img.names(a).len(), 50);
    assert_eq!(img.names(b).len(), 301);
    assert_eq!(img.names(img.lookup(b, b"deep")).len(), 300);
    assert_eq!(img.read(img.lookup(a, b"b7"), 0, 9000), vec![2u8; 9000]);
    assert_eq!(img.read(img.lookup(b, b"a7"), 0, 9000), vec![1u8; 2000]);
    assert_eq!(
        img.fs().getxattr(b, b"user.side").unwrap(),
        b"a".to_vec(),
        "extended attributes go with their directory"
    );
}

/// `copy_file_range` of a whole file into an empty one clones it (docs/SURGERY.md §5.3): one
/// range clone; the copy reads back the same, with the source's size and block count; writes to
/// either side (in the tree and out of line) stay on their side; deleting the source keeps the
/// copy; the checker is clean after a remount.
#[test]
fn a_whole_file_copied_into_an_empty_one_is_a_clone() {
    let mut img = Img::new(512 << 20);
    let data: Vec<u8> = (0..(3usize << 20) + 1234)
        .map(|i| (i * 7 % 251) as u8)
        .collect();
    let f = img.file(ROOT_INO, b"f", &data);
    let g = img.file(ROOT_INO, b"g", &[]);
    let clones = img.fs().engine().stats().range_clones;
    let len = data.len() as u64;
    assert_eq!(img.fs().copy_file_range(f, 0, g, 0, len).unwrap(), len);
    assert_eq!(
        img.fs().engine().stats().range_clones,
        clones + 1,
        "a clone"
    );
    let (fa, ga) = (img.fs().getattr(f).unwrap(), img.fs().getattr(g).unwrap());
    assert_eq!((ga.size, ga.blocks), (fa.size, fa.blocks));
    assert!(img.read(g, 0, len as u32 + 10) == data);
    // Writes to either side: a few bytes, and a run of blocks stored out of line.
    let write = |ino: u64, off: u64, bytes: &[u8]| {
        let fh = img.fs().open(ino, libc::O_RDWR, Ctx::default()).unwrap();
        common::write_all(img.fs(), ino, fh, off, bytes).unwrap();
        img.fs().release(ino, fh).unwrap();
    };
    let (mut fd, mut gd) = (data.clone(), data.clone());
    write(g, 5000, b"gg");
    gd[5000..5002].copy_from_slice(b"gg");
    write(f, 1 << 20, &[9u8; 256 << 10]);
    fd[1 << 20..(1 << 20) + (256 << 10)].fill(9);
    write(g, 2 << 20, &[8u8; 128 << 10]);
    gd[2 << 20..(2 << 20) + (128 << 10)].fill(8);
    assert!(img.read(f, 0, len as u32) == fd, "the source");
    assert!(img.read(g, 0, len as u32) == gd, "the copy");
    // Into a file that is not empty: a copy, not a clone.
    let h = img.file(ROOT_INO, b"h", b"x");
    let before = img.fs().engine().stats().range_clones;
    img.fs().copy_file_range(f, 0, h, 0, len).unwrap();
    assert_eq!(img.fs().engine().stats().range_clones, before);
    img.fs().unlink(ROOT_INO, b"f").unwrap();
    img.remount_checked();
    let g = img.lookup(ROOT_INO, b"g");
    assert!(
        img.read(g, 0, len as u32) == gd,
        "the copy after the source went"
    );
}
