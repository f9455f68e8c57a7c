//! Crashes through the real mount: `kill -9` of the daemon at a random moment during
//!
//! - **untar** of part of the Linux tree (kernel, lib, mm, fs, block, arch/x86: about 90 MB);
//! - **rsync** of the same tree from the host;
//! - a **data-integrity** workload: two clients, each in its own directory (creates, writes up to
//!   512 KiB — two operations when the kernel splits one, see docs/GUARANTEES.md —, truncates,
//!   replace-via-rename, unlinks, fsyncs), recording every operation and what
//!   every completed fsync made durable (its own and the other client's returned operations);
//! - a **SQLite** workload (sqlite3 CLI; rollback journal with synchronous=EXTRA or WAL with FULL; one
//!   transaction per batch of rows, each commit reported on stdout as it completes).
//!
//! After each kill: the dead mount is detached, `amaranth fsck` must be clean (exit 0, or only
//! orphans: files unlinked while the kernel held them, which the next mount deletes), the image
//! remounts, and the state must be what docs/GUARANTEES.md promises:
//! - untar: every file is the archive's file or, for the one being written, a prefix of it, and
//!   every file before the last one present (in archive order) is present and complete;
//! - rsync: every file in place is complete and identical, rsync's temporary files hold prefixes;
//!   a second rsync then completes the copy and `diff -r` finds nothing;
//! - integrity: each client's files are exactly the result of a prefix of its recorded operations
//!   that contains every operation made durable by a completed fsync (so every fsynced file is
//!   intact byte for byte);
//! - SQLite: `PRAGMA integrity_check` says ok, every transaction reported committed is there,
//!   transactions are all-or-nothing and in order; the database keeps working.
//!
//! `AMARANTH_CRASH_CYCLES` cycles in all (default 8), the workloads in turn; `make crash-mount`
//! runs 100 (`CRASH_CYCLES=...`); `AMARANTH_CRASH_WORKLOADS=rsync,sqlite` runs only those. Failed
//! cycles are counted and reported (their scratch directories kept), then the test fails.

mod support;

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::*;

const WORKLOADS: [&str; 4] = ["untar", "rsync", "integrity", "sqlite"];

/// The part of the Linux tree used (a tar and its extracted reference on the host).
fn tree() -> (PathBuf, PathBuf) {
    linux_variant(
        "linux-crash",
        &["kernel", "lib", "mm", "fs", "block", "arch/x86"],
        &[],
    )
}

fn opts() -> MountOpts {
    MountOpts::default()
}

/// Random delay in `lo..hi` milliseconds.
fn delay(rng: &mut Rng, lo: u64, hi: u64) -> Duration {
    Duration::from_millis(rng.range(lo, hi))
}

/// Stops a workload process (after the daemon was killed) by its pid and reaps it.
fn stop_child(mut c: Child) -> bool {
    let finished = matches!(c.try_wait(), Ok(Some(_)));
    let _ = c.kill();
    let _ = c.wait();
    finished
}

// ----- untar ---------------------------------------------------------------------------------

/// Non-directory members of the tar, in archive order (relative to `linux-source-6.1/`).
fn tar_order(tar: &Path) -> Vec<PathBuf> {
    sh_ok(&format!("tar -tf {}", q(tar)))
        .lines()
        .filter(|l| !l.ends_with('/'))
        .filter_map(|l| l.strip_prefix("linux-source-6.1/"))
        .map(PathBuf::from)
        .collect()
}

fn untar_cycle(
    s: &Scratch,
    rng: &mut Rng,
    tar: &Path,
    reference: &Path,
    order: &[PathBuf],
) -> String {
    let m = s.mount(&s.mkfs("fs.img", "2G"), "mnt", &opts());
    let dst = m.p("x");
    fs::create_dir(&dst).unwrap();
    let mut tar_x = Command::new("tar");
    tar_x.arg("-xf").arg(tar).arg("-C").arg(&dst);
    let (m, wait) = run_then_crash(s, m, rng, tar_x);
    let top = m.p("x/linux-source-6.1");
    let found = walk_if_there(&top);
    let ref_tree = walk(reference);
    let mut partial = 0;
    for (rel, e) in &found {
        let r = ref_tree
            .get(rel)
            .unwrap_or_else(|| panic!("{} is not in the archive", rel.display()));
        assert_eq!(e.kind, r.kind, "{}: kind", rel.display());
        match e.kind {
            'l' => assert_eq!(e.target, r.target, "{}: symlink target", rel.display()),
            'f' => {
                let got = fs::read(top.join(rel)).unwrap();
                let want = fs::read(reference.join(rel)).unwrap();
                assert!(
                    got.len() <= want.len() && got[..] == want[..got.len()],
                    "{}: {} bytes that are not a prefix of the archive's {}",
                    rel.display(),
                    got.len(),
                    want.len()
                );
                if got.len() < want.len() {
                    partial += 1;
                }
            }
            _ => {}
        }
    }
    // A prefix in archive order: everything before the last member present is there, complete.
    let last = order.iter().rposition(|p| found.contains_key(p));
    let mut complete = 0;
    if let Some(last) = last {
        for p in &order[..last] {
            let e = found
                .get(p)
                .unwrap_or_else(|| panic!("{} is missing but a later member exists", p.display()));
            assert_eq!(
                e.size,
                ref_tree[p].size,
                "{} is incomplete but a later member exists",
                p.display()
            );
            complete += 1;
        }
    }
    assert!(
        partial <= 1,
        "{partial} partial files (at most the last one)"
    );
    s.finish(m);
    format!(
        "killed after {:.1} s: {complete} of {} members complete, {partial} partial",
        wait.as_secs_f64(),
        order.len()
    )
}

/// Runs `cmd` on the mount, kills the daemon after a random delay, and remounts (see
/// `crash_and_remount_with`); returns the new mount and the delay.
fn run_then_crash(s: &Scratch, m: Mount, rng: &mut Rng, mut cmd: Command) -> (Mount, Duration) {
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let wait = delay(rng, 200, 7000);
    std::thread::sleep(wait);
    (crash_and_remount_with(s, m, child), wait)
}

fn walk_if_there(dir: &Path) -> BTreeMap<PathBuf, Entry> {
    if dir.exists() {
        walk(dir)
    } else {
        BTreeMap::new()
    }
}

/// Kills the daemon (then the workload process), checks that the dead mount is detached,
/// requires a clean fsck (but for orphans) and remounts.
fn crash_and_remount_with(s: &Scratch, m: Mount, child: Child) -> Mount {
    let img = m.image.clone();
    let mp = m.mp.clone();
    m.kill9();
    let finished = stop_child(child);
    if finished {
        eprintln!("(the workload had finished before the kill)");
    }
    assert!(!is_mounted(&mp), "the dead mount is still attached");
    s.assert_fsck_clean_after_crash(&img);
    s.mount(&img, "mnt", &opts())
}

// ----- rsync ---------------------------------------------------------------------------------

/// For rsync's temporary file `.NAME.XXXXXX`, `NAME`.
fn rsync_temp_target(name: &str) -> Option<String> {
    let rest = name.strip_prefix('.')?;
    let (base, suffix) = rest.rsplit_once('.')?;
    (suffix.len() == 6 && !base.is_empty()).then(|| base.to_string())
}

fn rsync_cycle(s: &Scratch, rng: &mut Rng, reference: &Path) -> String {
    let m = s.mount(&s.mkfs("fs.img", "2G"), "mnt", &opts());
    let mut rsync = Command::new("rsync");
    rsync
        .arg("-a")
        .arg(format!("{}/", reference.display()))
        .arg(format!("{}/", m.p("r").display()));
    let (m, wait) = run_then_crash(s, m, rng, rsync);
    let dst = m.p("r");
    let found = walk_if_there(&dst);
    let ref_tree = walk(reference);
    let (mut complete, mut temps) = (0, 0);
    for (rel, e) in &found {
        let name = rel.file_name().unwrap().to_string_lossy().into_owned();
        if let (Some(target), 'f') = (rsync_temp_target(&name), e.kind) {
            let twin = rel.with_file_name(&target);
            if ref_tree.get(&twin).is_some_and(|r| r.kind == 'f') && !ref_tree.contains_key(rel) {
                let got = fs::read(dst.join(rel)).unwrap();
                let want = fs::read(reference.join(&twin)).unwrap();
                assert!(
                    got.len() <= want.len() && got[..] == want[..got.len()],
                    "rsync temporary {} is not a prefix of {}",
                    rel.display(),
                    twin.display()
                );
                temps += 1;
                continue;
            }
        }
        let r = ref_tree
            .get(rel)
            .unwrap_or_else(|| panic!("{} is not in the source", rel.display()));
        assert_eq!(e.kind, r.kind, "{}: kind", rel.display());
        match e.kind {
            'l' => assert_eq!(e.target, r.target, "{}: symlink target", rel.display()),
            'f' => {
                assert!(
                    fs::read(dst.join(rel)).unwrap() == fs::read(reference.join(rel)).unwrap(),
                    "{}: renamed into place but not identical",
                    rel.display()
                );
                complete += 1;
            }
            _ => {}
        }
    }
    // The copy resumes on the recovered file system and ends identical.
    sh_ok(&format!("rsync -a --delete {}/ {}/", q(reference), q(&dst)));
    diff_r(reference, &dst);
    compare_trees(
        reference,
        &dst,
        Compare {
            nlink: false,
            ..Compare::all()
        },
    );
    s.finish(m);
    format!(
        "killed after {:.1} s: {complete} files in place, {temps} temporaries; resumed, identical",
        wait.as_secs_f64()
    )
}

// ----- data integrity ------------------------------------------------------------------------

/// Files of the integrity workload: `f0..f{FILES-1}` and the temporary `tmp` (index FILES).
const FILES: usize = 10;

/// One operation's effects: (file index, content fingerprint after it or None if gone).
type Effects = Vec<(usize, Option<u64>)>;

#[derive(Default)]
struct Journal {
    /// Every operation, recorded before it is issued.
    ops: Vec<Effects>,
    /// Operations before the last completed fsync.
    synced: usize,
    fsyncs: u64,
}

fn file_name(i: usize) -> String {
    if i == FILES {
        "tmp".into()
    } else {
        format!("f{i}")
    }
}

/// Clients of the integrity workload, each in its own directory with its own journal.
const CLIENTS: usize = 2;

/// The journals of all clients and, per client, how many of its operations have returned.
struct Journals {
    j: Vec<Mutex<Journal>>,
    returned: Vec<AtomicU64>,
}

/// Client `t` of the integrity workload on `dir` until an operation fails (the daemon is gone).
/// An fsync makes durable every operation of any client that had returned before it was issued:
/// those are the floors (`synced`) it raises in every journal when it completes.
fn integrity_workload(dir: &Path, seed: u64, t: usize, all: &Journals, done: &AtomicU64) {
    let mut rng = Rng::new(seed ^ t as u64);
    let mut model: Vec<Option<Vec<u8>>> = vec![None; FILES + 1];
    let journal = &all.j[t];
    let record = |e: Effects| journal.lock().unwrap().ops.push(e);
    let fp = |v: &Vec<u8>| Some(fnv(v));
    loop {
        let k = rng.below(FILES as u64) as usize;
        let p = dir.join(file_name(k));
        let r: std::io::Result<()> = (|| {
            match rng.below(10) {
                0..=4 => {
                    if model[k].is_none() {
                        record(vec![(k, Some(fnv(&[])))]);
                        File::create(&p)?;
                        model[k] = Some(Vec::new());
                    }
                    let cur = model[k].as_mut().unwrap();
                    let off = rng.below(cur.len() as u64 + 65_536) as usize;
                    let len = rng.range(1, 512 << 10) as usize;
                    let data = rng.bytes(len);
                    let mut next = cur.clone();
                    if next.len() < off + len {
                        next.resize(off + len, 0);
                    }
                    next[off..off + len].copy_from_slice(&data);
                    // Linux sends a write whose first page is partial and not cached as two FUSE
                    // requests (that page, then the rest): two operations, each atomic.
                    let head = (4096 - off % 4096) % 4096;
                    if head != 0 && head < len {
                        let mut first = cur.clone();
                        if first.len() < off + head {
                            first.resize(off + head, 0);
                        }
                        first[off..off + head].copy_from_slice(&data[..head]);
                        record(vec![(k, fp(&first))]);
                    }
                    record(vec![(k, fp(&next))]);
                    OpenOptions::new()
                        .write(true)
                        .open(&p)?
                        .write_all_at(&data, off as u64)?;
                    *cur = next;
                }
                5 => {
                    if let Some(cur) = model[k].as_mut() {
                        let len = rng.below(cur.len() as u64 + 100_000) as usize;
                        let mut next = cur.clone();
                        next.resize(len, 0);
                        record(vec![(k, fp(&next))]);
                        OpenOptions::new()
                            .write(true)
                            .open(&p)?
                            .set_len(len as u64)?;
                        *cur = next;
                    }
                }
                6 | 7 => {
                    // Replace via rename: a complete new file takes the name atomically.
                    let t = dir.join("tmp");
                    let n = rng.range(0, 300_000) as usize;
                    let data = rng.bytes(n);
                    record(vec![(FILES, Some(fnv(&[])))]);
                    let mut f = File::create(&t)?;
                    model[FILES] = Some(Vec::new());
                    if !data.is_empty() {
                        record(vec![(FILES, fp(&data))]);
                        f.write_all(&data)?;
                    }
                    drop(f);
                    model[FILES] = Some(data.clone());
                    record(vec![(k, fp(&data)), (FILES, None)]);
                    fs::rename(&t, &p)?;
                    model[k] = Some(data);
                    model[FILES] = None;
                }
                8 => {
                    if model[k].is_some() {
                        record(vec![(k, None)]);
                        fs::remove_file(&p)?;
                        model[k] = None;
                    }
                }
                _ => {
                    if model[k].is_some() {
                        let f = File::open(&p)?;
                        let floors: Vec<u64> = all
                            .returned
                            .iter()
                            .map(|r| r.load(Ordering::SeqCst))
                            .collect();
                        if rng.chance(0.5) {
                            f.sync_all()?;
                        } else {
                            f.sync_data()?;
                        }
                        for (j, floor) in all.j.iter().zip(floors) {
                            let mut j = j.lock().unwrap();
                            j.synced = j.synced.max(floor as usize);
                        }
                        journal.lock().unwrap().fsyncs += 1;
                    }
                }
            }
            Ok(())
        })();
        if r.is_err() {
            return;
        }
        let n = journal.lock().unwrap().ops.len();
        all.returned[t].store(n as u64, Ordering::SeqCst);
        done.fetch_add(1, Ordering::Relaxed);
    }
}

fn integrity_cycle(s: &Scratch, rng: &mut Rng) -> String {
    let m = s.mount(&s.mkfs("fs.img", "2G"), "mnt", &opts());
    for t in 0..CLIENTS {
        fs::create_dir_all(m.p(&format!("w/c{t}"))).unwrap();
    }
    // The directories themselves are durable before the workload starts.
    syncfs(&m.mp).unwrap();
    let all = Arc::new(Journals {
        j: (0..CLIENTS).map(|_| Mutex::default()).collect(),
        returned: (0..CLIENTS).map(|_| AtomicU64::new(0)).collect(),
    });
    let done = Arc::new(AtomicU64::new(0));
    let seed = rng.next_u64();
    let workers: Vec<_> = (0..CLIENTS)
        .map(|t| {
            let (dir, all, done) = (m.p(&format!("w/c{t}")), all.clone(), done.clone());
            std::thread::spawn(move || integrity_workload(&dir, seed, t, &all, &done))
        })
        .collect();
    let wait = delay(rng, 300, 4000);
    std::thread::sleep(wait);
    let img = m.image.clone();
    m.kill9();
    for w in workers {
        w.join().expect("a workload thread panicked");
    }
    assert!(!is_mounted(&s.path("mnt")));
    s.assert_fsck_clean_after_crash(&img);
    let m = s.mount(&img, "mnt", &opts());
    let mut parts = Vec::new();
    for t in 0..CLIENTS {
        let j = all.j[t].lock().unwrap();
        let k = check_client(&m.p(&format!("w/c{t}")), &j);
        parts.push(format!(
            "client {t}: {} operations, {} fsyncs, state = prefix of {k} (synced {}, lost {})",
            j.ops.len(),
            j.fsyncs,
            j.synced,
            j.ops.len() - k
        ));
    }
    s.finish(m);
    format!(
        "killed after {:.1} s: {}",
        wait.as_secs_f64(),
        parts.join("; ")
    )
}

/// The files of one client must be the result of a prefix of its journal at least as long as its
/// durable floor; returns the prefix length.
fn check_client(dir: &Path, j: &Journal) -> usize {
    let mut seen: Vec<Option<u64>> = Vec::new();
    for i in 0..=FILES {
        seen.push(read_opt(&dir.join(file_name(i))).map(|b| fnv(&b)));
    }
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.retain(|n| !(0..=FILES).any(|i| file_name(i) == *n));
    assert!(names.is_empty(), "files nobody created: {names:?}");
    let mut state: Vec<Option<u64>> = vec![None; FILES + 1];
    // For the diagnosis: the prefix closest to what is seen, and the files that differ there.
    let mut best = (usize::MAX, 0, Vec::new());
    for k in 0..=j.ops.len() {
        if k > 0 {
            for &(i, h) in &j.ops[k - 1] {
                state[i] = h;
            }
        }
        if k >= j.synced && state == seen {
            return k;
        }
        let differ: Vec<usize> = (0..=FILES).filter(|&i| state[i] != seen[i]).collect();
        if differ.len() <= best.0 {
            best = (differ.len(), k, differ);
        }
    }
    let (_, k, differ) = best;
    let last_op = |i: usize, upto: usize| {
        j.ops[..upto]
            .iter()
            .rposition(|e| e.iter().any(|x| x.0 == i))
    };
    let detail: Vec<String> = differ
        .iter()
        .map(|&i| {
            format!(
                "{}: seen {:?}, last changed by operation {:?} before the closest prefix; \
                 operations on it after the floor: {:?}",
                file_name(i),
                seen[i],
                last_op(i, k),
                (j.synced..j.ops.len())
                    .filter(|&o| j.ops[o].iter().any(|x| x.0 == i))
                    .map(|o| (o, j.ops[o].clone()))
                    .collect::<Vec<_>>()
            )
        })
        .collect();
    panic!(
        "{}: the files after the crash are not the result of any prefix of the {} operations \
         that holds the {} made durable by completed fsyncs; the closest prefix is {k} ({}), \
         where these differ: {}",
        dir.display(),
        j.ops.len(),
        j.synced,
        if k < j.synced {
            "shorter than the durable floor"
        } else {
            "past the floor"
        },
        detail.join("; ")
    );
}

// ----- SQLite --------------------------------------------------------------------------------

const ROWS: u64 = 40;

/// The script: `batches` transactions of `ROWS` rows, each followed by a commit report.
///
/// Durability of a commit: in WAL mode `synchronous=FULL` makes each commit durable; in DELETE
/// mode the commit point is the unlink of the journal, which SQLite makes durable (fsync of the
/// directory) only with `synchronous=EXTRA` — with FULL the last commit may roll back after a
/// crash on any file system (observed here: the unlink is in the lost suffix), so EXTRA is used.
fn sqlite_script(journal: &str, batches: u64) -> String {
    let sync = if journal == "WAL" { "FULL" } else { "EXTRA" };
    let mut s = format!(
        "PRAGMA journal_mode={journal};\nPRAGMA synchronous={sync};\n\
         CREATE TABLE t(batch INTEGER, i INTEGER, v TEXT, PRIMARY KEY(batch, i));\n\
         CREATE TABLE meta(last INTEGER);\nINSERT INTO meta VALUES(0);\n"
    );
    for b in 1..=batches {
        s.push_str(&format!(
            "BEGIN;\nWITH RECURSIVE c(x) AS (VALUES(0) UNION ALL SELECT x+1 FROM c WHERE x<{}) \
             INSERT INTO t SELECT {b}, x, printf('%0300d', {b}*1000+x) FROM c;\n\
             UPDATE meta SET last={b};\nCOMMIT;\nSELECT 'committed', {b};\n",
            ROWS - 1
        ));
    }
    s
}

fn sqlite_cycle(s: &Scratch, rng: &mut Rng, cycle: usize) -> String {
    let m = s.mount(&s.mkfs("fs.img", "2G"), "mnt", &opts());
    let journal = if cycle.is_multiple_of(2) {
        "DELETE"
    } else {
        "WAL"
    };
    let script = s.path("script.sql");
    fs::write(&script, sqlite_script(journal, 20_000)).unwrap();
    let db = m.p("db.sqlite");
    let mut child = Command::new("sqlite3")
        .arg("-bail")
        .arg(&db)
        .stdin(File::open(&script).unwrap())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Commits reported so far (each line is printed after its COMMIT returned).
    let committed = Arc::new(AtomicU64::new(0));
    let reader = {
        let out = child.stdout.take().unwrap();
        let committed = committed.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Some(b) = line.strip_prefix("committed|") {
                    committed.store(b.trim().parse().unwrap(), Ordering::SeqCst);
                }
            }
        })
    };
    let wait = delay(rng, 300, 4000);
    std::thread::sleep(wait);
    // What was reported committed before the kill must survive it.
    let acked = committed.load(Ordering::SeqCst);
    let m = crash_and_remount_with(s, m, child);
    reader.join().unwrap();
    let db = m.p("db.sqlite");
    let out = sh_ok(&format!(
        "sqlite3 -bail {} 'PRAGMA integrity_check; SELECT last FROM meta; \
         SELECT count(DISTINCT batch), coalesce(min(batch), 0), coalesce(max(batch), 0), count(*) \
         FROM t; SELECT count(*) FROM (SELECT batch FROM t GROUP BY batch HAVING count(*) != {ROWS});'",
        q(&db)
    ));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.first(), Some(&"ok"), "integrity_check: {out}");
    let last: u64 = lines[1].parse().unwrap();
    let agg: Vec<u64> = lines[2].split('|').map(|x| x.parse().unwrap()).collect();
    let (batches, min, max, rows) = (agg[0], agg[1], agg[2], agg[3]);
    assert_eq!(lines[3], "0", "a transaction is only partly there: {out}");
    assert!(
        max >= acked,
        "transaction {acked} was reported committed but the database ends at {max}"
    );
    assert_eq!(last, max, "meta and rows disagree: {out}");
    assert_eq!(
        batches, max,
        "transactions are missing in the middle: {out}"
    );
    assert!(max == 0 || min == 1);
    assert_eq!(rows, max * ROWS);
    // The recovered database keeps working.
    let more = sh_ok(&format!(
        "sqlite3 -bail {} \"BEGIN; INSERT INTO t VALUES({}, 0, 'after'); UPDATE meta SET last={}; \
         COMMIT; PRAGMA integrity_check;\"",
        q(&db),
        max + 1,
        max + 1
    ));
    assert_eq!(more.trim(), "ok");
    s.finish(m);
    format!(
        "{journal} journal, killed after {:.1} s: {acked} commits reported, {max} present",
        wait.as_secs_f64()
    )
}

// ----- the test ------------------------------------------------------------------------------

fn cycles() -> usize {
    std::env::var("AMARANTH_CRASH_CYCLES")
        .ok()
        .map(|v| {
            v.trim()
                .parse()
                .expect("AMARANTH_CRASH_CYCLES must be a number")
        })
        .unwrap_or(8)
}

#[test]
fn kill_the_daemon_during_real_workloads() {
    if !mount_env_ok() {
        return;
    }
    let _serial = serial();
    let t0 = Instant::now();
    let cycles = cycles();
    let mut rng = Rng::new(seed("crash-mount"));
    let (tar, reference) = tree();
    let order = tar_order(&tar);
    let mut kills = [0usize; 4];
    let mut failures: Vec<String> = Vec::new();
    // AMARANTH_CRASH_WORKLOADS=rsync,sqlite: only those (to chase one failure).
    let only: Vec<usize> = match std::env::var("AMARANTH_CRASH_WORKLOADS") {
        Ok(v) => v
            .split(',')
            .map(|w| {
                WORKLOADS
                    .iter()
                    .position(|x| *x == w.trim())
                    .unwrap_or_else(|| panic!("unknown workload {w:?}: one of {WORKLOADS:?}"))
            })
            .collect(),
        Err(_) => (0..WORKLOADS.len()).collect(),
    };
    for cycle in 0..cycles {
        let w = only[cycle % only.len()];
        let s = Scratch::new(&format!("crash-{}", WORKLOADS[w]));
        let t = Instant::now();
        let mut crng = Rng::new(rng.next_u64());
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match w {
            0 => untar_cycle(&s, &mut crng, &tar, &reference, &order),
            1 => rsync_cycle(&s, &mut crng, &reference),
            2 => integrity_cycle(&s, &mut crng),
            _ => sqlite_cycle(&s, &mut crng, kills[w]),
        }));
        kills[w] += 1;
        match r {
            Ok(line) => eprintln!(
                "== cycle {}/{cycles} {}: {line} ({:.1} s)",
                cycle + 1,
                WORKLOADS[w],
                t.elapsed().as_secs_f64()
            ),
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                eprintln!(
                    "== cycle {}/{cycles} {}: FAILED: {msg}",
                    cycle + 1,
                    WORKLOADS[w]
                );
                failures.push(format!("cycle {} {}: {msg}", cycle + 1, WORKLOADS[w]));
                // Keep the failed cycle's image and logs (a name the stale-directory reaper skips).
                let keep = test_root().join(format!(
                    "crash-mount-failed-pid{}-cycle{}",
                    std::process::id(),
                    cycle + 1
                ));
                let _ = fs::rename(&s.dir, &keep);
                eprintln!("kept {}", keep.display());
            }
        }
    }
    let per: Vec<String> = WORKLOADS
        .iter()
        .zip(kills)
        .map(|(w, k)| format!("{w} {k}"))
        .collect();
    report(&format!(
        "crash-mount: {} cycles ({}), {} failures, {:.0} s",
        kills.iter().sum::<usize>(),
        per.join(", "),
        failures.len(),
        t0.elapsed().as_secs_f64()
    ));
    assert!(
        failures.is_empty(),
        "failed cycles:\n{}",
        failures.join("\n")
    );
}
