//! `mount -o remount,ro DIR` and `remount,rw`: the kernel's half (`mount(2)` with `MS_REMOUNT`,
//! which also changes `nodev`, `nosuid`, `noexec` and the access-time flags of the mount) and the
//! daemon's half (over its control socket: the file system stops or resumes writing, with the
//! access-time and sync settings asked for).
//!
//! Going read-only, the kernel goes first: it refuses with `EBUSY` while a file is open for
//! writing and from then on sends no more changes; then the daemon writes a final clean checkpoint
//! and writes nothing more to the image. Going writable, the daemon goes first (it may refuse: an
//! image that cannot be written), then the kernel; if the kernel refuses, the daemon goes back.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use serde_json::{json, Value};

use crate::options::{Origin, Parsed};
use crate::util::{self, CliResult, Failure};

/// Runs a remount of the Amaranth mount at `dir` with the option lists `options` (as `mount(8)`
/// passes them: the current options merged with the new ones).
pub fn run(dir: &Path, options: &[String]) -> CliResult {
    let mp = util::absolute(dir).map_err(|e| Failure::new(format!("{}: {e}", dir.display())))?;
    match amaranth_fuse::find_mount(&mp) {
        Some(m) if amaranth_fuse::is_amaranth_type(&m.fstype) => {}
        Some(m) => {
            return Err(Failure::new(format!(
                "{} is not an Amaranth mount (it is {} of type {})",
                mp.display(),
                m.source,
                m.fstype
            )))
        }
        None => return Err(Failure::new(format!("{} is not mounted", mp.display()))),
    }
    if !util::is_root() {
        return Err(Failure::new(
            "a remount needs root (mount(2) with MS_REMOUNT)",
        ));
    }
    let mut parsed = Parsed::defaults(Origin::MountCommand, true);
    parsed.apply(options)?;
    let o = &parsed.mount;
    let mut flags = libc::MS_REMOUNT | amaranth_fuse::mount_flags(o);
    if !o.dev {
        flags |= libc::MS_NODEV;
    }
    if !o.suid {
        flags |= libc::MS_NOSUID;
    }
    if o.noexec {
        flags |= libc::MS_NOEXEC;
    }
    let request = json!({
        "op": "remount",
        "read_only": o.read_only,
        "relatime": !o.noatime,
        "strictatime": o.strictatime,
        "lazytime": o.lazytime,
        "sync": o.sync || o.dirsync,
    });
    if o.read_only {
        kernel_remount(&mp, flags)?;
        tell_daemon(&mp, &request).map_err(|f| {
            Failure::new(format!(
                "{} is read-only for applications now, but its daemon did not stop writing: {}",
                mp.display(),
                f.message
            ))
        })
    } else {
        tell_daemon(&mp, &request)?;
        if let Err(f) = kernel_remount(&mp, flags) {
            let mut back = request.clone();
            back["read_only"] = json!(true);
            let _ = tell_daemon(&mp, &back);
            return Err(f);
        }
        Ok(())
    }
}

/// `mount(2)` with `MS_REMOUNT` and `flags` (the FUSE options of the mount cannot change).
fn kernel_remount(mp: &Path, flags: libc::c_ulong) -> CliResult {
    let target = CString::new(mp.as_os_str().as_bytes())
        .map_err(|_| Failure::new("NUL in the mount point"))?;
    // SAFETY: a valid NUL-terminated path; no source, type or data on a remount.
    let rc = unsafe {
        libc::mount(
            std::ptr::null(),
            target.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    Err(Failure::new(match e.raw_os_error() {
        Some(libc::EBUSY) => format!(
            "cannot remount {} read-only: files on it are open for writing",
            mp.display()
        ),
        _ => format!("cannot remount {}: {e}", mp.display()),
    }))
}

fn tell_daemon(mp: &Path, request: &Value) -> CliResult {
    let answer = crate::control::request(mp, request)
        .map_err(|e| Failure::new(format!("cannot reach the daemon of {}: {e}", mp.display())))?;
    if answer.get("ok") == Some(&Value::Bool(true)) {
        return Ok(());
    }
    Err(Failure::new(format!(
        "the daemon of {} refused the remount: {}",
        mp.display(),
        answer
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("it did not understand the request (an older daemon?)")
    )))
}
