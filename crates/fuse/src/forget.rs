//! Keeps the inode table within its memory limit by asking the kernel to forget inodes.
//!
//! The kernel alone decides which inodes it remembers; an entry invalidation
//! (`FUSE_NOTIFY_INVAL_ENTRY`) makes it drop a name's dentry, and an inode no longer referenced is
//! then evicted and FORGET sent, which removes it from the table. The file system picks the names
//! ([`Fs::forget_candidates`]: least recently looked up, never open files). Notifications are sent
//! from this thread, never from a request handler: the kernel takes the parent directory's lock to
//! invalidate, and a request from a process holding it would wait for a handler that waits for it.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use amaranth_fs::Fs;

use crate::abi::{self, NotifyInvalEntryOut, OutHeader, NOTIFY_INVAL_ENTRY};

/// How often the table's size is checked.
const PERIOD: Duration = Duration::from_millis(100);

/// The thread; stopping it (or dropping this) joins it, so it holds no reference to the file
/// system afterwards.
pub(crate) struct Forgetter {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Forgetter {
    pub(crate) fn start(fs: Arc<Fs>, dev: Arc<OwnedFd>) -> Forgetter {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("amaranth-forget".into())
            .spawn(move || run(&fs, &dev, &s))
            .map_err(|e| log::warn!("amaranth: no thread to keep the inode table bounded: {e}"))
            .ok();
        Forgetter { stop, thread }
    }
}

/// Asks the kernel to drop the dentry `parent/name` (`FUSE_NOTIFY_INVAL_ENTRY` on /dev/fuse).
pub(crate) fn inval_entry(dev: &OwnedFd, parent: u64, name: &[u8]) -> io::Result<()> {
    let body = NotifyInvalEntryOut {
        parent,
        namelen: name.len() as u32,
        flags: 0,
    };
    let len = std::mem::size_of::<OutHeader>() + std::mem::size_of_val(&body) + name.len() + 1;
    let h = OutHeader {
        len: len as u32,
        error: NOTIFY_INVAL_ENTRY,
        unique: 0,
    };
    let mut msg = Vec::with_capacity(len);
    msg.extend_from_slice(abi::bytes(&h));
    msg.extend_from_slice(abi::bytes(&body));
    msg.extend_from_slice(name);
    msg.push(0);
    // SAFETY: writes a valid buffer to our own descriptor.
    let n = unsafe { libc::write(dev.as_raw_fd(), msg.as_ptr().cast(), msg.len()) };
    if n < 0 {
        let e = io::Error::last_os_error();
        // ENOENT: the kernel had already dropped it.
        if e.raw_os_error() != Some(libc::ENOENT) {
            return Err(e);
        }
    }
    Ok(())
}

fn run(fs: &Fs, dev: &OwnedFd, stop: &(Mutex<bool>, Condvar)) {
    let mut asked: u64 = 0;
    let mut warned = false;
    loop {
        {
            let stopped = stop.0.lock().unwrap_or_else(|e| e.into_inner());
            let (stopped, _) = stop
                .1
                .wait_timeout_while(stopped, PERIOD, |s| !*s)
                .unwrap_or_else(|e| e.into_inner());
            if *stopped {
                return;
            }
        }
        let names = fs.forget_candidates();
        if names.is_empty() {
            continue;
        }
        if !warned {
            log::info!(
                "amaranth: the inode table holds {} MiB, above its limit of {} MiB; asking the \
                 kernel to forget the least recently used inodes",
                fs.table_bytes() >> 20,
                fs.table_limit() >> 20
            );
            warned = true;
        }
        for (parent, name) in names {
            match inval_entry(dev, parent, &name) {
                Ok(()) => asked += 1,
                // The connection is gone: the session is ending.
                Err(e) if e.raw_os_error() == Some(libc::ENODEV) => return,
                Err(e) => log::debug!("amaranth: invalidating an entry of {parent}: {e}"),
            }
        }
        log::debug!("amaranth: {asked} entries invalidated so far");
    }
}

impl Drop for Forgetter {
    fn drop(&mut self) {
        *self.stop.0.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.stop.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
