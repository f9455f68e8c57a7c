//! Small helpers shared by the subcommands: sizes, paths, processes, errors.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// An error that ends the command with a message and an exit code.
#[derive(Debug)]
pub struct Failure {
    /// What to print (after `amaranth: `).
    pub message: String,
    /// Process exit code.
    pub code: i32,
}

impl Failure {
    /// A failure with exit code 1.
    pub fn new(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            code: 1,
        }
    }
    /// A failure with a chosen exit code.
    pub fn with_code(code: i32, message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            code,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Result of a subcommand.
pub type CliResult<T = ()> = Result<T, Failure>;

/// Parses a size: a number of bytes with an optional binary suffix (`K`, `M`, `G`, `T`, `P`, `E`,
/// with or without `iB`/`B`), e.g. `8G`, `512M`, `1P`, `1048576`, `1.5G`. Sizes that do not fit
/// in 64 bits are errors, never wrapped or saturated.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let bad = || format!("cannot parse size {s:?} (use e.g. 8G, 512M, 1P, 65536)");
    let lower = s.trim().to_ascii_lowercase();
    let num_end = lower
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(lower.len());
    let (num, suffix) = lower.split_at(num_end);
    let shift: u32 = match suffix.trim() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        "p" | "pb" | "pib" => 50,
        "e" | "eb" | "eib" => 60,
        _ => return Err(bad()),
    };
    let too_large = || format!("size {s:?} is too large (at most 16E)");
    match num.split_once('.') {
        None => {
            let v: u64 = num.parse().map_err(|_| bad())?;
            v.checked_mul(1 << shift).ok_or_else(too_large)
        }
        Some((whole, frac)) => {
            if (whole.is_empty() && frac.is_empty()) || frac.contains('.') {
                return Err(bad());
            }
            let v: f64 = num.parse().map_err(|_| bad())?;
            let bytes = v * (1u64 << shift) as f64;
            // 2^64 is exactly representable; anything at or above it does not fit.
            if !bytes.is_finite() || bytes >= 18_446_744_073_709_551_616.0 {
                return Err(too_large());
            }
            Ok(bytes as u64)
        }
    }
}

/// Formats bytes for people: `8.0 GiB`, `512 MiB`, `4096 B`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else if v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Physical memory in bytes.
pub fn total_memory() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let (pages, size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if pages > 0 && size > 0 {
        pages as u64 * size as u64
    } else {
        4 << 30
    }
}

/// Whether we run as root.
pub fn is_root() -> bool {
    euid() == 0
}

/// The effective user id.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// An absolute, normalized path without touching the path itself (works on a dead FUSE mount,
/// where `canonicalize` fails with `ENOTCONN`): the parent is canonicalized instead.
pub fn absolute(p: &Path) -> io::Result<PathBuf> {
    if let Ok(c) = p.canonicalize() {
        return Ok(c);
    }
    let abs = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()?.join(p)
    };
    match (abs.parent(), abs.file_name()) {
        (Some(parent), Some(name)) => Ok(parent
            .canonicalize()
            .unwrap_or_else(|_| parent.to_path_buf())
            .join(name)),
        _ => Ok(abs),
    }
}

/// Whether process `pid` is alive (not gone and not a zombie).
pub fn process_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            // The state follows the command name in parentheses.
            let state = s
                .rsplit_once(')')
                .and_then(|(_, r)| r.trim_start().chars().next());
            !matches!(state, Some('Z') | Some('X') | None)
        }
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("8G").unwrap(), 8 << 30);
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("1.5k").unwrap(), 1536);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999T").is_err());
        // P and E, and sizes at the edge of 64 bits.
        assert_eq!(parse_size("1P").unwrap(), 1 << 50);
        assert_eq!(parse_size("2PiB").unwrap(), 2 << 50);
        assert_eq!(parse_size("15E").unwrap(), 15 << 60);
        assert!(parse_size("16E").is_err());
        assert!(parse_size("16.0E").is_err());
        assert!(parse_size("99999999999.5P").is_err());
        assert_eq!(parse_size("0.5P").unwrap(), 1 << 49);
        assert_eq!(parse_size("18446744073709551615").unwrap(), u64::MAX);
        assert!(parse_size("18446744073709551616").is_err());
        // Garbage is an error, never a panic.
        for s in [
            "-1", ".", "1..5G", "1.2.3", "G", "1GG", "1 G B", "١G", "1e3", "0x10",
        ] {
            assert!(parse_size(s).is_err(), "{s:?} parsed");
        }
        assert_eq!(human(8 << 30), "8 GiB");
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(12), "12 B");
        assert_eq!(human(1 << 50), "1 PiB");
        assert_eq!(human(u64::MAX), "16 EiB");
    }
}
