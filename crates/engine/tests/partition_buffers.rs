//! A cold sequential read through a cache smaller than the data reads most leaves into the memory
//! of leaves shed before (their partitions are used in place in the image read, and the image's
//! buffer goes back to the store's pool when they are shed), or decodes partitions into the
//! memory of partitions shed before (the engine's buffer pool), not into newly mapped memory, and
//! stays within the cache bound. One test in this file: the partition pool is shared by the
//! process.

use std::ops::Bound;
use std::sync::Arc;

use amaranth_device::{BlockDevice, MemDevice};
use amaranth_engine::{Batch, Engine, Format, Options};

const MIB: usize = 1 << 20;
const BLOCK: usize = 4096;

fn key(blk: u64) -> Vec<u8> {
    format!("d/file/{blk:010}").into_bytes()
}

fn value(blk: u64) -> Vec<u8> {
    let mut v = vec![(blk % 251) as u8; BLOCK];
    v[..8].copy_from_slice(&blk.to_le_bytes());
    v
}

#[test]
fn a_sequential_read_reuses_the_buffers_of_shed_partitions() {
    let blocks = (96 * MIB / BLOCK) as u64;
    let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(1 << 30));
    let opts = |cache| Options {
        cache_size: cache,
        ..Options::default()
    };
    let e = Engine::create(dev.clone(), Format::default(), opts(64 * MIB)).unwrap();
    for chunk in (0..blocks).collect::<Vec<_>>().chunks(64) {
        let mut b = Batch::new();
        for &blk in chunk {
            b.put(key(blk), value(blk));
        }
        e.write(&b).unwrap();
    }
    e.close().unwrap();

    let e = Engine::open(dev, opts(32 * MIB)).unwrap();
    let before = e.stats();
    let mut at = 0;
    while at < blocks {
        let end = (at + 256).min(blocks);
        let mut next = at;
        e.scan(
            Bound::Included(&key(at)),
            Bound::Excluded(&key(end)),
            |_, v| {
                assert_eq!(v, value(next).as_slice(), "block {next}");
                next += 1;
                true
            },
        )
        .unwrap();
        assert_eq!(next, end);
        at = end;
    }
    e.wait_read_ahead();
    let st = e.stats();
    let reused = st.partition_buffers_reused - before.partition_buffers_reused;
    let images = st.image_buffers_reused - before.image_buffers_reused;
    // What the 96 MiB read past the first cache fill (32 MiB) read into reused memory: images of
    // up to a node each, or partitions of 128 KiB or less each.
    let reused_bytes =
        images as usize * Format::default().node_size + reused as usize * (128 << 10);
    println!(
        "partitions loaded {}, image buffers reused {images}, partition buffers reused {reused}, \
         cache peak {} of {}",
        st.partition_loads, st.cache_peak_bytes, st.cache_budget
    );
    assert!(
        reused_bytes >= 64 * MIB / 2,
        "{images} image and {reused} partition buffers reused: less than half of what was read \
         after the first cache fill"
    );
    assert!(st.cache_peak_bytes <= st.cache_budget);
    e.close().unwrap();
}
