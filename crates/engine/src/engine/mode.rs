//! Switching an open engine between read-only and writable (a file system remounted `ro` or `rw`).
//!
//! Read-only means that nothing at all is written to the device: no log chunk, no node, no
//! checkpoint, no superblock. Going read-only waits for the modifications in progress, writes one
//! last checkpoint marked clean (so the image is exactly as after a clean unmount) and stops the
//! background threads. Going writable does what a read-write open does before it writes: it
//! needs a device opened for writing, refuses an image with known damage (recorded in the
//! superblock or found by a read while read-only: `amaranth fsck --repair` first), heals the
//! superblock copies that are damaged, overwritten or lagging, then starts a new log epoch with a checkpoint and restarts the threads.

use std::sync::atomic::Ordering;

use super::checkpoint::Checkpointer;
use super::Engine;
use crate::error::{Error, Result};
use crate::superblock::Superblock;

impl Engine {
    /// Whether the engine refuses writes and writes nothing to the device.
    pub fn is_read_only(&self) -> bool {
        self.snap.is_some() || self.inner.tree.is_read_only()
    }

    /// Makes the engine read-only or writable while it is open (see the module documentation).
    /// Writable again fails with `ReadOnly` if the device cannot be written or an earlier failure
    /// made the engine refuse writes, and with `Damaged` if the image has known damage; the
    /// engine then stays read-only.
    pub fn set_read_only(&self, read_only: bool) -> Result<()> {
        if read_only && self.snap.is_some() {
            return Ok(());
        }
        self.refuse_if_snapshot()?;
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        if read_only == self.is_read_only() {
            return Ok(());
        }
        if read_only {
            self.make_read_only()
        } else {
            self.make_writable()
        }
    }

    fn make_read_only(&self) -> Result<()> {
        self.stop_threads();
        // An open atomic group is committed as it stands (its later changes fail): the last
        // checkpoint below must not wait for it, and read-only it could never commit.
        self.inner.cut_open_group()?;
        // Every modification holds `mode` shared from its check to its end: once we hold it, none
        // is in progress and every later one sees the flag.
        let _mode = self.inner.mode.write();
        self.inner.tree.set_read_only(true);
        if let Some(e) = self.inner.failure() {
            return Err(e);
        }
        self.inner.log.flush(true)?;
        self.inner.checkpoint_now(true)
    }

    fn make_writable(&self) -> Result<()> {
        let inner = &self.inner;
        if !inner.dev.writable() {
            return Err(Error::ReadOnly(format!(
                "{} was opened read-only",
                inner.dev.describe()
            )));
        }
        if let Some(e) = inner.failure() {
            return Err(Error::ReadOnly(e.to_string()));
        }
        {
            let _mode = inner.mode.write();
            self.refuse_known_damage()?;
            self.prepare_writes()?;
            // As a read-write open: a new epoch, so that chunks of the recovered one are never
            // replayed once the checkpoint below records the new one.
            let epoch = inner.log.epoch().wrapping_add(1);
            inner.log.start_epoch(epoch);
            inner.tree.set_read_only(false);
            if let Err(e) = inner.checkpoint_now(false) {
                inner.tree.set_read_only(true);
                return Err(e);
            }
        }
        self.start_threads();
        Ok(())
    }

    /// A damaged image is never written but by a repair (as a read-write open refuses it).
    fn refuse_known_damage(&self) -> Result<()> {
        let inner = &self.inner;
        if inner.ckpt.superblock().damaged {
            return Err(Error::Damaged(
                "recorded in the superblock when a read found a damaged node".into(),
            ));
        }
        if inner.damage.load(Ordering::Acquire) {
            let detail = inner.damage_detail.lock().clone();
            return Err(Error::Damaged(detail.unwrap_or_else(|| {
                "a read found a damaged node while read-only".into()
            })));
        }
        Ok(())
    }

    /// What a read-write open does before its first write: heal the superblock copies (so that
    /// every backup describes this checkpoint before the allocator reuses an older one's blocks).
    /// The copies must still hold the checkpoint the engine runs
    /// on: a read-only engine wrote nothing, so anything else was written by someone else.
    fn prepare_writes(&self) -> Result<()> {
        let inner = &self.inner;
        let located = Superblock::locate(&*inner.dev, inner.options.fallback_superblock)?;
        let sb = inner.ckpt.superblock();
        if located.sb.generation != sb.generation || located.sb.uuid != sb.uuid {
            return Err(Error::Corrupt(format!(
                "the superblock changed while the image was open read-only (checkpoint {} \
                 expected, {} found): something else wrote to {}",
                sb.generation,
                located.sb.generation,
                inner.dev.describe()
            )));
        }
        for line in located.describe() {
            log::warn!("amaranth engine: {line}");
        }
        Checkpointer::heal_copies(&*inner.dev, &located)?;
        Ok(())
    }
}
