//! Snapshots in the random tests: each one kept beside the model as a frozen copy of it, taken,
//! checked through its view and deleted at random.

use std::collections::BTreeMap;
use std::ops::Bound;

use amaranth_engine::{Engine, Error};
use rand::Rng;

use super::{Gen, Model};

/// The snapshots a test has taken, each with the model as it was then.
#[derive(Default)]
pub struct Snaps {
    pub frozen: BTreeMap<String, Model>,
    next: u32,
}

/// Every entry of snapshot `name`, read through a view.
pub fn snapshot_dump(e: &Engine, name: &str) -> Model {
    let v = e
        .snapshot_view(name)
        .unwrap_or_else(|err| panic!("view of {name}: {err}"));
    v.range(Bound::Unbounded, Bound::Unbounded)
        .map(|r| r.unwrap_or_else(|err| panic!("scan of snapshot {name}: {err}")))
        .collect()
}

impl Snaps {
    /// One random snapshot operation: take one (now and then under a name in use, which must
    /// be refused), delete one (now and then one that does not exist, refused too), or check
    /// one against its frozen model (a full scan and a point read).
    pub fn step(&mut self, e: &Engine, m: &Model, g: &mut Gen, at: &str) {
        let existing: Vec<String> = self.frozen.keys().cloned().collect();
        let pick = |g: &mut Gen| existing[g.rng.gen_range(0..existing.len())].clone();
        match g.rng.gen_range(0..10) {
            0..=3 if existing.len() < 6 => {
                self.next += 1;
                let name = format!("s{}", self.next);
                e.snapshot_create(&name)
                    .unwrap_or_else(|err| panic!("{at}: snapshot {name}: {err}"));
                self.frozen.insert(name, m.clone());
            }
            4 if !existing.is_empty() => {
                let name = pick(g);
                assert!(
                    matches!(e.snapshot_create(&name), Err(Error::SnapshotExists(_))),
                    "{at}: a second snapshot {name}"
                );
            }
            5..=6 if !existing.is_empty() => {
                let name = pick(g);
                e.snapshot_delete(&name)
                    .unwrap_or_else(|err| panic!("{at}: delete snapshot {name}: {err}"));
                self.frozen.remove(&name);
            }
            7 => assert!(
                matches!(e.snapshot_delete("none"), Err(Error::NoSuchSnapshot(_))),
                "{at}: deleted a snapshot that is not there"
            ),
            _ if !existing.is_empty() => {
                let name = pick(g);
                self.check(e, &name, g, at);
            }
            _ => {}
        }
    }

    /// Snapshot `name` against its frozen model: a full scan and a point read.
    pub fn check(&self, e: &Engine, name: &str, g: &mut Gen, at: &str) {
        let want = &self.frozen[name];
        let got = snapshot_dump(e, name);
        if got != *want {
            let diff: Vec<_> = got
                .iter()
                .filter(|(k, v)| want.get(*k) != Some(v))
                .map(|(k, _)| String::from_utf8_lossy(k).into_owned())
                .chain(
                    want.keys()
                        .filter(|k| !got.contains_key(*k))
                        .map(|k| String::from_utf8_lossy(k).into_owned()),
                )
                .take(5)
                .collect();
            panic!("{at}: snapshot {name} differs from its model, e.g. at {diff:?}");
        }
        let k = g.key();
        let v = e.snapshot_view(name).expect("view");
        assert_eq!(
            v.get(&k)
                .unwrap_or_else(|err| panic!("{at}: get in {name}: {err}"))
                .as_ref(),
            want.get(&k),
            "{at}: get {:?} in snapshot {name}",
            String::from_utf8_lossy(&k)
        );
    }

    /// Every snapshot checked, and the names the engine lists are the test's.
    pub fn check_all(&self, e: &Engine, g: &mut Gen, at: &str) {
        let listed: Vec<String> = e.snapshots().into_iter().map(|s| s.name).collect();
        let kept: Vec<String> = self.frozen.keys().cloned().collect();
        assert_eq!(listed, kept, "{at}: snapshots listed");
        for name in self.frozen.keys() {
            self.check(e, name, g, at);
        }
    }

    /// Deletes every snapshot.
    pub fn delete_all(&mut self, e: &Engine, at: &str) {
        for name in std::mem::take(&mut self.frozen).into_keys() {
            e.snapshot_delete(&name)
                .unwrap_or_else(|err| panic!("{at}: delete snapshot {name}: {err}"));
        }
    }
}
