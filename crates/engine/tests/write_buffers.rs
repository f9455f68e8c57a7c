//! The data of a large write (`put_blocks`) is copied into a slot of the pool of huge pages
//! (`writebuf.rs`), so that the data writers write a 1 MiB run as one device request (from 4 KiB
//! pages a loop device cut it into two of 512 KiB), and the slots come back for the next writes
//! without the slabs being mapped again.
//! One test in this file: the pool is shared by the process.

use std::sync::Arc;

use amaranth_device::{advised_huge_for_tests, BlockDevice, MemDevice};
use amaranth_engine::{Batch, Engine, Format, Op, Options};

const MIB: usize = 1 << 20;
const BLOCK: usize = 4096;
const HUGE_PAGE: usize = 2 << 20;

fn keys(first: u64, n: usize) -> Vec<Vec<u8>> {
    (first..first + n as u64)
        .map(|b| format!("d/file/{b:010}").into_bytes())
        .collect()
}

#[test]
fn the_data_of_a_1_mib_write_is_in_a_huge_page_and_its_buffer_comes_back() {
    let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(512 << 20));
    let e = Engine::create(dev, Format::default(), Options::default()).unwrap();
    let before = e.stats();
    let data: Vec<u8> = (0..MIB).map(|i| (i * 31 + i / BLOCK) as u8).collect();
    let per = MIB / BLOCK;
    let writes = 200;
    for w in 0..writes {
        let mut b = Batch::new();
        b.put_blocks(keys((w * per) as u64, per), &data);
        if w == 0 {
            // The bytes sit in one half of a huge page, advised for transparent huge pages.
            let Op::PutBlocks { data: d, .. } = &b.ops()[0] else {
                panic!("not a put_blocks");
            };
            let at = d.bytes().expect("not written yet").as_ptr() as usize;
            assert!(at.is_multiple_of(MIB), "data at {at:#x}");
            assert!(
                advised_huge_for_tests(at & !(HUGE_PAGE - 1)),
                "the data of a 1 MiB write is not in a mapping advised for huge pages"
            );
        }
        e.write(&b).unwrap();
    }
    e.sync().unwrap();
    let after = e.stats();
    // 200 MiB went through a pool of at most 48 MiB: every buffer was a slot, so slots came back.
    assert_eq!(
        after.data_buffers_pooled - before.data_buffers_pooled,
        writes as u64
    );
    assert_eq!(after.data_buffers_unpooled, before.data_buffers_unpooled);
    // And the slabs stayed mapped while the writes went on: mapping one again costs a huge
    // page's fault and clear (at most 24 slabs are mapped at once).
    let mapped = after.data_buffer_slabs_mapped - before.data_buffer_slabs_mapped;
    assert!(mapped <= 24, "{mapped} slabs mapped for 200 writes");
    assert_eq!(after.data_writes - before.data_writes, writes as u64);
    let got = e
        .get(format!("d/file/{:010}", 3 * per + 5).as_bytes())
        .unwrap()
        .unwrap();
    assert_eq!(&got[..], &data[5 * BLOCK..6 * BLOCK]);
    e.close().unwrap();
}
