//! Data-integrity exerciser on a real mount: a seeded random mix of reads, writes (unaligned,
//! spanning blocks, beyond EOF), O_APPEND writes, truncates (shrink and extend), fallocate (mode 0,
//! KEEP_SIZE, PUNCH_HOLE|KEEP_SIZE), copy_file_range, SEEK_DATA/SEEK_HOLE and fsync over several
//! files, one of them sparse beyond 4 GiB (data near 4 GiB and 5 GiB), checked byte for byte
//! against an in-memory sparse model. The file system is unmounted, checked with fsck and mounted
//! again several times in between, and every file is verified in full after each remount.
//!
//! The daemon gets the smallest cache it accepts (32 MiB, 8 nodes), so nodes are evicted and read
//! back from the image all the time. `AMARANTH_INTEGRITY_OPS` (default 150,000) and
//! `AMARANTH_INTEGRITY_REMOUNTS` (default 6) scale it; `AMARANTH_TEST_SEED` replays a run.

mod support;

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::time::Instant;

use support::*;

const BLOCK: u64 = 4096;
const FILES: usize = 8;
/// The file that lives beyond 4 GiB.
const BIG: usize = FILES - 1;
/// Normal files stay below this size.
const SMALL_MAX: u64 = 24 << 20;
const GIB: u64 = 1 << 30;
/// Where the big file's activity happens: its start, across the 4 GiB boundary, near 5 GiB.
const ANCHORS: [u64; 3] = [0, 4 * GIB - (256 << 10), 5 * GIB - (512 << 10)];

/// A sparse file: its size and its 4 KiB blocks. A block in the map may hold zeros; a block not in
/// the map is a hole. The map over-approximates the blocks the file system may hold (every block a
/// write, punch edge, truncate or copy touched), which is what the SEEK_DATA checks rely on. Bytes
/// at or beyond `size` are always zero.
#[derive(Clone, Default)]
struct Model {
    size: u64,
    blocks: BTreeMap<u64, Vec<u8>>,
}

impl Model {
    fn block_mut(&mut self, b: u64) -> &mut Vec<u8> {
        self.blocks
            .entry(b)
            .or_insert_with(|| vec![0u8; BLOCK as usize])
    }
    fn read(&self, off: u64, len: u64) -> Vec<u8> {
        let end = (off + len).min(self.size);
        if off >= end {
            return Vec::new();
        }
        let mut out = vec![0u8; (end - off) as usize];
        for (&b, data) in self.blocks.range(off / BLOCK..=(end - 1) / BLOCK) {
            let start = b * BLOCK;
            let (a, z) = (start.max(off), (start + BLOCK).min(end));
            out[(a - off) as usize..(z - off) as usize]
                .copy_from_slice(&data[(a - start) as usize..(z - start) as usize]);
        }
        out
    }
    fn write(&mut self, off: u64, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        let mut pos = 0usize;
        while pos < data.len() {
            let abs = off + pos as u64;
            let (b, inb) = (abs / BLOCK, (abs % BLOCK) as usize);
            let n = (BLOCK as usize - inb).min(data.len() - pos);
            self.block_mut(b)[inb..inb + n].copy_from_slice(&data[pos..pos + n]);
            pos += n;
        }
        self.size = self.size.max(off + data.len() as u64);
    }
    /// Zeroes `[a, z)`: whole blocks become holes, partial ones are zeroed (and may exist).
    fn zero(&mut self, a: u64, z: u64) {
        if a >= z {
            return;
        }
        let mut b = a / BLOCK;
        while b * BLOCK < z {
            let (s, e) = (b * BLOCK, (b + 1) * BLOCK);
            if a <= s && e <= z {
                self.blocks.remove(&b);
            } else {
                let blk = self.block_mut(b);
                let (x, y) = (a.max(s) - s, z.min(e) - s);
                blk[x as usize..y as usize].fill(0);
            }
            b += 1;
        }
    }
    fn truncate(&mut self, size: u64) {
        if size < self.size {
            let keep = size.div_ceil(BLOCK);
            let gone: Vec<u64> = self.blocks.range(keep..).map(|(&b, _)| b).collect();
            for b in gone {
                self.blocks.remove(&b);
            }
            if !size.is_multiple_of(BLOCK) {
                let blk = self.block_mut(size / BLOCK);
                blk[(size % BLOCK) as usize..].fill(0);
            }
        }
        self.size = size;
    }
    fn punch(&mut self, off: u64, len: u64) {
        let z = (off + len).min(self.size);
        self.zero(off, z);
    }
    /// First non-zero byte in `[a, z)`.
    fn first_nonzero(&self, a: u64, z: u64) -> Option<u64> {
        if a >= z {
            return None;
        }
        for (&b, data) in self.blocks.range(a / BLOCK..=(z - 1) / BLOCK) {
            let s = b * BLOCK;
            let (x, y) = (a.max(s) - s, z.min(s + BLOCK) - s);
            if let Some(i) = data[x as usize..y as usize].iter().position(|&c| c != 0) {
                return Some(s + x + i as u64);
            }
        }
        None
    }
    fn has_block(&self, b: u64) -> bool {
        self.blocks.contains_key(&b)
    }
}

/// Open handles of one file for the current mount.
struct Handles {
    rw: File,
    app: File,
}

struct Run {
    rng: Rng,
    models: Vec<Model>,
    handles: Vec<Option<Handles>>,
    counts: BTreeMap<&'static str, u64>,
    bytes_written: u64,
    bytes_read: u64,
    /// The last changes of each file, for failure messages.
    hist: Vec<std::collections::VecDeque<String>>,
}

fn name(i: usize) -> String {
    format!("file{i}")
}

impl Run {
    fn count(&mut self, what: &'static str) {
        *self.counts.entry(what).or_default() += 1;
    }
    fn note(&mut self, i: usize, what: String) {
        let h = &mut self.hist[i];
        if h.len() == 40 {
            h.pop_front();
        }
        h.push_back(format!("{what} -> size {}", self.models[i].size));
    }
    fn history(&self, i: usize) -> String {
        let h: Vec<&str> = self.hist[i].iter().map(|s| s.as_str()).collect();
        format!("\nlast changes of {}:\n  {}", name(i), h.join("\n  "))
    }
    fn open_all(&mut self, m: &Mount) {
        self.handles.clear();
        for i in 0..FILES {
            let p = m.p(&name(i));
            let rw = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&p)
                .unwrap();
            let app = OpenOptions::new().read(true).append(true).open(&p).unwrap();
            self.handles.push(Some(Handles { rw, app }));
        }
    }
    fn h(&self, i: usize) -> &Handles {
        self.handles[i].as_ref().unwrap()
    }
    /// An offset for file `i` where things happen.
    fn offset(&mut self, i: usize) -> u64 {
        let size = self.models[i].size;
        if i == BIG {
            let a = *self.rng.pick(&ANCHORS);
            let w = 2 << 20;
            let o = (a + self.rng.below(w)).saturating_sub(w / 4);
            return if self.rng.chance(0.2) {
                o & !(BLOCK - 1)
            } else {
                o
            };
        }
        let o = match self.rng.below(10) {
            0..=4 => self.rng.below(size + 1),
            5..=7 => (size + self.rng.below(128 << 10)).saturating_sub(64 << 10),
            8 => size + self.rng.below(1 << 20),
            _ => self.rng.below(size / BLOCK + 2) * BLOCK,
        };
        o.min(SMALL_MAX - 1)
    }
    fn length(&mut self) -> u64 {
        match self.rng.below(20) {
            0..=9 => self.rng.range(1, 700),
            10..=15 => self.rng.range(1, 20_000),
            16..=18 => self.rng.range(1, 33) * BLOCK,
            _ => self.rng.range(1, 300 << 10),
        }
    }
    fn cap(&self, i: usize, off: u64, len: u64) -> u64 {
        if i == BIG {
            len
        } else {
            len.min(SMALL_MAX - off).max(1)
        }
    }

    fn check_read(&mut self, i: usize, off: u64, len: u64, drop: bool) {
        if drop {
            drop_cache(&self.h(i).rw);
        }
        let mut buf = vec![0u8; len as usize];
        let mut got = 0usize;
        while got < buf.len() {
            let n = self
                .h(i)
                .rw
                .read_at(&mut buf[got..], off + got as u64)
                .unwrap();
            if n == 0 {
                break;
            }
            got += n;
        }
        buf.truncate(got);
        let want = self.models[i].read(off, len);
        if buf != want {
            let first = buf
                .iter()
                .zip(&want)
                .position(|(a, b)| a != b)
                .unwrap_or(buf.len().min(want.len()));
            panic!(
                "{}: read of {len} bytes at {off} (cache dropped: {drop}) differs from the model: \
                 got {} bytes, want {}; first difference at byte {} (file offset {}): got {:?}, \
                 want {:?}; model size {}, st_size {}{}",
                name(i),
                buf.len(),
                want.len(),
                first,
                off + first as u64,
                buf.get(first),
                want.get(first),
                self.models[i].size,
                self.h(i).rw.metadata().map(|m| m.len()).unwrap_or(0),
                self.history(i)
            );
        }
        self.bytes_read += got as u64;
    }

    fn check_seek(&mut self, i: usize, x: u64) {
        let size = self.models[i].size;
        let f = &self.handles[i].as_ref().unwrap().rw;
        let model = &self.models[i];
        let fname = name(i);
        let ctx = self.history(i);
        match seek_data_hole(f, x, libc::SEEK_DATA) {
            Ok(d) => {
                assert!(
                    d >= x && d < size,
                    "{fname}: SEEK_DATA({x}) = {d} outside [{x}, {size}){ctx}"
                );
                if let Some(z) = model.first_nonzero(x, d) {
                    panic!("{fname}: SEEK_DATA({x}) = {d} skips data at {z}{ctx}");
                }
                assert!(
                    model.has_block(d / BLOCK),
                    "{fname}: SEEK_DATA({x}) = {d}, but block {} was never written{ctx}",
                    d / BLOCK
                );
            }
            Err(libc::ENXIO) => {
                if let Some(z) = model.first_nonzero(x, size) {
                    panic!("{fname}: SEEK_DATA({x}) = ENXIO but there is data at {z} (size {size}){ctx}");
                }
            }
            Err(e) => panic!("{fname}: SEEK_DATA({x}): errno {e}{ctx}"),
        }
        match seek_data_hole(f, x, libc::SEEK_HOLE) {
            Ok(h) => {
                assert!(
                    h >= x && h <= size,
                    "{fname}: SEEK_HOLE({x}) = {h} outside [{x}, {size}]{ctx}"
                );
                if h < size {
                    // The hole extends at least to the end of h's block.
                    let end = ((h / BLOCK + 1) * BLOCK).min(size);
                    if let Some(z) = model.first_nonzero(h, end) {
                        panic!("{fname}: SEEK_HOLE({x}) = {h}, but {z} holds data{ctx}");
                    }
                }
                if h > x {
                    for b in x / BLOCK..h.div_ceil(BLOCK) {
                        assert!(
                            model.has_block(b),
                            "{fname}: SEEK_HOLE({x}) = {h} reports block {b} as data, but it was \
                             never written{ctx}"
                        );
                    }
                }
            }
            Err(e) => panic!("{fname}: SEEK_HOLE({x}) (size {size}): errno {e}{ctx}"),
        }
    }

    /// Verifies one file completely: size, then contents (data segments for the big file).
    fn verify_file(&mut self, m: &Mount, i: usize) {
        let p = m.p(&name(i));
        let size = std::fs::metadata(&p).unwrap().len();
        assert_eq!(size, self.models[i].size, "{}: size", name(i));
        let f = File::open(&p).unwrap();
        drop_cache(&f);
        if i != BIG {
            let data = std::fs::read(&p).unwrap();
            let want = self.models[i].read(0, size);
            assert!(data == want, "{}: contents differ from the model", name(i));
            self.bytes_read += data.len() as u64;
            return;
        }
        // Sparse: walk the data segments, read them, and require every non-zero byte inside one.
        let mut x = 0u64;
        let mut covered: Vec<(u64, u64)> = Vec::new();
        while x < size {
            let d = match seek_data_hole(&f, x, libc::SEEK_DATA) {
                Ok(d) => d,
                Err(libc::ENXIO) => break,
                Err(e) => panic!("{}: SEEK_DATA({x}): errno {e}", name(i)),
            };
            let h = seek_data_hole(&f, d, libc::SEEK_HOLE).unwrap();
            assert!(h > d, "{}: SEEK_HOLE({d}) = {h} after SEEK_DATA", name(i));
            let mut buf = vec![0u8; (h - d) as usize];
            f.read_exact_at(&mut buf, d).unwrap();
            assert!(
                buf == self.models[i].read(d, h - d),
                "{}: data segment [{d}, {h}) differs from the model",
                name(i)
            );
            self.bytes_read += buf.len() as u64;
            covered.push((d, h));
            x = h;
        }
        let mut prev = 0;
        for &(d, h) in covered.iter().chain(std::iter::once(&(size, size))) {
            if let Some(z) = self.models[i].first_nonzero(prev, d) {
                panic!(
                    "{}: model data at {z} lies in a reported hole [{prev}, {d})",
                    name(i)
                );
            }
            prev = h;
        }
        // A few reads inside holes, through the daemon.
        for _ in 0..8 {
            let off = self.rng.below(size.max(1));
            let mut buf = vec![0u8; 8192];
            let n = f.read_at(&mut buf, off).unwrap();
            buf.truncate(n);
            assert!(
                buf == self.models[i].read(off, 8192),
                "{}: read of 8192 bytes at {off} differs from the model",
                name(i)
            );
        }
    }

    fn verify_all(&mut self, m: &Mount) {
        let t = Instant::now();
        for i in 0..FILES {
            self.verify_file(m, i);
        }
        eprintln!("verified all files in {:.1} s", t.elapsed().as_secs_f64());
    }

    fn step(&mut self, m: &Mount) {
        let i = if self.rng.chance(0.15) {
            BIG
        } else {
            self.rng.below(BIG as u64) as usize
        };
        let op = self.rng.below(100);
        match op {
            // Positioned write.
            0..=29 => {
                let off = self.offset(i);
                let len = self.length();
                let len = self.cap(i, off, len);
                let data = self.rng.bytes(len as usize);
                self.h(i).rw.write_all_at(&data, off).unwrap();
                self.models[i].write(off, &data);
                self.note(i, format!("pwrite({off}, {len})"));
                self.bytes_written += len;
                self.count("write");
            }
            // Read and compare, sometimes through the daemon (page cache dropped).
            30..=54 => {
                let off = self.offset(i);
                let len = self.length();
                let drop = self.rng.chance(0.3);
                self.check_read(i, off, len, drop);
                self.count("read");
            }
            // O_APPEND write: lands at the end, and the position follows.
            55..=61 => {
                if i == BIG && self.models[i].size > ANCHORS[2] + (8 << 20) {
                    return;
                }
                let size = self.models[i].size;
                let len = self.length().min(64 << 10);
                let len = self.cap(i, size.min(SMALL_MAX - 1), len);
                if i != BIG && size + len > SMALL_MAX {
                    return;
                }
                let data = self.rng.bytes(len as usize);
                let away = self.rng.below(size + 1);
                let mut f = &self.h(i).app;
                // Move the position away first: O_APPEND must ignore it.
                f.seek(SeekFrom::Start(away)).unwrap();
                f.write_all(&data).unwrap();
                let pos = f.stream_position().unwrap();
                self.models[i].write(size, &data);
                self.note(i, format!("append({len}) at {size}"));
                assert_eq!(
                    pos,
                    size + len,
                    "{}: position after O_APPEND write",
                    name(i)
                );
                self.bytes_written += len;
                self.count("append");
            }
            // Truncate: shrink or extend.
            62..=69 => {
                let size = self.models[i].size;
                let new = if self.rng.chance(0.4) {
                    if self.rng.chance(0.8) {
                        // Shrink a little (the big file stays beyond 4 GiB most of the time).
                        size.saturating_sub(self.rng.below(if i == BIG {
                            3 << 20
                        } else {
                            size / 8 + 1
                        }))
                    } else {
                        self.rng.below(size + 1)
                    }
                } else if i == BIG {
                    self.offset(i).max(size)
                } else {
                    (size + self.rng.below(1 << 20)).min(SMALL_MAX)
                };
                self.h(i).rw.set_len(new).unwrap();
                self.models[i].truncate(new);
                self.note(i, format!("ftruncate({new})"));
                self.count("truncate");
            }
            // fallocate mode 0 (extends the size) and KEEP_SIZE (changes nothing visible).
            70..=75 => {
                let off = self.offset(i);
                let len = self.length();
                let len = self.cap(i, off, len);
                let keep = self.rng.chance(0.4);
                let mode = if keep { libc::FALLOC_FL_KEEP_SIZE } else { 0 };
                let r = fallocate(&self.h(i).rw, mode, off, len);
                assert_eq!(r, 0, "{}: fallocate({mode}, {off}, {len})", name(i));
                if !keep {
                    let end = off + len;
                    if end > self.models[i].size {
                        self.models[i].size = end;
                    }
                }
                self.note(i, format!("fallocate({mode}, {off}, {len})"));
                self.count(if keep {
                    "fallocate_keep_size"
                } else {
                    "fallocate"
                });
            }
            // Punch a hole.
            76..=82 => {
                let off = self.offset(i);
                let len = self.length() * if self.rng.chance(0.3) { 8 } else { 1 };
                let len = self.cap(i, off, len);
                let r = fallocate(
                    &self.h(i).rw,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    off,
                    len,
                );
                assert_eq!(r, 0, "{}: punch({off}, {len})", name(i));
                self.models[i].punch(off, len);
                self.note(i, format!("punch({off}, {len})"));
                self.count("punch_hole");
            }
            // copy_file_range between two small files (aligned: block copy; else read+write).
            83..=86 => {
                let src = self.rng.below(BIG as u64) as usize;
                let dst = (src + 1 + self.rng.below(BIG as u64 - 1) as usize) % BIG;
                let aligned = self.rng.chance(0.5);
                let (mut off_in, mut off_out, mut len) = (
                    self.rng.below(self.models[src].size + 1),
                    self.offset(dst),
                    self.length(),
                );
                if aligned {
                    off_in &= !(BLOCK - 1);
                    off_out &= !(BLOCK - 1);
                    len = len.div_ceil(BLOCK) * BLOCK;
                }
                let len = len.min(SMALL_MAX - off_out);
                let (mut a, mut b) = (off_in as i64, off_out as i64);
                let mut done = 0u64;
                while done < len {
                    // SAFETY: valid fds and offset pointers.
                    let n = unsafe {
                        libc::copy_file_range(
                            self.h(src).rw.as_raw_fd(),
                            &mut a,
                            self.h(dst).rw.as_raw_fd(),
                            &mut b,
                            (len - done) as usize,
                            0,
                        )
                    };
                    assert!(
                        n >= 0,
                        "copy_file_range {src}->{dst} ({off_in}, {off_out}, {len}): errno {}",
                        errno()
                    );
                    if n == 0 {
                        break;
                    }
                    done += n as u64;
                }
                let data = self.models[src].read(off_in, done);
                assert_eq!(data.len() as u64, done, "copy_file_range copied past EOF");
                self.models[dst].write(off_out, &data);
                self.note(
                    dst,
                    format!(
                        "copy_file_range(from {src} at {off_in}, to {off_out}, {len}) = {done}"
                    ),
                );
                self.count(if aligned {
                    "copy_file_range_aligned"
                } else {
                    "copy_file_range"
                });
            }
            // SEEK_DATA / SEEK_HOLE against the model.
            87..=91 => {
                let size = self.models[i].size;
                if size == 0 {
                    return;
                }
                let x = if i == BIG && self.rng.chance(0.7) {
                    self.offset(i).min(size - 1)
                } else {
                    self.rng.below(size)
                };
                self.check_seek(i, x);
                self.count("seek_data_hole");
            }
            // stat: the size.
            92..=94 => {
                let st = self.h(i).rw.metadata().unwrap();
                assert_eq!(st.len(), self.models[i].size, "{}: st_size", name(i));
                self.count("stat");
            }
            // fsync.
            95..=96 => {
                self.h(i).rw.sync_all().unwrap();
                self.count("fsync");
            }
            // Unlink and recreate a small file (new handles).
            97 => {
                if i == BIG || self.rng.chance(0.5) {
                    return;
                }
                self.handles[i] = None;
                let p = m.p(&name(i));
                std::fs::remove_file(&p).unwrap();
                assert!(!p.exists());
                let rw = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .open(&p)
                    .unwrap();
                let app = OpenOptions::new().append(true).open(&p).unwrap();
                self.handles[i] = Some(Handles { rw, app });
                self.models[i] = Model::default();
                self.note(i, "unlink + create".into());
                self.count("recreate");
            }
            // Read across EOF and far beyond it.
            _ => {
                let size = self.models[i].size;
                let off = size.saturating_sub(self.rng.below(5000));
                let drop = self.rng.chance(0.5);
                self.check_read(i, off, 10_000, drop);
                let far = size + self.rng.below(1 << 20);
                self.check_read(i, far, 100, false);
                self.count("read_eof");
            }
        }
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn random_io_matches_a_model_across_remounts() {
    if !mount_env_ok() {
        return;
    }
    let _serial = serial();
    let total = env_u64("AMARANTH_INTEGRITY_OPS", 150_000);
    let remounts = env_u64("AMARANTH_INTEGRITY_REMOUNTS", 6);
    let seed = seed("integrity");
    let t0 = Instant::now();
    let s = Scratch::new("integrity");
    let img = s.mkfs("fs.img", "4G");
    let mut run = Run {
        rng: Rng::new(seed),
        models: vec![Model::default(); FILES],
        handles: Vec::new(),
        counts: BTreeMap::new(),
        bytes_written: 0,
        bytes_read: 0,
        hist: vec![Default::default(); FILES],
    };
    let opts = MountOpts {
        cache_size: "32M".into(),
        ..MountOpts::default()
    };
    let mut m = s.mount(&img, "mnt", &opts);
    run.open_all(&m);
    // The big file starts beyond 5 GiB, with a little data just below 4 GiB.
    let head = run.rng.bytes(10_000);
    run.h(BIG).rw.write_all_at(&head, 5 * GIB + 123).unwrap();
    run.models[BIG].write(5 * GIB + 123, &head);
    let mid = run.rng.bytes(9000);
    run.h(BIG).rw.write_all_at(&mid, 4 * GIB - 4500).unwrap();
    run.models[BIG].write(4 * GIB - 4500, &mid);
    run.check_seek(BIG, 0);
    // The small files start dense, 1 to 12 MiB each, written in 1 MiB requests.
    for i in 0..BIG {
        let len = run.rng.range(1 << 20, 12 << 20) as usize;
        let data = run.rng.bytes(len);
        for (k, chunk) in data.chunks(1 << 20).enumerate() {
            run.h(i).rw.write_all_at(chunk, (k << 20) as u64).unwrap();
        }
        run.models[i].write(0, &data);
        run.bytes_written += len as u64;
    }
    let per_cycle = total / (remounts + 1);
    let mut done = 0u64;
    for cycle in 0..=remounts {
        let t = Instant::now();
        let n = if cycle == remounts {
            total - done
        } else {
            per_cycle
        };
        for _ in 0..n {
            run.step(&m);
        }
        done += n;
        eprintln!(
            "cycle {cycle}: {n} operations in {:.1} s ({done} of {total})",
            t.elapsed().as_secs_f64()
        );
        run.verify_all(&m);
        run.handles.clear();
        s.finish(m);
        m = s.mount(&img, "mnt", &opts);
        run.verify_all(&m);
        run.open_all(&m);
    }
    run.handles.clear();
    s.finish(m);
    let counts: Vec<String> = run.counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
    report(&format!(
        "integrity: seed {seed}: {done} operations ({}), {} remounts, {} MiB written, {} MiB \
         read and compared, big file {} bytes, in {:.1} s",
        counts.join(", "),
        remounts + 1,
        run.bytes_written >> 20,
        run.bytes_read >> 20,
        run.models[BIG].size,
        t0.elapsed().as_secs_f64()
    ));
}
