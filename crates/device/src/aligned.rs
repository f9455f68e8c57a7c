//! A heap buffer aligned to 4 KiB, as `O_DIRECT` requires.

use std::alloc::{self, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::BLOCK_SIZE;

/// A zero-initialised byte buffer whose address and length are multiples of [`BLOCK_SIZE`].
///
/// Buffers of [`MAPPED_MIN`] bytes or more are anonymous memory mappings: the kernel hands out
/// zeroed pages, so no memset runs (the allocator's `alloc_zeroed` clears over-aligned blocks by
/// hand, which took a quarter of a cold sequential read's CPU). Smaller ones come from the heap.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

/// The size of a transparent huge page (x86-64, arm64 with 4 KiB pages). Buffers of this size and
/// more (whole node images) start at a huge-page boundary and are advised for huge pages: a
/// direct read or write into 4 KiB pages is cut into requests of at most `max_segments` pages
/// (128 on a loop device: 512 KiB), one into a huge page is one request.
const HUGE_PAGE: usize = 2 << 20;

/// Bytes of all live buffers and the most they ever were at once (process-wide), for the memory
/// accounting of the programs above (the daemon's memory bound) and its tests.
static LIVE: AtomicUsize = AtomicUsize::new(0);
static LIVE_PEAK: AtomicUsize = AtomicUsize::new(0);

/// Bytes held by live [`AlignedBuf`]s in this process, and the highest that ever was.
pub fn aligned_bytes() -> (usize, usize) {
    (
        LIVE.load(Ordering::Relaxed),
        LIVE_PEAK.load(Ordering::Relaxed),
    )
}

fn count(len: usize) {
    let now = LIVE.fetch_add(len, Ordering::Relaxed) + len;
    LIVE_PEAK.fetch_max(now, Ordering::Relaxed);
}

/// The size from which a buffer is mapped rather than allocated (the daemon's allocator maps
/// blocks from 64 KiB on as well, so memory goes back to the system alike).
const MAPPED_MIN: usize = 64 * 1024;

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only allow reads of plain bytes.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates `len` zeroed bytes, rounded up to a whole number of blocks.
    pub fn zeroed(len: usize) -> AlignedBuf {
        let len = round_up(len.max(1));
        count(len);
        let layout = Layout::from_size_align(len, BLOCK_SIZE).expect("aligned buffer layout");
        if len >= MAPPED_MIN {
            // A buffer of a huge page or more starts at a huge-page boundary: map one huge page
            // more, then trim the unaligned head and the tail.
            let extra = if len >= HUGE_PAGE { HUGE_PAGE } else { 0 };
            // SAFETY: an anonymous private mapping; no existing memory is touched.
            let mut raw = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len + extra,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if raw == libc::MAP_FAILED {
                alloc::handle_alloc_error(layout);
            }
            if extra > 0 {
                let start = raw as usize;
                let aligned = start.next_multiple_of(HUGE_PAGE);
                // SAFETY: unmaps the parts of our own mapping outside [aligned, aligned + len);
                // the advice only asks for huge pages (without them the buffer is 4 KiB pages).
                unsafe {
                    if aligned > start {
                        libc::munmap(raw, aligned - start);
                    }
                    let tail = start + len + extra - (aligned + len);
                    if tail > 0 {
                        libc::munmap((aligned + len) as *mut libc::c_void, tail);
                    }
                    libc::madvise(aligned as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
                }
                raw = aligned as *mut libc::c_void;
            }
            // Anonymous mappings are page-aligned and read as zeros until written (mmap(2)), so
            // every byte is initialised.
            assert_eq!(raw as usize % BLOCK_SIZE, 0, "mapping not block-aligned");
            let ptr = NonNull::new(raw.cast::<u8>()).expect("mmap returned null");
            return AlignedBuf { ptr, len };
        }
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len }
    }

    /// Copies `data` into a new buffer, zero-padded to a whole number of blocks.
    pub fn from_slice(data: &[u8]) -> AlignedBuf {
        let mut buf = AlignedBuf::zeroed(data.len());
        buf[..data.len()].copy_from_slice(data);
        buf
    }

    /// Length in bytes (a multiple of [`BLOCK_SIZE`]).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a buffer holds at least one block.
    pub fn is_empty(&self) -> bool {
        false
    }
}

/// Whether the mapping that starts at `addr` is advised for transparent huge pages (`hg` among
/// its `VmFlags` in `/proc/self/smaps`; false when no mapping starts there). For tests.
#[doc(hidden)]
pub fn advised_huge_for_tests(addr: usize) -> bool {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap_or_default();
    let mut ours = false;
    for line in smaps.lines() {
        // A mapping's lines start with its range (`lo-hi perms ...`) and end with `VmFlags:`.
        let range = line.split(' ').next().unwrap_or("");
        let lo = range.split_once('-').and_then(|(lo, hi)| {
            usize::from_str_radix(hi, 16).ok()?;
            usize::from_str_radix(lo, 16).ok()
        });
        if let Some(lo) = lo {
            ours = lo == addr;
        } else if let Some(f) = line.strip_prefix("VmFlags:").filter(|_| ours) {
            return f.split_whitespace().any(|f| f == "hg");
        }
    }
    false
}

/// Rounds `n` up to a multiple of [`BLOCK_SIZE`].
pub fn round_up(n: usize) -> usize {
    n.div_ceil(BLOCK_SIZE) * BLOCK_SIZE
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        LIVE.fetch_sub(self.len, Ordering::Relaxed);
        if self.len >= MAPPED_MIN {
            // SAFETY: mapped in `zeroed` with exactly this address and length, unmapped once.
            let r = unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
            assert_eq!(r, 0, "munmap of an aligned buffer failed");
            return;
        }
        let layout = Layout::from_size_align(self.len, BLOCK_SIZE).expect("aligned buffer layout");
        // SAFETY: allocated in `zeroed` with this exact layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised bytes for the lifetime of self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for len initialised bytes and uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_rounded() {
        let b = AlignedBuf::zeroed(5000);
        assert_eq!(b.len(), 8192);
        assert_eq!(b.as_ptr() as usize % BLOCK_SIZE, 0);
        assert!(b.iter().all(|&x| x == 0));
        let c = AlignedBuf::from_slice(b"hello");
        assert_eq!(&c[..5], b"hello");
        assert_eq!(c.len(), BLOCK_SIZE);
    }

    #[test]
    fn mapped_buffers_are_zeroed_aligned_and_writable() {
        for len in [MAPPED_MIN - 1, MAPPED_MIN, 4 << 20] {
            let mut b = AlignedBuf::zeroed(len);
            assert_eq!(b.len(), round_up(len));
            assert_eq!(b.as_ptr() as usize % BLOCK_SIZE, 0);
            assert!(b.iter().all(|&x| x == 0));
            let n = b.len();
            b[n - 1] = 7;
            b[0] = 9;
            assert_eq!((b[0], b[n - 1]), (9, 7));
        }
    }

    #[test]
    fn buffers_of_a_huge_page_and_more_start_at_one_and_are_advised_huge() {
        for len in [HUGE_PAGE, 4 << 20, (5 << 20) + 4096] {
            let mut b = AlignedBuf::zeroed(len);
            let at = b.as_ptr() as usize;
            assert_eq!(at % HUGE_PAGE, 0, "{len}-byte buffer at {at:#x}");
            assert!(
                advised_huge_for_tests(at),
                "{len}-byte buffer not advised for huge pages"
            );
            assert!(b.iter().all(|&x| x == 0));
            let n = b.len();
            b[n - 1] = 1;
        }
        // Smaller mapped buffers are ordinary mappings.
        let small = AlignedBuf::zeroed(MAPPED_MIN);
        assert!(!advised_huge_for_tests(small.as_ptr() as usize));
    }
}
