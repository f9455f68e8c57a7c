//! The bytes of a sub-block in memory (a leaf partition, or a child's buffer encoding): a buffer
//! of its own, or its range of a buffer shared with other sub-blocks.
//!
//! An uncompressed sub-block's stored bytes are its in-memory form (`partition.rs`,
//! `buffer/encoded.rs`), so a node read from the device uses them where they lie in what was
//! read (the whole image, or the sub-block's own read) instead of copying each one out into a
//! buffer of its own; and a large leaf re-lifted by a cut is rebuilt into one buffer that its new
//! partitions share (`node/lift.rs`). On this machine a copy into fresh memory costs a page
//! fault and a page clear per 4 KiB (the daemon's allocator maps every buffer of 64 KiB or more
//! afresh, `cli/src/memlimit.rs`): in the first rename of a cold directory tree, which reads the
//! nodes at its range's edges whole to cut them, those copies and their faults were most of the
//! page faults (docs/BENCHMARKS.md, "Range rename: sub-blocks read in place").
//!
//! A shared buffer stays mapped while any range of it is used, so a node charges each buffer its
//! sub-blocks lie in whole and once ([`ImageCharge`], in `Leaf::mem` and `Internal::mem`), and
//! keeps those ranges only while they use more than half of it: otherwise the cache copies them
//! out before it measures the node (`Node::unshare_sparse_images`). A sub-block changed in place
//! is copied out first ([`SubBytes::to_mut`]); a shared buffer is never written.

use std::ops::Deref;
use std::sync::Arc;

use amaranth_device::AlignedBuf;

/// A buffer shared by the sub-blocks that are ranges of it (a node image read from the device,
/// or a re-lifted leaf's entries).
pub(crate) type SharedImage = Arc<ImageBuf>;

/// The buffer of a [`SharedImage`]; when the last range of it is dropped it goes back to the
/// pool it came from, if any (`Store::read_image`), so that a sequential read's images are read
/// into the memory of the images shed before rather than into new mappings.
#[derive(Debug)]
pub(crate) struct ImageBuf {
    buf: Option<AlignedBuf>,
    home: Option<Arc<ImagePool>>,
}

impl ImageBuf {
    /// `buf`, freed when dropped.
    pub(crate) fn new(buf: AlignedBuf) -> ImageBuf {
        ImageBuf {
            buf: Some(buf),
            home: None,
        }
    }

    /// `buf`, given back to `home` when dropped.
    pub(crate) fn pooled(buf: AlignedBuf, home: Arc<ImagePool>) -> ImageBuf {
        ImageBuf {
            buf: Some(buf),
            home: Some(home),
        }
    }
}

impl Deref for ImageBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.buf.as_ref().expect("image buffer")
    }
}

impl Drop for ImageBuf {
    fn drop(&mut self) {
        if let (Some(buf), Some(home)) = (self.buf.take(), &self.home) {
            home.give(buf);
        }
    }
}

/// Buffers kept for reuse (at most `kept` of them and `max_bytes` in all, newest kept): a fresh mapping costs a page fault and a
/// kernel page clear per 4 KiB (or per huge page) before the device can fill it. The store keeps
/// two: one for whole node images ([`ImagePool::images`]) and one for the reads of single
/// sub-blocks ([`ImagePool::subblocks`]), each given back its buffers when the last range of them
/// is dropped.
#[derive(Debug)]
pub(crate) struct ImagePool {
    bufs: parking_lot::Mutex<Vec<AlignedBuf>>,
    reused: std::sync::atomic::AtomicU64,
    /// Buffers shorter than this are not kept (the heap serves them without new mappings).
    min: usize,
    /// How many buffers are kept at most.
    kept: usize,
    /// How many bytes (buffer lengths) are kept at most.
    max_bytes: usize,
    /// Bytes kept now.
    bytes: std::sync::atomic::AtomicUsize,
}

impl ImagePool {
    /// The pool of whole node images: one buffer per read-ahead worker and one for a foreground
    /// reader, of 1 MiB or more.
    pub(crate) fn images() -> ImagePool {
        ImagePool::new(1 << 20, 3, usize::MAX)
    }

    /// The pool of single sub-block reads (a cold point read's partition, a buffer read for a
    /// point query): buffers of 64 KiB or more (the size from which an aligned buffer is a
    /// mapping of its own), up to [`crate::bufpool::POOL_BYTES`] in all, the most a cache's
    /// shedding step frees at once (`Tree::make_room`), so that a run of cold point reads through
    /// a full cache reads each partition into the memory of one shed before. Without it every
    /// such read mapped, faulted and unmapped its buffer afresh (half of the reader's CPU,
    /// docs/benchmarks/engine.md).
    pub(crate) fn subblocks() -> ImagePool {
        ImagePool::new(64 << 10, 1024, crate::bufpool::POOL_BYTES)
    }

    fn new(min: usize, kept: usize, max_bytes: usize) -> ImagePool {
        assert!(min >= amaranth_device::BLOCK_SIZE && kept > 0 && max_bytes >= min);
        ImagePool {
            bufs: parking_lot::Mutex::new(Vec::new()),
            reused: std::sync::atomic::AtomicU64::new(0),
            min,
            kept,
            max_bytes,
            bytes: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Bytes kept now (outside every cache's bound; at most `max_bytes`).
    #[cfg(test)]
    pub(crate) fn kept_bytes(&self) -> usize {
        self.bytes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether a buffer of `len` bytes is one this pool keeps.
    pub(crate) fn keeps(&self, len: usize) -> bool {
        len >= self.min
    }

    /// A kept buffer for `len` bytes: at least `len`, and at most a quarter longer, so that the
    /// sub-blocks read in place use most of it (they keep the whole buffer).
    pub(crate) fn take(&self, len: usize) -> Option<AlignedBuf> {
        if !self.keeps(len) {
            return None;
        }
        let mut bufs = self.bufs.lock();
        let i = bufs
            .iter()
            .rposition(|b| b.len() >= len && b.len() <= len + len / 4)?;
        self.reused
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let buf = bufs.swap_remove(i);
        self.bytes
            .fetch_sub(buf.len(), std::sync::atomic::Ordering::Relaxed);
        Some(buf)
    }

    /// Keeps `buf` for a later [`ImagePool::take`], dropping the oldest kept ones to stay within
    /// the pool's limits.
    pub(crate) fn give(&self, buf: AlignedBuf) {
        use std::sync::atomic::Ordering::Relaxed;
        if !self.keeps(buf.len()) || buf.len() > self.max_bytes {
            return;
        }
        let mut bufs = self.bufs.lock();
        let mut bytes = self.bytes.load(Relaxed) + buf.len();
        let mut drop_from = 0;
        while bufs.len() - drop_from >= self.kept || bytes > self.max_bytes {
            bytes -= bufs[drop_from].len();
            drop_from += 1;
        }
        let old: Vec<AlignedBuf> = bufs.drain(..drop_from).collect();
        bufs.push(buf);
        self.bytes.store(bytes, Relaxed);
        assert!(bufs.len() <= self.kept && bytes <= self.max_bytes);
        debug_assert_eq!(bytes, bufs.iter().map(|b| b.len()).sum::<usize>());
        drop(bufs);
        drop(old);
    }

    /// Buffers handed out again so far.
    pub(crate) fn reused(&self) -> u64 {
        self.reused.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// A sub-block's bytes.
#[derive(Clone, Debug)]
pub(crate) enum SubBytes {
    /// A buffer of its own (built, changed, or decompressed).
    Own(Vec<u8>),
    /// `len` bytes at `start` of a node image.
    Image {
        image: SharedImage,
        start: usize,
        len: usize,
    },
}

impl Default for SubBytes {
    fn default() -> SubBytes {
        SubBytes::Own(Vec::new())
    }
}

impl From<Vec<u8>> for SubBytes {
    fn from(v: Vec<u8>) -> SubBytes {
        SubBytes::Own(v)
    }
}

impl SubBytes {
    /// `len` bytes at `start` of `image`, used in place.
    pub(crate) fn in_image(image: &SharedImage, start: usize, len: usize) -> SubBytes {
        assert!(
            start.checked_add(len).is_some_and(|end| end <= image.len()),
            "sub-block range {start}+{len} outside its image of {}",
            image.len()
        );
        SubBytes::Image {
            image: image.clone(),
            start,
            len,
        }
    }

    /// The bytes as a buffer of their own, copied out of the image first if they are shared.
    pub(crate) fn to_mut(&mut self) -> &mut Vec<u8> {
        if let SubBytes::Image { .. } = self {
            let mut own = crate::bufpool::POOL.take(self.len());
            own.extend_from_slice(self);
            *self = SubBytes::Own(own);
        }
        match self {
            SubBytes::Own(v) => v,
            SubBytes::Image { .. } => unreachable!("copied out above"),
        }
    }

    /// The image whose range these bytes are, if they are shared.
    pub(crate) fn image(&self) -> Option<&SharedImage> {
        match self {
            SubBytes::Own(_) => None,
            SubBytes::Image { image, .. } => Some(image),
        }
    }

    /// Memory of a buffer of their own (0 for a shared range: the image is charged whole by
    /// the nodes that hold it).
    pub(crate) fn own_capacity(&self) -> usize {
        match self {
            SubBytes::Own(v) => v.capacity(),
            SubBytes::Image { .. } => 0,
        }
    }

    /// The buffer of their own, leaving an empty one (for the pool when a partition is dropped).
    pub(crate) fn take_own(&mut self) -> Option<Vec<u8>> {
        match std::mem::take(self) {
            SubBytes::Own(v) => Some(v),
            SubBytes::Image { .. } => None,
        }
    }
}

impl Deref for SubBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            SubBytes::Own(v) => v,
            SubBytes::Image { image, start, len } => &image[*start..*start + *len],
        }
    }
}

/// The memory of the distinct images some sub-blocks lie in: each image once, whole, with the
/// bytes of it those sub-blocks use.
#[derive(Default)]
pub(crate) struct ImageCharge {
    /// Each image counted (its address and length), and the bytes of it the ranges counted use.
    seen: Vec<(*const ImageBuf, usize, usize)>,
    mem: usize,
}

impl ImageCharge {
    /// Counts the image `bytes` are a range of, unless it was counted already, and the range.
    pub(crate) fn add(&mut self, bytes: &SubBytes) {
        if let Some(image) = bytes.image() {
            let p = Arc::as_ptr(image);
            match self.seen.iter_mut().find(|(q, _, _)| *q == p) {
                Some((_, _, used)) => *used += bytes.len(),
                None => {
                    self.seen.push((p, image.len(), bytes.len()));
                    self.mem += image.len();
                }
            }
        }
    }

    /// The bytes of the images counted.
    pub(crate) fn mem(&self) -> usize {
        self.mem
    }

    /// Whether some image counted is used for no more than [`KEEP_USED`] of its bytes by the
    /// ranges counted ([`ImageCharge::is_sparse`] tells which ranges lie in one).
    pub(crate) fn any_sparse(&self) -> bool {
        self.seen.iter().any(|&(_, len, used)| sparse(used, len))
    }

    /// Whether `bytes` lie in an image that the ranges counted use sparsely.
    pub(crate) fn is_sparse(&self, bytes: &SubBytes) -> bool {
        let Some(image) = bytes.image() else {
            return false;
        };
        let p = Arc::as_ptr(image);
        self.seen
            .iter()
            .any(|&(q, len, used)| q == p && sparse(used, len))
    }
}

/// A node keeps ranges of an image only while they use more than half of it; otherwise they are
/// copied into buffers of their own ([`crate::node::Node::unshare_sparse_images`]). So a node
/// charges less than twice its ranges' bytes for an image, and of the pieces of a cut or a split
/// at most one keeps it.
const KEEP_USED: (usize, usize) = (1, 2);

fn sparse(used: usize, len: usize) -> bool {
    used * KEEP_USED.1 <= len * KEEP_USED.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_range_reads_in_place_and_is_copied_once_changed() {
        let mut buf = AlignedBuf::zeroed(8192);
        buf[100..110].copy_from_slice(b"0123456789");
        let image: SharedImage = Arc::new(ImageBuf::new(buf));
        let mut b = SubBytes::in_image(&image, 100, 10);
        assert_eq!(&*b, b"0123456789");
        assert_eq!(b.own_capacity(), 0);
        assert!(Arc::ptr_eq(b.image().unwrap(), &image));
        assert_eq!(Arc::strong_count(&image), 2);
        b.to_mut().push(b'x');
        assert_eq!(&*b, b"0123456789x");
        assert!(b.image().is_none() && b.own_capacity() >= 11);
        assert_eq!(
            Arc::strong_count(&image),
            1,
            "the copy lets go of the image"
        );
    }

    #[test]
    fn images_are_charged_once_each_and_whole() {
        let (a, b): (SharedImage, SharedImage) = (
            Arc::new(ImageBuf::new(AlignedBuf::zeroed(8192))),
            Arc::new(ImageBuf::new(AlignedBuf::zeroed(4096))),
        );
        let parts = [
            SubBytes::in_image(&a, 0, 10),
            SubBytes::in_image(&a, 10, 10),
            SubBytes::from(vec![1; 50]),
            SubBytes::in_image(&b, 0, 1),
        ];
        let mut all = ImageCharge::default();
        parts.iter().for_each(|b| all.add(b));
        assert_eq!(all.mem(), 8192 + 4096);
        let mut own = ImageCharge::default();
        own.add(&parts[2]);
        assert_eq!(own.mem(), 0);
    }

    #[test]
    fn a_pool_keeps_its_newest_buffers_and_hands_out_only_snug_ones() {
        let pool = Arc::new(ImagePool::new(64 << 10, 2, usize::MAX));
        pool.give(AlignedBuf::zeroed(32 << 10));
        assert!(
            pool.take(32 << 10).is_none(),
            "shorter than the pool's minimum"
        );
        for len in [64 << 10, 128 << 10, 136 << 10] {
            let image = Arc::new(ImageBuf::pooled(AlignedBuf::zeroed(len), pool.clone()));
            drop(image);
        }
        // Two kept (128 and 136 KiB), the oldest (64 KiB) dropped.
        assert!(pool.take(64 << 10).is_none(), "not snug, and dropped");
        assert!(pool.take(140 << 10).is_none(), "too short");
        assert_eq!(
            pool.take(120 << 10).unwrap().len(),
            136 << 10,
            "newest first"
        );
        assert_eq!(pool.take(128 << 10).unwrap().len(), 128 << 10);
        assert!(pool.take(128 << 10).is_none(), "empty");
        assert_eq!(pool.reused(), 2);
        assert_eq!(pool.kept_bytes(), 0);

        // A byte limit: 300 KiB keeps two of 128 KiB; the third pushes the oldest out.
        let pool = Arc::new(ImagePool::new(64 << 10, 100, 300 << 10));
        for _ in 0..3 {
            pool.give(AlignedBuf::zeroed(128 << 10));
        }
        assert_eq!(pool.kept_bytes(), 256 << 10);
        pool.give(AlignedBuf::zeroed(400 << 10));
        assert_eq!(
            pool.kept_bytes(),
            256 << 10,
            "larger than the whole limit: not kept"
        );
        assert!(pool.take(128 << 10).is_some() && pool.take(128 << 10).is_some());
        assert!(pool.take(128 << 10).is_none());
    }

    #[test]
    #[should_panic(expected = "outside its image")]
    fn a_range_past_the_image_is_refused() {
        let image: SharedImage = Arc::new(ImageBuf::new(AlignedBuf::zeroed(4096)));
        SubBytes::in_image(&image, 4000, 200);
    }
}
