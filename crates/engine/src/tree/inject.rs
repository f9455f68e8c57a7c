//! Message injection: a batch of messages gets its sequence numbers and goes into the root
//! (routed into the root's child buffers, or applied to a root leaf).

use std::sync::atomic::Ordering;

use super::{Bounds, Msg, Tree};
use crate::buffer::Buffer;
use crate::error::Result;
use crate::msg::Msn;
use crate::node::{child_index, Body, Internal, ROOT_ID};

impl Tree {
    /// Applies `msgs` at the root as one atomic step. `before_apply(first_msn)` runs under the root
    /// latch just before the messages get their numbers (the engine appends the log record there, so
    /// log order is application order); it must not fail after side effects. Returns the first MSN
    /// and whether the root now needs a flush.
    pub fn inject(
        &self,
        msgs: Vec<Msg>,
        before_apply: &mut dyn FnMut(Msn) -> Result<()>,
    ) -> Result<(Msn, bool)> {
        let mut pins = Vec::new();
        loop {
            let root = self.pin(ROOT_ID)?;
            let mut g = root.write();
            if !g.fully_resident() {
                drop(g);
                self.load_partitions(&root, None)?;
                pins.push(root);
                continue;
            }
            self.begin_modify(&root, &g);
            let first = self.next_msn.load(Ordering::Relaxed);
            before_apply(first)?;
            let count = msgs.len() as u64;
            let bytes: usize = msgs.iter().map(|m| m.size()).sum();
            let ranges = msgs.iter().any(|m| matches!(m, Msg::Range { .. }));
            let node = &mut *g;
            let mut released = Vec::new();
            match &mut node.body {
                Body::Internal(n) => {
                    for (i, m) in msgs.into_iter().enumerate() {
                        route(n, first + i as u64, m, &mut released);
                    }
                }
                Body::Leaf(l) => {
                    let mut tmp = Buffer::new();
                    for (i, m) in msgs.into_iter().enumerate() {
                        let msn = first + i as u64;
                        match m {
                            Msg::Point { key, op } => released.extend(tmp.add_point(key, msn, op)),
                            Msg::Range { lo, hi } => released.extend(tmp.add_range(msn, &lo, &hi)),
                        }
                    }
                    let (ranges, mut points) = tmp.into_parts();
                    self.inline_heavy_refs(l, &ranges, &mut points, &mut released)?;
                    released.extend(l.apply(&ranges, &points, &self.format));
                }
            }
            self.release_refs(&released);
            if count > 0 {
                node.max_msn = first + count - 1;
            }
            if ranges {
                self.drop_covered(node, &Bounds::root());
            }
            self.next_msn.store(first + count, Ordering::Relaxed);
            self.end_modify(&root, &g);
            self.counters.messages.fetch_add(count, Ordering::Relaxed);
            self.counters
                .user_bytes
                .fetch_add(bytes as u64, Ordering::Relaxed);
            let needs_flush = g.bytes() > self.format.node_size;
            return Ok((first, needs_flush));
        }
    }

    /// Bytes the root holds (entries for a leaf root, buffered messages for an internal one).
    pub fn root_bytes(&self) -> Result<usize> {
        let root = self.pin(ROOT_ID)?;
        let g = root.read();
        Ok(g.bytes())
    }
}

/// Routes a numbered message into the right child buffer(s) of an internal node; the blocks whose
/// references it dropped go to `released`.
pub(super) fn route(n: &mut Internal, msn: Msn, m: Msg, released: &mut Vec<u64>) {
    match m {
        Msg::Point { key, op } => {
            let c = child_index(&n.pivots, &key);
            released.extend(n.buffers[c].mutate(|b| b.add_point(key, msn, op)));
        }
        Msg::Range { lo, hi } => route_range(n, msn, &lo, &hi, released),
    }
}

/// Adds a range delete to every child buffer whose range it intersects, clipped to that range;
/// the blocks whose references it dropped go to `released`.
pub(super) fn route_range(
    n: &mut Internal,
    msn: Msn,
    lo: &[u8],
    hi: &[u8],
    released: &mut Vec<u64>,
) {
    for (c, l, h) in range_pieces(n, lo, hi) {
        released.extend(n.buffers[c].mutate(|b| b.add_range(msn, &l, &h)));
    }
}

/// The non-empty pieces of `[lo, hi)` in each child's range: (child, lo, hi).
pub(super) fn range_pieces(n: &Internal, lo: &[u8], hi: &[u8]) -> Vec<(usize, Vec<u8>, Vec<u8>)> {
    let first = child_index(&n.pivots, lo);
    let last = n.pivots.partition_point(|p| p.as_slice() < hi);
    let mut out = Vec::new();
    for c in first..=last.min(n.children.len() - 1) {
        let (cl, ch) = n.child_bounds(c, lo, None);
        let l = if cl > lo { cl.to_vec() } else { lo.to_vec() };
        let h = match ch {
            Some(h) if h < hi => h.to_vec(),
            _ => hi.to_vec(),
        };
        if l < h {
            out.push((c, l, h));
        }
    }
    out
}
