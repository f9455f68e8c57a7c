//! Access times (`noatime`, relatime rules, `strictatime`, `lazytime`), `sync` mounts, and
//! switching between read-only and writable (a remount).
//!
//! With `lazytime` an access-time update changes only the cached inode and remembers it; the
//! change reaches the engine with the next batch that writes the inode anyway, or when the inode
//! is synced (`fsync`, `syncfs`), forgotten by the kernel, or the file system is unmounted or made
//! read-only. A read-only file system updates no access times at all.

use std::sync::Arc;

use amaranth_engine::{Batch, Lsn};
use parking_lot::Mutex;

use super::{Fs, FsOptions};
use crate::error::Result;
use crate::inode::{Inode, Meta, Time};
use crate::keys;

/// The access-time and sync settings, which a remount can change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Modes {
    /// Update access times on read (false: `noatime`).
    pub relatime: bool,
    /// On every read, not by relatime rules.
    pub strictatime: bool,
    /// Keep access-time updates in memory for a while.
    pub lazytime: bool,
    /// Every change durable before its call returns.
    pub sync: bool,
}

impl Modes {
    pub(super) fn from_options(o: &FsOptions) -> Modes {
        Modes {
            relatime: o.relatime,
            strictatime: o.strictatime,
            lazytime: o.lazytime,
            sync: o.sync,
        }
    }
}

impl Fs {
    /// The access-time and sync settings in force.
    pub fn modes(&self) -> Modes {
        *self.modes.lock()
    }

    /// Changes the access-time and sync settings (a remount). Access times kept in memory are
    /// written when `lazytime` is turned off.
    pub fn set_modes(&self, modes: Modes) {
        let was_lazy = std::mem::replace(&mut *self.modes.lock(), modes).lazytime;
        if was_lazy && !modes.lazytime && !self.engine.is_read_only() {
            self.write_lazy_atimes();
        }
    }

    /// After a read of `ino`: updates its access time as the options say.
    pub(super) fn touch_atime(&self, ino: u64, shared: &Arc<Mutex<Inode>>) {
        let modes = self.modes();
        if !modes.relatime || self.engine.is_read_only() {
            return;
        }
        let mut i = shared.lock();
        let now = Time::now();
        let recent = i.atime > i.mtime && i.atime > i.ctime && now.sec - i.atime.sec < 24 * 3600;
        if recent && !modes.strictatime {
            return;
        }
        let mut next = i.clone();
        next.atime = now;
        if modes.lazytime {
            *i = next;
            self.lazy_atimes.lock().insert(ino);
            return;
        }
        // At its home or path (a parked file's data is elsewhere: `fs/orphans.rs`).
        let Ok(meta) = self.meta_of(ino) else {
            return;
        };
        let mut b = Batch::new();
        b.put(meta, next.encode());
        if self.commit(&mut b).is_ok() {
            *i = next;
        }
    }

    /// Writes the access time kept in memory for `ino` (`lazytime`), if any.
    pub(super) fn write_lazy_atime(&self, ino: u64) {
        if !self.lazy_atimes.lock().remove(&ino) {
            return;
        }
        let _ns = self.ns.read();
        let Some(shared) = self.table.lock().inode(ino) else {
            return;
        };
        let i = shared.lock();
        // Under the inode's lock: a rename under the shared namespace lock moves it holding that.
        let Some(fk) = self.table.lock().file_key(ino) else {
            return;
        };
        let key = keys::meta_key(&fk);
        // Only if the key still holds this inode: an unlinked inode is never written back.
        let current = self.engine.get(&key).ok().flatten();
        if !matches!(current.as_deref().map(Meta::decode), Some(Ok(Meta::Inode(c))) if c.ino == ino)
        {
            return;
        }
        let mut b = Batch::new();
        b.put(key, i.encode());
        if let Err(e) = self.commit(&mut b) {
            log::warn!("amaranth: cannot write the access time of inode {ino}: {e}");
        }
    }

    /// Writes every access time kept in memory (`lazytime`).
    pub fn write_lazy_atimes(&self) {
        let inos: Vec<u64> = self.lazy_atimes.lock().iter().copied().collect();
        for ino in inos {
            self.write_lazy_atime(ino);
        }
    }

    /// On a `sync` mount, waits until the batch `lsn` is durable.
    pub(super) fn sync_if_wanted(&self, lsn: Lsn) -> Result<()> {
        if self.modes().sync {
            self.pg.sync_to(lsn)?;
        }
        Ok(())
    }

    /// Whether the file system refuses changes (mounted or remounted read-only).
    pub fn is_read_only(&self) -> bool {
        self.engine.is_read_only()
    }

    /// Makes the file system read-only (access times kept in memory are written first, then a
    /// clean checkpoint; nothing more is written to the image) or writable again (then, as at a
    /// writable mount, an older schema is upgraded and files unlinked while open before an earlier
    /// crash are removed; name changes wait meanwhile). Returns the engine's error, which says why
    /// (a device opened read-only, known damage that needs `amaranth fsck --repair`).
    pub fn set_read_only(&self, read_only: bool) -> amaranth_engine::Result<()> {
        if read_only {
            self.reap_forgotten();
            self.write_lazy_atimes();
            return self.engine.set_read_only(true);
        }
        // Already writable: nothing to prepare (and the files unlinked while open now are open).
        let _ns = self.ns.write();
        if !self.engine.is_read_only() {
            return Ok(());
        }
        self.engine.set_read_only(false)?;
        self.prepare_writes().map_err(|e| {
            amaranth_engine::Error::io(
                "upgrading the schema or removing files unlinked while open",
                std::io::Error::from_raw_os_error(e.0),
            )
        })
    }
}

impl Drop for Fs {
    /// Files waiting to be deleted (`fs/doomed.rs`) are deleted and access times kept in memory
    /// (`lazytime`) written before the engine can be closed.
    fn drop(&mut self) {
        if !self.engine.is_read_only() {
            self.reap_forgotten();
            self.write_lazy_atimes();
        }
    }
}
