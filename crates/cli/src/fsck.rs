//! `amaranth fsck`: the offline checker, with e2fsck-like exit codes.
//!
//! Without `--repair` it changes nothing: the superblock copies are read and judged, every node of
//! the last checkpoint is read and checked (every damaged node is named, with the key range it held
//! in file-system terms), and, if the tree is intact, the log is replayed in memory and the
//! file-system schema checked. With `--repair` the engine rebuilds a damaged tree from its intact
//! parts, damaged superblock copies are rewritten, and the schema is repaired in rounds until
//! nothing is left; a final check must then be clean.

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use amaranth_device::{BlockDevice, FileDevice};
use amaranth_engine::{Damage, DamagedPart, Engine, Error, ImageInfo, Options, SalvageReport};
use amaranth_fs::check::{self, CheckReport, Severity};
use amaranth_fs::describe;

use crate::image::superblock_error;
use crate::util::{human, total_memory, CliResult, Failure};

/// Exit code: no problems.
pub const CLEAN: i32 = 0;
/// Exit code: problems found and all corrected.
pub const CORRECTED: i32 = 1;
/// Exit code: problems left uncorrected.
pub const UNCORRECTED: i32 = 4;
/// Exit code: the check could not run.
pub const OPERATIONAL: i32 = 8;

/// Files listed per damage report before "and more".
const FILES_SHOWN: usize = 1000;

/// Runs `fsck`; returns the exit code.
pub fn run(image: &Path, repair: bool, fallback_superblock: bool) -> CliResult<i32> {
    let t0 = Instant::now();
    let dev: Arc<dyn BlockDevice> = Arc::new(open_device(image, repair)?);
    let located = ImageInfo::read(&*dev, fallback_superblock).map_err(|e| {
        let code = match e {
            Error::BadMagic(_) | Error::UnsupportedVersion { .. } => OPERATIONAL,
            _ => UNCORRECTED,
        };
        let mut msg = superblock_error(image, &*dev, &e, "fsck: cannot check");
        if matches!(e, Error::Checksum { .. }) && !fallback_superblock {
            msg += " (`amaranth fsck --repair --fallback-superblock` accepts the older copy)";
        }
        Failure::with_code(code, msg)
    })?;
    let sb = &located;
    note!(
        "fsck: {}: format {}, generation {}, {}{}",
        image.display(),
        sb.version(),
        sb.generation(),
        if sb.clean() {
            "closed cleanly"
        } else {
            "not closed cleanly (the log will be replayed)"
        },
        if sb.damaged() {
            "; damage was recorded by an earlier read"
        } else {
            ""
        }
    );
    let opts = engine_options(sb, repair, fallback_superblock)?;
    let sb_problems: Vec<String> = located
        .problems()
        .iter()
        .map(|(b, m)| format!("superblock copy at block {b}: {m}"))
        .collect();
    let code = if repair {
        repair_image(image, dev, opts, &sb_problems)?
    } else {
        check_image(image, dev, opts, &sb_problems, sb.damaged())?
    };
    note!("fsck: done in {:.1} s", t0.elapsed().as_secs_f64());
    Ok(code)
}

fn open_device(image: &Path, repair: bool) -> CliResult<FileDevice> {
    let open = if repair {
        FileDevice::open(image)
    } else {
        FileDevice::open_read_only(image)
    };
    open.map_err(|e| match e.kind() {
        io::ErrorKind::ResourceBusy => Failure::with_code(
            OPERATIONAL,
            format!(
                "{} is in use (mounted?): unmount it first (`amaranth umount DIR`)",
                image.display()
            ),
        ),
        _ => Failure::with_code(OPERATIONAL, format!("cannot open {}: {e}", image.display())),
    })
}

fn engine_options(sb: &ImageInfo, repair: bool, fallback: bool) -> CliResult<Options> {
    let format = sb
        .format()
        .map_err(|e| Failure::with_code(UNCORRECTED, format!("the superblock is damaged: {e}")))?;
    let cache = (total_memory() / 8).clamp(128 << 20, 1 << 30) as usize;
    Ok(Options {
        read_only: !repair,
        salvage: repair,
        fallback_superblock: fallback,
        background_threads: false,
        cache_size: cache.max(format.node_size * 16),
        ..Options::default()
    })
}

/// A failure to open the engine: damage is "errors left uncorrected", anything else operational.
fn open_failure(image: &Path, e: &Error) -> Failure {
    let code = if e.is_corruption() || matches!(e, Error::TooSmall(_)) {
        UNCORRECTED
    } else {
        OPERATIONAL
    };
    Failure::with_code(
        code,
        format!(
            "{}: cannot open the engine: {}",
            image.display(),
            crate::image::engine_error(image, e)
        ),
    )
}

/// The check without repair.
fn check_image(
    image: &Path,
    dev: Arc<dyn BlockDevice>,
    opts: Options,
    sb_problems: &[String],
    recorded: bool,
) -> CliResult<i32> {
    for p in sb_problems {
        say!("CORRUPTION SuperblockCopy: {p}");
    }
    note!("fsck: reading every node of the last checkpoint");
    let survey = Engine::survey(dev.clone(), opts.clone()).map_err(|e| open_failure(image, &e))?;
    if !survey.damage.is_empty() {
        print_damage(&survey);
        say!(
            "{}: {} damaged nodes, partitions or buffers; the file-system check needs an intact \
             tree: `amaranth fsck --repair {}` rebuilds it from what is intact",
            image.display(),
            survey.damage.len(),
            image.display()
        );
        say!("errors left uncorrected");
        return Ok(UNCORRECTED);
    }
    note!("fsck: opening the engine (replaying the log if needed)");
    let engine = Engine::open(dev, opts).map_err(|e| open_failure(image, &e))?;
    replay_note(&engine);
    let report = check::check(&engine, false, |msg| note!("fsck: {msg}"));
    print_problems(&report, "");
    let flagged = needs_check(&engine);
    summary(image, &report);
    if recorded {
        say!(
            "DAMAGE MARK: an earlier read found damage that this check does not see; \
             `--repair` clears the mark"
        );
    }
    let left = !sb_problems.is_empty() || recorded || flagged || report.exit_code() == UNCORRECTED;
    Ok(if left {
        say!("errors left uncorrected (run with --repair to fix them)");
        UNCORRECTED
    } else {
        finish_line(report.exit_code())
    })
}

/// The repair: the engine salvages, the schema is repaired in rounds, a final check.
fn repair_image(
    image: &Path,
    dev: Arc<dyn BlockDevice>,
    opts: Options,
    sb_problems: &[String],
) -> CliResult<i32> {
    for p in sb_problems {
        say!("CORRUPTION SuperblockCopy: {p} [repaired]");
    }
    note!("fsck: reading every node; rebuilding the tree if any is damaged; replaying the log");
    let engine = Engine::open(dev, opts).map_err(|e| open_failure(image, &e))?;
    replay_note(&engine);
    let salvage = engine
        .salvage_report()
        .cloned()
        .expect("a repair open reports");
    if salvage.is_damaged() {
        print_damage(&salvage);
        print_salvage(&engine, &salvage);
    }
    let rounds = check::repair(&engine, |msg| note!("fsck: {msg}"));
    for (i, r) in rounds.iter().enumerate() {
        print_problems(r, &format!("round {}: ", i + 1));
    }
    note!("fsck: checking the repaired file system");
    let last = check::check(&engine, false, |_| {});
    print_problems(&last, "after repair: ");
    let flagged = needs_check(&engine);
    if flagged && last.problems.is_empty() {
        match engine.clear_needs_check() {
            Ok(()) => say!("the check flag is cleared [repaired]"),
            Err(e) => say!("the check flag could not be cleared: {e}"),
        }
    }
    summary(image, &last);
    engine.close().map_err(|e| {
        Failure::with_code(
            UNCORRECTED,
            format!("the repaired image could not be closed: {e}"),
        )
    })?;
    if !last.problems.is_empty() {
        say!("errors left uncorrected");
        return Ok(UNCORRECTED);
    }
    let repaired = salvage.is_damaged()
        || flagged
        || !sb_problems.is_empty()
        || rounds.iter().any(|r| !r.problems.is_empty());
    Ok(finish_line(if repaired { CORRECTED } else { CLEAN }))
}

/// Reports the engine's "needs a check" flag (log records that could not be applied were skipped
/// at an open); returns whether it is set.
fn needs_check(engine: &Engine) -> bool {
    let st = engine.stats();
    if st.needs_check {
        say!(
            "CORRUPTION NeedsCheck: log records that could not be applied were skipped at an open \
             ({} at this one); the operations they held are lost",
            st.skipped_records
        );
    }
    st.needs_check
}

fn replay_note(engine: &Engine) {
    let st = engine.stats();
    if st.opened_after_crash {
        note!(
            "fsck: replayed {} log records ({})",
            st.recovered_records,
            st.recovery_stop
        );
    }
}

fn finish_line(code: i32) -> i32 {
    match code {
        CLEAN => say!("clean"),
        CORRECTED => say!("errors corrected"),
        _ => say!("errors left uncorrected"),
    }
    code
}

/// One line per damaged node, partition or buffer, with what it held.
fn print_damage(r: &SalvageReport) {
    for d in &r.damage {
        say!("CORRUPTION DamagedNode: {}", damage_line(d));
    }
    if let Some(l) = &r.log {
        say!("CORRUPTION DamagedLog: {l}");
    }
}

fn damage_line(d: &Damage) -> String {
    let at = d
        .extent
        .map(|(b, n)| format!(" (blocks {b}..{})", b + n))
        .unwrap_or_default();
    let part = match &d.part {
        DamagedPart::Node { height: Some(0) } => "leaf".to_string(),
        DamagedPart::Node { height: Some(h) } => format!("internal node of height {h}"),
        DamagedPart::Node { height: None } => "node".to_string(),
        DamagedPart::Partition {
            index,
            entries,
            bytes,
        } => format!("partition {index} ({entries} entries, {})", human(*bytes)),
        DamagedPart::Buffer {
            index,
            messages,
            bytes,
        } => format!(
            "buffer {index} ({messages} pending changes, {})",
            human(*bytes)
        ),
    };
    let held = match &d.range {
        Some((lo, hi)) => format!("held {}", describe::describe_range(lo, hi.as_deref())),
        None => "unreachable, key range unknown".to_string(),
    };
    format!("node {}{at}: {part}, {held}: {}", d.node, d.error)
}

/// What the rebuild kept, and which files had keys in damaged ranges.
fn print_salvage(engine: &Engine, r: &SalvageReport) {
    say!(
        "salvage: {} leaves kept, {} rebuilt, {} entries, {} subtrees of damaged nodes adopted, \
         {} unreferenced nodes left out",
        r.leaves_kept,
        r.leaves_rebuilt,
        r.entries,
        r.orphans_adopted,
        r.orphans_left.len()
    );
    if !r.snapshots_dropped.is_empty() {
        say!(
            "salvage: the rebuilt tree shares nothing with the snapshots, which were deleted: {}",
            r.snapshots_dropped.join(", ")
        );
    }
    let ranges: Vec<(Vec<u8>, Option<Vec<u8>>)> =
        r.damage.iter().filter_map(|d| d.range.clone()).collect();
    match describe::files_in_ranges(engine, &ranges, FILES_SHOWN) {
        Ok(files) if !files.is_empty() => {
            let more = if files.len() >= FILES_SHOWN {
                " (and maybe more)"
            } else {
                ""
            };
            say!(
                "files with records in damaged ranges (their contents may be incomplete or \
                 older){more}:"
            );
            for (f, what) in files {
                say!("  {f}: {}", what.join(", "));
            }
        }
        Ok(_) => {}
        Err(e) => say!("cannot list the files in damaged ranges: {e}"),
    }
}

fn print_problems(report: &CheckReport, prefix: &str) {
    for p in &report.problems {
        let sev = match p.class.severity() {
            Severity::Benign => "benign",
            Severity::Corruption => "CORRUPTION",
        };
        say!(
            "{prefix}{sev:>10} {:?}: {}{}",
            p.class,
            p.detail,
            if p.repaired { " [repaired]" } else { "" }
        );
    }
}

fn summary(image: &Path, report: &CheckReport) {
    if let Some(t) = &report.tree {
        say!(
            "tree: height {}, {} internal nodes, {} leaves, {} entries",
            t.height,
            t.internal_nodes,
            t.leaves,
            t.leaf_entries
        );
    }
    let benign = report
        .problems
        .iter()
        .filter(|p| p.class.severity() == Severity::Benign)
        .count();
    say!(
        "{}: {} inodes ({} directories), {} data blocks ({}), {} xattrs; {} problems ({} benign, {} corruption, {} repaired)",
        image.display(),
        report.inodes,
        report.directories,
        report.data_blocks,
        human(report.data_bytes),
        report.xattrs,
        report.problems.len(),
        benign,
        report.problems.len() - benign,
        report.problems.iter().filter(|p| p.repaired).count(),
    );
}
