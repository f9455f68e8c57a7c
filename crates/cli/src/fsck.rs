//! `amaranth fsck`: the offline checker, with e2fsck-like exit codes.

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use amaranth_device::FileDevice;
use amaranth_engine::{Engine, Error, Options, Superblock};
use amaranth_fs::check::{self, Severity};

use crate::util::{human, total_memory, CliResult, Failure};

/// Exit code: no problems.
pub const CLEAN: i32 = 0;
/// Exit code: problems found and all corrected.
pub const CORRECTED: i32 = 1;
/// Exit code: problems left uncorrected.
pub const UNCORRECTED: i32 = 4;
/// Exit code: the check could not run.
pub const OPERATIONAL: i32 = 8;

/// Runs `fsck`; returns the exit code.
pub fn run(image: &Path, repair: bool, fallback_superblock: bool) -> CliResult<i32> {
    let t0 = Instant::now();
    let open = if repair {
        FileDevice::open(image)
    } else {
        FileDevice::open_read_only(image)
    };
    let dev = open.map_err(|e| match e.kind() {
        io::ErrorKind::ResourceBusy => Failure::with_code(
            OPERATIONAL,
            format!(
                "{} is in use (mounted?): unmount it first (`amaranth umount DIR`)",
                image.display()
            ),
        ),
        _ => Failure::with_code(OPERATIONAL, format!("cannot open {}: {e}", image.display())),
    })?;
    let sb =
        Superblock::read_newest(&dev, fallback_superblock).map_err(|e| open_failure(image, &e))?;
    let format = sb.format().map_err(|e| open_failure(image, &e))?;
    note!(
        "fsck: {}: generation {}, {}",
        image.display(),
        sb.generation,
        if sb.clean {
            "closed cleanly"
        } else {
            "not closed cleanly (the log will be replayed)"
        }
    );
    let cache = (total_memory() / 8).clamp(128 << 20, 1 << 30) as usize;
    let opts = Options {
        read_only: !repair,
        fallback_superblock,
        background_threads: false,
        cache_size: cache.max(format.node_size * 16),
        ..Options::default()
    };
    note!("fsck: opening the engine (replaying the log if needed)");
    let engine = Engine::open(Arc::new(dev), opts).map_err(|e| open_failure(image, &e))?;
    let st = engine.stats();
    if st.opened_after_crash {
        note!(
            "fsck: replayed {} log records ({})",
            st.recovered_records,
            st.recovery_stop
        );
    }
    let report = check::check(&engine, repair, |msg| note!("fsck: {msg}"));
    let flag = check_flag(&engine, &report, repair);
    for p in &report.problems {
        let sev = match p.class.severity() {
            Severity::Benign => "benign",
            Severity::Corruption => "CORRUPTION",
        };
        say!(
            "{sev:>10} {:?}: {}{}",
            p.class,
            p.detail,
            if p.repaired { " [repaired]" } else { "" }
        );
    }
    let close = engine.close();
    let benign = report
        .problems
        .iter()
        .filter(|p| p.class.severity() == Severity::Benign)
        .count();
    let corrupt = report.problems.len() - benign;
    let repaired = report.problems.iter().filter(|p| p.repaired).count();
    if let Some(t) = &report.tree {
        say!(
            "tree: height {}, {} internal nodes, {} leaves, {} entries",
            t.height,
            t.internal_nodes,
            t.leaves,
            t.leaf_entries
        );
    }
    say!(
        "{}: {} inodes ({} directories), {} data blocks ({}), {} xattrs; {} problems ({} benign, {} corruption, {} repaired) in {:.1} s",
        image.display(),
        report.inodes,
        report.directories,
        report.data_blocks,
        human(report.data_bytes),
        report.xattrs,
        report.problems.len(),
        benign,
        corrupt,
        repaired,
        t0.elapsed().as_secs_f64()
    );
    if let Err(e) = close {
        if repair {
            return Err(Failure::with_code(
                UNCORRECTED,
                format!("the repaired image could not be closed: {e}"),
            ));
        }
    }
    let code = match flag {
        Flag::None => report.exit_code(),
        Flag::Cleared => report.exit_code().max(CORRECTED),
        Flag::Kept => UNCORRECTED,
    };
    match code {
        CLEAN => say!("clean"),
        CORRECTED => say!("errors corrected"),
        _ => say!(
            "errors left uncorrected{}",
            if repair {
                ""
            } else {
                " (run with --repair to fix the benign ones)"
            }
        ),
    }
    Ok(code)
}

/// What became of the engine's "needs a check" flag (log records were skipped at an open).
enum Flag {
    /// Not set.
    None,
    /// Set, and cleared by this repair run (nothing left uncorrected).
    Cleared,
    /// Set and left set.
    Kept,
}

/// Reports the engine's check flag; a repair run that leaves nothing uncorrected clears it.
fn check_flag(engine: &Engine, report: &check::CheckReport, repair: bool) -> Flag {
    let st = engine.stats();
    if !st.needs_check {
        return Flag::None;
    }
    say!(
        "CORRUPTION NeedsCheck: log records that could not be applied were skipped at an open \
         ({} at this one); the operations they held are lost",
        st.skipped_records
    );
    if repair && report.exit_code() <= CORRECTED && engine.clear_needs_check().is_ok() {
        say!("the check flag is cleared [repaired]");
        return Flag::Cleared;
    }
    Flag::Kept
}

/// A failure to open: damage is "errors left uncorrected", anything else is operational.
fn open_failure(image: &Path, e: &Error) -> Failure {
    match e {
        Error::Checksum { .. } | Error::Corrupt(_) => Failure::with_code(
            UNCORRECTED,
            format!(
                "{}: the image is damaged: {e}\n(if a superblock is damaged, \
                 `amaranth fsck --repair --fallback-superblock` may recover the older copy)",
                image.display()
            ),
        ),
        Error::BadMagic(_) => Failure::with_code(
            OPERATIONAL,
            format!("{}: not an Amaranth image: {e}", image.display()),
        ),
        _ => Failure::with_code(OPERATIONAL, format!("cannot open {}: {e}", image.display())),
    }
}
