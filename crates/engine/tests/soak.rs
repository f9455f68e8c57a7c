//! A long soak: model runs and power-cut runs with fresh seeds until the time is up.
//! `make soak` (AMARANTH_SOAK_SECONDS, default 600) runs it; it prints what it checked.

mod common;

use std::time::{Duration, Instant};

use amaranth_device::CrashPlan;
use common::crashsim::*;

#[test]
#[ignore]
fn soak() {
    let secs: u64 = std::env::var("AMARANTH_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    let base: u64 = std::env::var("AMARANTH_SEED_BASE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs()
        });
    let deadline = Instant::now() + Duration::from_secs(secs);
    let (mut runs, mut states) = (0u64, 0u64);
    let mut seed = base;
    while Instant::now() < deadline {
        seed += 1;
        eprintln!("soak seed {seed}");
        let run = workload(seed, 400);
        for (i, pos) in crash_points(&run, seed, 60).into_iter().enumerate() {
            for plan in [
                CrashPlan::DropAll,
                CrashPlan::KeepAll,
                CrashPlan::Random {
                    seed: seed ^ i as u64,
                    keep: 0.5,
                    tear: 0.5,
                },
                CrashPlan::Random {
                    seed: seed ^ (i as u64) << 20,
                    keep: 0.9,
                    tear: 0.2,
                },
            ] {
                check_crash(
                    &run,
                    pos,
                    &plan,
                    &format!("seed {seed} crash at {pos} with {plan:?}"),
                );
                states += 1;
            }
        }
        runs += 1;
    }
    println!(
        "soak: {runs} workloads, {states} crash states checked, 0 failures (seeds {}..={seed})",
        base + 1
    );
}
