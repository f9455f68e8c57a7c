//! Power cuts through the whole file system: ACE-style bounded workloads and long random ones.
//! CI runs a bounded, seeded set; `make crash-soak` runs as long as asked.

mod common;

use common::*;

#[test]
fn ace_sequences_of_one_and_two_operations() {
    let alpha = alphabet();
    let mut states = 0;
    let mut workloads = 0;
    // Every operation alone, followed or not by a sync.
    for (i, op) in alpha.iter().enumerate() {
        for sync in [false, true] {
            let mut ops = vec![op.clone()];
            if sync {
                ops.push(FsOp::Sync);
            }
            let run = record(&ops);
            states += check_run(&run, i as u64, 4, &format!("seq-1 {ops:?}"));
            workloads += 1;
        }
    }
    // Every ordered pair, the first followed by a sync half of the time (deterministically).
    for (i, a) in alpha.iter().enumerate() {
        for (j, b) in alpha.iter().enumerate() {
            let mut ops = vec![a.clone()];
            if (i + j) % 2 == 0 {
                ops.push(FsOp::Sync);
            }
            ops.push(b.clone());
            let run = record(&ops);
            states += check_run(&run, (i * 100 + j) as u64, 2, &format!("seq-2 {ops:?}"));
            workloads += 1;
        }
    }
    eprintln!("ACE seq-1/seq-2: {workloads} workloads, {states} crash states checked");
}

#[test]
fn sampled_sequences_of_three_operations() {
    let alpha = alphabet();
    let n: u64 = std::env::var("AMARANTH_SEQ3_SAMPLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(150);
    let mut states = 0;
    let mut x = 0x5e93u64;
    for s in 0..n {
        let mut ops = Vec::new();
        for _ in 0..3 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ops.push(alpha[(x >> 33) as usize % alpha.len()].clone());
            if (x >> 20).is_multiple_of(3) {
                ops.push(FsOp::Sync);
            }
        }
        let run = record(&ops);
        states += check_run(&run, s, 2, &format!("seq-3 sample {s} {ops:?}"));
    }
    eprintln!("ACE seq-3 sample: {n} workloads, {states} crash states checked");
}

#[test]
fn long_random_workloads() {
    let runs: u64 = std::env::var("AMARANTH_FS_CRASH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    let (mut states, mut clones) = (0, 0);
    for seed in 0..runs {
        let ops = random_ops(seed, 400);
        let run = record(&ops);
        clones += run.clones;
        states += check_run(&run, seed, 60, &format!("random workload seed {seed}"));
    }
    eprintln!(
        "long random workloads: {runs} workloads, {clones} whole-file clones, {states} crash \
         states checked"
    );
    assert!(
        clones > 0,
        "no workload cloned a file (random_ops copies into empty files)"
    );
}

/// Hard links whose count returns to one (the file moves from its home back to its remaining
/// path, `fs/links.rs`): by unlink of either name, by a rename over a name, after a rename of
/// the remaining name, and linked again afterwards. Every crash state is a prefix and fsck-clean
/// (the names index included).
#[test]
fn hard_links_returning_to_one_name() {
    let ops = vec![
        FsOp::Link("A/foo", "B/foo2"),
        FsOp::Unlink("A/foo"),
        FsOp::Link("B/foo2", "A/C/again"),
        FsOp::Rename("A/C/again", "A/renamed"),
        FsOp::Rename("B/bar", "B/foo2"),
        FsOp::Sync,
        FsOp::Link("A/renamed", "B/third"),
        FsOp::Link("B/third", "B/fourth"),
        FsOp::Unlink("B/third"),
        FsOp::Checkpoint,
        FsOp::Unlink("A/renamed"),
        FsOp::Append {
            path: "B/fourth",
            len: 3000,
            fill: 4,
        },
    ];
    let run = record(&ops);
    let states = check_run(&run, 13, 40, "hard links returning to one name");
    eprintln!("hard links returning to one name: {states} crash states checked");
}
