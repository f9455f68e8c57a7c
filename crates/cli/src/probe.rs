//! What an existing image file or block device holds, so that `mkfs` overwrites nothing by
//! accident: an Amaranth file system (our magic in either superblock copy), anything `blkid -p`
//! recognises (file systems, partition tables, RAID and LVM members, encrypted volumes), or any
//! other data in the first MiB.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;
use std::process::{Command, Stdio};

use amaranth_device::FileDevice;
use amaranth_engine::ImageInfo;

/// How much of the start is read to look for our magic and for data.
const HEAD: u64 = 1 << 20;
/// The superblock magic (FORMAT.md), at the start of block 0 and of block 1.
const MAGIC: &[u8; 8] = b"AMARANTH";

/// Something worth keeping found on a device.
#[derive(Debug, PartialEq, Eq)]
pub enum Found {
    /// An Amaranth file system; the generation if a superblock copy is valid.
    Amaranth(Option<u64>),
    /// What `blkid -p` recognised, e.g. `ext4`, `swap`, `a gpt partition table`.
    Recognised(String),
    /// Nonzero bytes that nothing recognised; the offset of the first.
    Data(u64),
}

impl Found {
    /// The refusal for `mkfs` without `--force`, in one line.
    pub fn refusal(&self, path: &Path) -> String {
        let what = match self {
            Found::Amaranth(Some(g)) => format!("an Amaranth file system (generation {g})"),
            Found::Amaranth(None) => "an Amaranth file system (damaged superblocks)".to_string(),
            Found::Recognised(what) => format!("{what} (found by blkid)"),
            Found::Data(at) => format!("data (a nonzero byte at offset {at}) of an unknown kind"),
        };
        format!(
            "{} already holds {what}; use --force to overwrite it",
            path.display()
        )
    }
}

/// Looks at what `path` holds (read only). `None` if it is empty or all zeros at the start and
/// unknown to blkid.
pub fn existing(path: &Path) -> io::Result<Option<Found>> {
    let mut head = Vec::new();
    File::open(path)?.take(HEAD).read_to_end(&mut head)?;
    let magic_at = |off: usize| head.get(off..off + MAGIC.len()) == Some(&MAGIC[..]);
    if magic_at(0) || magic_at(4096) {
        let generation = FileDevice::open_read_only(path)
            .ok()
            .and_then(|dev| ImageInfo::read(&dev, true).ok())
            .map(|sb| sb.generation());
        return Ok(Some(Found::Amaranth(generation)));
    }
    if let Some(what) = blkid(path) {
        return Ok(Some(Found::Recognised(what)));
    }
    Ok(head
        .iter()
        .position(|&b| b != 0)
        .map(|at| Found::Data(at as u64)))
}

/// What `blkid -p` (low-level probing, no cache) finds on `path`, if anything. Without blkid
/// (not installed, or it fails) the magic and data checks still apply.
fn blkid(path: &Path) -> Option<String> {
    // The system's blkid first: root's PATH is not consulted for a tool that reads devices.
    let program = ["/usr/sbin/blkid", "/sbin/blkid"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap_or("blkid");
    let out = Command::new(program)
        .args(["-p", "-o", "export", "--"])
        .arg(path)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    match out.status.code() {
        Some(0) => {}
        // Several signatures that contradict each other: something is there.
        Some(8) => return Some("several signatures".to_string()),
        // 2: nothing found; anything else: blkid could not probe.
        _ => return None,
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let value = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(str::to_string)
    };
    Some(match (value("TYPE"), value("PTTYPE")) {
        (Some(t), _) => t,
        (None, Some(pt)) => format!("a {pt} partition table"),
        (None, None) => "a signature".to_string(),
    })
}
