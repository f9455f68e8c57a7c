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
//!
//! Replies to READs alone are committed plainly (`uring.rs`): a sequential reader's read-ahead
//! READs complete pages it waits for, and a random reader's READ waited for the device; there the
//! caller was better placed by the scheduler (4 GiB cold sequential read 1,086-1,157 MiB/s with
//! READ replies at `SCHED_IDLE` against 1,300-1,356 without, cold random 4 KiB reads at QD1
//! 5,423-6,308/s against 5,973-7,729; docs/BENCHMARKS.md).
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

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

    /// Whether the next replies are to be committed at `SCHED_IDLE` ([`ReplyWake::commit_idle`]):
    /// this thread may, and some CPU of the machine has been idle lately ([`MIN_IDLE_PCT`]).
    pub(crate) fn wanted(&self) -> bool {
        self.here() && GAUGE.some_cpu_idle()
    }

    /// Runs `commit` (a submission that ends requests, waking their callers) with the calling
    /// thread at `SCHED_IDLE`, then returns the thread to its own policy (plainly where it may
    /// not). Should that return be refused ([`probe`] made the same change, so only a capability
    /// dropped since could refuse it), the thread says so and commits plainly from then on.
    pub(crate) fn commit_idle<T>(&mut self, commit: impl FnOnce() -> T) -> T {
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

/// How often [`IdleGauge`] reads the machine's CPU times again.
const GAUGE_PERIOD: Duration = Duration::from_millis(100);

/// The share of the machine's CPU time (in percent) that must have been idle over the last
/// [`GAUGE_PERIOD`] for replies to be committed at `SCHED_IDLE`. Where no CPU is idle the
/// scheduler has nowhere to move a caller to, and the policy changes only cost: with a busy loop
/// on each CPU, chmod took 18-20 µs a call against 10-12 committed plainly (2-vCPU VM,
/// docs/BENCHMARKS.md "Replies that keep the caller on its CPU"). A serial caller keeps about one
/// CPU busy (50% idle on two CPUs); an untar of the Linux tree left 15-46% idle or waiting for
/// I/O.
const MIN_IDLE_PCT: u64 = 10;

/// Whether some CPU of the machine has been idle lately, from `/proc/stat` (idle and I/O wait
/// time over all CPUs), read at most once per [`GAUGE_PERIOD`] by whichever ring thread finds the
/// reading old; the others use the last answer. Starts out yes.
struct IdleGauge {
    /// When the process started measuring (the clock of `read_at`).
    epoch: Instant,
    /// Nanoseconds after `epoch` of the last reading.
    read_at: AtomicU64,
    /// The answer of the last reading.
    idle: AtomicBool,
    /// The last reading's CPU times (idle, total), taken by the thread that reads.
    last: Mutex<Option<(u64, u64)>>,
}

static GAUGE: LazyLock<IdleGauge> = LazyLock::new(|| IdleGauge {
    epoch: Instant::now(),
    read_at: AtomicU64::new(0),
    idle: AtomicBool::new(true),
    last: Mutex::new(None),
});

impl IdleGauge {
    fn some_cpu_idle(&self) -> bool {
        let now = self.epoch.elapsed().as_nanos() as u64;
        let at = self.read_at.load(Ordering::Relaxed);
        if now.saturating_sub(at) >= GAUGE_PERIOD.as_nanos() as u64 {
            if let Ok(mut last) = self.last.try_lock() {
                self.read_at.store(now, Ordering::Relaxed);
                if let Some(next) = std::fs::read_to_string("/proc/stat")
                    .ok()
                    .and_then(|s| cpu_times(&s))
                {
                    if let Some(pct) = last.and_then(|prev| idle_pct(prev, next)) {
                        self.idle.store(pct >= MIN_IDLE_PCT, Ordering::Relaxed);
                    }
                    *last = Some(next);
                }
            }
        }
        self.idle.load(Ordering::Relaxed)
    }
}

/// (idle + I/O wait, total) jiffies of all CPUs, from the first line of `/proc/stat`
/// (`cpu user nice system idle iowait irq softirq steal guest guest_nice`; guest time is already
/// in user and nice).
fn cpu_times(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().next()?;
    let mut f = line.split_ascii_whitespace();
    if f.next()? != "cpu" {
        return None;
    }
    let v: Vec<u64> = f.take(8).map(|x| x.parse().ok()).collect::<Option<_>>()?;
    if v.len() < 5 {
        return None;
    }
    Some((v[3] + v[4], v.iter().sum()))
}

/// The idle share in percent between two readings, if any time passed.
fn idle_pct(prev: (u64, u64), next: (u64, u64)) -> Option<u64> {
    let total = next.1.checked_sub(prev.1).filter(|&t| t > 0)?;
    let idle = next.0.checked_sub(prev.0)?.min(total);
    Some(idle * 100 / total)
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

    #[test]
    fn cpu_times_and_the_idle_share_come_from_the_first_line_of_proc_stat() {
        let a = "cpu  100 5 50 800 40 3 2 0 7 0\ncpu0 50 2 25 400 20 1 1 0 3 0\nintr 5 1\n";
        assert_eq!(cpu_times(a), Some((840, 1000)));
        let b = "cpu  190 5 60 800 50 3 2 0 7 0\n";
        assert_eq!(cpu_times(b), Some((850, 1110)));
        // 10 of 110 jiffies idle or waiting.
        assert_eq!(idle_pct((840, 1000), (850, 1110)), Some(9));
        assert_eq!(idle_pct((840, 1000), (840, 1000)), None, "no time passed");
        assert_eq!(cpu_times("intr 5 1\n"), None);
        assert_eq!(cpu_times("cpu 1 2 x 4 5\n"), None);
        assert_eq!(cpu_times("cpu 1 2 3\n"), None);
        // This machine's own file parses, and its total moves on.
        let here = std::fs::read_to_string("/proc/stat").unwrap();
        let (idle, total) = cpu_times(&here).unwrap();
        assert!(idle <= total && total > 0);
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
            let during = w.commit_idle(|| policy_of(tid()));
            assert_eq!(during, libc::SCHED_IDLE);
            assert_eq!(policy_of(tid()), own);
            let plain = ReplyWake::plain().commit_idle(|| policy_of(tid()));
            assert!(w.here(), "still committing on the caller's CPU");
            assert_eq!(plain, own);
            assert!(!ReplyWake::plain().here());
        })
        .join()
        .unwrap();
    }
}
