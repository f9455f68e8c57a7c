//! `amaranth umount`: unmounts and waits until the daemon has written its final checkpoint and
//! exited.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::rundir::{self, RunDir};
use crate::util::{self, CliResult, Failure};

/// Runs `umount`.
pub fn run(dir: &Path, lazy: bool, timeout: Option<u64>) -> CliResult {
    let mp = util::absolute(dir).map_err(|e| Failure::new(format!("{}: {e}", dir.display())))?;
    let Some(m) = amaranth_fuse::find_mount(&mp) else {
        return Err(Failure::new(format!("{} is not mounted", mp.display())));
    };
    let ours = format!("fuse.{}", amaranth_fuse::SUBTYPE);
    if m.fstype != ours {
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
        if let Some(t) = timeout {
            if start.elapsed() > Duration::from_secs(t) {
                return Err(Failure::new(format!(
                    "the daemon (pid {pid}) is still running {t} s after the unmount"
                )));
            }
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
                     them or use --lazy",
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
