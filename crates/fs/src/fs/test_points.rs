//! Named points in racy paths where this crate's unit tests run code of their own, to force one
//! interleaving of two operations (`fs/race_tests.rs`). Outside `cargo test` of this crate the
//! points compile to nothing and the struct is empty.

#[cfg(test)]
use parking_lot::Mutex;

/// A point in a racy path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Point {
    /// An unlink under the shared namespace lock found the kernel knows the file, and is about
    /// to take the inode's lock.
    UnlinkBeforeInodeLock,
    /// The same unlink holds the inode's lock and has checked again that the kernel knows it.
    UnlinkHoldingInodeLock,
    /// A rename under the shared namespace lock over a file the kernel knows is about to take
    /// both files' locks.
    RenameBeforeLocks,
    /// A rename under the shared namespace lock over a file the kernel knows holds both files'
    /// locks and has checked again that the kernel knows the one it replaces.
    RenameHoldingVictimLock,
}

/// The hook a test installs (none outside tests).
#[derive(Default)]
pub(crate) struct TestPoints {
    #[cfg(test)]
    #[allow(clippy::type_complexity)]
    hook: Mutex<Option<Box<dyn FnMut(Point) + Send>>>,
}

impl TestPoints {
    /// Runs the test's hook, if any, at `point`.
    #[inline(always)]
    pub(crate) fn reach(&self, point: Point) {
        #[cfg(test)]
        if let Some(h) = self.hook.lock().as_mut() {
            h(point);
        }
        #[cfg(not(test))]
        let _ = point;
    }

    /// Installs `hook`, run at every point reached from now on.
    #[cfg(test)]
    pub(crate) fn set(&self, hook: impl FnMut(Point) + Send + 'static) {
        *self.hook.lock() = Some(Box::new(hook));
    }
}
