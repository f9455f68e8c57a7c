//! Operations that run concurrently under the shared namespace lock and change the used-inode
//! counter (the last release of files unlinked while open) must leave it exact: the checker finds
//! no `InodeCount` problem after many such releases from several threads at once.

mod common;

use std::sync::{Arc, Barrier};

use amaranth_device::MemDevice;
use amaranth_engine::{Engine, Options};
use amaranth_fs::{check, Ctx, Fs, ROOT_INO};
use common::{engine_options, format, fs_options};

#[test]
fn concurrent_last_releases_keep_the_inode_counter_exact() {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let engine = Engine::create(dev.clone(), format(), engine_options()).unwrap();
    Fs::mkfs(&engine, 0, 0).unwrap();
    let fs = Arc::new(Fs::new(Arc::new(engine), fs_options()).unwrap());
    let threads = 8;
    let rounds = 1000;
    for round in 0..rounds {
        // Every thread holds a file that is unlinked while open...
        let mut held = Vec::new();
        for t in 0..threads {
            let name = format!("r{round}-t{t}");
            let (i, fh) = fs
                .create(
                    ROOT_INO,
                    name.as_bytes(),
                    0o644,
                    libc::O_RDWR,
                    Ctx::default(),
                )
                .unwrap();
            fs.write(i.ino, fh, 0, b"data", false).unwrap();
            fs.unlink(ROOT_INO, name.as_bytes()).unwrap();
            held.push((i.ino, fh));
        }
        // ...and all close them at once: the deletions race.
        let go = Arc::new(Barrier::new(threads));
        let hs: Vec<_> = held
            .into_iter()
            .map(|(ino, fh)| {
                let (fs, go) = (fs.clone(), go.clone());
                std::thread::spawn(move || {
                    go.wait();
                    fs.release(ino, fh).unwrap();
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
    }
    let engine = Arc::try_unwrap(fs)
        .ok()
        .expect("sole owner")
        .engine()
        .clone();
    Arc::try_unwrap(engine)
        .ok()
        .expect("sole engine owner")
        .close()
        .unwrap();
    let ro = Options {
        read_only: true,
        ..engine_options()
    };
    let engine = Engine::open(dev, ro).unwrap();
    let report = check::check(&engine, false, |_| {});
    assert_eq!(report.exit_code(), 0, "checker: {report:?}");
}
