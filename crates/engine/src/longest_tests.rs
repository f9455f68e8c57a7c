//! Key-length bounds (docs/SURGERY.md §2.6): written with the nodes and read back, checked by
//! `verify`, and a prefix move the bounds cannot show to fit is decided by the exact scan, at
//! its application and at its replay alike.

use std::sync::Arc;

use amaranth_device::MemDevice;

use crate::node::{Body, ROOT_ID};
use crate::ops::prefix_end;
use crate::{Batch, Engine, Error, Format, Options};

fn options() -> Options {
    Options {
        cache_size: 1 << 20,
        background_threads: false,
        check_invariants: true,
        ..Options::default()
    }
}

/// An engine with keys `d/NNNNNN` (8 bytes) and `e/…` (28 bytes), flushed into a tree of height
/// at least 2.
fn engine_on(dev: Arc<MemDevice>) -> Engine {
    let e = Engine::create(dev, Format::small_for_tests(), options()).unwrap();
    for i in 0..1500u32 {
        e.put(format!("d/{i:06}").as_bytes(), &[1u8; 60]).unwrap();
        e.put(format!("e/{i:06}{}", "x".repeat(20)).as_bytes(), &[2u8; 60])
            .unwrap();
    }
    while e.tree().flush_step(0).unwrap() {}
    assert!(e.stats().height >= 2);
    e
}

fn bound(e: &Engine, p: &[u8]) -> usize {
    e.longest_key_bound(p, &prefix_end(p, 256)).unwrap()
}

#[test]
fn bounds_are_tight_survive_a_reopen_and_verify_checks_them() {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let e = engine_on(dev.clone());
    // The leaf holding the last d/ keys and the first e/ keys bounds both ranges by 28.
    let d = bound(&e, b"d/");
    assert!((8..=28).contains(&d), "{d}");
    assert_eq!(bound(&e, b"e/"), 28);
    e.close().unwrap();
    let e = Engine::open(dev, options()).unwrap();
    assert_eq!(bound(&e, b"d/"), d, "bounds are read back from the images");
    assert_eq!(bound(&e, b"e/"), 28);
    e.verify().unwrap();
    // A bound below a key it covers is damage.
    {
        let root = e.tree().pin(ROOT_ID).unwrap();
        let mut g = root.write();
        let Body::Internal(n) = &mut g.body else {
            panic!("a root with children")
        };
        n.buffers[0].longest = 1;
    }
    let err = e.verify().unwrap_err();
    assert!(err.to_string().contains("key-length bounds"), "{err}");
    e.abandon();
}

#[test]
fn a_move_the_bounds_refuse_is_decided_by_the_scan_and_replays() {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let e = engine_on(dev.clone());
    // A key of 255 bytes under d/ comes and goes: the bounds stay at 255 (deletions leave them
    // high), while the longest live key under d/ is 8 bytes.
    let long = [b"d/".as_slice(), &[b'z'; 253]].concat();
    e.put(&long, b"v").unwrap();
    e.delete(&long).unwrap();
    assert_eq!(bound(&e, b"d/"), 255);
    // d/ -> dddd/ lengthens keys by 3: 258 > 256 by the bounds, 11 by the keys.
    let mut b = Batch::new();
    b.move_prefix(b"d/".to_vec(), b"dddd/".to_vec());
    e.write(&b).expect("accepted by the exact check");
    e.sync().unwrap();
    e.abandon();
    let e = Engine::open(dev, options()).unwrap();
    assert_eq!(e.stats().skipped_records, 0, "the replay accepts it too");
    assert_eq!(
        e.get(b"dddd/000042").unwrap().as_deref(),
        Some(&[1u8; 60][..])
    );
    assert_eq!(e.get(b"d/000042").unwrap(), None);
    // A live key that does not fit is still refused.
    e.put(&long, b"v").unwrap();
    let mut b = Batch::new();
    b.move_prefix(b"d/".to_vec(), b"dddd/".to_vec());
    assert!(matches!(
        e.write(&b),
        Err(Error::KeyTooLong { len: 258, .. })
    ));
    e.close().unwrap();
}
