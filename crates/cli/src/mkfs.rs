//! `amaranth mkfs`: a new, empty file system on an image file or a block device.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use amaranth_device::{BlockDevice, FileDevice};
use amaranth_engine::{Compression, Engine, Format, Options};
use amaranth_fs::Fs;

use crate::probe;
use crate::util::{human, parse_size, CliResult, Failure};

/// Image files are whole 4 KiB blocks.
const BLOCK: u64 = 4096;

/// Smallest and largest redo log for a file system (a 1 MiB write must fit one record: 1/8 of it).
const LOG_MIN: u64 = 16 << 20;
const LOG_MAX: u64 = 256 << 20;

/// What `mkfs` was asked for.
pub struct MkfsArgs<'a> {
    pub image: &'a Path,
    pub size: Option<u64>,
    pub node_size: Option<u64>,
    pub compression: &'a str,
    pub force: bool,
    /// `-L`: the label (empty: none).
    pub label: &'a str,
    /// `-U`: the uuid (`None`: a random one).
    pub uuid: Option<[u8; 16]>,
}

/// Parses a `-U` value: a UUID, or `random`.
pub fn parse_uuid_arg(s: &str) -> Result<Option<[u8; 16]>, String> {
    if s == "random" {
        return Ok(None);
    }
    amaranth_engine::parse_uuid(s).map(Some)
}

/// `mkfs.amaranth [-L LABEL] [-U UUID] [-f|-F] [-q] [-v] [--size SIZE] [-c COMPRESSION] IMAGE
/// [SIZE]`, as `mkfs -t amaranth` runs it.
pub fn run_helper(argv: &[std::ffi::OsString]) -> CliResult {
    let usage = |m: &str| {
        Failure::new(format!(
            "{m}; usage: mkfs.amaranth [-L LABEL] [-U UUID] [-f] IMAGE [SIZE]"
        ))
    };
    let mut positional: Vec<&std::ffi::OsString> = Vec::new();
    let (mut label, mut uuid, mut force, mut size) = (String::new(), None, false, None);
    let mut compression = "none".to_string();
    let mut i = 0;
    while i < argv.len() {
        let a = argv[i].to_string_lossy().into_owned();
        let mut value = || {
            i += 1;
            argv.get(i)
                .and_then(|v| v.to_str())
                .map(str::to_string)
                .ok_or_else(|| usage(&format!("{a} needs a value")))
        };
        match a.as_str() {
            "-L" => label = value()?,
            "-U" => uuid = parse_uuid_arg(&value()?).map_err(Failure::new)?,
            "-c" | "--compression" => compression = value()?,
            "-s" | "--size" => size = Some(parse_size(&value()?).map_err(Failure::new)?),
            "-f" | "-F" | "--force" => force = true,
            "-q" | "-v" | "-V" => {}
            s if s.starts_with('-') && s.len() > 1 => {
                return Err(usage(&format!("unknown option {s}")))
            }
            _ => positional.push(&argv[i]),
        }
        i += 1;
    }
    let (image, size) = match positional[..] {
        [image] => (image, size),
        [image, s] => (
            image,
            Some(parse_size(&s.to_string_lossy()).map_err(Failure::new)?),
        ),
        _ => return Err(usage("give one image")),
    };
    run(MkfsArgs {
        image: Path::new(image),
        size,
        node_size: None,
        compression: &compression,
        force,
        label: &label,
        uuid,
    })
}

/// The log size for an image of `size` bytes.
pub fn log_size_for(size: u64) -> u64 {
    (size / 16).clamp(LOG_MIN, LOG_MAX)
}

/// Smallest image for a node size: the superblocks, the log, and room for sixteen nodes; and
/// the log must fit in the first quarter (the first backup superblock follows it).
pub fn min_size(node_size: u64) -> u64 {
    (2 * 4096 + LOG_MIN + 16 * node_size).max(4 * (LOG_MIN + 2 * 4096))
}

fn progress(msg: &str) {
    note!("mkfs: {msg}");
}

/// Runs `mkfs`.
pub fn run(a: MkfsArgs<'_>) -> CliResult {
    amaranth_engine::check_label(a.label).map_err(|e| Failure::new(format!("bad label: {e}")))?;
    let compression = Compression::from_name(a.compression).ok_or_else(|| {
        Failure::new(format!(
            "unknown compression {:?} (choose none, lz4 or zstd)",
            a.compression
        ))
    })?;
    let mut format = Format {
        compression,
        ..Format::default()
    };
    if let Some(n) = a.node_size {
        format.node_size = n as usize;
    }
    // Keep the default partition/node ratio valid for other node sizes.
    format.partition_size = format.partition_size.min(format.node_size / 2);
    format
        .validate()
        .map_err(|e| Failure::new(format!("bad --node-size: {e}")))?;

    let target = inspect(a.image)?;
    if target == Target::Block && a.size.is_some() {
        return Err(Failure::new(format!(
            "{} is a block device: its size is fixed, drop --size",
            a.image.display()
        )));
    }
    if target != Target::Missing {
        refuse_to_overwrite(a.image, a.force)?;
    }
    let min = min_size(format.node_size as u64);
    let size = match (a.size, target) {
        (Some(s), _) => Some(s / BLOCK * BLOCK),
        (None, Target::File { len, .. }) if len > 0 => None, // the file's own size
        (None, Target::Block) => None,
        (None, _) => {
            return Err(Failure::new(format!(
                "{} {}: give --size to make an image file (e.g. --size 8G)",
                a.image.display(),
                if target == Target::Missing {
                    "does not exist"
                } else {
                    "is empty"
                }
            )))
        }
    };
    if let Some(size) = size {
        if size < min {
            return Err(too_small(size, min, &format));
        }
        check_host_space(a.image, target, size, a.force)?;
    }
    // From here on, a failure removes the image file this mkfs created.
    let mut created = None;
    let dev = match size {
        Some(size) => {
            progress(&format!(
                "creating image file {} of {} (sparse but for its log, written now: the rest takes host \
                 space as it fills)",
                a.image.display(),
                human(size)
            ));
            created = make_image_file(a.image, target, size)?;
            FileDevice::open(a.image)
        }
        None => FileDevice::open(a.image),
    }
    .map_err(|e| open_error(a.image, e))?;
    let len = dev.len();
    if len < min {
        return Err(too_small(len, min, &format));
    }
    if dev.is_block_device() {
        progress(&format!(
            "block device {} of {}",
            a.image.display(),
            human(len)
        ));
    }
    format.log_size = Some(log_size_for(len));
    let options = Options {
        cache_size: (format.node_size * 16).max(64 << 20),
        background_threads: false,
        ..Options::default()
    };
    progress("writing superblocks, log and root node");
    let engine = Engine::create(Arc::new(dev), format.clone(), options).map_err(|e| {
        Failure::new(format!(
            "cannot create the engine on {}: {e}",
            a.image.display()
        ))
    })?;
    let (random_uuid, _) = engine.identity();
    engine
        .set_identity(a.uuid.unwrap_or(random_uuid), a.label)
        .map_err(|e| Failure::new(format!("cannot set the label and uuid: {e}")))?;
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    progress("creating the root directory");
    Fs::mkfs(&engine, uid, gid)
        .map_err(|e| Failure::new(format!("cannot create the file system: {e}")))?;
    let stats = engine.stats();
    let (uuid, _) = engine.identity();
    engine
        .close()
        .map_err(|e| Failure::new(format!("cannot close the new image: {e}")))?;
    if let Some(c) = created.as_mut() {
        c.keep();
    }
    let label = if a.label.is_empty() {
        String::new()
    } else {
        format!(", label {:?}", a.label)
    };
    say!(
        "created an Amaranth file system on {}: uuid {}{label}, {} ({} for data), {} log, {} nodes, compression {}, root owned by {uid}:{gid}",
        a.image.display(),
        amaranth_engine::format_uuid(&uuid),
        human(len),
        human(stats.data_bytes),
        human(format.log_size.unwrap_or(0)),
        human(format.node_size as u64),
        a.compression
    );
    Ok(())
}

/// What the image path names now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    Missing,
    File { len: u64, allocated: u64 },
    Block,
}

fn inspect(image: &Path) -> CliResult<Target> {
    refuse_planted(image)?;
    match std::fs::metadata(image) {
        Ok(m) if m.file_type().is_block_device() => Ok(Target::Block),
        Ok(m) if m.is_file() => Ok(Target::File {
            len: m.len(),
            allocated: m.blocks() * 512,
        }),
        Ok(_) => Err(Failure::new(format!(
            "{} is neither an image file nor a block device",
            image.display()
        ))),
        // A dangling symbolic link also lands here: creating refuses it (O_EXCL).
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Target::Missing),
        Err(e) => Err(Failure::new(format!("{}: {e}", image.display()))),
    }
}

/// In a directory that others can write into (like /tmp), refuses an image path that someone else
/// may have planted: a symbolic link, a file with other hard links, or a file of another user.
/// Root would otherwise overwrite whatever it leads to.
fn refuse_planted(image: &Path) -> CliResult {
    let Ok(m) = std::fs::symlink_metadata(image) else {
        return Ok(());
    };
    let dir = match image.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let shared = std::fs::metadata(dir).is_ok_and(|d| d.mode() & 0o002 != 0);
    let why = if !shared {
        return Ok(());
    } else if m.file_type().is_symlink() {
        "is a symbolic link".to_string()
    } else if m.is_file() && m.nlink() > 1 {
        format!("has {} hard links", m.nlink())
    } else if m.uid() != crate::util::euid() {
        format!("belongs to uid {}", m.uid())
    } else {
        return Ok(());
    };
    Err(Failure::new(format!(
        "{} {why} in {}, a directory others can write into: refusing to write through it \
         (name the image where nobody else can plant it)",
        image.display(),
        dir.display()
    )))
}

/// Refuses an image in use, and, without `--force`, one that holds a file system or data.
fn refuse_to_overwrite(image: &Path, force: bool) -> CliResult {
    if let Err(e) = FileDevice::open_read_only(image) {
        if e.kind() == io::ErrorKind::ResourceBusy {
            return Err(Failure::new(format!(
                "{} is in use (mounted?): {e}",
                image.display()
            )));
        }
    }
    if force {
        return Ok(());
    }
    match probe::existing(image) {
        Ok(None) => Ok(()),
        Ok(Some(found)) => Err(Failure::new(found.refusal(image))),
        Err(e) => Err(Failure::new(format!(
            "cannot read {} to check what it holds: {e}",
            image.display()
        ))),
    }
}

/// Refuses (without `--force`) an image file larger than the host file system's free space: it
/// would fill the host as it fills. With `--force`, warns.
fn check_host_space(image: &Path, target: Target, size: u64, force: bool) -> CliResult {
    let dir = match image.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let Some(free) = free_space(dir) else {
        return Ok(());
    };
    // Space that resizing an existing file gives back first.
    let reclaimed = match target {
        Target::File { allocated, .. } => allocated,
        _ => 0,
    };
    let room = free.saturating_add(reclaimed);
    if size <= room {
        return Ok(());
    }
    let msg = format!(
        "--size {} is more than the {} free on the file system holding {}",
        human(size),
        human(room),
        image.display()
    );
    if !force {
        return Err(Failure::new(format!(
            "{msg}: the image would fill it; give a smaller --size (or --force to make it anyway)"
        )));
    }
    progress(&format!(
        "warning: {msg}; once the host is full the file system stops accepting writes"
    ));
    Ok(())
}

/// Bytes an unprivileged writer may still use on the file system holding `dir`.
fn free_space(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs is plain data.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid NUL-terminated path and a struct to fill.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// Makes the image file `size` bytes long and sparse: a new file is created with `O_EXCL` (never
/// through a link left at its name) and mode 0600, and is removed again if mkfs fails; an existing
/// one (checked or forced) is emptied and resized.
fn make_image_file(image: &Path, target: Target, size: u64) -> CliResult<Option<Created>> {
    let fail = |e: io::Error| {
        Failure::new(match e.kind() {
            io::ErrorKind::AlreadyExists => format!(
                "{} appeared while mkfs ran, or is a dangling symbolic link: not creating it",
                image.display()
            ),
            _ => format!("cannot create {}: {e}", image.display()),
        })
    };
    if target == Target::Missing {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(image)
            .map_err(fail)?;
        let m = file.metadata().map_err(fail)?;
        let created = Created {
            path: image.to_path_buf(),
            id: (m.dev(), m.ino()),
            keep: false,
        };
        file.set_len(size).map_err(fail)?;
        return Ok(Some(created));
    }
    let file = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(image)
        .map_err(fail)?;
    file.set_len(0)
        .and_then(|()| file.set_len(size))
        .map_err(fail)?;
    Ok(None)
}

/// An image file this mkfs created: removed when dropped unless kept (a failed mkfs leaves
/// nothing behind). Only the same file is removed, never one that replaced it at that name.
struct Created {
    path: PathBuf,
    id: (u64, u64),
    keep: bool,
}

impl Created {
    fn keep(&mut self) {
        self.keep = true;
    }
}

impl Drop for Created {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        if let Ok(m) = std::fs::symlink_metadata(&self.path) {
            if (m.dev(), m.ino()) == self.id {
                let _ = std::fs::remove_file(&self.path);
                progress(&format!("removed the unfinished {}", self.path.display()));
            }
        }
    }
}

fn too_small(size: u64, min: u64, format: &Format) -> Failure {
    Failure::new(format!(
        "image size {} is too small: the minimum is {} ({} log + room for 16 nodes of {})",
        human(size),
        human(min),
        human(LOG_MIN),
        human(format.node_size as u64)
    ))
}

fn open_error(image: &Path, e: io::Error) -> Failure {
    match e.kind() {
        io::ErrorKind::ResourceBusy => {
            Failure::new(format!("{} is in use (mounted?): {e}", image.display()))
        }
        _ => Failure::new(format!("cannot open {}: {e}", image.display())),
    }
}
