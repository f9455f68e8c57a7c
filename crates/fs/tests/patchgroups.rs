//! Patchgroup rules and their errors, process exits and inheritance, atomic groups' limits and
//! deadline, and the in-flight rule (a disengage returns only once every change that joined the
//! group is logged), through the operation layer with declared processes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use amaranth_device::MemDevice;
use amaranth_engine::{Engine, Format, Options};
use amaranth_fs::patchgroup::{ProcessModel, MAX_PER_PROCESS, PG_ATOMIC};
use amaranth_fs::{Ctx, Errno, Fs, FsOptions, ROOT_INO};

const A: u32 = 501;
const B: u32 = 502;

fn mount(timeout: Duration) -> (Arc<MemDevice>, Fs) {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let options = Options {
        cache_size: 4 << 20,
        background_threads: false,
        check_invariants: true,
        atomic_group_timeout: timeout,
        ..Options::default()
    };
    let f = Format {
        max_key_len: 1024,
        max_value_len: 4096 + 64,
        partition_size: 8 << 10,
        node_size: 32 << 10,
        log_size: Some(4 << 20),
        ..Format::small_for_tests()
    };
    let engine = Engine::create(dev.clone(), f, options).expect("create");
    Fs::mkfs(&engine, 0, 0).expect("mkfs");
    let fs = Fs::new(
        Arc::new(engine),
        FsOptions {
            processes: ProcessModel::Declared,
            reserve_bytes: 0,
            ..FsOptions::default()
        },
    )
    .expect("fs");
    (dev, fs)
}

/// Creates `name` in the root as process `pid` and writes `len` bytes into it.
fn put(fs: &Fs, pid: u32, name: &str, len: usize) -> Result<(), Errno> {
    let _c = fs.caller(pid);
    let ino = match fs.lookup(ROOT_INO, name.as_bytes()) {
        Ok(a) => a.ino,
        Err(_) => {
            let (a, fh) = fs.create(
                ROOT_INO,
                name.as_bytes(),
                0o644,
                libc::O_RDWR,
                Ctx::default(),
            )?;
            fs.release(a.ino, fh)?;
            a.ino
        }
    };
    let fh = fs.open(ino, libc::O_RDWR, Ctx::default())?;
    let r = fs.write(ino, fh, 0, &vec![b'x'; len], false);
    fs.release(ino, fh)?;
    fs.forget(ino, 1);
    r.map(|_| ())
}

fn exists(fs: &Fs, name: &str) -> bool {
    fs.lookup(ROOT_INO, name.as_bytes()).is_ok()
}

#[test]
fn rules_and_their_errors() {
    let (_dev, fs) = mount(Duration::from_secs(60));
    let pg = fs.patchgroups();
    assert_eq!(pg.create(A, 0x80), Err(Errno::EINVAL), "unknown flags");
    let p = pg.create(A, 0).unwrap();
    let q = pg.create(A, 0).unwrap();
    // A process controls only its own groups.
    assert_eq!(pg.engage(B, p), Err(Errno::ENOENT));
    assert_eq!(pg.release(B, p), Err(Errno::ENOENT));
    assert_eq!(pg.sync(A, 999), Err(Errno::ENOENT));
    // Engaging needs a release first.
    assert_eq!(pg.engage(A, p), Err(Errno::EINVAL));
    assert_eq!(pg.add_depend(A, p, p), Err(Errno::EINVAL));
    pg.release(A, p).unwrap();
    pg.engage(A, p).unwrap();
    pg.engage(A, p).unwrap(); // engaging again is a no-op
    put(&fs, A, "p1", 100).unwrap();
    // `before` must be engaged nowhere; an engaged group cannot be abandoned.
    assert_eq!(pg.add_depend(A, q, p), Err(Errno::EBUSY));
    assert_eq!(pg.abandon(A, p), Err(Errno::EBUSY));
    pg.disengage(A, p).unwrap();
    assert_eq!(pg.disengage(A, p), Err(Errno::EINVAL), "not engaged");
    pg.add_depend(A, q, p).unwrap();
    // p has an after: sealed, never engaged again, never gains befores.
    assert_eq!(pg.engage(A, p), Err(Errno::EINVAL));
    let r = pg.create(A, 0).unwrap();
    assert_eq!(pg.add_depend(A, p, r), Err(Errno::EINVAL));
    // No cycle can be built: q ⇝ p, so p ⇝ q is refused.
    assert_eq!(pg.add_depend(A, p, q), Err(Errno::EINVAL));
    // After its release, q gains no befores.
    pg.release(A, q).unwrap();
    assert_eq!(pg.add_depend(A, q, r), Err(Errno::EINVAL));
    pg.engage(A, q).unwrap();
    put(&fs, A, "q1", 100).unwrap();
    pg.disengage(A, q).unwrap();
    assert!(pg.newest_record(q) > pg.newest_record(p));
    pg.sync(A, q).unwrap();
    pg.sync(A, 0).unwrap();
    for g in [p, q, r] {
        pg.abandon(A, g).unwrap();
    }
    assert_eq!(pg.abandon(A, p), Err(Errno::ENOENT));
    assert_eq!(pg.groups(), 0);
    // Atomic groups: one per process, one process at a time, engaged once.
    let a1 = pg.create(A, PG_ATOMIC).unwrap();
    let a2 = pg.create(A, PG_ATOMIC).unwrap();
    pg.release(A, a1).unwrap();
    pg.release(A, a2).unwrap();
    pg.engage(A, a1).unwrap();
    assert_eq!(pg.engage(A, a2), Err(Errno::EBUSY));
    put(&fs, A, "a1", 100).unwrap();
    assert_eq!(
        pg.sync(A, a1),
        Err(Errno::EBUSY),
        "not durable before its commit"
    );
    assert_eq!(
        pg.sync(A, 0),
        Err(Errno::EBUSY),
        "the owner cannot wait for itself"
    );
    pg.disengage(A, a1).unwrap();
    assert_eq!(
        pg.engage(A, a1),
        Err(Errno::EINVAL),
        "an atomic group is engaged once"
    );
    pg.sync(A, a1).unwrap();
    // Limits.
    let mut made = 2;
    let err = loop {
        match pg.create(B, 0) {
            Ok(_) => made += 1,
            Err(e) => break e,
        }
    };
    assert_eq!(err, Errno::EMFILE);
    assert_eq!(made - 2, MAX_PER_PROCESS);
    pg.process_exited(B);
    assert_eq!(pg.groups(), 2);
}

#[test]
fn an_exit_disengages_commits_and_drops_handles() {
    let (dev, fs) = mount(Duration::from_secs(60));
    let pg = fs.patchgroups();
    let g = pg.create(A, PG_ATOMIC).unwrap();
    pg.release(A, g).unwrap();
    pg.engage(A, g).unwrap();
    put(&fs, A, "in-atomic", 100).unwrap();
    put(&fs, B, "derived", 100).unwrap();
    // Another process's new atomic group must wait for A's: A exits, which commits it.
    pg.process_exited(A);
    assert_eq!(pg.groups(), 0);
    let h = pg.create(B, PG_ATOMIC).unwrap();
    pg.release(B, h).unwrap();
    pg.engage(B, h).unwrap();
    pg.disengage(B, h).unwrap();
    fs.fsync().unwrap();
    drop(fs);
    let engine = Engine::open(dev, Options::default()).unwrap();
    let fs = Fs::new(Arc::new(engine), FsOptions::default()).unwrap();
    assert!(exists(&fs, "in-atomic") && exists(&fs, "derived"));
}

#[test]
fn children_inherit_groups_and_an_atomic_group_commits_when_the_last_leaves() {
    let (dev, fs) = mount(Duration::from_secs(60));
    let pg = fs.patchgroups();
    let g = pg.create(A, PG_ATOMIC).unwrap();
    pg.release(A, g).unwrap();
    pg.engage(A, g).unwrap();
    pg.spawned(600, A);
    put(&fs, 600, "child", 100).unwrap(); // first sight: inherits g, engaged
    pg.disengage(A, g).unwrap(); // the child still has it engaged: no commit yet
    put(&fs, 600, "child2", 100).unwrap();
    let crash_now = || {
        fs.engine().flush_log().unwrap();
        let e = Engine::open(
            Arc::new(MemDevice::from_bytes(dev.to_bytes())),
            Options::default(),
        )
        .unwrap();
        Fs::new(Arc::new(e), FsOptions::default()).unwrap()
    };
    let crashed = crash_now();
    assert!(
        !exists(&crashed, "child") && !exists(&crashed, "child2"),
        "uncommitted"
    );
    drop(crashed);
    pg.process_exited(600); // the last to have it engaged: commits
    let crashed = crash_now();
    assert!(exists(&crashed, "child") && exists(&crashed, "child2"));
    drop(crashed);
    // A child of a process without groups inherits nothing.
    pg.spawned(601, B);
    put(&fs, 601, "plain", 10).unwrap();
    assert_eq!(pg.engage(601, g), Err(Errno::ENOENT));
    pg.process_exited(A);
    assert_eq!(pg.groups(), 0);
}

#[test]
fn an_atomic_group_larger_than_its_limit_gets_efbig() {
    let (_dev, fs) = mount(Duration::from_secs(60));
    let pg = fs.patchgroups();
    let g = pg.create(A, PG_ATOMIC).unwrap();
    pg.release(A, g).unwrap();
    pg.engage(A, g).unwrap();
    let mut i = 0;
    let err = loop {
        match put(&fs, A, &format!("f{i}"), 60_000) {
            Ok(()) => i += 1,
            Err(e) => break e,
        }
        assert!(i < 100, "no limit");
    };
    assert_eq!(err, Errno::EFBIG);
    pg.disengage(A, g).unwrap();
    assert!(exists(&fs, "f0"));
}

#[test]
fn a_group_past_its_deadline_is_cut_by_a_sync_and_refuses_more() {
    let (dev, fs) = mount(Duration::from_millis(200));
    let pg = fs.patchgroups();
    let g = pg.create(A, PG_ATOMIC).unwrap();
    pg.release(A, g).unwrap();
    pg.engage(A, g).unwrap();
    put(&fs, A, "before-cut", 10).unwrap();
    {
        let _c = fs.caller(B);
        fs.fsync().unwrap(); // waits for A's group; cut at its deadline
    }
    assert_eq!(put(&fs, A, "after-cut", 10), Err(Errno::ETIMEDOUT));
    assert_eq!(pg.disengage(A, g), Err(Errno::ETIMEDOUT));
    let e = Engine::open(
        Arc::new(MemDevice::from_bytes(dev.to_bytes())),
        Options::default(),
    )
    .unwrap();
    let crashed = Fs::new(Arc::new(e), FsOptions::default()).unwrap();
    assert!(exists(&crashed, "before-cut"));
    assert!(!exists(&crashed, "after-cut"));
}

#[test]
fn a_disengage_returns_once_every_change_that_joined_is_logged() {
    let (_dev, fs) = mount(Duration::from_secs(60));
    let fs = Arc::new(fs);
    for round in 0..150 {
        let pg = fs.patchgroups();
        let g = pg.create(A, 0).unwrap();
        pg.release(A, g).unwrap();
        pg.engage(A, g).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        // Another thread of process A keeps changing files.
        let writer = {
            let (fs, stop) = (fs.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    put(&fs, A, &format!("w{}", n % 4), 3000).unwrap();
                    n += 1;
                }
            })
        };
        std::thread::sleep(Duration::from_millis(2));
        pg.disengage(A, g).unwrap();
        let logged = fs.engine().stats().log.next_lsn;
        std::thread::sleep(Duration::from_millis(2));
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
        let newest = pg.newest_record(g);
        assert!(
            newest.is_none_or(|l| l < logged),
            "round {round}: a change joined the group after its disengage returned ({newest:?} >= {logged})"
        );
        pg.abandon(A, g).unwrap();
    }
}
