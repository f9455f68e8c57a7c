//! Power cuts around writes and copies as large as one FUSE request (1 MiB, the `max_write` the
//! daemon negotiates) with small logs: each call is one batch, so after a crash it is all there
//! or not at all, and an extending truncate after it shows zeros, never bytes of a lost part.
//! A write larger than what one log record holds is not split into several batches: it returns
//! a short count (POSIX allows it; the application writes the rest), and what it reports is atomic.

mod common;

use std::sync::Arc;

use amaranth_device::MemDevice;
use amaranth_engine::Engine;
use amaranth_fs::{Ctx, Fs, FsOptions, SetAttr, COPY_MAX, ROOT_INO};
use common::*;

const MIB: usize = 1 << 20;

#[test]
fn requests_up_to_a_mebibyte_are_atomic_across_power_cuts() {
    let ops = vec![
        FsOp::Write {
            path: "A/foo",
            offset: 0,
            len: MIB,
            fill: 11,
        },
        FsOp::Write {
            path: "A/foo",
            offset: 1000,
            len: MIB - 1,
            fill: 12,
        },
        FsOp::Write {
            path: "B/bar",
            offset: 300,
            len: 300_000,
            fill: 13,
        },
        FsOp::Truncate {
            path: "B/bar",
            size: 3 * MIB as u64,
        },
        FsOp::Sync,
        FsOp::Append {
            path: "B/bar",
            len: MIB,
            fill: 14,
        },
        FsOp::Write {
            path: "A/foo",
            offset: 5 * MIB as u64 + 4096,
            len: MIB,
            fill: 15,
        },
        FsOp::Truncate {
            path: "A/foo",
            size: 8 * MIB as u64,
        },
        FsOp::Write {
            path: "A/foo",
            offset: 12_345,
            len: 777_777,
            fill: 16,
        },
    ];
    let run = record_with(&ops, twelve_mib_log(), 52 << 20);
    let states = check_run(&run, 0x1a46e, 60, "1 MiB requests, 12 MiB log");
    eprintln!("1 MiB requests: {states} crash states checked");
}

/// Out-of-line blocks (docs/WRITEONCE.md) through everything that changes or drops them: small
/// writes into them (patches on their references), overwrites, a punched hole, a rename and a
/// hard link (their references moved, counted twice until the source's delete reaches them),
/// unlinks, a truncate into them, and new writes after checkpoints that may reuse released
/// blocks. Every crash state is a prefix, its data table equal to its references (the engine's
/// verify in the recovery).
#[test]
fn out_of_line_blocks_survive_power_cuts_through_everything_that_drops_them() {
    let ops = vec![
        FsOp::Mkdir("C"),
        FsOp::Write {
            path: "A/foo",
            offset: 0,
            len: MIB,
            fill: 41,
        },
        FsOp::Sync,
        FsOp::Write {
            path: "A/foo",
            offset: 3 * 4096 + 100,
            len: 50,
            fill: 42,
        },
        FsOp::Write {
            path: "A/foo",
            offset: 8192,
            len: 200_000,
            fill: 43,
        },
        FsOp::Punch {
            path: "A/foo",
            offset: 300_000,
            len: 200_000,
        },
        FsOp::Rename("A/foo", "C/moved"),
        FsOp::Link("C/moved", "B/hard"),
        FsOp::Checkpoint,
        FsOp::Write {
            path: "B/big",
            offset: 0,
            len: 2 * MIB,
            fill: 44,
        },
        FsOp::Unlink("B/hard"),
        FsOp::Unlink("C/moved"),
        FsOp::Truncate {
            path: "B/big",
            size: 100_000,
        },
        FsOp::Checkpoint,
        FsOp::Write {
            path: "B/big",
            offset: 5 * MIB as u64,
            len: MIB,
            fill: 45,
        },
        FsOp::Sync,
    ];
    let run = record_with(&ops, twelve_mib_log(), 52 << 20);
    let states = check_run(&run, 0x0b10c, 60, "out-of-line blocks, 12 MiB log");
    eprintln!("out-of-line blocks: {states} crash states checked");
}

#[test]
fn a_copy_file_range_call_is_atomic_across_power_cuts() {
    let ops = vec![
        FsOp::Write {
            path: "A/foo",
            offset: 0,
            len: 3 * MIB,
            fill: 21,
        },
        FsOp::Sync,
        // Aligned: whole blocks; asked for 3 MiB, one call copies at most COPY_MAX.
        FsOp::Copy {
            from: "A/foo",
            off_in: 0,
            to: "B/bar",
            off_out: 4096,
            len: 3 * MIB as u64,
        },
        // Unaligned: bytes.
        FsOp::Copy {
            from: "A/foo",
            off_in: 5,
            to: "B/bar",
            off_out: 2 * MIB as u64 + 7,
            len: 900_000,
        },
        FsOp::Truncate {
            path: "B/bar",
            size: 5 * MIB as u64,
        },
    ];
    let run = record_with(&ops, twelve_mib_log(), 52 << 20);
    let states = check_run(&run, 0xc0b1, 60, "copy_file_range, 12 MiB log");
    eprintln!("copy_file_range: {states} crash states checked");
}

#[test]
fn a_write_larger_than_a_log_record_is_short_and_atomic_across_power_cuts() {
    // The case: the crash format's 1 MiB log holds records of at most 128 KiB, so a
    // 300,000-byte write is written in part (a short count) as one batch; the extending
    // truncate after it shows zeros past what was written.
    let ops = vec![
        FsOp::Write {
            path: "A/foo",
            offset: 0,
            len: 300_000,
            fill: 31,
        },
        FsOp::Truncate {
            path: "A/foo",
            size: 400_000,
        },
        FsOp::Write {
            path: "B/bar",
            offset: 1000,
            len: 300_000,
            fill: 32,
        },
    ];
    let run = record(&ops);
    let states = check_run(&run, 0x300, 40, "300,000-byte writes, 1 MiB log");
    eprintln!("writes past a log record: {states} crash states checked");
}

#[test]
fn short_counts_cover_the_whole_write_when_the_caller_loops() {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let engine = Engine::create(dev, format(), engine_options()).unwrap();
    Fs::mkfs(&engine, 0, 0).unwrap();
    // Blocks in the tree: their data is in the log record, which is smaller than the write.
    let inline = FsOptions {
        out_of_line_min: 0,
        ..fs_options()
    };
    let fs = Fs::new(Arc::new(engine), inline).unwrap();
    let (f, fh) = fs
        .create(ROOT_INO, b"f", 0o644, libc::O_RDWR, Ctx::default())
        .unwrap();
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let max = fs.engine().max_batch_bytes();
    // Unaligned start: the first piece ends on a block boundary.
    let mut pos = 0usize;
    let mut calls = 0;
    while pos < data.len() {
        let n = fs
            .write(f.ino, fh, 1000 + pos as u64, &data[pos..], false)
            .unwrap();
        assert!(n > 0);
        calls += 1;
        assert_eq!(fs.getattr(f.ino).unwrap().size, 1000 + (pos + n) as u64);
        pos += n;
        if pos < data.len() {
            assert_eq!(
                (1000 + pos) % 4096,
                0,
                "a short write ends on a block boundary"
            );
            assert!(n < max, "{n} bytes in a record of at most {max}");
        }
    }
    assert!(
        calls > 2,
        "{calls} calls: the log's records are smaller than the write"
    );
    let got = fs.read(f.ino, 0, 400_000).unwrap();
    assert_eq!(&got[..1000], &[0; 1000][..]);
    assert_eq!(&got[1000..], &data[..]);
    // copy_file_range copies at most COPY_MAX, and less with records this small.
    let (g, gh) = fs
        .create(ROOT_INO, b"g", 0o644, libc::O_RDWR, Ctx::default())
        .unwrap();
    // Not empty: a whole file copied into an empty one is cloned in one call instead.
    assert_eq!(fs.write(g.ino, gh, 0, b"x", false).unwrap(), 1);
    let n = fs.copy_file_range(f.ino, 0, g.ino, 0, 301_000).unwrap();
    assert!(n > 0 && n < COPY_MAX && (n as usize) < max, "copied {n}");
    let mut copied = n;
    while copied < 301_000 {
        copied += fs
            .copy_file_range(f.ino, copied, g.ino, copied, 301_000 - copied)
            .unwrap();
    }
    assert_eq!(fs.read(g.ino, 0, 400_000).unwrap(), got);
    fs.setattr(
        g.ino,
        &SetAttr {
            size: Some(310_000),
            ..SetAttr::default()
        },
        Ctx::default(),
    )
    .unwrap();
    assert_eq!(fs.read(g.ino, 301_000, 9_000).unwrap(), vec![0; 9_000]);
    fs.release(f.ino, fh).unwrap();
    fs.release(g.ino, gh).unwrap();
}
