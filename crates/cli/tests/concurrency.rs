//! Many clients at once on a real mount, clients killed mid-write, the daemon stopped by SIGTERM
//! and SIGINT while clients still work, and a second mount of an image in use:
//!
//! - `many_clients_in_shared_and_private_directories`: 8 threads create, write, append, truncate,
//!   rename, link, unlink, list and fsync, each in its own directory (checked exactly against its
//!   own model) and in shared ones (names of their own, replace-via-rename of common files whose
//!   contents identify one complete writer, mkdir/rmdir races); everything is checked again after a
//!   clean unmount, fsck and remount;
//! - `killed_clients_leave_prefixes_and_others_continue`: `dd` clients SIGKILLed mid-write (their
//!   files hold a prefix of what they wrote) and a client killed while holding an unlinked file
//!   open, while four other clients keep working and are checked;
//! - `sigterm_and_sigint_stop_the_daemon_cleanly`: the signal arrives while clients hold files
//!   open and keep writing: the mount is detached, the daemon serves them until they close, then
//!   closes the engine cleanly; after a remount every acknowledged write is there (no fsync);
//! - `a_mounted_image_is_refused`: a second mount of the same image (also through a hard link),
//!   fsck and mkfs are refused while it is mounted; the first mount is unharmed.
//!
//! `amaranth fsck` must be clean after each.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{CString, OsStr};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use support::*;

const THREADS: u64 = 8;

/// Contents that say who wrote them: a 32-byte header (magic, writer, generation, length) and
/// bytes derived from those; `identify` recognises exactly such contents.
fn content(writer: u64, generation: u64, len: usize) -> Vec<u8> {
    let len = len.max(32);
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(b"AMARCONC");
    v.extend_from_slice(&writer.to_le_bytes());
    v.extend_from_slice(&generation.to_le_bytes());
    v.extend_from_slice(&(len as u64).to_le_bytes());
    v.extend_from_slice(&pattern(writer << 32 ^ generation, len - 32));
    v
}

/// The (writer, generation) of contents made by `content`, if they are complete and intact.
fn identify(b: &[u8]) -> Option<(u64, u64)> {
    if b.len() < 32 || &b[..8] != b"AMARCONC" {
        return None;
    }
    let word = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
    let (w, g, len) = (word(8), word(16), word(24));
    (len as usize == b.len() && content(w, g, b.len()) == b).then_some((w, g))
}

fn names(dir: &Path) -> BTreeSet<String> {
    fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// One client's view of what it owns: files in its private directory, and its own files in the
/// shared directory tree (relative to the mount).
#[derive(Default)]
struct Owned {
    private: BTreeMap<String, Vec<u8>>,
    shared: BTreeMap<String, Vec<u8>>,
}

/// One client's random workload; `ops` operations. Errors are test failures except where racing
/// clients make them legitimate (mkdir/rmdir of shared directories).
fn client(mp: &Path, t: u64, seed: u64, ops: usize, stop: &AtomicBool) -> (Owned, u64) {
    let mut rng = Rng::new(seed ^ t.wrapping_mul(0x9e37_79b9));
    let mut own = Owned::default();
    let pdir = mp.join(format!("p{t}"));
    fs::create_dir(&pdir).unwrap();
    let mut generation = 0u64;
    let mut done = 0;
    for i in 0..ops {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        done += 1;
        generation += 1;
        let pick = |rng: &mut Rng, m: &BTreeMap<String, Vec<u8>>| -> Option<String> {
            if m.is_empty() {
                None
            } else {
                let k = rng.below(m.len() as u64) as usize;
                m.keys().nth(k).cloned()
            }
        };
        match rng.below(20) {
            // Create (or replace) a private file.
            0..=2 => {
                let name = format!("f{}", rng.below(40));
                let data = content(t, generation, rng.range(0, 70_000) as usize);
                fs::write(pdir.join(&name), &data).unwrap();
                own.private.insert(name, data);
            }
            // Overwrite a range, append, truncate.
            3 => {
                if let Some(name) = pick(&mut rng, &own.private) {
                    let data = own.private.get_mut(&name).unwrap();
                    let off = rng.below(data.len() as u64 + 5000) as usize;
                    let n = rng.range(1, 9000) as usize;
                    let piece = rng.bytes(n);
                    let f = OpenOptions::new()
                        .write(true)
                        .open(pdir.join(&name))
                        .unwrap();
                    f.write_all_at(&piece, off as u64).unwrap();
                    if data.len() < off + piece.len() {
                        data.resize(off + piece.len(), 0);
                    }
                    data[off..off + piece.len()].copy_from_slice(&piece);
                }
            }
            4 => {
                if let Some(name) = pick(&mut rng, &own.private) {
                    let n = rng.range(1, 5000) as usize;
                    let piece = rng.bytes(n);
                    let mut f = OpenOptions::new()
                        .append(true)
                        .open(pdir.join(&name))
                        .unwrap();
                    f.write_all(&piece).unwrap();
                    own.private
                        .get_mut(&name)
                        .unwrap()
                        .extend_from_slice(&piece);
                }
            }
            5 => {
                if let Some(name) = pick(&mut rng, &own.private) {
                    let data = own.private.get_mut(&name).unwrap();
                    let len = rng.below(data.len() as u64 + 10_000) as usize;
                    OpenOptions::new()
                        .write(true)
                        .open(pdir.join(&name))
                        .unwrap()
                        .set_len(len as u64)
                        .unwrap();
                    data.resize(len, 0);
                }
            }
            // Rename within the private directory (possibly over another file).
            6 => {
                if let Some(name) = pick(&mut rng, &own.private) {
                    let to = format!("f{}", rng.below(40));
                    fs::rename(pdir.join(&name), pdir.join(&to)).unwrap();
                    let data = own.private.remove(&name).unwrap();
                    own.private.insert(to, data);
                }
            }
            7 => {
                if let Some(name) = pick(&mut rng, &own.private) {
                    fs::remove_file(pdir.join(&name)).unwrap();
                    own.private.remove(&name);
                }
            }
            // Read back and list: exact for a private directory.
            8 => {
                if let Some(name) = pick(&mut rng, &own.private) {
                    let got = fs::read(pdir.join(&name)).unwrap();
                    assert!(got == own.private[&name], "client {t}: p{t}/{name} differs");
                }
                let want: BTreeSet<String> = own.private.keys().cloned().collect();
                assert_eq!(names(&pdir), want, "client {t}: listing of p{t}");
            }
            // Own files in the shared directories.
            9 | 10 => {
                let dir = if rng.chance(0.5) {
                    "shared"
                } else {
                    "shared/sub"
                };
                let rel = format!("{dir}/t{t}-{i}");
                let data = content(t, generation, rng.range(0, 20_000) as usize);
                fs::write(mp.join(&rel), &data).unwrap();
                own.shared.insert(rel, data);
            }
            11 => {
                if let Some(rel) = pick(&mut rng, &own.shared) {
                    let base = rel.rsplit('/').next().unwrap().to_string();
                    let to = if rel.starts_with("shared/sub/") {
                        format!("shared/{base}")
                    } else {
                        format!("shared/sub/{base}")
                    };
                    fs::rename(mp.join(&rel), mp.join(&to)).unwrap();
                    let data = own.shared.remove(&rel).unwrap();
                    own.shared.insert(to, data);
                }
            }
            12 => {
                if let Some(rel) = pick(&mut rng, &own.shared) {
                    fs::remove_file(mp.join(&rel)).unwrap();
                    own.shared.remove(&rel);
                }
            }
            13 => {
                // The shared listing holds every own file and no removed one.
                let listed = names(&mp.join("shared"));
                let mine: BTreeSet<String> = listed
                    .iter()
                    .filter(|n| n.starts_with(&format!("t{t}-")))
                    .cloned()
                    .collect();
                let want: BTreeSet<String> = own
                    .shared
                    .keys()
                    .filter_map(|r| r.strip_prefix("shared/"))
                    .filter(|r| !r.contains('/'))
                    .map(str::to_string)
                    .collect();
                assert_eq!(mine, want, "client {t}: own names in shared/");
            }
            // Replace-via-rename of a common file; readers see one complete version.
            14 | 15 => {
                let k = rng.below(4);
                let tmp = mp.join(format!("shared/.tmp-{t}"));
                let data = content(t, generation, rng.range(100, 30_000) as usize);
                fs::write(&tmp, &data).unwrap();
                fs::rename(&tmp, mp.join(format!("shared/common-{k}"))).unwrap();
            }
            16 => {
                let k = rng.below(4);
                match fs::read(mp.join(format!("shared/common-{k}"))) {
                    Ok(b) => assert!(
                        identify(&b).is_some(),
                        "client {t}: shared/common-{k} is not one writer's complete contents \
                         ({} bytes)",
                        b.len()
                    ),
                    // Not made yet. A file replaced while a reader's path walk had resolved it
                    // lives until the kernel forgets it, so the reader gets the old contents
                    // (no ESTALE: the kernel opens files without asking the daemon).
                    Err(e) => assert_eq!(
                        e.raw_os_error(),
                        Some(libc::ENOENT),
                        "client {t}: shared/common-{k}: {e}"
                    ),
                }
            }
            // Racing mkdir/rmdir of shared directories.
            17 => {
                let d = mp.join(format!("shared/d{}", rng.below(3)));
                let r = if rng.chance(0.5) {
                    fs::create_dir(&d)
                } else {
                    fs::remove_dir(&d)
                };
                if let Err(e) = r {
                    assert!(
                        matches!(e.raw_os_error(), Some(libc::EEXIST | libc::ENOENT)),
                        "client {t}: mkdir/rmdir {}: {e}",
                        d.display()
                    );
                }
            }
            // A hard link into the shared directory, read through it, removed.
            18 => {
                if let Some(name) = pick(&mut rng, &own.private) {
                    let l = mp.join(format!("shared/t{t}-link"));
                    fs::hard_link(pdir.join(&name), &l).unwrap();
                    assert_eq!(fs::metadata(&l).unwrap().nlink(), 2);
                    assert!(fs::read(&l).unwrap() == own.private[&name]);
                    fs::remove_file(&l).unwrap();
                }
            }
            _ => {
                if let Some(name) = pick(&mut rng, &own.private) {
                    File::open(pdir.join(&name)).unwrap().sync_all().unwrap();
                }
            }
        }
    }
    (own, done)
}

/// Checks what a client owns against the mount: its private directory exactly, its shared files.
fn verify_owned(mp: &Path, t: u64, own: &Owned) {
    let pdir = mp.join(format!("p{t}"));
    let want: BTreeSet<String> = own.private.keys().cloned().collect();
    assert_eq!(names(&pdir), want, "listing of p{t}");
    for (name, data) in &own.private {
        assert!(
            fs::read(pdir.join(name)).unwrap() == *data,
            "p{t}/{name} differs"
        );
    }
    for dir in ["shared", "shared/sub"] {
        let mine: BTreeSet<String> = names(&mp.join(dir))
            .into_iter()
            .filter(|n| n.starts_with(&format!("t{t}-")))
            .map(|n| format!("{dir}/{n}"))
            .collect();
        let want: BTreeSet<String> = own
            .shared
            .keys()
            .filter(|r| r.rsplit_once('/').map(|x| x.0) == Some(dir))
            .cloned()
            .collect();
        assert_eq!(mine, want, "client {t}: own names in {dir}");
    }
    for (rel, data) in &own.shared {
        assert!(fs::read(mp.join(rel)).unwrap() == *data, "{rel} differs");
    }
}

fn verify_common(mp: &Path) {
    for k in 0..4 {
        if let Some(b) = read_opt(&mp.join(format!("shared/common-{k}"))) {
            assert!(identify(&b).is_some(), "shared/common-{k} is not intact");
        }
    }
    let left: Vec<String> = names(&mp.join("shared"))
        .into_iter()
        .filter(|n| n.starts_with(".tmp-"))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
}

#[test]
fn many_clients_in_shared_and_private_directories() {
    if !mount_env_ok() {
        return;
    }
    let _serial = serial();
    let t0 = Instant::now();
    let seed = seed("many clients");
    let s = Scratch::new("conc-clients");
    let img = s.mkfs("fs.img", "2G");
    let m = s.mount(&img, "mnt", &MountOpts::default());
    fs::create_dir_all(m.p("shared/sub")).unwrap();
    let stop = AtomicBool::new(false);
    let ops = 4000;
    let results: Vec<(Owned, u64)> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..THREADS)
            .map(|t| {
                let (mp, stop) = (&m.mp, &stop);
                sc.spawn(move || {
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        client(mp, t, seed, ops, stop)
                    }));
                    if r.is_err() {
                        // Stop the others: the test has failed already.
                        stop.store(true, Ordering::Relaxed);
                    }
                    r
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| match h.join().unwrap() {
                Ok(r) => r,
                Err(p) => std::panic::resume_unwind(p),
            })
            .collect()
    });
    let total: u64 = results.iter().map(|r| r.1).sum();
    let work = t0.elapsed();
    for (t, (own, _)) in results.iter().enumerate() {
        verify_owned(&m.mp, t as u64, own);
    }
    verify_common(&m.mp);
    let img = m.image.clone();
    s.finish(m);
    let m = s.mount(&img, "mnt", &MountOpts::default());
    for (t, (own, _)) in results.iter().enumerate() {
        verify_owned(&m.mp, t as u64, own);
    }
    verify_common(&m.mp);
    s.finish(m);
    report(&format!(
        "concurrency: {THREADS} clients, {total} operations in {:.1} s, verified before and after \
         a remount; total {:.1} s",
        work.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    ));
}

/// A file of `len` pattern bytes on the host (the source of the killed writers).
fn host_pattern(s: &Scratch, len: usize) -> (std::path::PathBuf, Vec<u8>) {
    let data = pattern(77, len);
    let p = s.path("pattern.bin");
    fs::write(&p, &data).unwrap();
    (p, data)
}

#[test]
fn killed_clients_leave_prefixes_and_others_continue() {
    if !mount_env_ok() {
        return;
    }
    let _serial = serial();
    let seed = seed("killed clients");
    let s = Scratch::new("conc-killed");
    let img = s.mkfs("fs.img", "2G");
    let m = s.mount(&img, "mnt", &MountOpts::default());
    fs::create_dir_all(m.p("shared/sub")).unwrap();
    let (src, data) = host_pattern(&s, 96 << 20);
    let stop = AtomicBool::new(false);
    let kills = AtomicU64::new(0);
    let sizes = Mutex::new(Vec::new());
    let results: Vec<(Owned, u64)> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..4u64)
            .map(|t| {
                let (mp, stop) = (&m.mp, &stop);
                sc.spawn(move || client(mp, t, seed, 100_000, stop))
            })
            .collect();
        let mut rng = Rng::new(seed);
        // Writers killed at random moments, one after the other.
        for k in 0..4 {
            let dst = m.p(&format!("killed-{k}"));
            let mut dd = Command::new("dd")
                .arg(format!("if={}", src.display()))
                .arg(format!("of={}", dst.display()))
                .args(["bs=256k", "status=none"])
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            std::thread::sleep(Duration::from_millis(rng.range(50, 600)));
            dd.kill().unwrap();
            dd.wait().unwrap();
            kills.fetch_add(1, Ordering::Relaxed);
        }
        // A client killed while it holds an unlinked file open and writes to it.
        let orphan = m.p("orphan");
        let mut holder = Command::new("bash")
            .arg("-c")
            .arg(format!(
                "exec 3>{o}; rm {o}; while :; do cat {src} >&3; done",
                o = q(&orphan),
                src = q(&src)
            ))
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(700));
        // The whole group: a `cat` that outlived bash would keep writing to the unlinked file
        // and keep the mount busy at the unmount below.
        // SAFETY: signals the process group this test started.
        unsafe {
            libc::kill(-(holder.id() as i32), libc::SIGKILL);
        }
        holder.wait().unwrap();
        kills.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(300));
        stop.store(true, Ordering::Relaxed);
        let r: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        for k in 0..4 {
            let got = fs::read(m.p(&format!("killed-{k}"))).unwrap();
            assert!(
                got[..] == data[..got.len()],
                "killed-{k}: {} bytes that are not a prefix of what dd wrote",
                got.len()
            );
            sizes.lock().unwrap().push(got.len() >> 20);
        }
        assert!(!orphan.exists());
        r
    });
    let total: u64 = results.iter().map(|r| r.1).sum();
    for (t, (own, _)) in results.iter().enumerate() {
        verify_owned(&m.mp, t as u64, own);
    }
    let img = m.image.clone();
    // fsck (in finish) is clean: the killed holder's unlinked file is gone, not an orphan.
    s.finish(m);
    let m = s.mount(&img, "mnt", &MountOpts::default());
    for (t, (own, _)) in results.iter().enumerate() {
        verify_owned(&m.mp, t as u64, own);
    }
    s.finish(m);
    report(&format!(
        "killed clients: {} kills (dd sizes at the kill {:?} MiB), {total} operations of 4 other \
         clients verified",
        kills.load(Ordering::Relaxed),
        sizes.lock().unwrap()
    ));
}

/// Files a client wrote and closed: names and contents.
type Acked = Vec<(String, Vec<u8>)>;

/// A client that works through a descriptor of the mount's root (so it keeps working on the
/// mount after a lazy detach): files `w<t>-<i>` written and closed; returns the acknowledged ones.
fn dirfd_client(root: &OwnedFd, t: u64, stop: &AtomicBool) -> Acked {
    let mut rng = Rng::new(t);
    let mut acked = Vec::new();
    for i in 0.. {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let name = format!("w{t}-{i}");
        let c = CString::new(name.clone()).unwrap();
        // SAFETY: a valid directory fd and name.
        let fd = unsafe {
            libc::openat(
                root.as_raw_fd(),
                c.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC,
                0o644,
            )
        };
        assert!(fd >= 0, "client {t}: create {name}: errno {}", errno());
        // SAFETY: fd was just opened.
        let mut f = unsafe { File::from_raw_fd(fd) };
        let data = content(t, i, rng.range(1, 200_000) as usize);
        f.write_all(&data).unwrap();
        drop(f);
        acked.push((name, data));
    }
    acked
}

#[test]
fn sigterm_and_sigint_stop_the_daemon_cleanly() {
    if !mount_env_ok() {
        return;
    }
    let _serial = serial();
    let s = Scratch::new("conc-signals");
    // Large writes go out of line at the device's speed: the clients of both rounds can write
    // several GB before the signal on a quiet machine (a 1 GiB image filled: ENOSPC in CI).
    let img = s.mkfs("fs.img", "8G");
    let mut lines = Vec::new();
    for (sig, what) in [(libc::SIGTERM, "SIGTERM"), (libc::SIGINT, "SIGINT")] {
        // An idle daemon stops at once.
        let m = s.mount(&img, "mnt", &MountOpts::default());
        fs::write(m.p(&format!("idle-{what}")), what).unwrap();
        let t = Instant::now();
        // SAFETY: signals the daemon this test mounted.
        unsafe {
            libc::kill(m.pid(), sig);
        }
        m.expect_clean_exit(Duration::from_secs(60));
        let idle = t.elapsed();
        s.assert_fsck_clean(&img);
        // A busy one: clients keep writing through descriptors after the signal.
        let m = s.mount(&img, "mnt", &MountOpts::default());
        let dir = m.p(what);
        fs::create_dir(&dir).unwrap();
        let stop = AtomicBool::new(false);
        let roots: Vec<OwnedFd> = (0..4).map(|_| File::open(&dir).unwrap().into()).collect();
        let (acked, after): (Vec<Acked>, usize) = std::thread::scope(|sc| {
            let hs: Vec<_> = roots
                .iter()
                .enumerate()
                .map(|(t, root)| {
                    let stop = &stop;
                    sc.spawn(move || dirfd_client(root, t as u64, stop))
                })
                .collect();
            std::thread::sleep(Duration::from_millis(800));
            let count = || fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
            let before = count();
            // SAFETY: signals the daemon this test mounted.
            unsafe {
                libc::kill(m.pid(), sig);
            }
            std::thread::sleep(Duration::from_millis(800));
            stop.store(true, Ordering::Relaxed);
            let acked: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
            let total: usize = acked.iter().map(Vec::len).sum();
            (acked, total - before.min(total))
        });
        drop(roots);
        // The last descriptor is closed: the daemon finishes and closes cleanly.
        m.expect_clean_exit(Duration::from_secs(120));
        s.assert_fsck_clean(&img);
        let m = s.mount(&img, "mnt", &MountOpts::default());
        assert_eq!(
            fs::read(m.p(&format!("idle-{what}"))).unwrap(),
            what.as_bytes()
        );
        let mut n = 0;
        for (name, data) in acked.iter().flatten() {
            let got = fs::read(m.p(&format!("{what}/{name}")))
                .unwrap_or_else(|e| panic!("{what}/{name} acknowledged before {what}: {e}"));
            assert!(got == *data, "{what}/{name} differs after {what}");
            n += 1;
        }
        assert_eq!(names(&m.p(what)).len(), n, "files nobody acknowledged");
        s.finish(m);
        lines.push(format!(
            "{what}: idle stop in {:.2} s; busy: {n} acknowledged files persisted, {after} of them \
             written after the signal (detached mount)",
            idle.as_secs_f64()
        ));
    }
    report(&format!("signals: {}", lines.join("; ")));
}

#[test]
fn a_mounted_image_is_refused() {
    if !mount_env_ok() {
        return;
    }
    let s = Scratch::new("conc-inuse");
    let img = s.mkfs("fs.img", "256M");
    let m = s.mount(&img, "mnt", &MountOpts::default());
    fs::write(m.p("kept"), b"first mount").unwrap();
    let linked = s.path("hardlink.img");
    fs::hard_link(&img, &linked).unwrap();
    for image in [&img, &linked] {
        let mp2 = s.path("mnt2");
        fs::create_dir_all(&mp2).unwrap();
        let out = s.run(&[OsStr::new("mount"), image.as_os_str(), mp2.as_os_str()]);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        let mounted = is_mounted(&mp2);
        if mounted {
            detach(&mp2);
        }
        assert!(
            !out.status.success(),
            "a second mount of {}",
            image.display()
        );
        assert!(!mounted, "mounted twice");
        assert!(
            err.contains("in use") || err.contains("already mounted"),
            "the refusal says why: {err}"
        );
        for cmd in [
            vec![OsStr::new("fsck"), image.as_os_str()],
            vec![
                OsStr::new("mkfs"),
                image.as_os_str(),
                OsStr::new("--size"),
                OsStr::new("256M"),
            ],
        ] {
            let out = s.run(&cmd);
            assert!(!out.status.success(), "{cmd:?} of an image in use");
            assert!(String::from_utf8_lossy(&out.stderr).contains("in use"));
        }
    }
    // The first mount is unharmed.
    assert_eq!(fs::read(m.p("kept")).unwrap(), b"first mount");
    fs::write(m.p("more"), b"still works").unwrap();
    let mut got = String::new();
    File::open(m.p("more"))
        .unwrap()
        .read_to_string(&mut got)
        .unwrap();
    assert_eq!(got, "still works");
    s.finish(m);
    // Free again: the hard link mounts.
    let m = s.mount(&linked, "mnt2", &MountOpts::default());
    assert_eq!(fs::read(m.p("kept")).unwrap(), b"first mount");
    s.finish(m);
}
