//! [`ImageInfo`]: a read-only view of what an image's superblock copies say, for tools that look
//! at an image without opening the engine (`amaranth stat`, `fsck`, `mount`, probes before mkfs).
//! Nothing here writes: the engine writes superblocks only through its checkpointer.

use amaranth_device::BlockDevice;

use crate::config::Format;
use crate::copies::{self, Located};
use crate::error::Result;
use crate::superblock::format_uuid;

/// What an image's superblock copies say: the copy in use and what is wrong with the others.
#[derive(Clone, Debug)]
pub struct ImageInfo {
    located: Located,
}

impl ImageInfo {
    /// Reads every superblock copy of `dev` and picks the one to use, or returns the most telling
    /// error; `allow_fallback` accepts a copy that no backup vouches for when the newer one is
    /// damaged (the repair path).
    pub fn read(dev: &dyn BlockDevice, allow_fallback: bool) -> Result<ImageInfo> {
        copies::locate(dev, allow_fallback).map(|located| ImageInfo { located })
    }

    /// Format version of the image.
    pub fn version(&self) -> u32 {
        self.located.sb.version
    }

    /// Generation of the last checkpoint.
    pub fn generation(&self) -> u64 {
        self.located.sb.generation
    }

    /// Whether the image was closed cleanly (nothing to replay).
    pub fn clean(&self) -> bool {
        self.located.sb.clean
    }

    /// Whether a read recorded damage (the image mounts read-only until a repair).
    pub fn damaged(&self) -> bool {
        self.located.sb.damaged
    }

    /// Whether log records were skipped at an open (a check is asked for).
    pub fn needs_check(&self) -> bool {
        self.located.sb.needs_check
    }

    /// The image's uuid in the usual text form.
    pub fn uuid_string(&self) -> String {
        format_uuid(&self.located.sb.uuid)
    }

    /// The image's label.
    pub fn label(&self) -> &str {
        &self.located.sb.label
    }

    /// When the image was created (Unix seconds).
    pub fn created_unix(&self) -> u64 {
        self.located.sb.created_unix
    }

    /// When the last checkpoint was written (Unix seconds).
    pub fn checkpoint_unix(&self) -> u64 {
        self.located.sb.checkpoint_unix
    }

    /// The image's format parameters.
    pub fn format(&self) -> Result<Format> {
        self.located.sb.format()
    }

    /// Copies found damaged or overwritten: `(block, what is wrong)`.
    pub fn problems(&self) -> &[(u64, String)] {
        &self.located.problems
    }

    /// Whether the copy in use is an older one no backup vouches for.
    pub fn fell_back(&self) -> bool {
        self.located.fell_back
    }

    /// One line per problem with the copies (empty when there is none).
    pub fn describe(&self) -> Vec<String> {
        self.located.describe()
    }
}
