//! Superblock copies and known damage: overwriting the start of an image loses nothing, backups
//! stay usable at every crash point, and an image with known damage is only opened read-only.

mod common;

use std::sync::Arc;

use amaranth_device::MemDevice;
use amaranth_engine::{
    backup_blocks, downgrade_for_tests, upgrade, Batch, Engine, Error, Op, Options, Superblock,
};
use common::crashsim::*;
use common::*;

fn filled(keys: u32) -> (Arc<MemDevice>, Model) {
    let dev = Arc::new(MemDevice::new(24 << 20));
    let e = Engine::create(dev.clone(), small_format(), small_options()).unwrap();
    let mut m = Model::new();
    let mut g = Gen::new(u64::from(keys), keys, 300);
    for _ in 0..keys * 3 {
        let op = g.simple_op();
        apply_model(&mut m, &op);
        e.write(&Batch::from(vec![op])).unwrap();
    }
    e.close().unwrap();
    (dev, m)
}

#[test]
fn overwriting_the_first_64_kib_loses_nothing() {
    let (dev, m) = filled(500);
    dev.with_bytes_mut(|b| b[..64 << 10].fill(0));
    let before = Superblock::locate(&*dev, false).unwrap();
    assert!(before.fell_back, "{before:?}");
    assert_eq!(
        before.block,
        backup_blocks(dev.to_bytes().len() as u64 / 4096)[0]
    );
    // Read-only: the data, and the notes that say what happened.
    let ro = Options {
        read_only: true,
        ..small_options()
    };
    let e = Engine::open(dev.clone(), ro.clone()).unwrap();
    assert_eq!(dump(&e), m);
    let notes = e.stats().superblock_notes;
    assert!(notes.iter().any(|n| n.contains("block 0")), "{notes:?}");
    assert!(notes
        .last()
        .unwrap()
        .contains("using the superblock copy at block"));
    drop(e);
    // Read-write: the primaries are rewritten, and the next open finds nothing wrong.
    let e = Engine::open(dev.clone(), small_options()).unwrap();
    assert_eq!(dump(&e), m);
    e.close().unwrap();
    let after = Superblock::locate(&*dev, false).unwrap();
    assert!(after.problems.is_empty() && !after.fell_back, "{after:?}");
    assert!(Engine::open(dev, ro)
        .unwrap()
        .stats()
        .superblock_notes
        .is_empty());
}

#[test]
fn a_backup_is_usable_at_every_crash_point() {
    // Destroy both primary copies of every crash image: the backups must describe a checkpoint
    // whose blocks are intact and whose log is still there, so the state is a valid prefix.
    let mut states = 0;
    for seed in 0..2u64 {
        let seed = 0xbac0_0000 + seed;
        eprintln!("backup crash seed {seed}");
        let run = workload(seed, 250);
        for (pos, plan) in crash_states(&run, seed, 20) {
            let what = format!("seed {seed} crash at {pos} with {plan:?}, primaries lost");
            let mut img = run.dev.crash_image(pos, &plan);
            img[..8192].fill(0);
            let (e, report) = recover(img, &run.options, &what);
            assert!(report.leaked_nodes.is_empty(), "{what}: leaked nodes");
            let h = hash_model(&dump(&e));
            let min = synced_by(&run.syncs, pos);
            assert!(
                (min..run.states.len()).any(|k| run.states[k] == h),
                "{what}: not a prefix of at least {min} operations"
            );
            e.close().unwrap();
            states += 1;
        }
    }
    eprintln!("checked {states} crash states without primaries");
}

/// Flips the last byte of some non-root node's image, past its first block: a partition or
/// buffer, not its header. (Not a fixed offset in the last block: an image may end a few bytes
/// into it, and the padding after it is covered by no checksum.)
fn damage_a_node(dev: &MemDevice) -> u64 {
    let ro = Options {
        read_only: true,
        ..small_options()
    };
    let e = Engine::open(Arc::new(MemDevice::from_bytes(dev.to_bytes())), ro).unwrap();
    let bytes = dev.to_bytes();
    let (id, at) = e
        .node_extents()
        .into_iter()
        .filter(|&(id, _, blocks)| id != 1 && blocks > 1)
        .find_map(|(id, block, blocks)| {
            let start = ((block + 1) * 4096) as usize;
            let end = ((block + blocks) * 4096) as usize;
            let last = bytes[start..end].iter().rposition(|&x| x != 0)?;
            Some((id, start + last))
        })
        .expect("a node whose image goes past its first block");
    dev.with_bytes_mut(|b| b[at] ^= 0xff);
    id
}

#[test]
fn known_damage_refuses_read_write_opens() {
    let (dev, m) = filled(800);
    damage_a_node(&dev);
    // Not known yet: a read-write open works, and the first read of the damage records it.
    let e = Engine::open(dev.clone(), small_options()).unwrap();
    assert!(e.stats().known_damage.is_none());
    let err = e
        .scan(
            std::ops::Bound::Unbounded,
            std::ops::Bound::Unbounded,
            |_, _| true,
        )
        .unwrap_err();
    assert!(err.is_damage(), "{err}");
    assert!(e.stats().known_damage.is_some());
    drop(e);
    let err = Engine::open(dev.clone(), small_options())
        .err()
        .expect("refused");
    assert!(matches!(err, Error::Damaged(_)), "{err}");
    assert!(err.to_string().contains("amaranth fsck --repair"), "{err}");
    // Read-only still works, for what is intact.
    let ro = Options {
        read_only: true,
        ..small_options()
    };
    let e = Engine::open(dev, ro).unwrap();
    assert!(e.stats().known_damage.is_some());
    let (k, v) = m.iter().next().unwrap();
    if let Ok(got) = e.get(k) {
        assert_eq!(got.as_ref(), Some(v));
    }
}

#[test]
fn a_format_1_image_is_refused_and_upgraded_by_the_upgrade_command() {
    let (dev, m) = filled(300);
    let backups = Superblock::read_newest(&*dev, false).unwrap().backups;
    // As format 1 left it: full keys (node layout 1), no backups, one primary copy.
    downgrade_for_tests(dev.clone(), 1).unwrap();
    for read_only in [true, false] {
        let opts = Options {
            read_only,
            ..small_options()
        };
        let err = Engine::open(dev.clone(), opts).err().expect("refused");
        assert!(
            matches!(err, Error::UnsupportedVersion { found: 1, .. }),
            "{err}"
        );
        assert!(
            err.to_string()
                .contains("format 1 image: run `amaranth upgrade IMAGE`"),
            "{err}"
        );
    }
    let r = upgrade(dev.clone(), &mut |_, _| {}).unwrap();
    assert_eq!((r.from_version, r.to_version), (1, 4));
    let e = Engine::open(dev.clone(), small_options()).unwrap();
    assert_eq!(dump(&e), m);
    e.write(&Batch::from(vec![Op::Put {
        key: b"after".to_vec(),
        value: b"upgrade".to_vec(),
    }]))
    .unwrap();
    e.close().unwrap();
    let sb = Superblock::read_newest(&*dev, false).unwrap();
    assert_eq!((sb.version, &sb.backups), (4, &backups));
    // The backups the upgrade gave it hold the image when the primary copies are lost.
    dev.with_bytes_mut(|b| b[..8192].fill(0));
    let e = Engine::open(dev, small_options()).unwrap();
    assert_eq!(e.get(b"after").unwrap().as_deref(), Some(&b"upgrade"[..]));
}

#[test]
fn a_format_2_image_is_refused_naming_the_upgrade() {
    let (dev, _) = filled(100);
    // A format-2 superblock (full keys in its nodes) in every copy.
    let mut sb = Superblock::read_newest(&*dev, false).unwrap();
    sb.version = 2;
    sb.data_table = None;
    sb.data_table_crc = 0;
    sb.data_table_runs = 0;
    sb.forge_for_tests(&*dev).unwrap();
    for read_only in [true, false] {
        let opts = Options {
            read_only,
            ..small_options()
        };
        let err = Engine::open(dev.clone(), opts).err().expect("refused");
        assert!(
            matches!(err, Error::UnsupportedVersion { found: 2, .. }),
            "{err}"
        );
        let text = err.to_string();
        assert!(
            text.contains("format 2 image: run `amaranth upgrade IMAGE`"),
            "{text}"
        );
    }
}
