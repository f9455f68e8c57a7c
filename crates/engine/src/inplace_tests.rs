//! Sub-blocks read in place (`subbytes.rs`): an uncompressed partition or buffer read from the
//! device is used where it lies in what was read, not copied out; the node that holds it charges
//! the image whole, once; a change copies the bytes out first; compressed sub-blocks are
//! decompressed into buffers of their own as before.

use std::ops::Bound;
use std::sync::Arc;

use amaranth_device::{BlockDevice, MemDevice};

use crate::config::Compression;
use crate::dataref::Stored;
use crate::node::{Body, Node};
use crate::partition::Partition;
use crate::subbytes::ImageCharge;
use crate::{Engine, Format, Options};

fn options() -> Options {
    Options {
        cache_size: 8 << 20,
        background_threads: false,
        ..Options::default()
    }
}

/// An image holding 3,000 keys of 300-byte values in nodes of the test format, checkpointed
/// with messages still in internal buffers (the last 200 puts), closed.
fn image(compression: Compression) -> Arc<MemDevice> {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let format = Format {
        compression,
        ..Format::small_for_tests()
    };
    let e = Engine::create(dev.clone(), format, options()).unwrap();
    for i in 0..3000u32 {
        e.put(format!("k/{i:06}").as_bytes(), &value(i)).unwrap();
    }
    e.checkpoint().unwrap();
    for i in (0..3000u32).step_by(15) {
        e.put(format!("k/{i:06}").as_bytes(), &value(i + 1))
            .unwrap();
    }
    e.checkpoint().unwrap();
    e.close().unwrap();
    dev
}

fn value(i: u32) -> Vec<u8> {
    let mut v = vec![(i % 251) as u8; 300];
    v[..4].copy_from_slice(&i.to_le_bytes());
    v
}

fn want(i: u32) -> Vec<u8> {
    value(if i.is_multiple_of(15) { i + 1 } else { i })
}

/// Every node of the tree read whole from the device.
fn nodes_read_whole(e: &Engine) -> Vec<Node> {
    let tree = e.tree();
    let next = tree.next_node_id.load(std::sync::atomic::Ordering::Relaxed);
    (1..next)
        .filter(|&id| tree.store.location(id).is_some())
        .map(|id| tree.read_node(id, true).unwrap().0)
        .collect()
}

/// The partitions of a leaf and the encodings of an internal node's buffers: whether each is
/// a range of an image, and the images' charge.
fn sharing(n: &Node) -> (Vec<bool>, usize) {
    let mut images = ImageCharge::default();
    let mut shared = Vec::new();
    match &n.body {
        Body::Leaf(l) => {
            for p in l.resident_parts() {
                shared.push(p.part_bytes().image().is_some());
                images.add(p.part_bytes());
            }
        }
        Body::Internal(int) => {
            for b in &int.buffers {
                let mut one = ImageCharge::default();
                b.charge_image(&mut one);
                shared.push(one.mem() > 0);
                b.charge_image(&mut images);
            }
        }
    }
    (shared, images.mem())
}

#[test]
fn uncompressed_sub_blocks_are_read_in_place_and_their_image_charged_once() {
    let dev = image(Compression::None);
    let e = Engine::open(dev, options()).unwrap();
    let nodes = nodes_read_whole(&e);
    let (mut leaves, mut buffers) = (0, 0);
    for n in &nodes {
        let (shared, images) = sharing(n);
        assert!(
            shared.iter().all(|&s| s),
            "a sub-block copied out of its image"
        );
        match &n.body {
            Body::Leaf(l) => {
                leaves += 1;
                let parts = l.resident_parts();
                // One image for all of them, charged once and whole.
                let first = parts[0].part_bytes().image().unwrap();
                assert!(parts
                    .iter()
                    .all(|p| Arc::ptr_eq(p.part_bytes().image().unwrap(), first)));
                assert_eq!(images, first.len());
                assert!(
                    l.mem() >= first.len(),
                    "the leaf charges less than its image"
                );
                let own: usize = parts.iter().map(|p| p.mem()).sum();
                assert!(
                    own < first.len() / 2,
                    "partitions charged their bytes as well"
                );
            }
            Body::Internal(int) => {
                buffers += int.buffers.iter().filter(|b| b.bytes() > 0).count();
                assert!(int.mem() >= images && images > 0);
            }
        }
    }
    assert!(
        leaves > 10 && buffers > 0,
        "{leaves} leaves, {buffers} buffers"
    );
    // Every key reads back through the loads of a cold cache: point reads (one sub-block read
    // on its own) and a scan (leaves read whole).
    for i in (0..3000u32).step_by(7) {
        assert_eq!(
            e.get(format!("k/{i:06}").as_bytes()).unwrap(),
            Some(want(i))
        );
    }
    let mut n = 0u32;
    e.scan(Bound::Unbounded, Bound::Unbounded, |k, v| {
        assert_eq!(k, format!("k/{n:06}").as_bytes());
        assert_eq!(v, want(n));
        n += 1;
        true
    })
    .unwrap();
    assert_eq!(n, 3000);
}

#[test]
fn a_partition_read_in_place_is_copied_out_before_it_changes() {
    let dev = image(Compression::None);
    let e = Engine::open(dev, options()).unwrap();
    let leaf = nodes_read_whole(&e)
        .into_iter()
        .find(|n| n.height == 0)
        .unwrap();
    let Body::Leaf(l) = &leaf.body else {
        unreachable!()
    };
    let read: Arc<Partition> = l.resident_parts()[0].clone();
    let image = read.part_bytes().image().unwrap().clone();
    let before = image.to_vec();
    let (key, stored) = (read.key(0).to_vec(), read.value(0).raw().to_vec());
    let mut changed = (*read).clone();
    changed.set(&key, Some(Stored::Bytes(b"changed")));
    changed.remove_run(1, 2);
    assert!(
        changed.part_bytes().image().is_none(),
        "changed in the image"
    );
    assert_eq!(changed.get(&key), Some(Stored::Bytes(&b"changed"[..])));
    assert_eq!(
        image[..],
        before[..],
        "the image changed under its other readers"
    );
    assert_eq!(read.value(0).raw(), stored.as_slice());
    assert_eq!(read.len(), changed.len() + 1);
}

#[test]
fn compressed_sub_blocks_are_decompressed_into_their_own_buffers() {
    let dev = image(Compression::Lz4);
    let e = Engine::open(dev, options()).unwrap();
    for n in &nodes_read_whole(&e) {
        let (shared, images) = sharing(n);
        assert!(shared.iter().all(|&s| !s) && images == 0);
    }
    for i in (0..3000u32).step_by(11) {
        assert_eq!(
            e.get(format!("k/{i:06}").as_bytes()).unwrap(),
            Some(want(i))
        );
    }
}

#[test]
fn a_damaged_sub_block_read_in_place_is_refused() {
    let dev = image(Compression::None);
    let e = Engine::open(dev.clone(), options()).unwrap();
    let tree = e.tree();
    let next = tree.next_node_id.load(std::sync::atomic::Ordering::Relaxed);
    let id = (1..next)
        .find(|&id| {
            tree.store.location(id).is_some() && tree.read_node(id, true).unwrap().0.height == 0
        })
        .unwrap();
    let ext = tree.store.location(id).unwrap();
    let h = {
        let img = tree
            .store
            .read_image(ext.offset(), ext.len(), "test")
            .unwrap();
        crate::node::parse_header(&img, &tree.format, "test", ext.offset()).unwrap()
    };
    drop(e);
    // One byte of the leaf's last partition flipped on the device.
    let loc = h.sublocs.last().unwrap();
    let at = ext.offset() + loc.offset as u64 + loc.stored_len as u64 / 2;
    let mut block = amaranth_device::AlignedBuf::zeroed(4096);
    let base = at / 4096 * 4096;
    dev.read_at(base, &mut block).unwrap();
    block[(at - base) as usize] ^= 0x40;
    dev.write_at(base, &block).unwrap();
    let e = Engine::open(dev, options()).unwrap();
    assert!(matches!(
        e.tree().read_node(id, true),
        Err(crate::Error::Checksum { .. })
    ));
}

#[test]
fn a_node_that_uses_little_of_its_image_copies_it_out() {
    // Nodes of 256 KiB and partitions of 32 KiB: a leaf read whole uses nearly all of its image.
    let dev = Arc::new(MemDevice::new(64 << 20));
    let format = Format {
        node_size: 256 << 10,
        partition_size: 32 << 10,
        max_fanout: 8,
        ..Format::small_for_tests()
    };
    let e = Engine::create(dev.clone(), format, options()).unwrap();
    for i in 0..6000u32 {
        e.put(format!("k/{i:06}").as_bytes(), &value(i)).unwrap();
    }
    e.checkpoint().unwrap();
    e.close().unwrap();
    let e = Engine::open(dev, options()).unwrap();
    let mut leaf = nodes_read_whole(&e)
        .into_iter()
        .filter(|n| n.height == 0)
        .max_by_key(|n| n.bytes())
        .unwrap();
    let image_len = {
        let Body::Leaf(l) = &leaf.body else {
            unreachable!()
        };
        assert!(l.parts.len() >= 4, "{} partitions", l.parts.len());
        l.resident_parts()[0].part_bytes().image().unwrap().len()
    };
    let (_, charged) = sharing(&leaf);
    assert_eq!(charged, image_len);
    assert!(
        !leaf.unshare_sparse_images(),
        "a leaf read whole uses most of its image and keeps it"
    );
    // Keep only the first partition (as a cut piece would): its image is now mostly unused.
    let Body::Leaf(l) = &mut leaf.body else {
        unreachable!()
    };
    l.parts.truncate(1);
    l.pivots.clear();
    let before = l.resident_parts()[0].raw().to_vec();
    assert!(leaf.unshare_sparse_images());
    let (shared, charged) = sharing(&leaf);
    assert_eq!((shared, charged), (vec![false], 0));
    let Body::Leaf(l) = &leaf.body else {
        unreachable!()
    };
    assert_eq!(l.resident_parts()[0].raw(), before.as_slice());
    assert!(l.mem() < image_len / 2, "the leaf still charges the image");
    // Through the cache: no node it holds after a cold scan keeps an image it uses half of or
    // less.
    e.scan(Bound::Unbounded, Bound::Unbounded, |_, _| true)
        .unwrap();
    for cn in e.tree().cache.all() {
        let g = cn.read();
        let (shared, _) = sharing(&g);
        if shared.contains(&true) {
            assert!(!g.unshare_sparse_images(), "the cache kept a sparse image");
        }
    }
}

/// Cold point reads through a cache much smaller than the data: each read sheds about one
/// partition for room, and reads the next one into the shed one's buffer (the store's sub-block
/// pool), not into a new mapping; every value is right (the bytes of a reused buffer past its
/// partition belong to no entry) and the cache stays within its bound.
#[test]
fn cold_point_reads_reuse_the_buffers_of_shed_partitions() {
    let dev = Arc::new(MemDevice::new(512 << 20));
    let opts = |cache| Options {
        cache_size: cache,
        background_threads: false,
        ..Options::default()
    };
    let big = |i: u32| {
        let mut v = vec![(i % 253) as u8; 1000 + (i as usize % 7) * 100];
        v[..4].copy_from_slice(&i.to_le_bytes());
        v
    };
    let keys = 48_000u32; // ~62 MB of values: several hundred 128 KiB partitions
                          // 1 MiB nodes (the default's 128 KiB partitions), so that an 8 MiB cache is allowed.
    let format = Format {
        node_size: 1 << 20,
        ..Format::default()
    };
    let e = Engine::create(dev.clone(), format, opts(64 << 20)).unwrap();
    for chunk in (0..keys).collect::<Vec<_>>().chunks(500) {
        let mut b = crate::Batch::new();
        for &i in chunk {
            b.put(format!("p/{i:08}").into_bytes(), big(i));
        }
        e.write(&b).unwrap();
    }
    e.close().unwrap();

    let e = Engine::open(dev, opts(8 << 20)).unwrap();
    let before = e.stats();
    let mut x = 0x9e37_79b9u32;
    for _ in 0..3000 {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        let i = x % keys;
        let got = e.get(format!("p/{i:08}").as_bytes()).unwrap();
        assert_eq!(got.as_deref(), Some(big(i).as_slice()), "key {i}");
    }
    let st = e.stats();
    let loads = st.partition_loads - before.partition_loads;
    let reused = st.subblock_buffers_reused - before.subblock_buffers_reused;
    println!(
        "partition loads {loads}, sub-block buffers reused {reused}, bytes read {}",
        st.node_bytes_read - before.node_bytes_read
    );
    // Most queries into a partition shed before read one run of it (`node/runs.rs`); the
    // first one into each loads it whole.
    assert!(loads > 500, "the reads were cold: {loads} loads");
    assert!(
        reused * 4 >= loads * 3,
        "{reused} of {loads} partition reads used a shed partition's buffer"
    );
    assert!(st.cache_peak_bytes <= st.cache_budget);
    e.close().unwrap();
}
