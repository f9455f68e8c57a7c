//! Fail-stop: a panic in any thread of the process ends the process at once.
//!
//! A panic is a broken invariant. Unwinding out of one thread (the default) lets the others go
//! on with memory the panicking thread left half changed: a node whose partitions were taken out
//! for a rebuild, a parent buffer whose messages were taken but not delivered. The daemon then
//! kept serving reads from that tree, and its next checkpoint (the one at unmount too) wrote it
//! to the image as if it were whole (seen in an aging run: the cleaner panicked in the middle of
//! a delivery and the range deletes it carried were lost). Aborting instead leaves the image as
//! the last checkpoint plus the log, which a mount replays: a prefix of acknowledged operations,
//! as after a power cut. The kernel answers the mount's callers with ECONNABORTED until it
//! is unmounted and mounted again.

use std::time::Duration;

/// Makes every later panic print its message and backtrace (the standard hook, to stderr: the
/// daemon's log), log that the process stops, and abort.
pub fn install() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        log::error!(
            "amaranth: internal error ({info}); stopping at once so that nothing more reaches \
             the image. Unmount, then mount again: the log is replayed and every operation \
             acknowledged before the failure is kept"
        );
        log::logger().flush();
        std::process::abort();
    }));
}

/// The environment variable of the test hook [`panic_later_for_tests`].
pub const TEST_PANIC_ENV: &str = "AMARANTH_TEST_PANIC_AFTER_MS";

/// Test hook: with [`TEST_PANIC_ENV`] set to a number of milliseconds, a thread of the daemon
/// panics that long after the mount is live (what the fail-stop test in `tests/mount.rs` checks).
pub fn panic_later_for_tests() {
    let Some(ms) = std::env::var(TEST_PANIC_ENV)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    else {
        return;
    };
    let spawned = std::thread::Builder::new()
        .name("amaranth-test-panic".into())
        .spawn(move || {
            std::thread::sleep(Duration::from_millis(ms));
            panic!("{TEST_PANIC_ENV}: a panic asked for by a test");
        });
    if let Err(e) = spawned {
        log::warn!("amaranth: cannot start the test panic thread: {e}");
    }
}
