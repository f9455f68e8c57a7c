//! Printing that never panics. `println!` panics when stdout is a closed pipe (`amaranth stat DIR |
//! head`); here a closed stdout or stderr only ends the output: the work in progress (a repair, a
//! mkfs) still finishes and the exit code stays its own. A write error other than a closed pipe
//! (`> /dev/full`) is reported once at exit.

use std::fmt;
use std::io::{self, Write};
use std::sync::Mutex;

/// The first failed write to stdout that was not a closed pipe.
static STDOUT_ERROR: Mutex<Option<io::Error>> = Mutex::new(None);

/// Writes to stdout; errors are remembered, never raised.
pub(crate) fn stdout(args: fmt::Arguments<'_>) {
    if let Err(e) = io::stdout().lock().write_fmt(args) {
        remember(e);
    }
}

/// Writes to stderr; errors are ignored (there is nowhere left to report them).
pub(crate) fn stderr(args: fmt::Arguments<'_>) {
    let _ = io::stderr().lock().write_fmt(args);
}

fn remember(e: io::Error) {
    if e.kind() == io::ErrorKind::BrokenPipe {
        return;
    }
    let mut first = STDOUT_ERROR.lock().unwrap_or_else(|p| p.into_inner());
    first.get_or_insert(e);
}

/// Flushes stdout; the first write error other than a closed pipe, if any.
pub(crate) fn finish() -> Option<io::Error> {
    if let Err(e) = io::stdout().lock().flush() {
        remember(e);
    }
    STDOUT_ERROR
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
}

/// `println!` that never panics (see the module documentation).
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::out::stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `eprintln!` that never panics.
macro_rules! note {
    ($($arg:tt)*) => {
        $crate::out::stderr(format_args!("{}\n", format_args!($($arg)*)))
    };
}
