//! Allocations on the data path, counted in the calling thread by this test's allocator: a 1 MiB
//! read of out-of-line blocks makes a few, not a few per block (the keys of its 256 blocks used
//! to be copied one allocation each), and a small write makes no zero-filled one (glibc's
//! `calloc` skips the per-thread cache: in a `randwrite` profile, the 8 zero bytes of the write's
//! room estimate took more time than the write's other allocations together).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;

use amaranth_device::{AlignedBuf, MemDevice};
use amaranth_engine::{Engine, Format, Options};
use amaranth_fs::{Ctx, Fs, FsOptions, ROOT_INO};

/// Counts the allocations (all, and zero-filled) of a thread while it counts.
struct Counting;

thread_local! {
    static COUNTS: Cell<Option<(usize, usize)>> = const { Cell::new(None) };
}

fn bump(zeroed: bool) {
    let _ = COUNTS.try_with(|c| {
        if let Some((all, z)) = c.get() {
            c.set(Some((all + 1, z + usize::from(zeroed))));
        }
    });
}

// SAFETY: forwards every call to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        bump(false);
        // SAFETY: as the caller's contract.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        bump(true);
        // SAFETY: as the caller's contract.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: as the caller's contract.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        bump(false);
        // SAFETY: as the caller's contract.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Allocations (all, zero-filled) that `f` makes in this thread.
fn counted<R>(f: impl FnOnce() -> R) -> (R, usize, usize) {
    COUNTS.with(|c| c.set(Some((0, 0))));
    let r = f();
    let (all, zeroed) = COUNTS.with(|c| c.take()).expect("counting");
    (r, all, zeroed)
}

const CTX: Ctx = Ctx {
    uid: 0,
    gid: 0,
    pid: 0,
};
const MIB: usize = 1 << 20;

#[test]
fn a_block_read_and_a_small_write_allocate_little() {
    let dev = Arc::new(MemDevice::new(256 << 20));
    let opts = Options {
        background_threads: false,
        ..Options::default()
    };
    let engine = Engine::create(dev, Format::default(), opts).unwrap();
    Fs::mkfs(&engine, 0, 0).unwrap();
    let fs = Fs::new(Arc::new(engine), FsOptions::default()).unwrap();
    let (a, fh) = fs.create(ROOT_INO, b"f", 0o644, libc::O_RDWR, CTX).unwrap();
    fs.release(a.ino, fh).unwrap();
    let data: Vec<u8> = (0..8 * MIB).map(|i| (i * 7 + i / 4096) as u8).collect();
    for (k, c) in data.chunks(MIB).enumerate() {
        fs.write(a.ino, 0, (k * MIB) as u64, c, false).unwrap();
    }
    assert!(
        !fs.engine().blocks_under_for_tests(b"").is_empty(),
        "the file was not written out of line"
    );
    let mut out = AlignedBuf::zeroed(MIB);
    fs.read_to_slice(a.ino, 3 * MIB as u64, &mut out).unwrap(); // the leaves are cached now
    let (n, all, _) = counted(|| fs.read_to_slice(a.ino, 2 * MIB as u64, &mut out).unwrap());
    assert_eq!((n, &out[..]), (MIB, &data[2 * MIB..3 * MIB]));
    assert!(
        all < 64,
        "a 1 MiB read of 256 blocks made {all} allocations"
    );
    let (w, _, zeroed) = counted(|| fs.write(a.ino, 0, 12_345, b"abcd", false).unwrap());
    assert_eq!(
        (w, zeroed),
        (4, 0),
        "a 4-byte write made zero-filled allocations"
    );
}
