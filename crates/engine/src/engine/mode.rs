//! Switching an open engine between read-only and writable (a file system remounted `ro` or `rw`).
//!
//! Read-only means that nothing at all is written to the device: no log chunk, no node, no
//! checkpoint, no superblock. Going read-only waits for the modifications in progress, writes one
//! last checkpoint marked clean (so the image is exactly as after a clean unmount) and stops the
//! background threads. Going writable needs a device opened for writing; it starts a new log epoch
//! with a checkpoint (as a read-write open does) and restarts the threads.

use std::sync::atomic::Ordering;

use super::Engine;
use crate::error::{Error, Result};

impl Engine {
    /// Whether the engine refuses writes and writes nothing to the device.
    pub fn is_read_only(&self) -> bool {
        self.inner.tree.is_read_only()
    }

    /// Makes the engine read-only or writable while it is open (see the module documentation).
    /// Writable again fails with `ReadOnly` if the device cannot be written or an earlier failure
    /// made the engine refuse writes.
    pub fn set_read_only(&self, read_only: bool) -> Result<()> {
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
        // Every modification holds `mode` shared from its check to its end: once we hold it, none
        // is in progress and every later one sees the flag.
        let _mode = self.inner.mode.write();
        self.inner.tree.set_read_only(true);
        if let Some(e) = self.inner.failed.lock().clone() {
            return Err(e);
        }
        self.inner.log.flush(true)?;
        self.inner.checkpoint_now(true)
    }

    fn make_writable(&self) -> Result<()> {
        if !self.inner.dev.writable() {
            return Err(Error::ReadOnly(format!(
                "{} was opened read-only",
                self.inner.dev.describe()
            )));
        }
        if let Some(e) = self.inner.failed.lock().clone() {
            return Err(Error::ReadOnly(e.to_string()));
        }
        {
            let _mode = self.inner.mode.write();
            // As a read-write open: a new epoch, so that chunks of the recovered one are never
            // replayed once the checkpoint below records the new one.
            let epoch = self.inner.log.epoch().wrapping_add(1);
            self.inner.log.start_epoch(epoch);
            self.inner.tree.set_read_only(false);
            if let Err(e) = self.inner.checkpoint_now(false) {
                self.inner.tree.set_read_only(true);
                return Err(e);
            }
        }
        self.start_threads();
        Ok(())
    }
}
