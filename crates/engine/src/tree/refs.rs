//! References to out-of-line blocks in the tree's flushes: reporting the references a change
//! dropped to the data table, and, before messages reach a leaf, turning a reference whose
//! patches would pass [`REF_PATCH_LIMIT`] into an inline value (the block read once, here, so
//! that applying the messages to the leaf reads nothing and cannot fail).

use std::collections::HashSet;

use super::Tree;
use crate::dataref::{DataRef, Stored, Val, REF_BYTES, REF_PATCH_LIMIT};
use crate::datatable::RunMap;
use crate::error::Result;
use crate::msg::{KeyMsgs, RangeDel};
use crate::node::{child_index, Body, Leaf, ROOT_ID};

impl Tree {
    /// Counts the references to out-of-line blocks the whole tree holds (every node read once,
    /// a shared one too; the snapshots' trees, the subtrees the test hook holds and dead ones waiting for the
    /// collector included: their references are counted until they are freed).
    pub(crate) fn recount_refs(&self) -> Result<RunMap> {
        let mut refs = RunMap::default();
        let mut stack = self.store.btt.lock().refs.dead(usize::MAX);
        stack.extend(self.holds().iter().map(|h| h.id));
        stack.extend(self.snapshot_roots());
        stack.push(ROOT_ID);
        let mut seen = HashSet::new();
        while let Some(id) = stack.pop() {
            if !seen.insert(id) {
                continue;
            }
            let cn = self.pin(id)?;
            self.load_partitions(&cn, None)?;
            let g = cn.read();
            match &g.body {
                Body::Leaf(l) => {
                    for p in l.resident_parts() {
                        for b in p.ref_blocks(0, p.len()) {
                            refs.add(b, 1);
                        }
                    }
                }
                Body::Internal(n) => {
                    for slot in &n.buffers {
                        for block in slot.ref_blocks() {
                            refs.add(block, 1);
                        }
                    }
                    stack.extend(n.children.iter().copied());
                }
            }
            drop(g);
            drop(cn);
            self.make_room()?;
        }
        Ok(refs)
    }

    /// Drops one reference to each of `blocks` in the data table.
    pub(crate) fn release_refs(&self, blocks: &[u64]) {
        if !blocks.is_empty() {
            self.store.data.lock().release(blocks);
        }
    }

    /// Rewrites, among `points` about to be applied to `leaf` (after `ranges`), the messages that
    /// would leave a reference with more than [`REF_PATCH_LIMIT`] bytes of patches: into a put
    /// of the patched value, read now. A reference message so rewritten is dropped (its block
    /// goes to `released`); a reference in the leaf goes when the put is applied over it.
    pub(crate) fn inline_heavy_refs(
        &self,
        leaf: &Leaf,
        ranges: &[RangeDel],
        points: &mut [(Vec<u8>, KeyMsgs)],
        released: &mut Vec<u64>,
    ) -> Result<()> {
        // Each partition's longest reference, taken once (not per key).
        let ref_max: Vec<Option<usize>> = leaf
            .parts
            .iter()
            .map(|slot| slot.data().map(|p| p.ref_max()))
            .collect();
        for (k, km) in points.iter_mut() {
            let heavy = match &*km {
                KeyMsgs::PutRef { r, .. } => r.patch_bytes() > REF_PATCH_LIMIT,
                KeyMsgs::Upserts(_) if ranges.iter().any(|r| r.covers(k)) => false,
                // Patches only fold (never grow) as they join a reference: when the partition's
                // longest reference and these patches together stay within the limit, nothing
                // needs to be looked up or decoded (a random 4-byte write's upsert, nearly always;
                // the lookup, decode and copy of every upserted key's reference took as long as
                // applying the messages to the leaf in a profile of `randwrite`).
                KeyMsgs::Upserts(list)
                    if ref_max[child_index(&leaf.pivots, k)].is_some_and(|longest| {
                        longest + list.iter().map(|(_, p)| p.size()).sum::<usize>()
                            <= REF_BYTES + REF_PATCH_LIMIT
                    }) =>
                {
                    false
                }
                KeyMsgs::Upserts(list) => {
                    let base = leaf_value(leaf, k);
                    match base {
                        Some(mut r) => {
                            for (_, p) in list {
                                r.push(p.clone());
                            }
                            r.patch_bytes() > REF_PATCH_LIMIT
                        }
                        None => false,
                    }
                }
                KeyMsgs::Put { .. } | KeyMsgs::Delete { .. } => false,
            };
            if !heavy {
                continue;
            }
            let value = match &*km {
                KeyMsgs::PutRef { r, .. } => {
                    released.push(r.block);
                    self.store.read_value(r, k)?
                }
                KeyMsgs::Upserts(_) => {
                    let base = leaf_value(leaf, k).expect("a reference below the upserts");
                    let bytes = self.store.read_value(&base, k)?;
                    match km.apply(Some(Val::Bytes(bytes))) {
                        Some(Val::Bytes(v)) => v,
                        _ => unreachable!("upserts onto bytes give bytes"),
                    }
                }
                _ => unreachable!("only references and upserts are heavy"),
            };
            *km = KeyMsgs::Put {
                msn: km.max_msn(),
                value,
            };
        }
        Ok(())
    }
}

/// The reference `leaf` (fully resident) holds for `key`, if it holds one.
fn leaf_value(leaf: &Leaf, key: &[u8]) -> Option<DataRef> {
    let p = leaf.parts[child_index(&leaf.pivots, key)]
        .data()
        .expect("a leaf receiving messages is resident");
    match p.get(key)? {
        Stored::Ref(r) => Some(DataRef::decode_checked(r)),
        Stored::Bytes(_) => None,
    }
}
