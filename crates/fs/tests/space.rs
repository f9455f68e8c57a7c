//! Space through the file-system layer (issue 16, "Space is true and comes back"): `statfs` follows
//! the writes at once and does not jump at a remount; `st_blocks` counts a file's real blocks;
//! `fallocate` fails with `ENOSPC` and changes nothing beyond the free space, and what it reserves
//! stays reserved (across a remount) until truncate, punch or unlink; space freed by copies,
//! renames, overwrites and deletes comes back, within the bound docs/DESIGN.md (Space) states.
//!
//! Images are sparse files under `$AMARANTH_TEST_DIR` (default /var/tmp), deleted at the end.

use std::ops::Bound;
use std::path::PathBuf;
use std::sync::Arc;

use amaranth_device::{BlockDevice, FileDevice};
use amaranth_engine::{Engine, Format, Options};
use amaranth_fs::{check, keys};
use amaranth_fs::{
    Ctx, Errno, Fs, FsOptions, Kind, SetAttr, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE,
    FALLOC_FL_ZERO_RANGE, ROOT_INO,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const MIB: u64 = 1 << 20;
const CTX: Ctx = Ctx {
    uid: 0,
    gid: 0,
    pid: 0,
};

/// A file system on an image file, remountable; the image is deleted on drop.
struct T {
    fs: Option<Fs>,
    dev: Arc<FileDevice>,
    opts: Options,
    path: PathBuf,
}

impl Drop for T {
    fn drop(&mut self) {
        drop(self.fs.take());
        let _ = std::fs::remove_file(&self.path);
    }
}

impl T {
    fn new(name: &str, size: u64, format: Format, opts: Options) -> T {
        let dir = std::env::var("AMARANTH_TEST_DIR").unwrap_or_else(|_| "/var/tmp".into());
        std::fs::create_dir_all(&dir).unwrap();
        let path = PathBuf::from(dir).join(format!("fs-space-{name}-{}.img", std::process::id()));
        let dev = Arc::new(FileDevice::create_image(&path, size).unwrap());
        let engine = Engine::create(dev.clone(), format, opts.clone()).unwrap();
        Fs::mkfs(&engine, 0, 0).unwrap();
        let fs = Fs::new(Arc::new(engine), FsOptions::default()).unwrap();
        T {
            fs: Some(fs),
            dev,
            opts,
            path,
        }
    }

    fn fs(&self) -> &Fs {
        self.fs.as_ref().expect("mounted")
    }

    fn remount(&mut self) {
        let engine = self.fs.take().expect("mounted").engine().clone();
        Arc::try_unwrap(engine)
            .ok()
            .expect("sole engine owner")
            .close()
            .unwrap();
        let engine = Engine::open(self.dev.clone(), self.opts.clone()).unwrap();
        self.fs = Some(Fs::new(Arc::new(engine), FsOptions::default()).unwrap());
    }

    /// Unmounts and mounts read-only (writable again with `Fs::set_read_only(false)`).
    fn remount_read_only(&mut self) {
        let engine = self.fs.take().expect("mounted").engine().clone();
        Arc::try_unwrap(engine)
            .ok()
            .expect("sole engine owner")
            .close()
            .unwrap();
        let opts = Options {
            read_only: true,
            ..self.opts.clone()
        };
        let engine = Engine::open(self.dev.clone(), opts).unwrap();
        self.fs = Some(Fs::new(Arc::new(engine), FsOptions::default()).unwrap());
    }

    /// The schema the image records.
    fn schema(&self) -> u32 {
        let v = self.fs().engine().get(&keys::system_key("format")).unwrap();
        u32::from_le_bytes(v.unwrap().try_into().unwrap())
    }

    /// The classes of the problems fsck finds.
    fn fsck_classes(&self) -> Vec<check::Class> {
        let rep = check::check(self.fs().engine(), false, |_| {});
        rep.problems.iter().map(|p| p.class).collect()
    }

    fn look(&self, path: &str) -> u64 {
        let mut cur = ROOT_INO;
        for c in path.split('/').filter(|c| !c.is_empty()) {
            cur = self.fs().lookup(cur, c.as_bytes()).unwrap().ino;
        }
        cur
    }

    fn split(path: &str) -> (&str, &str) {
        match path.rfind('/') {
            Some(i) => (&path[..i], &path[i + 1..]),
            None => ("", path),
        }
    }

    fn mkdir(&self, path: &str) {
        let (d, n) = Self::split(path);
        self.fs()
            .mkdir(self.look(d), n.as_bytes(), 0o755, CTX)
            .unwrap();
    }

    fn create(&self, path: &str) -> u64 {
        let (d, n) = Self::split(path);
        let (i, fh) = self
            .fs()
            .create(self.look(d), n.as_bytes(), 0o644, libc::O_RDWR, CTX)
            .unwrap();
        self.fs().release(i.ino, fh).unwrap();
        i.ino
    }

    /// Writes `data` at `offset` in 1 MiB requests (as the kernel sends them).
    fn write_at(&self, ino: u64, offset: u64, data: &[u8]) -> Result<(), Errno> {
        for (k, c) in data.chunks(MIB as usize).enumerate() {
            self.fs().write(ino, 0, offset + k as u64 * MIB, c, false)?;
        }
        Ok(())
    }

    /// Replaces the whole contents of `path` (creating it).
    fn write_file(&self, path: &str, data: &[u8]) {
        let (d, n) = Self::split(path);
        let ino = match self.fs().lookup(self.look(d), n.as_bytes()) {
            Ok(i) => {
                self.set_size(i.ino, 0);
                i.ino
            }
            Err(_) => self.create(path),
        };
        self.write_at(ino, 0, data).unwrap();
    }

    fn read_file(&self, path: &str) -> Vec<u8> {
        let ino = self.look(path);
        let size = self.fs().getattr(ino).unwrap().size;
        let mut out = Vec::new();
        while (out.len() as u64) < size {
            let r = self.fs().read(ino, out.len() as u64, MIB as u32).unwrap();
            out.extend_from_slice(&r);
        }
        out
    }

    fn set_size(&self, ino: u64, size: u64) {
        let set = SetAttr {
            size: Some(size),
            ..SetAttr::default()
        };
        self.fs().setattr(ino, &set, CTX).unwrap();
    }

    fn list(&self, path: &str) -> Vec<(String, Kind)> {
        let ino = self.look(path);
        let fh = self.fs().opendir(ino).unwrap();
        let mut out = Vec::new();
        let mut off = 0;
        loop {
            let mut got = Vec::new();
            self.fs()
                .readdir(ino, fh, off, false, |e| {
                    got.push(e.clone());
                    true
                })
                .unwrap();
            let Some(last) = got.last() else { break };
            off = last.offset;
            for e in got {
                if e.name != b"." && e.name != b".." {
                    out.push((String::from_utf8(e.name).unwrap(), e.kind));
                }
            }
        }
        self.fs().releasedir(fh);
        out
    }

    fn copy_tree(&self, from: &str, to: &str) {
        self.mkdir(to);
        for (n, k) in self.list(from) {
            let (f, t) = (format!("{from}/{n}"), format!("{to}/{n}"));
            if k == Kind::Dir {
                self.copy_tree(&f, &t);
            } else {
                self.write_file(&t, &self.read_file(&f));
            }
        }
    }

    /// Unlinks `name` in directory `dir` and, as the kernel does once nothing uses the file any
    /// more, forgets it (a file whose last name is gone is deleted at its last FORGET).
    fn unlink(&self, dir: u64, name: &str) {
        let ino = self.fs().lookup(dir, name.as_bytes()).unwrap().ino;
        self.fs().unlink(dir, name.as_bytes()).unwrap();
        self.fs().forget(ino, u64::MAX);
    }

    fn rm_rf(&self, path: &str) {
        for (n, k) in self.list(path) {
            let p = format!("{path}/{n}");
            if k == Kind::Dir {
                self.rm_rf(&p);
            } else {
                self.unlink(self.look(path), &n);
            }
        }
        let (d, n) = Self::split(path);
        self.fs().rmdir(self.look(d), n.as_bytes()).unwrap();
    }

    fn rename(&self, from: &str, to: &str) {
        let (fd, fname) = Self::split(from);
        let (td, tname) = Self::split(to);
        self.fs()
            .rename(
                self.look(fd),
                fname.as_bytes(),
                self.look(td),
                tname.as_bytes(),
                0,
            )
            .unwrap();
    }

    /// `f_blocks - f_bfree` in bytes (what `df` shows used).
    fn used(&self) -> u64 {
        let s = self.fs().statfs();
        (s.blocks - s.bfree) * s.bsize as u64
    }

    /// `f_bavail` in bytes.
    fn avail(&self) -> u64 {
        let s = self.fs().statfs();
        s.bavail * s.bsize as u64
    }

    /// `st_blocks` in bytes (what `du` shows).
    fn du(&self, ino: u64) -> u64 {
        self.fs().getattr(ino).unwrap().st_blocks() * 512
    }

    fn fsck_clean(&self) {
        let rep = check::check(self.fs().engine(), false, |_| {});
        assert!(rep.problems.is_empty(), "fsck: {:?}", rep.problems);
    }
}

fn random_data(rng: &mut SmallRng, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rng.fill(&mut v[..]);
    v
}

fn options(cache: usize) -> Options {
    Options {
        cache_size: cache,
        ..Options::default()
    }
}

/// The issue's measurement: 2,000 incompressible files of 4–124 KiB in 20 directories (124 MiB)
/// on a 2 GiB image, written and synced. `df` used 70–72 MiB then and 127 MiB after a remount.
#[test]
fn df_used_follows_writes_and_does_not_jump_at_remount() {
    let mut t = T::new("df", 2 << 30, Format::default(), options(512 << 20));
    let used0 = t.used();
    let mut rng = SmallRng::seed_from_u64(124);
    let mut written = 0u64;
    for d in 0..20 {
        t.mkdir(&format!("d{d}"));
    }
    for f in 0..2000 {
        let len = rng.gen_range(4 << 10..=124 << 10);
        written += len as u64;
        let data = random_data(&mut rng, len);
        t.write_file(&format!("d{}/f{f}", f % 20), &data);
    }
    t.fs().fsync().unwrap();
    // A checkpoint the log's fill started may still be running. The old images of the nodes it
    // rewrote stay allocated beside the new ones until it completes, but are not counted as used
    // (204–214 MiB was seen here when they were, and 3–5 MiB more than after the remount while
    // images being written or held until the next checkpoint were). A reading past the bound is
    // taken again once a running checkpoint had time to complete.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut synced = t.used() - used0;
    let first = synced;
    while synced > written + written / 8 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
        synced = t.used() - used0;
    }
    let checkpoints = t.fs().engine().stats().checkpoints;
    t.remount();
    let remounted = t.used() - used0;
    eprintln!(
        "{} files, {:.1} MiB written: df used {:.1} MiB right after sync, {:.1} MiB as checked \
         ({checkpoints} checkpoints), {:.1} MiB after a remount",
        2000,
        written as f64 / MIB as f64,
        first as f64 / MIB as f64,
        synced as f64 / MIB as f64,
        remounted as f64 / MIB as f64
    );
    // Every file's blocks are whole 4 KiB blocks on disk: at least the data, at most a little
    // more (keys, padding of partitions, inodes).
    assert!(
        synced >= written && synced <= written + written / 8,
        "used {synced} bytes right after writing and syncing {written}"
    );
    assert!(
        remounted.abs_diff(synced) <= synced / 50,
        "used went from {synced} to {remounted} bytes at the remount"
    );
    t.fsck_clean();
}

/// A large file written in 1 MiB requests goes out of line (docs/WRITEONCE.md): its data reaches
/// the device once (device bytes written per byte at most 1.1, a checkpoint included), `df`
/// counts it, it reads back, and its space comes back once it is deleted (at the checkpoint after
/// the delete reaches its references). Before the data went out of line this wrote 2.1 bytes per
/// byte (docs/BENCHMARKS.md).
#[test]
fn a_large_write_is_written_once_counted_and_given_back() {
    let mut t = T::new("once", 512 << 20, Format::default(), options(64 << 20));
    let used0 = t.used();
    let dev0 = t.dev.io_stats().bytes_written;
    let mut rng = SmallRng::seed_from_u64(14);
    let data = random_data(&mut rng, 64 * MIB as usize);
    let f = t.create("big");
    t.write_at(f, 0, &data).unwrap();
    t.fs().fsync().unwrap();
    t.fs().engine().checkpoint().unwrap();
    let written = t.dev.io_stats().bytes_written - dev0;
    let per_byte = written as f64 / data.len() as f64;
    let used = t.used() - used0;
    eprintln!(
        "64 MiB in 1 MiB writes: {per_byte:.3} device bytes written per byte, df used {:.1} MiB",
        used as f64 / MIB as f64
    );
    assert!(per_byte <= 1.1, "{per_byte} device bytes per byte");
    let len = data.len() as u64;
    assert!(
        used >= len && used <= len + len / 32,
        "df used {used} bytes for {len} written"
    );
    assert_eq!(t.read_file("big"), data);
    t.remount();
    assert_eq!(t.read_file("big"), data);
    t.fsck_clean();
    t.unlink(ROOT_INO, "big");
    t.fs().engine().reclaim_space(u64::MAX).unwrap();
    t.fs().engine().checkpoint().unwrap();
    let after = t.used().saturating_sub(used0);
    assert!(after < 2 * MIB, "{after} bytes still used after the delete");
    t.fsck_clean();
}

/// `st_blocks` is the file's real blocks: holes (sparse writes, extending truncates, punches,
/// copies of holes) take none, and the counts survive a remount.
#[test]
fn st_blocks_counts_real_blocks() {
    let mut t = T::new("blocks", 256 << 20, Format::default(), options(64 << 20));
    let f = t.create("f");
    // One block at 1 GiB: a 1 GiB + 4 KiB file of one block (it used to report its size).
    t.write_at(f, 1 << 30, &[7u8; 4096]).unwrap();
    assert_eq!(t.fs().getattr(f).unwrap().size, (1 << 30) + 4096);
    assert_eq!(t.du(f), 4096);
    // A partial write into a hole makes one block; writing it again changes nothing.
    t.write_at(f, 5000, b"hello").unwrap();
    t.write_at(f, 4096, &[1u8; 4096]).unwrap();
    assert_eq!(t.du(f), 2 * 4096);
    // 1 MiB spanning existing and new blocks (unaligned): 257 blocks touched, one existed.
    t.write_at(f, 4000, &vec![2u8; 1 << 20]).unwrap();
    assert_eq!(t.du(f), 4096 + 257 * 4096);
    // Punch the middle: the whole blocks go, the edge blocks stay (zeroed in part).
    t.fs()
        .fallocate(
            f,
            8192,
            512 * 1024,
            FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
        )
        .unwrap();
    assert_eq!(t.du(f), 4096 + (257 - 128) * 4096);
    // Extending truncate adds nothing; shrinking removes the blocks past the end.
    t.set_size(f, 3 << 30);
    assert_eq!(t.du(f), 4096 + 129 * 4096);
    t.set_size(f, 600 * 1024);
    let left = t.du(f);
    // Kept: blocks 0 and 1, and 130..150 after the punched ones.
    assert_eq!(left, 22 * 4096);
    // A copy keeps the holes: the copy has exactly the source's blocks.
    let g = t.create("g");
    let n = t.fs().copy_file_range(f, 0, g, 0, 600 * 1024).unwrap();
    assert_eq!(n, 600 * 1024);
    assert_eq!(t.du(g), left);
    t.remount();
    let (f, g) = (t.look("f"), t.look("g"));
    assert_eq!((t.du(f), t.du(g)), (left, left));
    // Filling the holes of a sparse file counts each block once.
    t.write_at(f, 0, &vec![3u8; 600 * 1024]).unwrap();
    assert_eq!(t.du(f), 150 * 4096);
    t.set_size(f, 0);
    assert_eq!(t.du(f), 0);
    t.fsck_clean();
}

/// `fallocate` of more than the free space (5 GiB on a 1 GiB image) fails with `ENOSPC` and
/// changes nothing, in every reserving mode.
#[test]
fn fallocate_beyond_free_space_fails_and_changes_nothing() {
    let t = T::new("enospc", 1 << 30, Format::default(), options(64 << 20));
    let f = t.create("f");
    t.write_at(f, 0, &[9u8; 10_000]).unwrap();
    let before = t.fs().getattr(f).unwrap();
    let (used, avail) = (t.used(), t.avail());
    for mode in [0, FALLOC_FL_KEEP_SIZE, FALLOC_FL_ZERO_RANGE] {
        let r = t.fs().fallocate(f, 4096, 5 << 30, mode);
        assert_eq!(r, Err(Errno::ENOSPC), "fallocate mode {mode} of 5 GiB");
        assert_eq!(
            t.fs().getattr(f).unwrap(),
            before,
            "mode {mode} changed the file"
        );
        assert_eq!(
            (t.used(), t.avail()),
            (used, avail),
            "mode {mode} changed statfs"
        );
    }
    assert_eq!(t.read_file("f"), vec![9u8; 10_000]);
    // What fits succeeds and shows at once in du and df.
    t.fs().fallocate(f, 0, 200 * MIB, 0).unwrap();
    assert_eq!(t.fs().getattr(f).unwrap().size, 200 * MIB);
    assert_eq!(t.du(f), 200 * MIB);
    assert!(
        t.used() >= used + 200 * MIB - 12288,
        "df used {} -> {} after reserving 200 MiB",
        used,
        t.used()
    );
    t.fsck_clean();
}

/// What `fallocate` reserved stays the file's: after a remount and with the rest of the device
/// filled until `ENOSPC`, writes inside the range still succeed. Truncate, punch and unlink give
/// the reservation back.
#[test]
fn fallocate_reserves_until_truncate_punch_or_unlink() {
    let mut t = T::new("reserve", 384 << 20, Format::default(), options(64 << 20));
    let r = t.create("r");
    let avail0 = t.avail();
    t.fs().fallocate(r, 0, 64 * MIB, 0).unwrap();
    let k = t.create("k");
    t.fs()
        .fallocate(k, 0, 16 * MIB, FALLOC_FL_KEEP_SIZE)
        .unwrap();
    assert_eq!(t.fs().getattr(k).unwrap().size, 0);
    assert_eq!(t.du(k), 16 * MIB);
    let reserved = avail0 - t.avail();
    assert!(
        reserved >= 80 * MIB,
        "reserving 80 MiB took {reserved} bytes from f_bavail"
    );
    t.remount();
    let (r, k) = (t.look("r"), t.look("k"));
    assert_eq!(t.du(r), 64 * MIB);
    // Fill the rest.
    let other = t.create("other");
    let mut rng = SmallRng::seed_from_u64(3);
    let chunk = random_data(&mut rng, MIB as usize);
    let mut filled = 0u64;
    loop {
        match t.write_at(other, filled, &chunk) {
            Ok(()) => filled += MIB,
            Err(e) => {
                assert_eq!(e, Errno::ENOSPC);
                break;
            }
        }
        assert!(filled < 384 * MIB, "never ENOSPC");
    }
    eprintln!("filled {} MiB besides the 80 MiB reserved", filled / MIB);
    // Every write inside the reservations succeeds (in random order, unaligned at the edges).
    let mut order: Vec<u64> = (0..64).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.gen_range(0..=i));
    }
    for m in order {
        let data = random_data(&mut rng, MIB as usize);
        t.write_at(r, m * MIB, &data)
            .unwrap_or_else(|e| panic!("write at {m} MiB inside the reservation: {e:?}"));
    }
    t.write_at(k, 0, &random_data(&mut rng, 16 * MIB as usize - 100))
        .expect("write inside the KEEP_SIZE reservation");
    // (Writes outside the reservations respected them: "other" got ENOSPC while the reserved
    // space was still there for these writes.)
    assert_eq!((t.du(r), t.du(k)), (64 * MIB, 16 * MIB));
    t.fsck_clean();
    // Release: a new reservation given back by truncate, by punch, by unlink.
    t.unlink(ROOT_INO, "other");
    // Let that space come back first, so that f_bavail moves only with the reservations below.
    t.fs().engine().reclaim_space(u64::MAX).unwrap();
    let q = t.create("q");
    let avail1 = t.avail();
    t.fs().fallocate(q, 0, 32 * MIB, 0).unwrap();
    assert!(
        t.avail() + 32 * MIB <= avail1,
        "f_bavail {} after reserving 32 MiB, {avail1} before",
        t.avail()
    );
    t.set_size(q, 16 * MIB);
    assert_eq!(t.du(q), 16 * MIB);
    t.fs()
        .fallocate(q, 0, 8 * MIB, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)
        .unwrap();
    assert_eq!(t.du(q), 8 * MIB);
    t.unlink(ROOT_INO, "q");
    assert!(
        t.avail() + MIB >= avail1,
        "f_bavail {} after unlinking, {} before reserving",
        t.avail(),
        avail1
    );
    t.fsck_clean();
}

/// Reservations far apart in one file (as in the 5 GiB sparse files of the integrity test) are
/// kept apart, up to four ranges; a fifth joins the two closest (the gap is reserved too), and
/// punches that split ranges give up the smallest pieces beyond four. Counts stay exact (fsck).
#[test]
fn reservations_far_apart_stay_apart() {
    let t = T::new("ranges", 1 << 30, Format::default(), options(64 << 20));
    let f = t.create("f");
    const GIB: u64 = 1 << 30;
    for at in [0, 4 * GIB, 5 * GIB] {
        t.fs().fallocate(f, at, MIB, 0).unwrap();
    }
    assert_eq!(t.fs().getattr(f).unwrap().size, 5 * GIB + MIB);
    assert_eq!(t.du(f), 3 * MIB);
    t.write_at(f, 4 * GIB + 4096, &[1u8; 8192]).unwrap();
    assert_eq!(t.du(f), 3 * MIB);
    // Ranges at 0, 8, 16, 24 MiB (one MiB each), then a fifth at 40 MiB: the closest two join.
    let g = t.create("g");
    for k in [0, 8, 16, 24, 40] {
        t.fs()
            .fallocate(g, k * MIB, MIB, FALLOC_FL_KEEP_SIZE)
            .unwrap();
    }
    assert_eq!(t.du(g), 4 * MIB + 8 * MIB);
    t.fsck_clean();
    // Punch the middle of every range: each splits in two, the smallest pieces are given up.
    t.write_at(g, 0, &[2u8; 4096]).unwrap();
    t.set_size(g, 48 * MIB);
    for k in [0, 8, 16, 24, 40] {
        t.fs()
            .fallocate(
                g,
                k * MIB + MIB / 4,
                MIB / 2,
                FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
            )
            .unwrap();
    }
    t.fsck_clean();
    let left = t.du(g);
    assert!(
        (4096..12 * MIB).contains(&left),
        "du {left} after the punches"
    );
    t.set_size(g, 0);
    assert_eq!(t.du(g), 0);
    t.fsck_clean();
}

/// Makes the image look as a version of `schema` (2 or 3) left it: every inode and redirect in
/// encoding 1 (no block count, no reserved ranges: there must be none), no counter of reserved
/// holes, and for schema 2 no inode index.
fn downgrade(t: &T, schema: u32) {
    let engine = t.fs().engine();
    let mut b = amaranth_engine::Batch::new();
    let (lo, hi) = ([keys::META], [keys::META + 1]);
    engine
        .scan(
            Bound::Included(&lo[..]),
            Bound::Excluded(&hi[..]),
            |k, v| {
                let mut v = v.to_vec();
                assert_eq!(v[0], 2, "encoding");
                if v[1] == b'I' {
                    // The fixed part ends with `homed` at 89, then `blocks` and `ranges` (encoding 2).
                    assert_eq!(v[98], 0, "reserved ranges in {k:?}");
                    v.drain(90..99);
                }
                v[0] = 1;
                b.put(k.to_vec(), v);
                true
            },
        )
        .unwrap();
    if schema < 3 {
        b.range_delete(vec![keys::INDEX], vec![keys::INDEX + 1]);
    }
    b.delete(keys::system_key("reserved"));
    b.put(keys::system_key("format"), schema.to_le_bytes().to_vec());
    engine.write(&b).unwrap();
}

/// An image of schema 2 (no inode index, inodes without block counts) gets both at its first
/// writable mount: the index is built (fsck finds it complete, a hard link's file at its home
/// included) and the current schema recorded; its files count every block up to their size until
/// `fsck --repair` recounts them, and files written since count exactly.
#[test]
fn schema_2_images_get_the_index_and_the_block_counts_at_a_writable_mount() {
    let mut t = T::new("schema2", 256 << 20, Format::default(), options(64 << 20));
    t.mkdir("d");
    let dense = t.create("d/dense");
    t.write_at(dense, 0, &[1u8; 10_000]).unwrap();
    let sparse = t.create("d/sparse");
    t.write_at(sparse, MIB, &[2u8; 8192]).unwrap();
    t.fs().link(dense, ROOT_INO, b"link").unwrap();
    downgrade(&t, 2);
    t.remount();
    assert_eq!(t.schema(), amaranth_fs::SCHEMA_VERSION);
    assert_eq!(amaranth_fs::SCHEMA_VERSION, 6);
    for ino in [t.look("d"), dense, sparse] {
        assert!(
            t.fs().engine().get(&keys::ino_key(ino)).unwrap().is_some(),
            "no index entry for inode {ino}"
        );
    }
    assert_eq!(t.du(t.look("d/dense")), 3 * 4096);
    assert_eq!(
        t.du(t.look("d/sparse")),
        MIB + 8192,
        "an encoding-1 inode counts up to its size"
    );
    assert_eq!(t.fsck_classes(), [check::Class::BlockCount]);
    let f = t.create("d/new");
    t.write_at(f, MIB, &[3u8; 4096]).unwrap();
    assert_eq!(t.du(f), 4096);
    let rep = check::check(t.fs().engine(), true, |_| {});
    assert!(
        rep.problems.iter().all(|p| p.repaired),
        "{:?}",
        rep.problems
    );
    t.remount();
    t.fsck_clean();
    assert_eq!(t.du(t.look("d/sparse")), 8192);
    assert_eq!(t.read_file("link"), vec![1u8; 10_000]);
}

/// Images of schemas 2 and 3 mounted read-only keep their schema (nothing is written) and are
/// upgraded when remounted writable, as at a writable mount.
#[test]
fn older_schemas_upgrade_when_remounted_writable() {
    for schema in [2, 3] {
        let mut t = T::new("schema-ro", 256 << 20, Format::default(), options(64 << 20));
        let f = t.create("f");
        t.write_at(f, MIB, &[5u8; 8192]).unwrap();
        downgrade(&t, schema);
        t.remount_read_only();
        assert_eq!(t.schema(), schema);
        assert_eq!(t.du(t.look("f")), MIB + 8192);
        t.fs().set_read_only(false).unwrap();
        assert_eq!(t.schema(), amaranth_fs::SCHEMA_VERSION, "from {schema}");
        assert_eq!(
            t.fsck_classes(),
            [check::Class::BlockCount],
            "from schema {schema}: the index is complete, only the old count is off"
        );
        let g = t.create("g");
        t.write_at(g, MIB, &[6u8; 4096]).unwrap();
        assert_eq!(t.du(g), 4096);
        t.remount();
        assert_eq!(t.schema(), amaranth_fs::SCHEMA_VERSION);
    }
}

/// An image of schema 3 (inodes without block counts) mounts, is marked current, and its files
/// count every block up to their size (an upper bound) until `fsck --repair` recounts them; fsck
/// also finds and repairs a wrong reserved-hole counter.
#[test]
fn schema_3_images_upgrade_and_fsck_recounts() {
    let mut t = T::new("schema1", 256 << 20, Format::default(), options(64 << 20));
    let f = t.create("f");
    t.write_at(f, 1 << 20, &[5u8; 8192]).unwrap();
    // Rewrite the inode in encoding 1 (no counts: drop `blocks` and the range count) and the
    // schema record as 3.
    let key = keys::meta_key(&keys::path_key(&[b"f"]));
    let engine = t.fs().engine().clone();
    let mut v = engine.get(&key).unwrap().unwrap();
    assert_eq!(v[1], b'I');
    let n = v.len();
    v.truncate(n - 9);
    v[0] = 1;
    let mut b = amaranth_engine::Batch::new();
    b.put(key, v);
    b.put(keys::system_key("format"), 3u32.to_le_bytes().to_vec());
    b.put(keys::system_key("reserved"), 7u64.to_le_bytes().to_vec());
    engine.write(&b).unwrap();
    drop(engine);
    t.remount();
    let schema = t.fs().engine().get(&keys::system_key("format")).unwrap();
    assert_eq!(
        schema,
        Some(amaranth_fs::SCHEMA_VERSION.to_le_bytes().to_vec())
    );
    assert_eq!(amaranth_fs::SCHEMA_VERSION, 6);
    let f = t.look("f");
    assert_eq!(
        t.du(f),
        (1 << 20) + 8192,
        "a version-1 inode counts up to its size"
    );
    let rep = check::check(t.fs().engine(), false, |_| {});
    let classes: Vec<_> = rep.problems.iter().map(|p| p.class).collect();
    assert_eq!(
        classes,
        [check::Class::BlockCount, check::Class::ReservedCount],
        "{:?}",
        rep.problems
    );
    let rep = check::check(t.fs().engine(), true, |_| {});
    assert!(
        rep.problems.iter().all(|p| p.repaired),
        "{:?}",
        rep.problems
    );
    t.remount();
    t.fsck_clean();
    assert_eq!(t.du(t.look("f")), 8192);
}

/// Copies, renames, overwrites and deletes in a loop: the space `df` shows used stays within
/// the bound of docs/DESIGN.md (Space) — twice the most live data there was (a rename copies
/// before it deletes) plus 16 nodes — and once the loop stops and the file system is remounted,
/// it is the live data plus a few percent. (Before: 2.43 times the live peak in the loop, and
/// 3.6–3.9 times the live data after the remount.)
#[test]
fn space_comes_back_under_copies_renames_overwrites_and_deletes() {
    let node = 1usize << 20;
    let format = Format {
        node_size: node,
        ..Format::default()
    };
    let mut t = T::new("loop", 1 << 30, format, options(128 << 20));
    let used0 = t.used();
    let mut rng = SmallRng::seed_from_u64(240);
    let mut live = 0u64;
    t.mkdir("a");
    for d in 0..10 {
        t.mkdir(&format!("a/d{d}"));
        for f in 0..100 {
            let len = rng.gen_range(4 << 10..124 << 10);
            live += len as u64;
            t.write_file(&format!("a/d{d}/f{f}"), &random_data(&mut rng, len));
        }
    }
    let bound = |peak: u64| 2 * peak + 16 * node as u64;
    let mut worst = 0f64;
    let mut most = 0u64;
    for _ in 0..6 {
        // The copy doubles the live data until the original is deleted.
        let peak = 2 * live;
        let mut check = |t: &T, what: &str| {
            // While a checkpoint runs, the old images of the nodes it rewrote stay allocated
            // beside the new ones until it completes (2.3x the live peak was seen once under a
            // loaded CI machine): the bound is for the moment none runs, so a reading above it is
            // taken again once the running one had time to finish.
            let mut used = t.used() - used0;
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while used > bound(peak) && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(100));
                used = t.used() - used0;
            }
            most = most.max(used);
            worst = worst.max(used as f64 / peak as f64);
            assert!(
                used <= bound(peak),
                "after {what}: used {} MiB with {} MiB live at most",
                used / MIB,
                peak / MIB
            );
        };
        t.copy_tree("a", "b");
        check(&t, "copy");
        t.rename("b", "c");
        check(&t, "rename");
        for d in 0..10 {
            for f in (0..100).step_by(3) {
                let p = format!("c/d{d}/f{f}");
                let len = t.read_file(&p).len();
                t.write_file(&p, &random_data(&mut rng, len));
            }
        }
        check(&t, "overwrites");
        t.rm_rf("a");
        check(&t, "rm -rf");
        t.rename("c", "a");
        check(&t, "rename back");
    }
    t.remount();
    let after = t.used() - used0;
    eprintln!(
        "live {} MiB: used at most {} MiB in the loop ({worst:.2} x the live peak), {} MiB after \
         a remount",
        live / MIB,
        most / MIB,
        after / MIB
    );
    assert!(
        after <= live + live / 10 + 4 * node as u64,
        "{} MiB used for {} MiB live after the loop and a remount",
        after / MIB,
        live / MIB
    );
    t.fsck_clean();
}
