//! Fail-stop (`crates/cli/src/failstop.rs`): a panic in any thread of the daemon ends the
//! daemon at once instead of letting the other threads go on with what the panicking one left
//! half changed. What was acknowledged before the panic survives: the image is as after a power
//! cut, and the next mount replays the log.
//!
//! - `a_panic_in_any_daemon_thread_stops_it_and_keeps_what_was_acknowledged`.

mod support;

use std::fs::{self, File};
use std::io::Write;
use std::time::{Duration, Instant};

use support::{mount_env_ok, serial, wait_gone, MountOpts, Scratch};

#[test]
fn a_panic_in_any_daemon_thread_stops_it_and_keeps_what_was_acknowledged() {
    if !mount_env_ok() {
        return;
    }
    let _serial = serial();
    let s = Scratch::new("failstop");
    let img = s.mkfs("fs.img", "256M");
    let delay = Duration::from_secs(4);
    let o = MountOpts {
        env: vec![(
            "AMARANTH_TEST_PANIC_AFTER_MS".into(),
            delay.as_millis().to_string(),
        )],
        ..MountOpts::default()
    };
    let t = Instant::now();
    let m = s.mount(&img, "m", &o);
    let pid = m.pid();
    let mut f = File::create(m.p("acknowledged")).unwrap();
    f.write_all(b"written and fsynced before the panic")
        .unwrap();
    f.sync_all().unwrap();
    drop(f);
    fs::create_dir(m.p("dir")).unwrap();
    File::open(m.p(".")).unwrap().sync_all().unwrap();
    assert!(
        t.elapsed() < delay,
        "the writes took longer than the test's delay ({delay:?}): raise it"
    );
    assert!(
        wait_gone(pid, Duration::from_secs(60)),
        "daemon {pid} still running after a panic in one of its threads (not fail-stop)"
    );
    let log = m.session_log();
    assert!(
        log.contains("a panic asked for by a test") && log.contains("stopping at once"),
        "the daemon's log does not say why it stopped:\n{log}"
    );
    // The dead mount fails every call until it is unmounted (ECONNABORTED, ENOTCONN, or
    // ECANCELED for a request that was on the io_uring queues).
    let e = fs::metadata(m.p("acknowledged")).unwrap_err();
    assert!(
        [libc::ECONNABORTED, libc::ENOTCONN, libc::ECANCELED]
            .map(Some)
            .contains(&e.raw_os_error()),
        "a dead mount's answer: {e}"
    );
    m.kill9();
    s.assert_fsck_clean_after_crash(&img);
    let m = s.mount(&img, "m", &MountOpts::default());
    assert_eq!(
        fs::read(m.p("acknowledged")).unwrap(),
        b"written and fsynced before the panic"
    );
    assert!(m.p("dir").is_dir(), "the fsynced directory is gone");
    m.umount();
    s.assert_fsck_clean(&img);
}
