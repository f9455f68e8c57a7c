//! Proof that the invariant checks run in the configuration the tests use (`cargo test --release`,
//! debug assertions off): a node broken on purpose stops the engine at its next change, and a node
//! the parser would reject is never serialized.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use amaranth_device::MemDevice;

use crate::node::{self, Node, ROOT_ID};
use crate::{Compression, Engine, Format, Options};

fn engine(check_invariants: bool) -> Engine {
    let dev = Arc::new(MemDevice::new(16 << 20));
    let options = Options {
        cache_size: 1 << 20,
        background_threads: false,
        check_invariants,
        ..Options::default()
    };
    Engine::create(dev, Format::small_for_tests(), options).unwrap()
}

/// The panic message of `f`, if it panicked.
fn panic_of(f: impl FnOnce()) -> Option<String> {
    let err = catch_unwind(AssertUnwindSafe(f)).err()?;
    Some(match err.downcast::<String>() {
        Ok(s) => *s,
        Err(e) => e
            .downcast::<&str>()
            .map(|s| s.to_string())
            .unwrap_or_default(),
    })
}

#[test]
fn a_broken_node_stops_the_next_write() {
    let e = engine(true);
    e.put(b"a", b"1").unwrap();
    // Break the root (a leaf) behind the engine's back: a leaf must have height 0.
    let tree = e.tree();
    tree.pin(ROOT_ID).unwrap().write().height = 3;
    let msg = panic_of(|| {
        let _ = e.put(b"b", b"2");
    });
    let msg = msg.expect("the check must fire on the next change");
    assert!(msg.contains("leaf with height 3"), "{msg}");
    e.abandon();
}

#[test]
fn the_option_turns_the_checks_on() {
    assert!(engine(true).tree().check_invariants);
    assert_eq!(
        engine(false).tree().check_invariants,
        cfg!(debug_assertions)
    );
}

#[test]
fn serialize_refuses_a_node_the_parser_would_reject() {
    let mut leaf = Node::empty_leaf();
    assert!(panic_of(|| drop(node::serialize(9, &leaf, Compression::None))).is_none());
    leaf.height = 2;
    let msg = panic_of(|| drop(node::serialize(9, &leaf, Compression::None)));
    assert!(msg.is_some_and(|m| m.contains("node 9")));
}
