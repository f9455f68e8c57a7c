//! Who writes the log buffer once it is past its write threshold: with the background threads,
//! the log thread, so that the writer whose record crossed the threshold does not wait for the
//! device (a write of ~1 MiB that took milliseconds in the request of one caller in ~250 4 KiB
//! writes); the writer itself only when the buffer grows far past it (4 MiB in these tests' 64 MiB
//! log; at most a sixteenth of the log), and always without the background threads.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use amaranth_device::{BlockDevice, IoStats, MemDevice};
use amaranth_engine::{Engine, Format, Options};
use parking_lot::{Condvar, Mutex};

/// A memory device whose writes wait while the gate is closed; it counts the writes made by the
/// putting thread (named [`PUTTER`]) that had to wait.
struct GatedDevice {
    inner: MemDevice,
    closed: Mutex<bool>,
    opened: Condvar,
    putter_waits: AtomicU64,
}

const PUTTER: &str = "putter";

impl GatedDevice {
    fn new() -> GatedDevice {
        GatedDevice {
            inner: MemDevice::new(320 << 20),
            closed: Mutex::new(false),
            opened: Condvar::new(),
            putter_waits: AtomicU64::new(0),
        }
    }
    fn set_closed(&self, closed: bool) {
        *self.closed.lock() = closed;
        self.opened.notify_all();
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
        let mut c = self.closed.lock();
        if *c && std::thread::current().name() == Some(PUTTER) {
            self.putter_waits.fetch_add(1, Ordering::SeqCst);
        }
        while *c {
            self.opened.wait(&mut c);
        }
        drop(c);
        self.inner.write_at(offset, buf)
    }
    fn flush(&self) -> io::Result<()> {
        self.inner.flush()
    }
    fn describe(&self) -> String {
        "gated memory device".into()
    }
    fn io_stats(&self) -> IoStats {
        self.inner.io_stats()
    }
}

fn format() -> Format {
    Format {
        log_size: Some(64 << 20),
        ..Format::default()
    }
}

fn options(background_threads: bool) -> Options {
    Options {
        background_threads,
        // No periodic work during the test: only the threshold makes the log written.
        log_flush_interval: Duration::from_secs(3600),
        checkpoint_interval: Duration::from_secs(3600),
        ..Options::default()
    }
}

/// Puts `n` 4 KiB values (keys `k` + number) on another thread, counting those returned in
/// `returned`; the receiver gets `()` when all returned.
fn put_blocks(e: &Arc<Engine>, n: u32, returned: Arc<AtomicU64>) -> mpsc::Receiver<()> {
    let (tx, rx) = mpsc::channel();
    let e = e.clone();
    std::thread::Builder::new()
        .name(PUTTER.into())
        .spawn(move || {
            for i in 0..n {
                e.put(format!("k{i:06}").as_bytes(), &[i as u8; 4096])
                    .unwrap();
                returned.fetch_add(1, Ordering::SeqCst);
            }
            // Let go of the engine before saying so: the receiver then unwraps it.
            drop(e);
            let _ = tx.send(());
        })
        .unwrap();
    rx
}

#[test]
fn writers_past_the_log_threshold_do_not_wait_for_the_log_write() {
    let dev = Arc::new(GatedDevice::new());
    let e = Arc::new(Engine::create(dev.clone(), format(), options(true)).unwrap());
    let written0 = e.stats().log.bytes_written;
    // The device stops taking writes: 2 MiB of puts (past the 1 MiB threshold, within the
    // backstop) must still return, the log write being the log thread's.
    dev.set_closed(true);
    let done = put_blocks(&e, 512, Arc::new(AtomicU64::new(0)));
    let returned = done.recv_timeout(Duration::from_secs(60)).is_ok();
    dev.set_closed(false);
    assert!(
        returned && dev.putter_waits.load(Ordering::SeqCst) == 0,
        "a put waited for the device: the writer wrote the log buffer itself"
    );
    // The log thread writes it once the device takes writes again.
    let mut written = e.stats().log.bytes_written;
    for _ in 0..600 {
        if written > written0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        written = e.stats().log.bytes_written;
    }
    assert!(
        written > written0 + (1 << 20),
        "the log thread did not write the buffer ({written0} -> {written} bytes)"
    );
    let e = Arc::try_unwrap(e).ok().expect("the put thread is done");
    e.close().unwrap();
    let e = Engine::open(dev.clone(), options(true)).unwrap();
    for i in [0u32, 255, 511] {
        let v = e
            .get(format!("k{i:06}").as_bytes())
            .unwrap()
            .expect("value");
        assert_eq!(v, vec![i as u8; 4096]);
    }
    e.close().unwrap();
}

#[test]
fn without_background_threads_the_writer_writes_the_log_past_the_threshold() {
    let dev = Arc::new(MemDevice::new(320 << 20));
    let e = Engine::create(dev.clone(), format(), options(false)).unwrap();
    let written0 = e.stats().log.bytes_written;
    for i in 0..512u32 {
        e.put(format!("k{i:06}").as_bytes(), &[i as u8; 4096])
            .unwrap();
    }
    let written = e.stats().log.bytes_written;
    assert!(
        written > written0 + (1 << 20),
        "the writer did not write the log buffer ({written0} -> {written} bytes)"
    );
    e.close().unwrap();
}

/// With the device closed, `puts` puts of 4 KiB on a log of `log_size` bytes: how many returned
/// before the puts stopped (no put returned for 2 s), or `None` if all of them did. The device is
/// opened again and the engine closed before returning.
fn puts_before_blocking(log_size: u64, puts: u32) -> Option<u64> {
    let dev = Arc::new(GatedDevice::new());
    let format = Format {
        log_size: Some(log_size),
        ..Format::default()
    };
    let e = Arc::new(Engine::create(dev.clone(), format, options(true)).unwrap());
    dev.set_closed(true);
    let returned = Arc::new(AtomicU64::new(0));
    let done = put_blocks(&e, puts, returned.clone());
    let mut last = u64::MAX;
    let mut finished = false;
    for _ in 0..60 {
        std::thread::sleep(Duration::from_secs(2));
        finished = done.try_recv().is_ok();
        let now = returned.load(Ordering::SeqCst);
        if finished || now == last {
            break;
        }
        last = now;
    }
    let n = returned.load(Ordering::SeqCst);
    dev.set_closed(false);
    if !finished {
        done.recv_timeout(Duration::from_secs(120))
            .expect("the puts return once the device takes writes");
    }
    let e = Arc::try_unwrap(e).ok().expect("the put thread is done");
    e.close().unwrap();
    (!finished).then_some(n)
}

#[test]
fn a_log_buffer_far_past_the_threshold_is_written_by_the_writer() {
    // The log thread cannot write (the device is closed): it takes what the buffer holds when it
    // runs (from ~1 MiB, ~250 puts, up to the backstop when it runs late on a loaded machine) into
    // its chunk and waits; the buffer behind it grows until the backstop (4 MiB in a 64 MiB log:
    // ~1,000 puts of 4 KiB) makes a writer write it, and that writer waits for the device. So at
    // most about two backstops' worth of the 16 MiB of puts return (1,861 seen under load).
    let n = puts_before_blocking(64 << 20, 4096);
    assert!(
        n.is_some_and(|n| n <= 2 * 1024 + 8),
        "{n:?} puts of 4 KiB returned with the device closed: the log buffer is unbounded"
    );
}

#[test]
fn a_small_log_is_written_by_the_writer_at_the_threshold() {
    // A 16 MiB log: a buffer of the backstop plus a record (2 MiB) could take more than a quarter
    // of it, so the writer writes at the threshold (1 MiB: ~250 puts) itself, as before.
    let n = puts_before_blocking(16 << 20, 2048);
    assert!(
        n.is_some_and(|n| n < 400),
        "{n:?} puts of 4 KiB returned with the device closed on a 16 MiB log"
    );
}
