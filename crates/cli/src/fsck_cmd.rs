//! The fsck command line, kept apart from the checker (`fsck.rs`): `amaranth fsck` and
//! `fsck.amaranth` as `fsck(8)` runs it (`fsck -t amaranth IMG`, fstab pass numbers), with
//! e2fsck's flags and exit codes:
//!
//! - `-n`: check only, change nothing (the image is opened read-only and nothing is written);
//! - `-y`, `-p`, `-a`: repair what can be repaired (`--repair`);
//! - `-f`: check even an image that was closed cleanly; without it, `-n`, `-y` and `-p` report a
//!   cleanly closed image as clean at once (as e2fsck does at boot) unless its superblock records
//!   damage, skipped log records or damaged copies, while plain `amaranth fsck IMG` always checks;
//! - what is checked and repaired is `fsck.rs`'s: `-n` opens the image read-only (the survey of
//!   every node, then the schema check), `-y`/`-p` run `--repair` (salvage of a damaged tree,
//!   superblock copies rewritten, the schema repaired with `/lost+found`);
//! - exit codes 0 clean, 1 errors corrected, 4 errors left, 8 operational error, 16 usage error.
//!
//! An image that a daemon is still releasing after its unmount is waited for (bounded).

use std::path::{Path, PathBuf};

use amaranth_device::FileDevice;
use amaranth_engine::ImageInfo;

use crate::fsck::{self, CLEAN, OPERATIONAL};
use crate::release;
use crate::util::{CliResult, Failure};

/// Exit code: bad arguments.
pub const USAGE: i32 = 16;

/// What to do to which image.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FsckRequest {
    /// Image file or block device.
    pub image: PathBuf,
    /// Repair (`-y`, `-p`, `-a`, `--repair`).
    pub repair: bool,
    /// Change nothing (`-n`).
    pub no_changes: bool,
    /// Check even a cleanly closed image (`-f`; implied when no e2fsck flag is given).
    pub force: bool,
    /// Accept an older superblock copy that no backup vouches for (`--fallback-superblock`).
    pub fallback_superblock: bool,
}

impl FsckRequest {
    /// Checks that the flags agree (e2fsck: only one of `-n`, `-y`, `-p`).
    pub fn validate(&self) -> CliResult {
        if self.repair && self.no_changes {
            return Err(Failure::with_code(
                USAGE,
                "only one of -n (no changes) and -y/-p/--repair (repair) may be given",
            ));
        }
        Ok(())
    }
}

/// Parses `fsck.amaranth [-n|-y|-p|-a] [-f] [-v] [-C FD] [-V] [-T] [--] IMAGE` as `fsck(8)` runs
/// it.
pub fn parse_helper_args(argv: &[std::ffi::OsString]) -> CliResult<FsckRequest> {
    let usage = |m: String| {
        Failure::with_code(
            USAGE,
            format!("{m}; usage: fsck.amaranth [-n|-y|-p] [-f] IMAGE"),
        )
    };
    let mut req = FsckRequest::default();
    let mut image: Option<PathBuf> = None;
    let mut i = 0;
    let mut options_done = false;
    while i < argv.len() {
        let a = &argv[i];
        let s = a.to_string_lossy();
        i += 1;
        if options_done || !s.starts_with('-') || s == "-" {
            if image.replace(PathBuf::from(a)).is_some() {
                return Err(usage("more than one image given".into()));
            }
            continue;
        }
        if s == "--" {
            options_done = true;
            continue;
        }
        // Clustered flags, as e2fsck takes them: -fy, -pf.
        for c in s[1..].chars() {
            match c {
                'n' => req.no_changes = true,
                'y' | 'p' | 'a' => req.repair = true,
                'f' => req.force = true,
                // Verbose, timing, fsck(8)'s own: nothing to change.
                'v' | 'V' | 'T' | 't' => {}
                // Progress to a file descriptor: the value may be attached or separate.
                'C' => {
                    if s.len() == 2 {
                        i += 1;
                    }
                    break;
                }
                _ => return Err(usage(format!("unknown option -{c}"))),
            }
        }
    }
    req.image = image.ok_or_else(|| usage("no image given".into()))?;
    req.validate()?;
    Ok(req)
}

/// Runs the check; returns the exit code.
pub fn run(req: &FsckRequest) -> CliResult<i32> {
    req.validate()?;
    wait_for_release(&req.image)?;
    if !req.force {
        if let Some(code) = clean_at_once(&req.image) {
            return Ok(code);
        }
    }
    fsck::run(&req.image, req.repair, req.fallback_superblock)
}

/// Waits (bounded) while a daemon releases the image after its unmount.
fn wait_for_release(image: &Path) -> CliResult {
    match release::wait_while_released(image, "fsck", || FileDevice::open_read_only(image)) {
        // Any other failure is reported by the checker itself.
        Err(e) if e.kind() == std::io::ErrorKind::ResourceBusy => Err(Failure::with_code(
            OPERATIONAL,
            format!(
                "{} is in use (mounted?): unmount it first (`umount DIR`): {e}",
                image.display()
            ),
        )),
        _ => Ok(()),
    }
}

/// Without `-f`: a cleanly closed image is reported clean without a full check, unless its
/// superblock says otherwise (as e2fsck checks a file system whose state is not clean): known
/// damage, skipped log records, or superblock copies damaged, overwritten or used as a fallback.
fn clean_at_once(image: &Path) -> Option<i32> {
    let dev = FileDevice::open_read_only(image).ok()?;
    let located = ImageInfo::read(&dev, false).ok()?;
    let sb = &located;
    if !sb.clean() {
        return None;
    }
    let why_check = if sb.damaged() {
        "damage was recorded by a read"
    } else if sb.needs_check() {
        "log records were skipped at an open"
    } else if !located.problems().is_empty() || located.fell_back() {
        "superblock copies are damaged or overwritten"
    } else {
        say!(
            "{}: clean (closed cleanly at generation {}; use -f to check it anyway)",
            image.display(),
            sb.generation()
        );
        return Some(CLEAN);
    };
    note!(
        "fsck: {}: closed cleanly, but {why_check}: checking it",
        image.display()
    );
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    fn parse(args: &[&str]) -> CliResult<FsckRequest> {
        let v: Vec<OsString> = args.iter().map(OsString::from).collect();
        parse_helper_args(&v)
    }

    #[test]
    fn e2fsck_flags() {
        let r = parse(&["-n", "img"]).unwrap();
        assert!(r.no_changes && !r.repair && !r.force);
        assert_eq!(r.image, PathBuf::from("img"));
        let r = parse(&["-fy", "img"]).unwrap();
        assert!(r.repair && r.force);
        let r = parse(&["-a", "-C", "3", "img"]).unwrap();
        assert!(r.repair);
        let r = parse(&["-C0", "-p", "--", "-img"]).unwrap();
        assert!(r.repair);
        assert_eq!(r.image, PathBuf::from("-img"));
        for bad in [
            &["-n", "-y", "img"][..],
            &["img", "other"],
            &["-x", "img"],
            &["-n"],
        ] {
            assert_eq!(parse(bad).unwrap_err().code, USAGE, "{bad:?}");
        }
    }
}
