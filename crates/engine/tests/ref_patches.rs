//! Patches on references to out-of-line blocks as flushes bring them to the leaves: a reference
//! keeps its patches up to `REF_PATCH_LIMIT` (1 KiB) and is made inline past it, whichever way
//! the flush decides (at once from the partition's longest reference, or by looking the key up).

use std::sync::Arc;

use amaranth_device::MemDevice;
use amaranth_engine::{Batch, Engine, Patch};

mod common;
use common::{blocks_format, small_options};

const KEYS: u32 = 64;

fn key(i: u32) -> Vec<u8> {
    format!("file/b{i:04}").into_bytes()
}

/// A write of `len` bytes of `fill` at `offset` of key `i`'s value (and the same on `model`).
fn patch(e: &Engine, model: &mut [Vec<u8>], i: u32, offset: usize, len: usize, fill: u8) {
    let data = vec![fill; len];
    model[i as usize][offset..offset + len].copy_from_slice(&data);
    let mut b = Batch::new();
    b.upsert(
        key(i),
        Patch::Write {
            offset: offset as u32,
            data,
        },
    );
    e.write(&b).unwrap();
}

/// Pushes every buffered message down to the leaves.
fn flush_all(e: &Engine) {
    e.flush_buffers(0, 10_000).unwrap();
}

fn is_ref(e: &Engine, i: u32) -> bool {
    !e.blocks_under_for_tests(&key(i)).is_empty()
}

#[test]
fn references_keep_patches_up_to_the_limit_and_are_made_inline_past_it() {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let e = Engine::create(dev, blocks_format(), small_options()).unwrap();
    let mut model: Vec<Vec<u8>> = (0..KEYS).map(|i| vec![i as u8; 4096]).collect();
    let mut b = Batch::new();
    b.put_blocks((0..KEYS).map(key).collect(), &model.concat());
    e.write(&b).unwrap();
    flush_all(&e);
    // Key 10: twenty 40-byte writes apart from each other (none folds into another), 980 bytes
    // of patches in all, delivered to the leaf in two flushes: still a reference.
    for n in 0..20 {
        patch(&e, &mut model, 10, n * 100, 40, 0xa0 + n as u8);
        if n == 9 {
            flush_all(&e);
        }
    }
    flush_all(&e);
    assert!(is_ref(&e, 10), "980 bytes of patches made the block inline");
    // Key 11, beside it: a 50-byte write. With key 10's reference that long in the partition,
    // the flush cannot tell at once and looks key 11 up: its own patches are few, it stays.
    patch(&e, &mut model, 11, 7, 50, 0xbb);
    // Key 12: small writes that fold into one patch, delivered at once.
    for n in 0..30 {
        patch(&e, &mut model, 12, 1000 + n, 1, n as u8);
    }
    flush_all(&e);
    assert!(is_ref(&e, 11) && is_ref(&e, 12));
    // One more write of key 10 takes its patches past 1 KiB: the leaf reads the block and keeps
    // the patched value inline.
    patch(&e, &mut model, 10, 3000, 40, 0xcc);
    flush_all(&e);
    assert!(
        !is_ref(&e, 10),
        "more than 1 KiB of patches kept on a reference"
    );
    for i in 0..KEYS {
        assert_eq!(
            e.get(&key(i)).unwrap().as_deref(),
            Some(&model[i as usize][..])
        );
        assert_eq!(is_ref(&e, i), i != 10, "key {i}");
    }
    e.check_data_table().unwrap();
    e.close().unwrap();
}
