//! `make crash-soak`: power cuts through the file system for as long as asked
//! (AMARANTH_CRASH_SOAK_SECONDS, default 600). Prints how many crash states it checked and how
//! many failed (a failure panics with its seed, so the count of failures printed is always zero).
//! One workload in four has patchgroups (common/pg.rs).

mod common;

use std::time::{Duration, Instant};

use common::*;

#[test]
#[ignore]
fn crash_soak() {
    let secs: u64 = std::env::var("AMARANTH_CRASH_SOAK_SECONDS")
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
    let alpha = alphabet();
    let (mut workloads, mut states) = (0u64, 0usize);
    let mut seed = base;
    while Instant::now() < deadline {
        seed += 1;
        // One workload in four uses patchgroups (several processes, dependencies, atomic groups).
        if seed % 4 == 1 {
            let plan = common::pg::generate(seed, 200);
            let run = common::pg::record_pg(&plan);
            states += common::pg::check_pg_run(
                &run,
                seed,
                40,
                &format!("soak patchgroup workload seed {seed}"),
            );
            workloads += 1;
            continue;
        }
        // Alternate long random workloads with random sequences of three ACE operations.
        let (ops, what) = if seed.is_multiple_of(4) {
            (
                random_ops(seed, 600),
                format!("soak random workload seed {seed}"),
            )
        } else {
            let mut x = seed.wrapping_mul(0x9e3779b97f4a7c15) | 1;
            let mut ops = Vec::new();
            for _ in 0..3 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                ops.push(alpha[(x % alpha.len() as u64) as usize].clone());
                if x.is_multiple_of(3) {
                    ops.push(FsOp::Sync);
                }
            }
            (ops, format!("soak seq-3 seed {seed}"))
        };
        let run = record(&ops);
        states += check_run(&run, seed, 40, &what);
        workloads += 1;
        if workloads % 100 == 0 {
            eprintln!("crash soak: {workloads} workloads, {states} crash states so far");
        }
    }
    println!("crash soak: {workloads} workloads, {states} crash states checked, 0 failed (seeds {}..={seed})", base + 1);
}
