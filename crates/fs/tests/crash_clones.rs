//! Power cuts around whole-file clones (docs/SURGERY.md §5.3, increment 8): `copy_file_range`
//! of a whole file into an empty one is one range clone; writes to either side after it (small
//! ones into shared leaves, large ones out of line), a clone of the clone, truncates, renames and
//! unlinks of either side (the random workloads of `crash.rs` and the soak clone too); and
//! directory clones (`amaranth clone`, §5.4): a tree with hard links and out-of-line data cloned,
//! written on both sides, cloned again, renamed into and deleted under. Every
//! crash state is the state after a prefix of the operations, its
//! reference counts and data table exact and fsck clean (`recovered_tree`: the checker runs the
//! engine's verify, which counts every node's references).

mod common;

use common::*;

const KIB: usize = 1 << 10;

#[test]
fn whole_file_clones_written_and_deleted_on_either_side_across_power_cuts() {
    let ops = vec![
        // A file of inline blocks and out-of-line runs (writes of 64 KiB and more).
        FsOp::Write {
            path: "A/foo",
            offset: 0,
            len: 600 * KIB,
            fill: 31,
        },
        FsOp::Write {
            path: "A/foo",
            offset: 70_000,
            len: 3000,
            fill: 32,
        },
        FsOp::Sync,
        FsOp::Creat("B/c1"),
        FsOp::Copy {
            from: "A/foo",
            off_in: 0,
            to: "B/c1",
            off_out: 0,
            len: 1 << 30,
        },
        // Both sides written: a few bytes into a shared block, a run out of line.
        FsOp::Write {
            path: "B/c1",
            offset: 100,
            len: 50,
            fill: 33,
        },
        FsOp::Write {
            path: "A/foo",
            offset: 200 * KIB as u64,
            len: 128 * KIB,
            fill: 34,
        },
        // A clone of the clone.
        FsOp::Creat("A/C/c2"),
        FsOp::Copy {
            from: "B/c1",
            off_in: 0,
            to: "A/C/c2",
            off_out: 0,
            len: 1 << 30,
        },
        FsOp::Checkpoint,
        FsOp::Append {
            path: "B/c1",
            len: 5000,
            fill: 35,
        },
        // The source goes; the clones keep their data.
        FsOp::Unlink("A/foo"),
        FsOp::Truncate {
            path: "A/C/c2",
            size: 10_000,
        },
        FsOp::Sync,
        FsOp::Rename("B/c1", "A/renamed"),
        FsOp::Creat("B/c3"),
        FsOp::Copy {
            from: "A/renamed",
            off_in: 0,
            to: "B/c3",
            off_out: 0,
            len: 1 << 30,
        },
        FsOp::Unlink("A/renamed"),
        FsOp::Punch {
            path: "B/c3",
            offset: 4096,
            len: 300 * KIB as u64,
        },
        FsOp::Checkpoint,
        FsOp::Unlink("A/C/c2"),
        FsOp::Write {
            path: "B/c3",
            offset: 500 * KIB as u64,
            len: 80 * KIB,
            fill: 36,
        },
        FsOp::Sync,
    ];
    // The 12 MiB log's records hold writes of several hundred KiB, stored out of line.
    let run = record_with(&ops, twelve_mib_log(), 52 << 20);
    assert_eq!(run.clones, 3, "every copy into an empty file is a clone");
    let states = check_run(&run, 0xc10e, 60, "whole-file clones, 12 MiB log");
    eprintln!("whole-file clones: {states} crash states checked");
}

/// A directory clone is one record: after a power cut anywhere, the whole tree is there (with
/// fresh inodes, its hard links split, its data shared) or none of it, as after a prefix of the
/// operations; writes to either side, a clone of the clone, renames and deletes around it too.
#[test]
fn directory_clones_are_all_or_nothing_across_power_cuts() {
    let ops = vec![
        FsOp::Creat("A/big"),
        FsOp::Write {
            path: "A/big",
            offset: 0,
            len: 300 * KIB,
            fill: 41,
        },
        FsOp::Creat("A/C/small"),
        FsOp::Write {
            path: "A/C/small",
            offset: 0,
            len: 3000,
            fill: 42,
        },
        FsOp::Link("A/foo", "A/C/foo-link"),
        FsOp::Symlink("foo", "A/sym"),
        FsOp::Sync,
        FsOp::CloneTree("A", "B/A2"),
        FsOp::Write {
            path: "B/A2/foo",
            offset: 100,
            len: 50,
            fill: 43,
        },
        FsOp::Write {
            path: "A/C/foo-link",
            offset: 0,
            len: 100 * KIB,
            fill: 44,
        },
        FsOp::CloneTree("B/A2", "D"),
        FsOp::Checkpoint,
        FsOp::SetXattr {
            path: "D/C",
            name: "user.d",
            len: 30,
        },
        FsOp::Unlink("B/A2/big"),
        FsOp::Rename("A/C", "D/C2"),
        FsOp::CloneTree("D/C2", "A/C"),
        FsOp::Sync,
        FsOp::Unlink("A/foo"),
        FsOp::CloneTree("A/C/small", "B/small-clone"),
        FsOp::Truncate {
            path: "D/big",
            size: 5000,
        },
        FsOp::Checkpoint,
        FsOp::Unlink("D/C/foo-link"),
        FsOp::Write {
            path: "B/small-clone",
            offset: 10,
            len: 10,
            fill: 45,
        },
        FsOp::Sync,
    ];
    let run = record_with(&ops, twelve_mib_log(), 52 << 20);
    assert!(
        run.clones >= 6,
        "the clones' data ranges by surgery: {}",
        run.clones
    );
    let states = check_run(&run, 0xd1c0, 60, "directory clones, 12 MiB log");
    eprintln!("directory clones: {states} crash states checked");
}

/// A clone of a wide directory right after writes that left nearly a megabyte in the log's
/// buffer: the engine writes the log out once a record takes it past its threshold, so a clone
/// split into two records would be cut by a log write (a crash point) between them; as one
/// record it is all there or not at all.
#[test]
fn a_wide_directory_clone_is_one_record() {
    let mut ops = vec![FsOp::Mkdir("W")];
    for i in 0..400 {
        let path: &'static str = Box::leak(format!("W/{i:03}{}", "n".repeat(150)).into_boxed_str());
        ops.push(FsOp::Creat(path));
    }
    ops.push(FsOp::Sync);
    // 16 writes of 60 KiB (inline: below the out-of-line threshold), not synced.
    for k in 0..16u64 {
        ops.push(FsOp::Write {
            path: "A/foo",
            offset: k * 64 * KIB as u64,
            len: 60 * KIB,
            fill: k as u8,
        });
    }
    ops.push(FsOp::CloneTree("W", "B/W2"));
    ops.push(FsOp::Unlink("W/000nnnnnnnnnn"));
    ops.push(FsOp::Sync);
    let run = record_with(&ops, twelve_mib_log(), 52 << 20);
    let last = run.states.last().expect("states");
    let cloned = last
        .keys()
        .filter(|k| k.len() == 3 && k[..2] == [b"B".to_vec(), b"W2".to_vec()])
        .count();
    assert_eq!(cloned, 400, "the clone happened");
    let states = check_run(&run, 0x31de, 20, "a wide directory clone");
    eprintln!("a wide directory clone: {states} crash states checked");
}
