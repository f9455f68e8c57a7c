//! Failures and damage: when the engine refuses writes, and what it records of damage a read
//! found (in memory, and in the superblock through the checkpointer).

use std::sync::atomic::Ordering;

use super::Inner;
use crate::error::{Error, Result};

impl Inner {
    pub(super) fn check_writable(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        if self.tree.is_read_only() {
            return Err(Error::ReadOnly("read-only".into()));
        }
        if let Some(e) = self.failure() {
            return Err(Error::ReadOnly(e.to_string()));
        }
        Ok(())
    }

    /// Records that a read found damage: in memory, and (read-write) in the superblock copies of
    /// the current checkpoint at once, so that the next read-write open is refused until a repair.
    pub(super) fn note_damage(&self, e: &Error) {
        if !e.is_damage() || self.damage.swap(true, Ordering::AcqRel) {
            return;
        }
        log::error!(
            "amaranth engine: damage found: {e}; the image needs `amaranth fsck --repair` \
             (until then it mounts read-only only)"
        );
        *self.damage_detail.lock() = Some(e.to_string());
        if self.tree.is_read_only() {
            return;
        }
        self.ckpt.record_damage(self);
    }

    /// Passes `r` through, noting damage it reports.
    pub(super) fn seen<T>(&self, r: Result<T>) -> Result<T> {
        if let Err(e) = &r {
            self.note_damage(e);
        }
        r
    }

    /// The failure that made the engine refuse writes, if any. Node writes happen on read paths
    /// too (a read making room in the cache writes dirty nodes back), where the error goes to the
    /// reader only: the store records the first failed write, and it fails the engine here, so
    /// that every check sees it before the next write.
    pub(super) fn failure(&self) -> Option<Error> {
        let write_failure = self.tree.store.write_failure.lock().clone();
        if let Some(e) = write_failure {
            self.fail(&e);
        }
        self.failed.lock().clone()
    }

    pub(super) fn fail(&self, e: &Error) {
        self.note_damage(e);
        if matches!(
            e,
            Error::Io { .. } | Error::Corrupt(_) | Error::Checksum { .. }
        ) {
            let mut f = self.failed.lock();
            if f.is_none() {
                log::error!("amaranth engine: refusing further writes after: {e}");
                *f = Some(e.clone());
            }
        }
    }

    pub(super) fn note(&self, r: Result<()>) -> Result<()> {
        if let Err(e) = &r {
            self.fail(e);
        }
        r
    }
}
