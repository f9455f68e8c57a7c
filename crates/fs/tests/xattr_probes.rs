//! The kernel asks for `security.capability` at every write to a file; a file with no extended
//! attributes at all is remembered as such after the first probe that finds none, so later probes
//! need no engine lookup. The mark never hides an attribute: probes racing `setxattr` and
//! `removexattr` of the same file from another thread, which must see its own attribute at once.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use amaranth_device::MemDevice;
use amaranth_engine::Engine;
use amaranth_fs::{Ctx, Errno, Fs, ROOT_INO};
use common::{close_and_check, engine_options, format, fs_options};

#[test]
fn probes_racing_setxattr_never_hide_an_attribute() {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let engine = Engine::create(dev.clone(), format(), engine_options()).unwrap();
    Fs::mkfs(&engine, 0, 0).unwrap();
    let fs = Arc::new(Fs::new(Arc::new(engine), fs_options()).unwrap());
    let i = fs
        .mknod(ROOT_INO, b"f", libc::S_IFREG | 0o644, 0, Ctx::default())
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let prober = {
        let (fs, stop) = (fs.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                assert_eq!(
                    fs.getxattr(i.ino, b"security.capability"),
                    Err(Errno::ENODATA)
                );
                n += 1;
            }
            n
        })
    };
    for round in 0..20_000u32 {
        let v = round.to_le_bytes();
        fs.setxattr(i.ino, b"user.k", &v, 0).unwrap();
        assert_eq!(
            fs.getxattr(i.ino, b"user.k"),
            Ok(v.to_vec()),
            "round {round}: the attribute just set"
        );
        assert_eq!(fs.listxattr(i.ino).unwrap(), b"user.k\0".to_vec());
        fs.removexattr(i.ino, b"user.k").unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let probes = prober.join().unwrap();
    eprintln!("{probes} probes beside the changes");
    assert!(probes > 1000, "the probes ran meanwhile");
    close_and_check(fs, dev, "xattr probes");
}
