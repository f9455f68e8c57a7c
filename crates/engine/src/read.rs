//! Queries: point lookups and leaf-sized chunks for range iteration.
//!
//! A query descends with coupled read latches, collecting the messages that ancestors hold for its
//! key (or its leaf's range), and applies them to what the leaf stores, deepest first (deeper
//! messages are older). Nothing is flushed and nothing is marked dirty.

use std::sync::Arc;

use crate::cache::ReadGuard;
use crate::error::{Error, Result};
use crate::msg::{KeyMsgs, Msn, RangeDel};
use crate::node::{child_index, Body, ROOT_ID};
use crate::partition::Partition;
use crate::tree::Tree;

/// How many times a query restarts after loading a node before giving up.
const MAX_RESTARTS: usize = 1000;

impl Tree {
    /// The value of `key`, with pending messages applied.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let mut pins = Vec::new();
        for _ in 0..MAX_RESTARTS {
            // (range delete msn covering the key, folded point messages), top to bottom.
            let mut layers: Vec<(Option<Msn>, Option<KeyMsgs>)> = Vec::new();
            let mut cn = self.pin(ROOT_ID)?;
            let mut g = cn.read();
            loop {
                let next = match &g.body {
                    Body::Internal(n) => {
                        let c = child_index(&n.pivots, key);
                        let b = &n.buffers[c];
                        layers.push((b.range_covering(key).map(|r| r.msn), b.point(key).cloned()));
                        n.children[c]
                    }
                    Body::Leaf(l) => {
                        let p = child_index(&l.pivots, key);
                        let Some(part) = l.parts[p].data() else {
                            drop(g);
                            self.load_partitions(&cn, Some(p))?;
                            pins.push(cn);
                            break;
                        };
                        let leaf_msn = g.max_msn;
                        let mut v = part.get(key).map(|x| x.to_vec());
                        for (range, point) in layers.iter().rev() {
                            if let Some(m) = range {
                                debug_assert!(
                                    *m > leaf_msn,
                                    "ancestor message already applied below"
                                );
                                if *m > leaf_msn {
                                    v = None;
                                }
                            }
                            if let Some(km) = point {
                                debug_assert!(
                                    km.min_msn() > leaf_msn,
                                    "ancestor message already applied below"
                                );
                                if km.max_msn() > leaf_msn {
                                    v = km.apply(v);
                                }
                            }
                        }
                        return Ok(v);
                    }
                };
                match self.cache.get(next) {
                    Some(ccn) => {
                        let cg = ccn.read();
                        g = cg;
                        cn = ccn;
                    }
                    None => {
                        drop(g);
                        pins.push(self.pin(next)?);
                        break;
                    }
                }
            }
        }
        Err(Error::Corrupt(
            "a lookup could not keep its path in memory (cache too small?)".into(),
        ))
    }

    /// The chunk of the tree around a position: one leaf's range with every pending message applied.
    pub fn chunk(&self, target: Target<'_>) -> Result<Chunk> {
        let mut pins = Vec::new();
        'restart: for _ in 0..MAX_RESTARTS {
            let mut lo: Vec<u8> = Vec::new();
            let mut hi: Option<Vec<u8>> = None;
            // The path's read latches stay held until the leaf is reached and its range known, so
            // only the messages for that range are copied out of each ancestor's buffer.
            let mut path: Vec<(ReadGuard, usize)> = Vec::new();
            let mut cn = self.pin(ROOT_ID)?;
            let mut g = cn.read();
            loop {
                let next = match &g.body {
                    Body::Internal(n) => {
                        let c = match target {
                            Target::AtOrAfter(k) => child_index(&n.pivots, k),
                            Target::Before(Some(e)) => {
                                n.pivots.partition_point(|p| p.as_slice() < e)
                            }
                            Target::Before(None) => n.children.len() - 1,
                        };
                        let (cl, ch) = n.child_bounds(c, &lo, hi.as_deref());
                        let (cl, ch) = (cl.to_vec(), ch.map(|h| h.to_vec()));
                        lo = cl;
                        hi = ch;
                        (n.children[c], c)
                    }
                    Body::Leaf(l) => {
                        let mut parts = Vec::with_capacity(l.parts.len());
                        for slot in &l.parts {
                            match slot.data() {
                                Some(p) => parts.push(p),
                                None => {
                                    drop(g);
                                    drop(path);
                                    self.load_partitions(&cn, None)?;
                                    pins.push(cn);
                                    continue 'restart;
                                }
                            }
                        }
                        let layers: Vec<Layer> = path
                            .iter()
                            .map(|(pg, c)| {
                                let Body::Internal(n) = &pg.body else {
                                    unreachable!("path of internal nodes")
                                };
                                let b = &n.buffers[*c];
                                let points = b
                                    .points_in(&lo, hi.as_deref())
                                    .map(|(k, m)| (k.clone(), m.clone()))
                                    .collect();
                                (b.ranges_in(&lo, hi.as_deref()), points)
                            })
                            .collect();
                        let max_msn = g.max_msn;
                        drop(g);
                        drop(path);
                        return Ok(Chunk::build(lo, hi, parts, layers, max_msn));
                    }
                };
                let (next, c) = next;
                match self.cache.get(next) {
                    Some(ccn) => {
                        let cg = ccn.read();
                        path.push((std::mem::replace(&mut g, cg), c));
                        cn = ccn;
                    }
                    None => {
                        drop(g);
                        drop(path);
                        pins.push(self.pin(next)?);
                        continue 'restart;
                    }
                }
            }
        }
        Err(Error::Corrupt(
            "a scan could not keep its path in memory (cache too small?)".into(),
        ))
    }
}

/// Which leaf a chunk is wanted for.
#[derive(Clone, Copy, Debug)]
pub enum Target<'a> {
    /// The leaf holding this key.
    AtOrAfter(&'a [u8]),
    /// The leaf holding the greatest key below this bound (`None`: the last leaf).
    Before(Option<&'a [u8]>),
}

/// One leaf's range with every pending ancestor message applied.
#[derive(Debug)]
pub struct Chunk {
    /// Inclusive low bound of the range (empty: unbounded).
    pub lo: Vec<u8>,
    /// Exclusive high bound (`None`: unbounded).
    pub hi: Option<Vec<u8>>,
    parts: Vec<Arc<Partition>>,
    /// Keys touched by point messages, with their resulting values (`None`: deleted), sorted.
    overlay: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    /// Union of pending range deletes, sorted and disjoint.
    deleted: Vec<(Vec<u8>, Vec<u8>)>,
}

type Layer = (Vec<RangeDel>, Vec<(Vec<u8>, KeyMsgs)>);

impl Chunk {
    fn build(
        lo: Vec<u8>,
        hi: Option<Vec<u8>>,
        parts: Vec<Arc<Partition>>,
        layers: Vec<Layer>,
        leaf_msn: Msn,
    ) -> Chunk {
        let lookup = |k: &[u8]| -> Option<Vec<u8>> {
            let i = parts.partition_point(|p| p.is_empty() || p.key(p.len() - 1) < k);
            parts.get(i).and_then(|p| p.get(k)).map(|v| v.to_vec())
        };
        // Every key with a point message anywhere on the path.
        // Upper layers were collected with their (wider) child ranges: keep only this leaf's range.
        let inside = |k: &[u8]| k >= lo.as_slice() && hi.as_ref().is_none_or(|h| k < h.as_slice());
        let mut keys: Vec<&Vec<u8>> = layers
            .iter()
            .flat_map(|(_, pts)| pts.iter().map(|(k, _)| k))
            .filter(|k| inside(k))
            .collect();
        keys.sort();
        keys.dedup();
        let mut overlay = Vec::with_capacity(keys.len());
        // Per layer, a cursor into its sorted point list.
        let mut cursors = vec![0usize; layers.len()];
        for k in keys {
            let mut v = lookup(k);
            for (li, (ranges, pts)) in layers.iter().enumerate().rev() {
                if ranges.iter().any(|r| r.msn > leaf_msn && r.covers(k)) {
                    v = None;
                }
                let cur = &mut cursors[li];
                while *cur < pts.len() && pts[*cur].0 < *k {
                    *cur += 1;
                }
                if *cur < pts.len() && pts[*cur].0 == *k && pts[*cur].1.max_msn() > leaf_msn {
                    v = pts[*cur].1.apply(v);
                }
            }
            overlay.push((k.clone(), v));
        }
        let mut ranges: Vec<(Vec<u8>, Vec<u8>)> = layers
            .into_iter()
            .flat_map(|(r, _)| r.into_iter())
            .filter(|r| {
                r.msn > leaf_msn
                    && r.hi.as_slice() > lo.as_slice()
                    && hi.as_ref().is_none_or(|h| r.lo < *h)
            })
            .map(|r| {
                let l = if r.lo < lo { lo.clone() } else { r.lo };
                let h = match &hi {
                    Some(h) if r.hi > *h => h.clone(),
                    _ => r.hi,
                };
                (l, h)
            })
            .collect();
        ranges.sort();
        let mut deleted: Vec<(Vec<u8>, Vec<u8>)> = Vec::with_capacity(ranges.len());
        for (l, h) in ranges {
            match deleted.last_mut() {
                Some(last) if l <= last.1 => {
                    if h > last.1 {
                        last.1 = h;
                    }
                }
                _ => deleted.push((l, h)),
            }
        }
        Chunk {
            lo,
            hi,
            parts,
            overlay,
            deleted,
        }
    }

    /// Calls `f(key, value)` for live entries in `[start, end)` in key order (or reverse order if
    /// `!forward`), until `f` returns false. Returns false if `f` stopped the walk.
    pub fn walk(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        forward: bool,
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> bool {
        let parts = &self.parts;
        let in_range = |k: &[u8]| k >= start && end.is_none_or(|e| k < e);
        let covered = |k: &[u8]| {
            if self.deleted.is_empty() {
                return false;
            }
            let i = self.deleted.partition_point(|(l, _)| l.as_slice() <= k);
            i > 0 && k < self.deleted[i - 1].1.as_slice()
        };
        let in_overlay = |k: &[u8]| {
            !self.overlay.is_empty()
                && self
                    .overlay
                    .binary_search_by(|(ok, _)| ok.as_slice().cmp(k))
                    .is_ok()
        };
        // Position of the first base entry >= k, as (partition, index).
        let lower = |k: &[u8]| -> (usize, usize) {
            let p = parts.partition_point(|p| p.is_empty() || p.key(p.len() - 1) < k);
            if p == parts.len() {
                (p, 0)
            } else {
                (p, parts[p].lower_bound(k))
            }
        };
        if forward {
            let (mut p, mut i) = lower(start);
            let mut o = self.overlay.partition_point(|(k, _)| k.as_slice() < start);
            loop {
                while p < parts.len() && i >= parts[p].len() {
                    p += 1;
                    i = 0;
                }
                let kb = (p < parts.len()).then(|| parts[p].key(i));
                let ko = self.overlay.get(o).map(|(k, _)| k.as_slice());
                let take_base = match (kb, ko) {
                    (None, None) => return true,
                    (Some(_), None) => true,
                    (None, Some(_)) => false,
                    (Some(x), Some(y)) => x < y,
                };
                if take_base {
                    let k = kb.expect("base key");
                    if !in_range(k) {
                        return true;
                    }
                    if !covered(k) && !in_overlay(k) && !f(k, parts[p].value(i)) {
                        return false;
                    }
                    i += 1;
                } else {
                    let (k, v) = &self.overlay[o];
                    if !in_range(k) {
                        return true;
                    }
                    if kb == Some(k.as_slice()) {
                        i += 1;
                    }
                    if let Some(v) = v {
                        if !f(k, v) {
                            return false;
                        }
                    }
                    o += 1;
                }
            }
        } else {
            // (p, i) is one past the next entry to visit.
            let (mut p, mut i) = match end {
                Some(e) => lower(e),
                None => (parts.len(), 0),
            };
            let mut o = match end {
                Some(e) => self.overlay.partition_point(|(k, _)| k.as_slice() < e),
                None => self.overlay.len(),
            };
            loop {
                while i == 0 && p > 0 {
                    p -= 1;
                    i = parts[p].len();
                }
                let kb = (i > 0).then(|| parts[p].key(i - 1));
                let ko = (o > 0).then(|| self.overlay[o - 1].0.as_slice());
                let take_base = match (kb, ko) {
                    (None, None) => return true,
                    (Some(_), None) => true,
                    (None, Some(_)) => false,
                    (Some(x), Some(y)) => x > y,
                };
                if take_base {
                    let k = kb.expect("base key");
                    if !in_range(k) {
                        return true;
                    }
                    if !covered(k) && !in_overlay(k) && !f(k, parts[p].value(i - 1)) {
                        return false;
                    }
                    i -= 1;
                } else {
                    let (k, v) = &self.overlay[o - 1];
                    if !in_range(k) {
                        return true;
                    }
                    if kb == Some(k.as_slice()) {
                        i -= 1;
                    }
                    if let Some(v) = v {
                        if !f(k, v) {
                            return false;
                        }
                    }
                    o -= 1;
                }
            }
        }
    }
}
