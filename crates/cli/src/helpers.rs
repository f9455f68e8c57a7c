//! The programs the system's commands run for us, all this same binary under other names
//! (installed as links by `amaranth install-helper`):
//!
//! | name | run by | does |
//! |---|---|---|
//! | `mount.fuse.amaranth` | `mount -t fuse.amaranth IMG DIR`, fstab, `mount -o remount` | mounts (prints nothing on success), or remounts |
//! | `umount.fuse.amaranth` | `umount DIR` | unmounts and waits for the daemon's final checkpoint |
//! | `fsck.amaranth`, `fsck.fuse.amaranth` | `fsck -t amaranth IMG`, fstab pass numbers | checks (e2fsck flags and exit codes) |
//! | `mkfs.amaranth` | `mkfs -t amaranth IMG` | makes a file system |
//!
//! Installed for another type (`install-helper --type amaranth-NAME`), the names end in that type
//! and mounts are of type `fuse.amaranth-NAME`: two builds can be installed side by side (the tests
//! use this so that they never touch the helpers of the machine).
//!
//! Failures exit as `mount(8)` does: 32 for a failed mount or unmount, 1 for bad usage.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;

use crate::mount::{self, MountArgs};
use crate::options::Origin;
use crate::util::{CliResult, Failure};

/// `mount(8)`'s exit code for a failed mount.
pub const MOUNT_FAILURE: i32 = 32;

/// Which helper a program name is, and for which type (`amaranth` or `amaranth-NAME`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Helper {
    /// `mount.fuse.TYPE` or `mount.TYPE`.
    Mount(String),
    /// `umount.fuse.TYPE`.
    Umount,
    /// `fsck.TYPE` or `fsck.fuse.TYPE`.
    Fsck,
    /// `mkfs.TYPE`.
    Mkfs,
}

/// The helper named by `argv0` (its file name), if it is one.
pub fn from_name(argv0: &str) -> Option<Helper> {
    let (kind, rest) = argv0.split_once('.')?;
    let subtype = rest.strip_prefix("fuse.").unwrap_or(rest);
    if !amaranth_fuse::is_amaranth_subtype(subtype) {
        return None;
    }
    match kind {
        "mount" => Some(Helper::Mount(subtype.to_string())),
        "umount" => Some(Helper::Umount),
        "fsck" => Some(Helper::Fsck),
        "mkfs" => Some(Helper::Mkfs),
        _ => None,
    }
}

/// Runs helper `h` with the arguments after the program name; returns the exit code.
pub fn run(h: Helper, argv: &[OsString]) -> CliResult<i32> {
    match h {
        Helper::Mount(subtype) => mount_helper(&subtype, argv).map(|()| 0),
        Helper::Umount => crate::umount::helper(argv).map(|()| 0),
        Helper::Fsck => crate::fsck_cmd::run(&crate::fsck_cmd::parse_helper_args(argv)?),
        Helper::Mkfs => crate::mkfs::run_helper(argv).map(|()| 0),
    }
}

/// A failure of the mount (or unmount) itself gets `mount(8)`'s code 32; usage errors keep 1.
pub fn with_mount_code(mut f: Failure) -> Failure {
    if f.code == 1 {
        f.code = MOUNT_FAILURE;
    }
    f
}

/// `mount.fuse.amaranth IMAGE DIR [-o OPTS] [-n] [-s] [-f] [-v] [-t TYPE]`, as `mount(8)` calls
/// it for `mount -t fuse.amaranth` and fstab lines (and for `mount -o remount,... DIR`).
fn mount_helper(subtype: &str, argv: &[OsString]) -> CliResult {
    let usage = || Failure::with_code(1, "usage: mount.fuse.amaranth IMAGE DIR [-o options]");
    let utf8 = |a: &OsString| -> CliResult<String> {
        a.to_str()
            .map(str::to_string)
            .ok_or_else(|| Failure::new(format!("mount options must be UTF-8: {a:?}")))
    };
    let mut positional: Vec<OsString> = Vec::new();
    let mut options = Vec::new();
    let mut fake = false;
    let mut i = 0;
    while i < argv.len() {
        let a = &argv[i];
        match a.to_str().unwrap_or("") {
            "-o" => {
                i += 1;
                options.push(utf8(argv.get(i).ok_or_else(usage)?)?);
            }
            "-t" | "-N" => i += 1,
            "-f" => fake = true,
            "-n" | "-s" | "-v" | "-i" | "-w" => {}
            "-r" => options.push("ro".into()),
            s if s.starts_with("-o") => options.push(s[2..].to_string()),
            _ if a.as_bytes().starts_with(b"-") && a.len() > 1 => {
                return Err(Failure::with_code(
                    1,
                    format!("mount helper: unknown flag {a:?}"),
                ))
            }
            _ => positional.push(a.clone()),
        }
        i += 1;
    }
    let remount = options
        .iter()
        .flat_map(|l| l.split(','))
        .any(|o| o.trim() == "remount");
    if remount {
        // mount(8) passes the source and the mount point; only the mount point matters.
        let dir = positional.pop().ok_or_else(usage)?;
        return if fake {
            Ok(())
        } else {
            crate::remount::run(&PathBuf::from(dir), &options).map_err(with_mount_code)
        };
    }
    let [image, dir] = <[OsString; 2]>::try_from(positional).map_err(|_| usage())?;
    if fake {
        return Ok(());
    }
    let image = match image.as_bytes().strip_prefix(b"amaranth#") {
        Some(rest) => OsString::from_vec(rest.to_vec()),
        None => image,
    };
    let dir = PathBuf::from(dir);
    let image = PathBuf::from(image);
    mount::run(MountArgs {
        image: image.clone(),
        dir: dir.clone(),
        options,
        origin: Origin::MountCommand,
        quiet: true,
        subtype: subtype.to_string(),
        ..MountArgs::default()
    })
    .map_err(with_mount_code)?;
    record_in_utab(&image, &dir);
    Ok(())
}

/// Records the new mount in utab so that a plain `umount DIR` runs our umount helper (see
/// `utab.rs`); without it (not root, or utab not writable) `umount` still works, and the next
/// mount or fsck waits for the daemon instead.
fn record_in_utab(image: &std::path::Path, dir: &std::path::Path) {
    if !crate::util::is_root() {
        return;
    }
    let (Ok(image), Ok(mp)) = (crate::util::absolute(image), crate::util::absolute(dir)) else {
        return;
    };
    let Some(id) = crate::utab::mount_id(&mp) else {
        return;
    };
    if let Err(e) = crate::utab::add(id, &image, &mp) {
        note!(
            "mount: cannot record {} in utab ({e}): `umount` will not wait for the daemon",
            mp.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helper_names() {
        assert_eq!(
            from_name("mount.fuse.amaranth"),
            Some(Helper::Mount("amaranth".into()))
        );
        assert_eq!(
            from_name("mount.amaranth-t1"),
            Some(Helper::Mount("amaranth-t1".into()))
        );
        assert_eq!(from_name("umount.fuse.amaranth-x.y"), Some(Helper::Umount));
        assert_eq!(from_name("fsck.amaranth"), Some(Helper::Fsck));
        assert_eq!(from_name("fsck.fuse.amaranth"), Some(Helper::Fsck));
        assert_eq!(from_name("mkfs.amaranth-t2"), Some(Helper::Mkfs));
        for no in [
            "amaranth",
            "mount.fuse.sshfs",
            "mount.amaranthx",
            "fsck.amaranth-",
            "x.amaranth",
        ] {
            assert_eq!(from_name(no), None, "{no}");
        }
    }
}
