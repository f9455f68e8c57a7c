//! `amaranth mkfs`: a new, empty file system on an image file or a block device.

use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::sync::Arc;

use amaranth_device::{BlockDevice, FileDevice};
use amaranth_engine::{Compression, Engine, Format, Options, Superblock};
use amaranth_fs::Fs;

use crate::util::{human, CliResult, Failure};

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
}

/// The log size for an image of `size` bytes.
pub fn log_size_for(size: u64) -> u64 {
    (size / 16).clamp(LOG_MIN, LOG_MAX)
}

/// Smallest image for a node size: the superblocks, the log, and room for sixteen nodes.
pub fn min_size(node_size: u64) -> u64 {
    2 * 4096 + LOG_MIN + 16 * node_size
}

fn progress(msg: &str) {
    eprintln!("mkfs: {msg}");
}

/// Runs `mkfs`.
pub fn run(a: MkfsArgs<'_>) -> CliResult {
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

    let meta = std::fs::metadata(a.image);
    let is_block = meta
        .as_ref()
        .map(|m| m.file_type().is_block_device())
        .unwrap_or(false);
    if is_block && a.size.is_some() {
        return Err(Failure::new(format!(
            "{} is a block device: its size is fixed, drop --size",
            a.image.display()
        )));
    }
    if let Ok(m) = &meta {
        if !is_block && !m.is_file() {
            return Err(Failure::new(format!(
                "{} is neither an image file nor a block device",
                a.image.display()
            )));
        }
    }
    // Refuse to overwrite an Amaranth file system by accident.
    if meta.is_ok() && !a.force {
        match FileDevice::open_read_only(a.image) {
            Ok(dev) => {
                if let Ok(sb) = Superblock::read_newest(&dev, true) {
                    return Err(Failure::new(format!(
                        "{} already holds an Amaranth file system (generation {}, {}); \
                         use --force to overwrite it",
                        a.image.display(),
                        sb.generation,
                        human(dev.len())
                    )));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::ResourceBusy => {
                return Err(Failure::new(format!(
                    "{} is in use (mounted?): {e}",
                    a.image.display()
                )))
            }
            Err(_) => {}
        }
    }
    let size = match (a.size, &meta) {
        (Some(s), _) => s,
        (None, Ok(m)) if is_block || m.len() > 0 => 0, // the device's or file's own size
        (None, _) => {
            return Err(Failure::new(format!(
                "{} does not exist: give --size to create an image file (e.g. --size 8G)",
                a.image.display()
            )))
        }
    };
    let min = min_size(format.node_size as u64);
    if size != 0 && size < min {
        return Err(too_small(size, min, &format));
    }
    let dev = if size != 0 {
        progress(&format!(
            "creating image file {} of {}",
            a.image.display(),
            human(size)
        ));
        FileDevice::create_image(a.image, size)
    } else {
        FileDevice::open(a.image)
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
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    progress("creating the root directory");
    Fs::mkfs(&engine, uid, gid)
        .map_err(|e| Failure::new(format!("cannot create the file system: {e}")))?;
    let stats = engine.stats();
    engine
        .close()
        .map_err(|e| Failure::new(format!("cannot close the new image: {e}")))?;
    println!(
        "created an Amaranth file system on {}: {} ({} for data), {} log, {} nodes, compression {}, root owned by {uid}:{gid}",
        a.image.display(),
        human(len),
        human(stats.data_bytes),
        human(format.log_size.unwrap_or(0)),
        human(format.node_size as u64),
        a.compression
    );
    Ok(())
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
