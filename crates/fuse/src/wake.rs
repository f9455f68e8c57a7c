//! Where a ring reply wakes its caller. A ring thread answers a request on the CPU that made it
//! (its queue's CPU), and the reply wakes the caller while that thread still runs there. The
//! scheduler then looks for an idle CPU for the caller, finds the other one (idle while the
//! request was served) and moves the caller there, and it keeps doing so: the caller's next
//! request goes to that CPU's queue, whose reply moves it back (the task remembers the CPU it last
//! left, `recent_used_cpu`, and takes it whenever it is idle). Every round trip then wakes a
//! halted vCPU: measured on this project's 2-vCPU VM, 20,000 mkdirs in a row took 128-176 µs each
//! with 1.5-2.4 caller migrations per mkdir, against 23-30 µs when the caller happened to stay on
//! one CPU (docs/BENCHMARKS.md, "Replies that keep the caller on its CPU").
//!
//! A CPU whose running tasks are all `SCHED_IDLE` counts as idle when the scheduler places a
//! waking task, and it is checked first (the target CPU, before any other). So a ring thread
//! commits its replies with the `SCHED_IDLE` policy and takes back its own policy at once, before
//! it waits for the next request: the caller wakes on the thread's CPU and runs there at once (a
//! normal task preempts an idle-policy one), and the thread goes on once the caller sleeps again.
//! The thread never waits for a request as `SCHED_IDLE` (woken behind a busy task with that
//! policy, it would hardly run); it is idle-policy only from its commit to its next time on the
//! CPU. Returning from `SCHED_IDLE` needs `CAP_SYS_NICE` (or an `RLIMIT_NICE` that allows nice 0),
//! so [`probe`] tries it once before any ring thread uses it.
use std::io;

/// How ring threads commit replies: on the caller's CPU (`SCHED_IDLE` around the commit) or
/// plainly (the scheduler may move the caller).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReplyWake {
    /// The policy the ring threads run with (and return to after each commit), or `None` when
    /// replies are committed plainly.
    own_policy: Option<libc::c_int>,
}

impl ReplyWake {
    /// Replies committed with the scheduler's own placement of the caller.
    pub(crate) fn plain() -> ReplyWake {
        ReplyWake { own_policy: None }
    }

    /// Whether replies keep their callers on the serving CPU.
    pub(crate) fn here(&self) -> bool {
        self.own_policy.is_some()
    }

    /// Runs `commit` (a submission that ends requests, waking their callers) with the calling
    /// thread at `SCHED_IDLE`, then returns the thread to its own policy. Should that return be
    /// refused ([`probe`] made the same change, so only a capability dropped since could refuse
    /// it), the thread says so and commits plainly from then on.
    pub(crate) fn commit<T>(&mut self, commit: impl FnOnce() -> T) -> T {
        let Some(own) = self.own_policy else {
            return commit();
        };
        let idle = set_policy(libc::SCHED_IDLE);
        let out = commit();
        if idle.is_ok() {
            if let Err(e) = set_policy(own) {
                log::error!(
                    "amaranth: a ring thread cannot leave SCHED_IDLE ({e}): it serves at that \
                     policy from now on, and commits its replies plainly"
                );
                self.own_policy = None;
            }
        }
        out
    }
}

fn set_policy(policy: libc::c_int) -> io::Result<()> {
    let p = libc::sched_param { sched_priority: 0 };
    // SAFETY: a valid sched_param, applied to the calling thread (pid 0).
    match unsafe { libc::sched_setscheduler(0, policy, &p) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Whether ring threads may commit at `SCHED_IDLE`: tries the change and its undo on a thread of
/// its own (which ends either way). Returns how replies are to be committed, and why not here if
/// they cannot be.
pub(crate) fn probe() -> Result<ReplyWake, String> {
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: reads the calling thread's policy.
            let own = unsafe { libc::sched_getscheduler(0) };
            if own != libc::SCHED_OTHER && own != libc::SCHED_BATCH {
                return Err(format!("the daemon runs with scheduling policy {own}"));
            }
            set_policy(libc::SCHED_IDLE).map_err(|e| format!("SCHED_IDLE: {e}"))?;
            set_policy(own).map_err(|e| {
                format!("cannot return from SCHED_IDLE ({e}; needs CAP_SYS_NICE or RLIMIT_NICE)")
            })?;
            Ok(ReplyWake {
                own_policy: Some(own),
            })
        })
        .join()
        .unwrap_or_else(|_| Err("the probe thread panicked".into()))
    })
}

/// The scheduling policy of thread `tid` of this process (`/proc/self/task/TID/stat`, field 41).
#[cfg(test)]
fn policy_of(tid: i32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap();
    // Fields after the command name (in parentheses, which may hold spaces): field 3 is the
    // first.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    rest.split(' ').nth(41 - 3).unwrap().parse().unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tid() -> i32 {
        // SAFETY: gettid has no preconditions.
        unsafe { libc::gettid() }
    }

    /// As root the probe succeeds, a commit runs at SCHED_IDLE, and the thread is back at its own
    /// policy after it; a plain commit changes nothing.
    #[test]
    fn a_commit_runs_idle_and_the_thread_returns_to_its_own_policy() {
        let w = match probe() {
            Ok(w) => w,
            Err(why) => {
                // SAFETY: geteuid has no preconditions.
                assert_ne!(unsafe { libc::geteuid() }, 0, "root cannot probe: {why}");
                eprintln!("SKIPPED: {why}");
                return;
            }
        };
        assert!(w.here());
        std::thread::spawn(move || {
            let mut w = w;
            let own = policy_of(tid());
            assert_eq!(own, libc::SCHED_OTHER);
            let during = w.commit(|| policy_of(tid()));
            assert_eq!(during, libc::SCHED_IDLE);
            assert_eq!(policy_of(tid()), own);
            let plain = ReplyWake::plain().commit(|| policy_of(tid()));
            assert!(w.here(), "still committing on the caller's CPU");
            assert_eq!(plain, own);
            assert!(!ReplyWake::plain().here());
        })
        .join()
        .unwrap();
    }
}
