//! Power cuts around whole-file clones (docs/SURGERY.md §5.3, increment 8): `copy_file_range`
//! of a whole file into an empty one is one range clone; writes to either side after it (small
//! ones into shared leaves, large ones out of line), a clone of the clone, truncates, renames and
//! unlinks of either side (the random workloads of `crash.rs` and the soak clone too). Every
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
