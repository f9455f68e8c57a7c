//! `amaranth umount` and the umount helper (`umount.fuse.amaranth`, which `umount(8)` runs for
//! our mounts): unmounts and waits until the daemon has written its final checkpoint and exited,
//! so that `umount DIR && mount IMG DIR` and `umount DIR && fsck IMG` always work.
//!
//! A lazy unmount (`-l`) detaches the mount and returns at once: the daemon serves the files still
//! open and finishes (final checkpoint, exit) when the last of them is closed. `--timeout S` bounds
//! the whole command, waiting for the daemon included.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::rundir::{self, RunDir};
use crate::util::{self, CliResult, Failure};

/// Runs `umount`, within `timeout` seconds if given.
pub fn run(dir: &Path, lazy: bool, timeout: Option<u64>) -> CliResult {
    let Some(t) = timeout else {
        return unmount_and_wait(dir, lazy, None);
    };
    let limit = Duration::from_secs(t);
    let Some(deadline) = Instant::now().checked_add(limit) else {
        // Longer than this machine can count: no limit.
        return unmount_and_wait(dir, lazy, None);
    };
    let dir = dir.to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    // A thread, so that even a system call that hangs (a daemon that stopped answering) cannot
    // hold the command past its timeout.
    std::thread::spawn(move || {
        let _ = tx.send(unmount_and_wait(&dir, lazy, Some(deadline)));
    });
    rx.recv_timeout(limit.saturating_add(Duration::from_millis(200)))
        .unwrap_or_else(|_| {
            Err(Failure::new(format!(
                "gave up after {t} s (--timeout): the unmount or the daemon did not finish"
            )))
        })
}

/// `umount.fuse.amaranth DIR [-l] [-f] [-n] [-r] [-v] [-i] [-t TYPE] [-N NS]`, as `umount(8)`
/// runs it.
pub fn helper(argv: &[std::ffi::OsString]) -> CliResult {
    let mut dir = None;
    let mut lazy = false;
    let mut i = 0;
    while i < argv.len() {
        let a = argv[i].to_string_lossy();
        match a.as_ref() {
            "-t" | "-N" => i += 1,
            "-l" => lazy = true,
            "-f" | "-n" | "-r" | "-v" | "-i" | "-d" | "-R" => {}
            s if s.starts_with('-') && s.len() > 1 => {
                return Err(Failure::new(format!("umount helper: unknown flag {s}")))
            }
            _ => {
                if dir.replace(std::path::PathBuf::from(&argv[i])).is_some() {
                    return Err(Failure::new("usage: umount.fuse.amaranth DIR [-l]"));
                }
            }
        }
        i += 1;
    }
    let dir = dir.ok_or_else(|| Failure::new("usage: umount.fuse.amaranth DIR [-l]"))?;
    unmount_and_wait(&dir, lazy, None).map_err(crate::helpers::with_mount_code)
}

fn unmount_and_wait(dir: &Path, lazy: bool, deadline: Option<Instant>) -> CliResult {
    let mp = util::absolute(dir).map_err(|e| Failure::new(format!("{}: {e}", dir.display())))?;
    let Some(m) = amaranth_fuse::find_mount(&mp) else {
        return Err(Failure::new(format!("{} is not mounted", mp.display())));
    };
    if !amaranth_fuse::is_amaranth_type(&m.fstype) {
        return Err(Failure::new(format!(
            "{} is not an Amaranth mount (it is {} of type {})",
            mp.display(),
            m.source,
            m.fstype
        )));
    }
    // The daemon: from its pid file, else from its control socket.
    let run = RunDir::existing().unwrap_or_else(|f| {
        note!("umount: {}", f.message);
        None
    });
    let pid = run
        .and_then(|r| r.read_pid(&rundir::pid_name(&mp)))
        .filter(|&p| util::process_alive(p))
        .or_else(|| {
            crate::stat::query(&mp)
                .ok()
                .and_then(|v| v["pid"].as_i64())
                .map(|p| p as i32)
        });
    unmount(&mp, lazy)?;
    if util::is_root() {
        crate::utab::remove(&mp);
    }
    if lazy || m.source.starts_with("snapshot:") {
        // The daemon finishes when the last user of the mount leaves; nothing to wait for here.
        // A mounted snapshot is a second session of a daemon that goes on serving its own mount.
        return Ok(());
    }
    let Some(pid) = pid else {
        note!(
            "umount: unmounted {}, but the daemon's pid is unknown: not waiting for it",
            mp.display()
        );
        return Ok(());
    };
    let start = Instant::now();
    let mut told = false;
    while util::process_alive(pid) {
        if !told && start.elapsed() > Duration::from_secs(2) {
            note!("umount: waiting for the daemon (pid {pid}) to write its final checkpoint");
            told = true;
        }
        if deadline.is_some_and(|d| Instant::now() > d) {
            return Err(Failure::new(format!(
                "the daemon (pid {pid}) is still running {:.0} s after the unmount (--timeout)",
                start.elapsed().as_secs_f64()
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

fn unmount(mp: &Path, lazy: bool) -> CliResult {
    if util::is_root() {
        let target = CString::new(mp.as_os_str().as_bytes())
            .map_err(|_| Failure::new("NUL in the mount point"))?;
        let flags = if lazy { libc::MNT_DETACH } else { 0 };
        // SAFETY: a valid NUL-terminated path.
        if unsafe { libc::umount2(target.as_ptr(), flags) } != 0 {
            let e = io::Error::last_os_error();
            return Err(Failure::new(match e.raw_os_error() {
                Some(libc::EBUSY) => format!(
                    "{} is busy (open files, or a process's working directory is inside); close \
                     them, or unmount lazily (-l)",
                    mp.display()
                ),
                _ => format!("cannot unmount {}: {e}", mp.display()),
            }));
        }
        return Ok(());
    }
    let mut cmd = std::process::Command::new("fusermount3");
    cmd.arg("-u");
    if lazy {
        cmd.arg("-z");
    }
    let out = cmd
        .arg("--")
        .arg(mp)
        .output()
        .map_err(|e| Failure::new(format!("cannot run fusermount3: {e}")))?;
    if !out.status.success() {
        return Err(Failure::new(format!(
            "cannot unmount {}: {}",
            mp.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}
