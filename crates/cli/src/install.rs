//! `amaranth install-helper`: this binary as `BIN_DIR/amaranth` and the mount helper
//! `SBIN_DIR/mount.fuse.amaranth` (a link to it), for `mount -t fuse.amaranth` and /etc/fstab.
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

/// Runs `install-helper`.
pub fn run(bin_dir: &Path, sbin_dir: &Path) -> CliResult {
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
    let helper = sbin_dir.join("mount.fuse.amaranth");
    // Removes a name (a link itself, never what it points to).
    let _ = fs::remove_file(&helper);
    std::os::unix::fs::symlink(&bin, &helper)
        .map_err(|e| Failure::new(format!("cannot create {}: {e}", helper.display())))?;
    say!(
        "installed {} and {} -> {}",
        bin.display(),
        helper.display(),
        bin.display()
    );
    say!("mount with:   mount -t fuse.amaranth IMAGE DIR [-o cache_size=1G,threads=2]");
    say!("fstab line:   /path/to/image.img  /mnt/amaranth  fuse.amaranth  defaults,cache_size=1G  0 0");
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
