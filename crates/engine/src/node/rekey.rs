//! The key rewrite of a range move (docs/SURGERY.md §3.2 step 6): a stored key `need s` becomes
//! `head s`. The surgery works one out per moved run of slots; a slot's buffer may hold it as a
//! pending rewrite (`node/slot.rs`), and a run moved again composes the two.

/// A stored key `need s` becomes `head s`. Every key it is applied to starts with `need`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RekeyPlan {
    need: Vec<u8>,
    head: Vec<u8>,
}

impl RekeyPlan {
    /// The rewrite of `need s` into `head s`.
    pub(crate) fn new(need: Vec<u8>, head: Vec<u8>) -> RekeyPlan {
        RekeyPlan { need, head }
    }

    /// `stored` rewritten. Panics if it does not start with `need` (a key outside the moved
    /// range, or outside its new node's prefix: a bug of the surgery).
    pub(crate) fn key(&self, stored: &[u8]) -> Vec<u8> {
        assert!(
            stored.starts_with(&self.need),
            "a moved key outside the moved range or its new node's prefix"
        );
        let tail = &stored[self.need.len()..];
        let mut out = Vec::with_capacity(self.head.len() + tail.len());
        out.extend_from_slice(&self.head);
        out.extend_from_slice(tail);
        out
    }

    /// How much longer every rewritten key is (negative: shorter).
    pub(crate) fn delta(&self) -> isize {
        self.head.len() as isize - self.need.len() as isize
    }

    /// Whether it leaves every key as it is.
    pub(crate) fn is_identity(&self) -> bool {
        self.need == self.head
    }

    /// This rewrite followed by `next`, as one: `next.key(self.key(k))` for every key `k` both
    /// accept. Panics if no key is accepted by both (`next` was worked out for other keys).
    pub(crate) fn then(&self, next: &RekeyPlan) -> RekeyPlan {
        if self.head.len() >= next.need.len() {
            // need s -> head s = next.need r s -> next.head r s
            assert!(
                self.head.starts_with(&next.need),
                "a second re-key of a run for keys it does not hold"
            );
            let mut head = next.head.clone();
            head.extend_from_slice(&self.head[next.need.len()..]);
            RekeyPlan {
                need: self.need.clone(),
                head,
            }
        } else {
            // need r s -> head r s = next.need s -> next.head s
            assert!(
                next.need.starts_with(&self.head),
                "a second re-key of a run for keys it does not hold"
            );
            let mut need = self.need.clone();
            need.extend_from_slice(&next.need[self.head.len()..]);
            RekeyPlan {
                need,
                head: next.head.clone(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::RekeyPlan;

    fn plan(need: &[u8], head: &[u8]) -> RekeyPlan {
        RekeyPlan::new(need.to_vec(), head.to_vec())
    }

    /// Every pair of plans over short keys of a two-letter alphabet: the composition rewrites
    /// every key both accept as the two in turn do, and accepts no other.
    #[test]
    fn a_composition_rewrites_as_the_two_in_turn() {
        let words: Vec<Vec<u8>> = (0..4usize)
            .flat_map(|len| {
                (0..1usize << len).map(move |bits| {
                    (0..len)
                        .map(|i| if bits >> i & 1 == 1 { b'b' } else { b'a' })
                        .collect()
                })
            })
            .collect();
        let mut compared = 0;
        for n1 in &words {
            for h1 in &words {
                let a = plan(n1, h1);
                for n2 in &words {
                    for h2 in &words {
                        let b = plan(n2, h2);
                        let accepted: Vec<&Vec<u8>> = words
                            .iter()
                            .filter(|k| k.starts_with(n1) && a.key(k).starts_with(n2))
                            .collect();
                        if accepted.is_empty() {
                            continue;
                        }
                        let c = a.then(&b);
                        for k in &words {
                            let both = accepted.contains(&k);
                            let ok = k.starts_with(&c.need);
                            assert_eq!(ok, both, "{a:?} then {b:?} = {c:?} on {k:?}");
                            if both {
                                assert_eq!(c.key(k), b.key(&a.key(k)), "{a:?} then {b:?} on {k:?}");
                                assert_eq!(c.delta(), a.delta() + b.delta());
                                compared += 1;
                            }
                        }
                    }
                }
            }
        }
        assert!(compared > 10_000, "only {compared} keys compared");
    }

    #[test]
    fn a_move_and_its_reverse_compose_to_nothing() {
        let there = plan(b"src/", b"dst-longer/");
        let back = plan(b"dst-longer/", b"src/");
        assert!(there.then(&back).is_identity());
        assert!(!there.is_identity());
    }

    #[test]
    #[should_panic(expected = "does not hold")]
    fn plans_for_other_keys_do_not_compose() {
        let _ = plan(b"a", b"x").then(&plan(b"y", b"z"));
    }
}
