//! Batches larger than a node and the memory bound (docs/DESIGN.md, Cache and memory bound).
//!
//! A flush that splits the child it flushed into leaves no piece over two nodes' worth of
//! buffers. A batch larger than a node moves down whole; when the node of height 1 it reaches
//! was over its fanout (a leaf split below it had added children), the flush split it, and the
//! piece that took the batch's slot was not the one the flush went down into: it stayed holding
//! the batch (a surgery-fuzz seed found one of 196 KiB with 8 KiB nodes, loaded whole again by a
//! later drain and passing the cache bound).
//!
//! Replaying such a batch at open makes room for it first, as writing it did.

use std::sync::Arc;

use amaranth_device::MemDevice;

use crate::lift_tests::options;
use crate::node::{Body, ROOT_ID};
use crate::{Batch, Engine, Format, Op, Options};

/// The largest buffered bytes of a node below the root, and its id and height.
fn heaviest_below_root(e: &Engine) -> (usize, u64, u32) {
    let mut worst = (0, 0, 0);
    for cn in e.tree().cache.all() {
        if cn.id == ROOT_ID {
            continue;
        }
        let g = cn.read();
        if let Body::Internal(n) = &g.body {
            worst = worst.max((n.buffered_bytes(), cn.id, g.height));
        }
    }
    worst
}

/// The fuzzer's format: 8 KiB nodes.
fn format() -> Format {
    Format {
        node_size: 8 << 10,
        ..Format::small_for_tests()
    }
}

/// A batch of `n` puts of one key family, `f/{first..first + n}`.
fn family_batch(first: u32, n: u32) -> Batch {
    let mut b = Batch::new();
    for j in first..first + n {
        b.push(Op::Put {
            key: format!("f/{j:06}").into_bytes(),
            value: vec![(j % 251) as u8; 60],
        });
    }
    b
}

#[test]
fn a_split_piece_holding_a_batch_drains_at_once() {
    let format = format();
    // Room for the whole tree: nothing evicted, every node inspected.
    let opts = Options {
        cache_size: 64 << 20,
        ..options()
    };
    let e = Engine::create(Arc::new(MemDevice::new(64 << 20)), format, opts).unwrap();
    for i in 0..1500u32 {
        e.put(format!("a/{i:06}").as_bytes(), &[(i % 251) as u8; 60])
            .unwrap();
    }
    while e.tree().flush_step(0).unwrap() {}
    assert!(
        e.stats().height >= 3,
        "a tree of {} levels",
        e.stats().height
    );
    // Batches of one key family, each several nodes' worth: each goes down whole along one
    // path, and the leaves it lands in split into many, so that the next batch finds their
    // parent over its fanout.
    let mut worst = (0, 0, 0);
    for round in 0..6u32 {
        e.write(&family_batch(round * 300, 300)).unwrap();
        worst = worst.max(heaviest_below_root(&e));
    }
    // A piece may keep up to twice the flush's threshold (a node's size here) before it drains.
    // Measured without the drain: 25,500 bytes in a node of height 2.
    let node_size = 8 << 10;
    assert!(
        worst.0 <= 2 * node_size,
        "node {} (height {}) below the root holds {} bytes of buffers (node size {node_size})",
        worst.1,
        worst.2,
        worst.0
    );
}

#[test]
fn a_batch_replayed_at_open_has_room_made_for_it() {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let opts = Options {
        cache_size: 128 << 10,
        ..options()
    };
    let e = Engine::create(dev.clone(), format(), opts.clone()).unwrap();
    for i in 0..1500u32 {
        e.put(format!("a/{i:06}").as_bytes(), &[(i % 251) as u8; 60])
            .unwrap();
    }
    e.checkpoint().unwrap();
    // Small writes after the checkpoint, to fill the cache as the replay goes, then batches of
    // several nodes' worth each (300 puts: about 70 KiB in a buffer).
    for i in 0..400u32 {
        e.put(format!("a/{:06}", i * 3).as_bytes(), &[1u8; 60])
            .unwrap();
    }
    for round in 0..4u32 {
        e.write(&family_batch(round * 300, 300)).unwrap();
        for i in 0..100u32 {
            e.put(format!("a/{:06}", i * 7 + round).as_bytes(), &[2u8; 60])
                .unwrap();
        }
    }
    e.sync().unwrap();
    e.abandon();
    let e = Engine::open(dev, opts).unwrap();
    // Measured: 131,378 bytes, as the writes themselves reached; 185,400 when the replay made no
    // room for a batch (it landed in a root the previous record had left at the eviction point).
    let st = e.stats();
    let allowed = st.cache_budget + 2 * format().node_size;
    assert!(
        st.cache_peak_bytes <= allowed,
        "the replay took the cache to {} bytes (bound {}, allowed {allowed})",
        st.cache_peak_bytes,
        st.cache_budget
    );
    assert_eq!(
        e.get(b"f/001199").unwrap(),
        Some(vec![(1199 % 251) as u8; 60])
    );
}
