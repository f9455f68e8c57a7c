//! What a user can observe of a checkpoint's timing, shown with a device that holds one thread's
//! writes or flushes (no timed assertions):
//! - the space used (`df`) does not jump while a checkpoint runs: the old images it replaced are
//!   held only until it completes, and are counted in what a checkpoint needs, not in the use;
//! - a checkpoint the log's fill started is not followed by a second one that writers asked for
//!   while the first ran (the first already moved the log's tail).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use amaranth_device::{BlockDevice, IoStats, MemDevice};
use amaranth_engine::{Engine, Format, Options};
use parking_lot::{Condvar, Mutex};

/// What the gate holds back.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Hold {
    /// Device flushes by the named thread.
    Flushes,
    /// Writes by the named thread at or past this offset (the data area, not the log).
    WritesFrom(u64),
}

/// A memory device that holds `hold` for the thread named `thread` while the gate is closed, and
/// counts the calls it held.
struct GatedDevice {
    inner: MemDevice,
    thread: &'static str,
    hold: Hold,
    closed: Mutex<bool>,
    opened: Condvar,
    held: AtomicU64,
}

impl GatedDevice {
    fn new(thread: &'static str, hold: Hold) -> GatedDevice {
        GatedDevice {
            inner: MemDevice::new(320 << 20),
            thread,
            hold,
            closed: Mutex::new(false),
            opened: Condvar::new(),
            held: AtomicU64::new(0),
        }
    }

    fn set_closed(&self, closed: bool) {
        *self.closed.lock() = closed;
        self.opened.notify_all();
    }

    fn wait_while_closed(&self) {
        if std::thread::current().name() != Some(self.thread) {
            return;
        }
        let mut c = self.closed.lock();
        if *c {
            self.held.fetch_add(1, Ordering::SeqCst);
        }
        while *c {
            self.opened.wait(&mut c);
        }
    }

    /// Waits until a call is held (panics after a minute: the test's premise failed).
    fn wait_for_held(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.held.load(Ordering::SeqCst) == 0 {
            assert!(Instant::now() < deadline, "nothing reached the gate");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl BlockDevice for GatedDevice {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        if let Hold::WritesFrom(from) = self.hold {
            if offset >= from {
                self.wait_while_closed();
            }
        }
        self.inner.write_at(offset, buf)
    }
    fn flush(&self) -> io::Result<()> {
        if self.hold == Hold::Flushes {
            self.wait_while_closed();
        }
        self.inner.flush()
    }
    fn describe(&self) -> String {
        "gated memory device".into()
    }
    fn io_stats(&self) -> IoStats {
        self.inner.io_stats()
    }
}

const MIB: u64 = 1 << 20;

fn key(i: u32) -> Vec<u8> {
    format!("k{i:06}").into_bytes()
}

/// 16 MiB of values on disk, then all overwritten: every dirty node has an old image that only
/// the last checkpoint references once the next checkpoint rewrites it. That checkpoint is held
/// at its device flush (all nodes and the table written, not yet complete): the space used then
/// is the use before it and after it.
#[test]
fn the_space_used_does_not_jump_while_a_checkpoint_runs() {
    let dev = Arc::new(GatedDevice::new("checkpointing", Hold::Flushes));
    let options = Options {
        background_threads: false,
        ..Options::default()
    };
    let e = Arc::new(Engine::create(dev.clone(), Format::default(), options).unwrap());
    for round in 0..2u8 {
        for i in 0..4096 {
            e.put(&key(i), &[round ^ i as u8; 4096]).unwrap();
        }
        if round == 0 {
            e.checkpoint().unwrap();
        }
    }
    let before = e.space_use();
    dev.set_closed(true);
    let ckpt = {
        let e = e.clone();
        std::thread::Builder::new()
            .name("checkpointing".into())
            .spawn(move || e.checkpoint().unwrap())
            .unwrap()
    };
    dev.wait_for_held();
    let during = e.space_use();
    dev.set_closed(false);
    ckpt.join().unwrap();
    let after = e.space_use();
    eprintln!(
        "used before {:.2} MiB, during {:.2} MiB (allocated {:.2} MiB, held by the checkpoint \
         {:.2} MiB), after {:.2} MiB",
        before.used() as f64 / MIB as f64,
        during.used() as f64 / MIB as f64,
        during.allocated as f64 / MIB as f64,
        during.checkpoint_held as f64 / MIB as f64,
        after.used() as f64 / MIB as f64,
    );
    assert!(
        during.checkpoint_held >= 16 * MIB,
        "the checkpoint replaced {} bytes of old images (expected the 16 MiB overwritten)",
        during.checkpoint_held
    );
    // The new table is allocated before the old one is freed: a few blocks.
    let slack = 4 * 4096 + before.table;
    assert!(
        during.used() <= before.used() + slack && during.used() + slack >= after.used(),
        "used {} bytes before the checkpoint, {} while it ran, {} after",
        before.used(),
        during.used(),
        after.used()
    );
    assert!(
        during.checkpoint_need() >= during.checkpoint_held,
        "what the running checkpoint holds is not in what a checkpoint needs"
    );
    assert_eq!(after.checkpoint_held, 0);
    e.check_space_accounting();
    let e = Arc::try_unwrap(e)
        .ok()
        .expect("the checkpoint thread is done");
    e.close().unwrap();
}

/// A node image being written (its extent allocated, the node still dirty and counting it as its
/// next image) is not counted twice: the checkpoint is held in its first node write.
#[test]
fn the_space_used_does_not_count_an_image_being_written_twice() {
    let log_size = 16 * MIB;
    let data_start = 2 * 4096 + log_size;
    let dev = Arc::new(GatedDevice::new(
        "checkpointing",
        Hold::WritesFrom(data_start),
    ));
    let format = Format {
        log_size: Some(log_size),
        ..Format::default()
    };
    let options = Options {
        background_threads: false,
        ..Options::default()
    };
    let e = Arc::new(Engine::create(dev.clone(), format, options).unwrap());
    for i in 0..2048 {
        e.put(&key(i), &[i as u8; 4096]).unwrap();
    }
    let before = e.space_use();
    dev.set_closed(true);
    let ckpt = {
        let e = e.clone();
        std::thread::Builder::new()
            .name("checkpointing".into())
            .spawn(move || e.checkpoint().unwrap())
            .unwrap()
    };
    dev.wait_for_held();
    let during = e.space_use();
    dev.set_closed(false);
    ckpt.join().unwrap();
    let after = e.space_use();
    eprintln!(
        "used before {:.2} MiB, during a node write {:.2} MiB ({:.2} MiB being written), after \
         {:.2} MiB",
        before.used() as f64 / MIB as f64,
        during.used() as f64 / MIB as f64,
        during.writing as f64 / MIB as f64,
        after.used() as f64 / MIB as f64,
    );
    assert!(during.writing > 0, "no image was being written");
    let slack = 4 * 4096 + before.table;
    assert!(
        during.used() <= before.used() + slack && during.used() + slack >= after.used(),
        "used {} bytes before the checkpoint, {} during a node write, {} after",
        before.used(),
        during.used(),
        after.used()
    );
    assert_eq!(after.writing, 0);
    let e = Arc::try_unwrap(e)
        .ok()
        .expect("the checkpoint thread is done");
    e.close().unwrap();
}

/// With the checkpointer held at its first node write, writers go on past half the log (each
/// asks for a checkpoint); once the held checkpoint completes, the log is nearly empty and the
/// checkpointer drops those requests instead of writing a second checkpoint.
#[test]
fn requests_a_running_checkpoint_satisfied_do_not_start_another() {
    let log_size = 16 * MIB;
    // Blocks 0 and 1 are the superblocks, then the log; past it, the data area.
    let data_start = 2 * 4096 + log_size;
    let dev = Arc::new(GatedDevice::new(
        "amaranth-ckpt",
        Hold::WritesFrom(data_start),
    ));
    let format = Format {
        log_size: Some(log_size),
        ..Format::default()
    };
    let options = Options {
        background_threads: true,
        checkpoint_interval: Duration::from_secs(3600),
        ..Options::default()
    };
    let e = Engine::create(dev.clone(), format, options).unwrap();
    let c0 = e.stats().checkpoints;
    dev.set_closed(true);
    let mut i = 0;
    let mut put_until = |e: &Engine, log_used: u64| {
        while e.stats().log.used <= log_used {
            e.put(&key(i), &[i as u8; 4096]).unwrap();
            i += 1;
        }
    };
    // Past half the log: the checkpointer starts and stops at its first node write.
    put_until(&e, log_size / 2 + 64 * 1024);
    dev.wait_for_held();
    // Writers go on (under three quarters, where they would wait), asking for a checkpoint at
    // each write.
    put_until(&e, log_size / 2 + 2 * MIB);
    let dropped0 = e.stats().checkpoint_requests_dropped;
    dev.set_closed(false);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let s = e.stats();
        if s.checkpoints >= c0 + 2 || s.checkpoint_requests_dropped > dropped0 {
            break;
        }
        assert!(Instant::now() < deadline, "the checkpoint did not complete");
        std::thread::sleep(Duration::from_millis(10));
    }
    let s = e.stats();
    eprintln!(
        "checkpoints {} -> {}, requests dropped {dropped0} -> {}, log used {:.1} MiB of {} MiB",
        c0,
        s.checkpoints,
        s.checkpoint_requests_dropped,
        s.log.used as f64 / MIB as f64,
        log_size / MIB
    );
    assert_eq!(
        s.checkpoints,
        c0 + 1,
        "a second checkpoint followed the one the log's fill started"
    );
    assert!(s.log.used <= log_size / 2);
    e.close().unwrap();
}
