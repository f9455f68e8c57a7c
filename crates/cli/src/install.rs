//! `amaranth install-helper`: this binary as `BIN_DIR/amaranth` and, as links to it in
//! `SBIN_DIR`, the helpers that the system's commands run (see `helpers.rs`):
//! `mount.fuse.TYPE` (`mount -t fuse.amaranth`, fstab, remount), `umount.fuse.TYPE` (`umount`),
//! `fsck.TYPE` and `fsck.fuse.TYPE` (`fsck -t amaranth`, fstab pass numbers) and `mkfs.TYPE`
//! (`mkfs -t amaranth`), where TYPE is `amaranth` or, with `--type amaranth-NAME`, that name.
//! `--remove` removes the helper links of that type (those that are links to an `amaranth`).
//!
//! Root runs what it installs (mount(8) runs the helper), so both directories and every directory
//! above them must be owned by root or by the installing user and not writable by others (unless
//! sticky, like /tmp above them): otherwise another user could replace the binary. The copy goes to
//! a new file (`O_EXCL`, never through a link left at its name) renamed into place atomically.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use crate::util::{euid, CliResult, Failure};

/// The helper names for type `subtype` (`amaranth` or `amaranth-NAME`).
pub fn helper_names(subtype: &str) -> [String; 5] {
    [
        format!("mount.fuse.{subtype}"),
        format!("umount.fuse.{subtype}"),
        format!("fsck.{subtype}"),
        format!("fsck.fuse.{subtype}"),
        format!("mkfs.{subtype}"),
    ]
}

fn check_type(subtype: &str) -> CliResult {
    if amaranth_fuse::is_amaranth_subtype(subtype) {
        return Ok(());
    }
    Err(Failure::new(format!(
        "bad --type {subtype:?}: amaranth, or amaranth-NAME with NAME of letters, digits, _ - ."
    )))
}

/// Runs `install-helper --remove`: removes the helper links of `subtype` from `sbin_dir`.
pub fn remove(sbin_dir: &Path, subtype: &str) -> CliResult {
    check_type(subtype)?;
    for name in helper_names(subtype) {
        let p = sbin_dir.join(&name);
        let ours = fs::read_link(&p).is_ok_and(|t| {
            t.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("amaranth"))
        });
        if ours {
            fs::remove_file(&p)
                .map_err(|e| Failure::new(format!("cannot remove {}: {e}", p.display())))?;
        }
    }
    Ok(())
}

/// Runs `install-helper`.
pub fn run(bin_dir: &Path, sbin_dir: &Path, subtype: &str) -> CliResult {
    check_type(subtype)?;
    let exe = std::env::current_exe().map_err(|e| Failure::new(format!("current exe: {e}")))?;
    for dir in [bin_dir, sbin_dir] {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .map_err(|e| Failure::new(format!("{}: {e}", dir.display())))?;
        check_dir(dir)?;
    }
    let bin = bin_dir.join("amaranth");
    let same = bin.canonicalize().ok() == exe.canonicalize().ok();
    if !same {
        copy_into_place(&exe, bin_dir, &bin)
            .map_err(|e| Failure::new(format!("cannot install {}: {e}", bin.display())))?;
    }
    for name in helper_names(subtype) {
        let helper = sbin_dir.join(&name);
        // Removes a name (a link itself, never what it points to).
        let _ = fs::remove_file(&helper);
        std::os::unix::fs::symlink(&bin, &helper)
            .map_err(|e| Failure::new(format!("cannot create {}: {e}", helper.display())))?;
    }
    say!(
        "installed {} and, linked to it in {}: {}",
        bin.display(),
        sbin_dir.display(),
        helper_names(subtype).join(", ")
    );
    say!("mount with:   mount -t fuse.{subtype} IMAGE DIR [-o ro,noatime,cache_size=1G]");
    say!("check with:   fsck -t {subtype} IMAGE (-n: no changes, -y: repair)");
    say!("make with:    mkfs -t {subtype} [-L LABEL] IMAGE SIZE");
    say!("fstab line:   /path/to/image.img  /mnt/amaranth  fuse.{subtype}  defaults  0 2");
    Ok(())
}

/// Copies `exe` to a new temporary file in `dir` and renames it to `bin` (a running binary is
/// replaced atomically).
fn copy_into_place(exe: &Path, dir: &Path, bin: &Path) -> io::Result<()> {
    let tmp = dir.join(".amaranth.new");
    // A stale temporary file or link from an earlier attempt: the name goes, not its target.
    let _ = fs::remove_file(&tmp);
    let mut dst = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o755)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)?;
    let copied = io::copy(&mut File::open(exe)?, &mut dst)
        .and_then(|_| dst.set_permissions(fs::Permissions::from_mode(0o755)))
        .and_then(|()| dst.sync_all())
        .and_then(|()| fs::rename(&tmp, bin));
    if copied.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    copied
}

/// Refuses a directory (or one above it) that another user could write into or owns.
fn check_dir(dir: &Path) -> CliResult {
    let real = dir
        .canonicalize()
        .map_err(|e| Failure::new(format!("{}: {e}", dir.display())))?;
    for d in real.ancestors() {
        let m = fs::metadata(d).map_err(|e| Failure::new(format!("{}: {e}", d.display())))?;
        let why = if m.uid() != 0 && m.uid() != euid() {
            format!("it is owned by uid {}", m.uid())
        } else if m.mode() & 0o022 != 0 && (d == real || m.mode() & libc::S_ISVTX == 0) {
            format!("others can write into it (mode {:04o})", m.mode() & 0o7777)
        } else {
            continue;
        };
        let through = if d == real {
            String::new()
        } else {
            format!(" (through {})", d.display())
        };
        return Err(Failure::new(format!(
            "refusing to install into {}{through}: {why}; another user could replace what root \
             runs",
            dir.display()
        )));
    }
    Ok(())
}
