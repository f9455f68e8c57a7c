//! Preferential splitting (docs/SURGERY.md §3.5): with the caller's boundary bytes set, leaves
//! split where a unit of the key structure starts, so a later range operation on a unit finds its
//! boundaries at pivots and cuts fewer nodes.

use std::sync::Arc;

use amaranth_device::MemDevice;

use crate::node::{Body, ROOT_ID};
use crate::ops::prefix_end;
use crate::tree::Bounds;
use crate::{Batch, Engine, Format, Options};

/// An engine holding 40 "directories" of 60 "files" each (`dNN/fileNNNN`), flushed down, with
/// leaf splits preferring `boundaries`. Returns it and the full pivots of its lowest internal
/// level.
fn filled(boundaries: &[u8]) -> (Engine, Vec<Vec<u8>>) {
    let options = Options {
        cache_size: 8 << 20,
        background_threads: false,
        check_invariants: true,
        ..Options::default()
    };
    let e = Engine::create(
        Arc::new(MemDevice::new(64 << 20)),
        Format::small_for_tests(),
        options,
    )
    .unwrap();
    e.set_split_boundaries(boundaries);
    for f in 0..60u32 {
        for d in 0..40u32 {
            e.put(format!("d{d:02}/file{f:04}").as_bytes(), &[7u8; 90])
                .unwrap();
        }
    }
    while e.tree().flush_step(0).unwrap() {}
    let mut pivots = Vec::new();
    let mut stack = vec![(ROOT_ID, Bounds::root())];
    while let Some((id, b)) = stack.pop() {
        let cn = e.tree().pin(id).unwrap();
        let g = cn.read();
        let Body::Internal(n) = &g.body else { continue };
        for (i, &c) in n.children.iter().enumerate() {
            if g.height == 1 && i > 0 {
                pivots.push(b.child(n, i).full_lo());
            }
            stack.push((c, b.child(n, i)));
        }
    }
    (e, pivots)
}

#[test]
fn leaves_split_at_directory_boundaries_and_moves_cut_fewer_leaves() {
    let (plain, _) = filled(b"");
    let (pref, pref_pivots) = filled(b"/");
    // A pivot either starts a directory or lies inside one (a directory larger than a leaf):
    // never between two directories' names.
    let inside_or_at = |p: &Vec<u8>| p.contains(&b'/');
    assert!(pref_pivots.len() >= 10, "{} leaves", pref_pivots.len());
    assert!(
        pref_pivots.iter().all(inside_or_at),
        "preferred pivots: {:?}",
        pref_pivots
            .iter()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .collect::<Vec<_>>()
    );
    // Moving each directory away cuts leaves only where a directory does not start at a pivot.
    let cuts = |e: &Engine| {
        let before = e.stats().leaf_splits;
        for d in 0..40u32 {
            let (from, to) = (format!("d{d:02}/"), format!("m{d:02}/"));
            let mut b = Batch::new();
            b.range_move(from.as_bytes(), to.as_bytes(), 0);
            e.write(&b).unwrap();
        }
        e.stats().leaf_splits - before
    };
    let (plain_cuts, pref_cuts) = (cuts(&plain), cuts(&pref));
    eprintln!("leaves cut by 40 moves: {plain_cuts} plain, {pref_cuts} preferred");
    assert!(
        pref_cuts < plain_cuts,
        "{pref_cuts} cuts against {plain_cuts}"
    );
    for e in [&plain, &pref] {
        e.verify().unwrap();
        let end = prefix_end(b"m", 256);
        assert_eq!(
            e.range(
                std::ops::Bound::Included(&b"m"[..]),
                std::ops::Bound::Excluded(&end[..])
            )
            .count(),
            2400
        );
    }
}
