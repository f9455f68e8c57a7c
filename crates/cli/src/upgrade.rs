//! `amaranth upgrade IMAGE`: rewrites an image of an older format (1 or 2: keys stored whole) with
//! its keys lifted, every node once (docs/SURGERY.md §2.4), and gives a format-3 image (or the one
//! just rewritten) its data table: this build's format 4 (docs/WRITEONCE.md). A format-1 or -2
//! image must have been closed cleanly; a crash during the upgrade leaves the old image (or a
//! format-3 one), and the command can run again. An image already at format 4 is left as it is.

use std::io;
use std::path::Path;
use std::sync::Arc;

use amaranth_device::{BlockDevice, FileDevice};
use amaranth_engine::{Error, Superblock};

use crate::image::superblock_error;
use crate::util::{human, CliResult, Failure};

/// Runs the upgrade; exit code 0 when the image is current afterwards.
pub fn run(image: &Path) -> CliResult<i32> {
    let img = image.display();
    let dev = FileDevice::open(image).map_err(|e| match e.kind() {
        io::ErrorKind::ResourceBusy => Failure::new(format!(
            "upgrade: {img} is in use (mounted?): unmount it first (`amaranth umount DIR`)"
        )),
        _ => Failure::new(format!("upgrade: cannot open {img}: {e}")),
    })?;
    let dev: Arc<dyn BlockDevice> = Arc::new(dev);
    let sb = Superblock::locate(&*dev, false)
        .map_err(|e| {
            Failure::new(superblock_error(
                image,
                &*dev,
                &e,
                "upgrade: cannot upgrade",
            ))
        })?
        .sb;
    if sb.version < amaranth_engine::FORMAT_VERSION {
        say!(
            "upgrading {img} from format {} to format {}: {}",
            sb.version,
            amaranth_engine::FORMAT_VERSION,
            if sb.version < 3 {
                "every node is rewritten once"
            } else {
                "a data table is added, no node is rewritten"
            }
        );
    }
    let mut shown = 0;
    let mut progress = |done: u64, total: u64| {
        let tenth = done * 10 / total.max(1);
        if tenth > shown {
            shown = tenth;
            note!("upgrade: {done} of {total} nodes");
        }
    };
    let r = amaranth_engine::upgrade(dev.clone(), &mut progress).map_err(|e| match e {
        Error::InvalidArgument(why) => Failure::new(format!("upgrade: {img}: {why}")),
        Error::Io { .. } => Failure::new(format!("upgrade: {img}: {e} (the image is unchanged)")),
        e => Failure::new(superblock_error(
            image,
            &*dev,
            &e,
            "upgrade: cannot upgrade",
        )),
    })?;
    if r.already_current() {
        say!("{img} is already at format {}: nothing to do", r.to_version);
        return Ok(0);
    }
    say!(
        "upgraded {img} to format {}: {} nodes rewritten ({} of images, {} before; leaf \
         entries {} bytes, {} before){}",
        r.to_version,
        r.nodes,
        human(r.bytes),
        human(r.bytes_before),
        r.leaf_entry_bytes.1,
        r.leaf_entry_bytes.0,
        if r.unreachable > 0 {
            format!("; {} unreachable nodes left out", r.unreachable)
        } else {
            String::new()
        }
    );
    Ok(0)
}
