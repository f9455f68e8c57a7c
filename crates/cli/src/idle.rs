//! How this machine's idle CPUs wait, as far as a FUSE mount is concerned. A request is a round
//! trip between the caller and a daemon thread, and often wakes a thread on the other CPU. On a
//! virtual machine whose idle vCPUs halt at once (the `haltpoll` cpuidle driver with
//! `guest_halt_poll_ns` 0, as this project's VMs boot), that wake-up waits for the host to resume
//! the halted vCPU: a futex ping-pong between two pinned threads took 68 µs a round trip against
//! 6.7 µs with idle vCPUs polling 200 µs first, and a FUSE no-op request 35 µs against 13 µs
//! (docs/BENCHMARKS.md, "An idle vCPU's wake-up"). The setting is the machine's, not the file
//! system's, so `mount` only says so; it does not change it.
use std::path::Path;

const CPUIDLE_DRIVER: &str = "/sys/devices/system/cpu/cpuidle/current_driver";
/// How long an idle vCPU polls before it halts (the `haltpoll` driver's module parameter).
pub(crate) const HALT_POLL_NS: &str = "/sys/module/haltpoll/parameters/guest_halt_poll_ns";

/// A note for the user when idle vCPUs halt without polling on a machine of more than one CPU.
pub(crate) fn halt_poll_note() -> Option<String> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    note_from(Path::new(CPUIDLE_DRIVER), Path::new(HALT_POLL_NS), cpus)
}

fn note_from(driver: &Path, poll: &Path, cpus: usize) -> Option<String> {
    if cpus < 2 || std::fs::read_to_string(driver).ok()?.trim() != "haltpoll" {
        return None;
    }
    let ns: u64 = std::fs::read_to_string(poll).ok()?.trim().parse().ok()?;
    (ns == 0).then(|| {
        format!(
            "note: idle CPUs of this virtual machine halt at once ({} is 0), so a request that \
             wakes a thread on an idle CPU waits for the host to resume it (measured on such a VM: \
             35 µs a round trip against 13 µs with polling). As root, `echo 200000 > {}` lets an \
             idle CPU poll up to 200 µs first (a machine-wide setting: idle CPUs then spin briefly \
             before they halt)",
            poll.display(),
            poll.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_only_a_halting_haltpoll_guest_of_several_cpus() {
        let dir = std::env::temp_dir().join(format!("amaranth-idle-note-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (driver, poll) = (dir.join("driver"), dir.join("poll"));
        std::fs::write(&driver, "haltpoll\n").unwrap();
        std::fs::write(&poll, "0\n").unwrap();
        let note = note_from(&driver, &poll, 2).expect("a halting guest is noted");
        assert!(note.contains(&poll.display().to_string()), "{note}");
        assert_eq!(
            note_from(&driver, &poll, 1),
            None,
            "one CPU: nothing to wake"
        );
        std::fs::write(&poll, "200000\n").unwrap();
        assert_eq!(note_from(&driver, &poll, 2), None, "polling already");
        std::fs::write(&poll, "0\n").unwrap();
        std::fs::write(&driver, "acpi_idle\n").unwrap();
        assert_eq!(note_from(&driver, &poll, 2), None, "not a haltpoll guest");
        std::fs::remove_file(&driver).unwrap();
        assert_eq!(note_from(&driver, &poll, 2), None, "no cpuidle driver");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
