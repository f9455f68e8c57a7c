//! The key-length bound of a key range in O(height) (docs/SURGERY.md §2.6): from the messages
//! for the range in the buffers on the path down to the range's slicing node, and the key-length
//! bounds of that node's slots that meet the range ([`crate::node::BufSlot::longest`]). Nothing
//! below the slicing node is read.

use std::sync::Arc;

use super::{Bounds, Tree};
use crate::cache::CachedNode;
use crate::error::{Error, Result};
use crate::node::{child_index, Body, ROOT_ID};

/// How many times the descent starts over after loading something before giving up.
const MAX_RESTARTS: usize = 1000;

impl Tree {
    /// An upper bound on the length of every live key in `[lo, hi)` (`lo < hi`): never below the
    /// longest, possibly above it (bounds are raised as keys arrive and never lowered). Reads the
    /// path to the range's slicing node and the buffers there that meet the range.
    pub fn longest_bound(&self, lo: &[u8], hi: &[u8]) -> Result<usize> {
        assert!(lo < hi, "an empty range has no keys to bound");
        let mut pins: Vec<Arc<CachedNode>> = Vec::new();
        'restart: for _ in 0..MAX_RESTARTS {
            let mut best = 0usize;
            let mut bounds = Bounds::root();
            let mut cn = self.pin(ROOT_ID)?;
            let mut g = cn.read();
            loop {
                let plen = bounds.prefix().len();
                let (slo, shi) = (bounds.lift_clipped(lo), bounds.lift_clipped(hi));
                let next = match &g.body {
                    Body::Leaf(l) => {
                        // A root leaf (the only leaf reached): its keys in the range, exactly.
                        let (p0, p1) = (
                            child_index(&l.pivots, &slo),
                            child_index(&l.pivots, &shi).min(l.parts.len() - 1),
                        );
                        for i in p0..=p1 {
                            let Some(p) = l.parts[i].data() else {
                                drop(g);
                                self.load_partitions(&cn, Some(i))?;
                                pins.push(cn);
                                continue 'restart;
                            };
                            for j in p.lower_bound(&slo)..p.len() {
                                let k = p.key(j);
                                if k >= shi.as_slice() {
                                    break;
                                }
                                best = best.max(plen + k.len());
                            }
                        }
                        return Ok(best);
                    }
                    Body::Internal(n) => {
                        let c0 = child_index(&n.pivots, &slo);
                        let c1 = n.pivots.partition_point(|p| p.as_slice() < shi.as_slice());
                        for c in c0..=c1 {
                            let Some(longest) = n.buffers[c].longest_point_in(&slo, &shi) else {
                                drop(g);
                                self.load_partitions(&cn, Some(c))?;
                                pins.push(cn);
                                continue 'restart;
                            };
                            if longest > 0 {
                                best = best.max(plen + longest);
                            }
                        }
                        if c0 != c1 || g.height == 1 {
                            // The slicing node: its slots' bounds cover what lies below.
                            for c in c0..=c1 {
                                best = best.max(plen + n.buffers[c].longest as usize);
                            }
                            return Ok(best);
                        }
                        bounds.descend(n, c0);
                        n.children[c0]
                    }
                };
                match self.couple(next, g, &mut pins)? {
                    Some((ccn, cg)) => (cn, g) = (ccn, cg),
                    None => continue 'restart,
                }
            }
        }
        Err(Error::Corrupt(
            "a key-length bound could not keep its path in memory (cache too small?)".into(),
        ))
    }
}
