//! Power cuts with patchgroups through the operation layer: random workloads of several
//! processes (common/pg.rs), and the rules' error cases.

mod common;

use common::pg::*;

#[test]
fn random_patchgroup_workloads_over_several_processes() {
    let runs: u64 = std::env::var("AMARANTH_PG_CRASH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    let mut states = 0;
    for seed in 0..runs {
        let plan = generate(seed, 120);
        let windows = plan.windows.len();
        let run = record_pg(&plan);
        let n = check_pg_run(&run, seed, 30, &format!("patchgroup workload seed {seed}"));
        eprintln!(
            "seed {seed}: {} steps, {} dependencies, {windows} atomic groups, {} syncs, {n} crash states",
            plan.steps.len(),
            plan.deps.len(),
            plan.promises.len()
        );
        states += n;
    }
    eprintln!("patchgroup workloads: {runs} workloads, {states} crash states checked");
}

/// The crash soak's seed 1795599901: the owner of an atomic group copied an empty file (no
/// change, no record: its group had not begun), another process wrote, and the owner's fsync
/// made that write durable. The workload model used to count the empty copy as the group's first
/// change, so it called the recovered state (which rightly holds the other process's write) a
/// cut inside an open group.
#[test]
fn a_copy_of_an_empty_file_opens_no_atomic_window() {
    let seed = 1_795_599_901;
    let plan = generate(seed, 200);
    let run = record_pg(&plan);
    let n = check_pg_run(&run, seed, 40, &format!("patchgroup workload seed {seed}"));
    eprintln!("seed {seed}: {n} crash states");
}

/// Soak seed 1795602129: a write of another process pushed deleted data over its bound, and the
/// foreground engine's cleanup checkpoint waited for an open atomic group and cut it at its
/// deadline (20 s), committing it half-done.
#[test]
fn a_cleanup_checkpoint_does_not_cut_another_process_atomic_group() {
    let seed = 1_795_602_129;
    let plan = generate(seed, 200);
    let run = record_pg(&plan);
    let n = check_pg_run(&run, seed, 40, &format!("patchgroup workload seed {seed}"));
    eprintln!("seed {seed}: {n} crash states");
}
