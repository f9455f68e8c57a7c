//! What to tell the user about an image that does not open: damaged (name fsck) versus blank
//! (only then mkfs: advice that erases whatever is there must never reach a damaged image).

use std::path::Path;

use amaranth_device::{AlignedBuf, BlockDevice, BLOCK_SIZE};
use amaranth_engine::{backup_blocks, Error};

/// Whether every place a superblock could be (the first 64 KiB and the backup locations) reads
/// as zeros: an empty file or device, not a damaged image.
pub fn blank(dev: &dyn BlockDevice) -> bool {
    let blocks = dev.len() / BLOCK_SIZE as u64;
    let mut places: Vec<(u64, usize)> = vec![(0, 16.min(blocks as usize))];
    places.extend(backup_blocks(blocks).into_iter().map(|b| (b, 1)));
    places.iter().all(|&(b, n)| {
        if n == 0 || b + n as u64 > blocks {
            return true;
        }
        let mut buf = AlignedBuf::zeroed(n * BLOCK_SIZE);
        dev.read_at(b * BLOCK_SIZE as u64, &mut buf).is_ok() && buf.iter().all(|&x| x == 0)
    })
}

/// The message for an image whose superblock cannot be used, naming `fsck` (and `mkfs` only
/// for a blank device). `action` is what failed ("cannot mount").
pub fn superblock_error(image: &Path, dev: &dyn BlockDevice, e: &Error, action: &str) -> String {
    let img = image.display();
    match e {
        Error::BadMagic(_) if blank(dev) => format!(
            "{action} {img}: it holds no file system (only zeros where superblocks go); \
             create one with `amaranth mkfs {img}`"
        ),
        // The engine's own words without its "not an Amaranth image" prefix: said once.
        Error::BadMagic(what) => format!(
            "{action} {img}: not an Amaranth image, or a damaged one ({what}); \
             check it with `amaranth fsck {img}`"
        ),
        Error::TooSmall(_) => format!(
            "{action} {img}: the image is damaged ({e}); check it with `amaranth fsck {img}`"
        ),
        Error::Damaged(why) => format!(
            "{action} {img} read-write: the image has known damage ({why}); mount it read-only \
             with `-o ro`, or repair it with `amaranth fsck --repair {img}`"
        ),
        Error::UnsupportedVersion { .. } => format!("{action} {img}: {}", engine_error(image, e)),
        _ => format!(
            "{action} {img}: the image is damaged ({e}); check it with `amaranth fsck {img}`"
        ),
    }
}

/// An engine error's text, with the upgrade command it may name (`amaranth upgrade IMAGE`, for an
/// image of an older format) spelled for this image.
pub fn engine_error(image: &Path, e: &Error) -> String {
    e.to_string().replace(
        "`amaranth upgrade IMAGE`",
        &format!("`amaranth upgrade {}`", image.display()),
    )
}
