//! Who a caller is: thread → process, process → parent, and exits.
//!
//! A FUSE request carries the calling *thread's* id. Patchgroups belong to processes, so the
//! thread is mapped to its thread group through `/proc/<tid>/status` (`Tgid:`, `PPid:`), cached
//! and checked on each use with `tgkill(tgid, tid, 0)` (a thread id reused by another process
//! fails it). Exits are noticed with a pidfd per process that has groups, polled by one thread.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;

use super::Patchgroups;

/// How the file system learns who its callers are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProcessModel {
    /// Real processes: a caller is a thread id, mapped to its process and parent through
    /// `/proc`; exits are noticed through pidfds.
    #[default]
    Linux,
    /// Every caller id is a process of its own; children are declared with
    /// [`Patchgroups::spawned`] and exits with [`Patchgroups::process_exited`] (tests and
    /// simulations through the operation layer).
    Declared,
}

/// What the patchgroups need to know about processes.
pub(crate) trait ProcessView: Send + Sync {
    /// The process (thread group) of thread `tid` and its parent; `None` if it is gone.
    fn identify(&self, tid: u32) -> Option<(u32, u32)>;
    /// The parent of process `tgid`.
    fn parent(&self, tgid: u32) -> Option<u32> {
        self.identify(tgid).map(|(_, ppid)| ppid)
    }
    /// Whether thread `tid` (still) belongs to process `tgid`.
    fn same(&self, tgid: u32, tid: u32) -> bool;
    /// Whether process `tgid` has not exited.
    fn alive(&self, tgid: u32) -> bool;
    /// Reports the exit of `tgid` to the patchgroups from now on.
    fn watch(&self, tgid: u32);
    /// Stops watching `tgid`.
    fn unwatch(&self, tgid: u32);
    /// Records a fork (declared processes only).
    fn declare_parent(&self, _child: u32, _parent: u32) {}
}

pub(super) fn view(model: ProcessModel, pg: Weak<Patchgroups>) -> Box<dyn ProcessView> {
    match model {
        ProcessModel::Linux => Box::new(LinuxView::new(pg)),
        ProcessModel::Declared => Box::new(DeclaredView::default()),
    }
}

// ----- declared processes -------------------------------------------------------------------

#[derive(Default)]
struct DeclaredView {
    parents: Mutex<HashMap<u32, u32>>,
}

impl ProcessView for DeclaredView {
    fn identify(&self, tid: u32) -> Option<(u32, u32)> {
        Some((tid, self.parents.lock().get(&tid).copied().unwrap_or(0)))
    }
    fn same(&self, tgid: u32, tid: u32) -> bool {
        tgid == tid
    }
    fn alive(&self, _tgid: u32) -> bool {
        true
    }
    fn watch(&self, _tgid: u32) {}
    fn unwatch(&self, tgid: u32) {
        self.parents.lock().remove(&tgid);
    }
    fn declare_parent(&self, child: u32, parent: u32) {
        self.parents.lock().insert(child, parent);
    }
}

// ----- real processes -----------------------------------------------------------------------

/// How often the watcher looks again for new processes to watch.
const WATCH_PERIOD: Duration = Duration::from_millis(100);

struct LinuxView {
    shared: Arc<Watched>,
}

struct Watched {
    pg: Weak<Patchgroups>,
    fds: Mutex<HashMap<u32, OwnedFd>>,
    /// Processes found gone when they were to be watched: reported by the watcher.
    gone: Mutex<Vec<u32>>,
    running: AtomicBool,
}

impl LinuxView {
    fn new(pg: Weak<Patchgroups>) -> LinuxView {
        LinuxView {
            shared: Arc::new(Watched {
                pg,
                fds: Mutex::new(HashMap::new()),
                gone: Mutex::new(Vec::new()),
                running: AtomicBool::new(false),
            }),
        }
    }
}

/// `(Tgid, PPid)` from `/proc/<tid>/status`.
fn read_status(tid: u32) -> Option<(u32, u32)> {
    let text = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    let field = |name: &str| -> Option<u32> {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
    };
    Some((field("Tgid:")?, field("PPid:")?))
}

fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    // SAFETY: a non-negative result is a descriptor we now own.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Whether a pidfd reports its process as exited (readable).
fn exited(fd: &OwnedFd) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0
}

impl Watched {
    /// The watcher thread: polls every pidfd and reports exits, as long as the patchgroups live.
    fn run(self: Arc<Watched>) {
        while self.pg.strong_count() > 0 {
            let gone = std::mem::take(&mut *self.gone.lock());
            for t in gone {
                let Some(pg) = self.pg.upgrade() else { return };
                pg.process_exited(t);
            }
            let (tgids, mut raw): (Vec<u32>, Vec<libc::pollfd>) = self
                .fds
                .lock()
                .iter()
                .map(|(&t, fd)| {
                    let p = libc::pollfd {
                        fd: fd.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    (t, p)
                })
                .unzip();
            if raw.is_empty() {
                std::thread::sleep(WATCH_PERIOD);
                continue;
            }
            // SAFETY: `raw` is a valid array of pollfds. A descriptor closed meanwhile by
            // `unwatch` reports POLLNVAL (or, reused, a spurious event that the check below
            // ignores).
            let n = unsafe {
                libc::poll(
                    raw.as_mut_ptr(),
                    raw.len() as libc::nfds_t,
                    WATCH_PERIOD.as_millis() as i32,
                )
            };
            if n <= 0 {
                continue;
            }
            for (t, r) in tgids.iter().zip(&raw) {
                if r.revents == 0 {
                    continue;
                }
                // Confirm with the descriptor watched now (the one polled may have been replaced).
                let gone = self.fds.lock().get(t).is_some_and(exited);
                if gone {
                    let Some(pg) = self.pg.upgrade() else { return };
                    pg.process_exited(*t);
                }
            }
        }
    }
}

impl ProcessView for LinuxView {
    fn identify(&self, tid: u32) -> Option<(u32, u32)> {
        read_status(tid)
    }

    fn same(&self, tgid: u32, tid: u32) -> bool {
        // SAFETY: signal 0 only checks that thread `tid` exists in thread group `tgid`.
        let r = unsafe { libc::syscall(libc::SYS_tgkill, tgid, tid, 0) };
        r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    }

    fn alive(&self, tgid: u32) -> bool {
        match self.shared.fds.lock().get(&tgid) {
            Some(fd) => !exited(fd),
            None => pidfd_open(tgid).is_some_and(|fd| !exited(&fd)),
        }
    }

    fn watch(&self, tgid: u32) {
        match pidfd_open(tgid) {
            Some(fd) => {
                self.shared.fds.lock().insert(tgid, fd);
            }
            // Already gone: the watcher reports it (outside the caller's locks).
            None => self.shared.gone.lock().push(tgid),
        }
        if !self.shared.running.swap(true, Ordering::AcqRel) {
            let shared = self.shared.clone();
            let spawned = std::thread::Builder::new()
                .name("amaranth-pg-exits".into())
                .spawn(move || shared.run());
            if let Err(e) = spawned {
                self.shared.running.store(false, Ordering::Release);
                log::error!("amaranth: cannot start the patchgroup exit watcher: {e}");
            }
        }
    }

    fn unwatch(&self, tgid: u32) {
        self.shared.fds.lock().remove(&tgid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_maps_to_its_process_and_parent() {
        let me = std::process::id();
        // SAFETY: gettid has no arguments and cannot fail.
        let tid = std::thread::spawn(|| unsafe { libc::gettid() } as u32)
            .join()
            .unwrap();
        let view = LinuxView::new(Weak::new());
        // The thread has ended: its id soon no longer maps to us. A joined thread is released by
        // the kernel a moment after the join returns (the join waits for the thread id's clear
        // at exit, which comes before the release), and meanwhile `tgkill` still finds it while
        // its /proc status may be gone already (CI saw exactly that once).
        let t = std::time::Instant::now();
        while view.same(me, tid) && t.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(
            !view.same(me, tid),
            "an ended thread still maps to us after 10 s"
        );
        let (tgid, ppid) = view.identify(me).expect("our own status");
        assert_eq!(tgid, me);
        assert_eq!(ppid, std::os::unix::process::parent_id());
        // SAFETY: as above.
        let main_tid = unsafe { libc::gettid() } as u32;
        assert!(view.same(me, main_tid));
        assert_eq!(view.identify(main_tid).map(|(t, _)| t), Some(me));
        assert!(view.alive(me));
    }

    #[test]
    fn a_child_that_exited_is_not_alive() {
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let pid = child.id();
        let view = LinuxView::new(Weak::new());
        let fd = pidfd_open(pid).expect("pidfd");
        child.wait().expect("wait");
        assert!(exited(&fd));
        assert!(!view.alive(pid));
    }
}
