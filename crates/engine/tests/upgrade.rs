//! `amaranth upgrade` (docs/SURGERY.md §2.4): a format-2 image (full keys, node layout 1) is
//! rewritten as format 3 with every key and value as it was, then gets its data table (format 4,
//! docs/WRITEONCE.md); a crash at any point of the upgrade leaves an image that is either the old
//! one (and upgrades again) or a new one, whole. A format-3 image needs no node rewritten: its
//! first read-write open, or the upgrade, adds the data table.

mod common;

use std::sync::Arc;

use amaranth_device::{BlockDevice, CrashPlan, FaultDevice, MemDevice};
use amaranth_engine::{
    downgrade_for_tests, upgrade, Batch, Engine, Error, Options, Superblock, UpgradeReport,
};
use common::*;

/// A cleanly closed image with random operations (messages left in buffers) and path-like keys
/// under long shared prefixes (nodes with long lifts), rewritten as format `version`.
fn old_image(version: u32, seed: u64) -> (Arc<MemDevice>, Model) {
    let dev = Arc::new(MemDevice::new(32 << 20));
    let e = Engine::create(dev.clone(), small_format(), small_options()).unwrap();
    let mut m = Model::new();
    let mut g = Gen::new(seed, 1500, 200);
    for i in 0..4000u32 {
        let op = g.simple_op();
        apply_model(&mut m, &op);
        e.write(&Batch::from(vec![op])).unwrap();
        let k = format!("d/usr/src/linux/drivers/{:03}/file{i:05}", i % 37).into_bytes();
        let v = format!("value {i}").into_bytes();
        e.put(&k, &v).unwrap();
        m.insert(k, v);
        if i % 1000 == 999 {
            e.checkpoint().unwrap();
        }
    }
    e.close().unwrap();
    downgrade_for_tests(dev.clone(), version).unwrap();
    (dev, m)
}

fn version(dev: &dyn BlockDevice) -> u32 {
    Superblock::locate(dev, false).unwrap().sb.version
}

fn no_progress() -> impl FnMut(u64, u64) {
    |_, _| {}
}

/// Opens the image and checks it holds exactly `m` and passes `verify`.
fn check_holds(dev: Arc<dyn BlockDevice>, m: &Model, what: &str) {
    let e = Engine::open(dev, small_options()).unwrap();
    assert!(dump(&e) == *m, "{what}: contents differ after the upgrade");
    e.verify().unwrap();
    e.close().unwrap();
}

#[test]
fn a_format_2_image_is_upgraded_with_every_key_and_value() {
    let (dev, m) = old_image(2, 1);
    assert_eq!(version(&*dev), 2);
    let err = Engine::open(dev.clone(), small_options()).err().unwrap();
    assert!(
        matches!(err, Error::UnsupportedVersion { found: 2, .. }),
        "{err}"
    );
    let mut calls = 0u64;
    let r = upgrade(dev.clone(), &mut |done, total| {
        assert!(done <= total);
        calls += 1;
    })
    .unwrap();
    assert_eq!((r.from_version, r.to_version), (2, 4));
    assert!(r.nodes > 10 && r.bytes > 0 && calls == r.nodes, "{r:?}");
    assert_eq!(r.unreachable, 0);
    assert_eq!(version(&*dev), 4);
    check_holds(dev.clone(), &m, "upgraded");
    // Again: nothing to do, nothing written.
    let before = dev.to_bytes();
    let again = upgrade(dev.clone(), &mut no_progress()).unwrap();
    assert!(again.already_current(), "{again:?}");
    assert!(dev.to_bytes() == before, "a current image was changed");
}

#[test]
fn a_format_3_image_becomes_format_4_at_its_first_writable_open_or_its_upgrade() {
    for how in ["open", "upgrade"] {
        let (dev, m) = old_image(3, 5);
        assert_eq!(version(&*dev), 3);
        // Read-only, it is read as it is and left untouched.
        let before = dev.to_bytes();
        let ro = Options {
            read_only: true,
            ..small_options()
        };
        let e = Engine::open(dev.clone(), ro).unwrap();
        assert!(dump(&e) == m, "{how}: read-only contents");
        drop(e);
        assert!(dev.to_bytes() == before, "{how}: a read-only open wrote");
        match how {
            "open" => Engine::open(dev.clone(), small_options())
                .unwrap()
                .close()
                .unwrap(),
            _ => {
                let r = upgrade(dev.clone(), &mut no_progress()).unwrap();
                assert_eq!((r.from_version, r.to_version, r.nodes), (3, 4, 0), "{r:?}");
            }
        }
        assert_eq!(version(&*dev), 4, "{how}");
        let sb = Superblock::locate(&*dev, false).unwrap().sb;
        assert_eq!(sb.data_table_runs, 0, "{how}: an empty data table");
        check_holds(dev, &m, how);
    }
}

#[test]
fn an_image_not_closed_cleanly_is_refused_and_left_unchanged() {
    let (dev, _) = old_image(2, 2);
    // The same image as a crashed format-2 engine would leave it: the clean flag cleared.
    let mut sb = Superblock::locate(&*dev, false).unwrap().sb;
    sb.clean = false;
    sb.forge_for_tests(&*dev).unwrap();
    let before = dev.to_bytes();
    let err = upgrade(dev.clone(), &mut no_progress()).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("not closed cleanly") && text.contains("mount and unmount"),
        "{text}"
    );
    assert!(dev.to_bytes() == before, "a refused upgrade wrote");
}

#[test]
fn a_crash_during_the_upgrade_leaves_the_old_image_or_the_new_one() {
    let (old, m) = old_image(2, 3);
    let dev = Arc::new(FaultDevice::from_bytes(old.to_bytes()));
    let full: UpgradeReport = upgrade(dev.clone(), &mut no_progress()).unwrap();
    assert_eq!(full.to_version, 4);
    // Every flush point and the point just before it (everything since the last one in flight),
    // and points between flushes, with several fates for the unflushed writes.
    let len = dev.trace_len();
    let mut points: Vec<usize> = dev.flush_points();
    points.extend(dev.flush_points().iter().map(|p| p - 1));
    points.extend((0..len).step_by((len / 12).max(1)));
    points.push(len);
    points.sort_unstable();
    points.dedup();
    let (mut old_seen, mut new_seen) = (0, 0);
    for (i, &pos) in points.iter().enumerate() {
        // Several random fates where writes are in flight: the superblock may reach the medium
        // before the nodes it names, unless a flush orders them.
        let randoms = if dev.unflushed_writes_at(pos) > 0 {
            8
        } else {
            1
        };
        let plans = [CrashPlan::DropAll, CrashPlan::KeepAll]
            .into_iter()
            .chain((0..randoms).map(|r| CrashPlan::Random {
                seed: (i * 8 + r) as u64,
                keep: 0.5,
                tear: 0.5,
            }));
        for plan in plans {
            let what = format!("crash at {pos} of {len} ({plan:?})");
            let img = Arc::new(MemDevice::from_bytes(dev.crash_image(pos, &plan)));
            match version(&*img) {
                2 => {
                    old_seen += 1;
                    let r = upgrade(img.clone(), &mut no_progress()).unwrap();
                    assert_eq!(r.nodes, full.nodes, "{what}");
                    check_holds(img, &m, &what);
                }
                // Nodes rewritten lifted, the data table not added yet: a format-3 image, whose
                // next read-write open makes it format 4.
                3 | 4 => {
                    new_seen += 1;
                    check_holds(img, &m, &what);
                }
                v => panic!("{what}: format {v}"),
            }
        }
    }
    assert!(
        old_seen > 0 && new_seen > 0,
        "{old_seen} old, {new_seen} new"
    );
}

#[test]
fn a_read_only_open_of_a_format_2_image_is_refused_too() {
    let (dev, _) = old_image(2, 4);
    let ro = Options {
        read_only: true,
        ..small_options()
    };
    let err = Engine::open(dev, ro).err().unwrap();
    assert!(
        err.to_string()
            .contains("format 2 image: run `amaranth upgrade IMAGE`"),
        "{err}"
    );
}
