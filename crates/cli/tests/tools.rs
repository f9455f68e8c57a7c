//! The tools cannot hurt (issue 16): what `mkfs`, `stat` and `fsck` do with input that would
//! otherwise lose data, fill the host or panic.
//!
//! - `mkfs_refuses_to_overwrite_without_force`: an ext4 image file, an ext4 block device (a loop
//!   device), an Amaranth image and a file of other data are refused in one line naming --force and
//!   left as they were; a file of zeros and anything with --force are made;
//! - `mkfs_checks_host_space_and_leaves_nothing_when_it_fails`: `--size 1P` parses and is refused
//!   for the host's free space (at once, nothing left behind); on a nearly full host (a tiny tmpfs)
//!   a forced mkfs fails on ENOSPC and removes the file it created;
//! - `mkfs_makes_a_sparse_private_image`: `--size 8G` allocates almost nothing, mode 0600; a
//!   dangling link at the image path is not followed, and in a directory others can write into a
//!   link, a hard link or another user's file at the image path is refused, even with --force;
//! - `a_full_host_file_system_is_an_io_error_without_damage`: a sparse image on a host file system
//!   that fills up: writes fail with an error (never a hang or a crash), and once the host has room
//!   again everything synced before is there and fsck is clean;
//! - `odd_input_never_panics`: arguments that are not UTF-8, sizes at and beyond 64 bits, zero and
//!   huge node, cache and thread counts, empty and special paths, broken mount-helper argument
//!   lists: each gets an error (or works), never a panic;
//! - `closed_output_pipes_never_panic`: `amaranth stat MOUNT | head` and friends: a closed stdout or
//!   stderr ends the output, not the command (no panic, the command's own exit code).

mod support;

use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use support::*;

fn stderr_of(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The first MiB of a file, to see that a refused mkfs left it alone.
fn head(p: &Path) -> Vec<u8> {
    let mut v = Vec::new();
    File::open(p)
        .unwrap()
        .take(1 << 20)
        .read_to_end(&mut v)
        .unwrap();
    v
}

/// `mkfs IMAGE [ARGS]`.
fn mkfs(s: &Scratch, image: &Path, args: &[&str]) -> Output {
    let mut v = vec![OsStr::new("mkfs"), image.as_os_str()];
    v.extend(args.iter().map(OsStr::new));
    s.run(&v)
}

/// Asserts that mkfs refused, in one line that names --force and `what`.
fn assert_refused(o: &Output, what: &str) {
    let err = stderr_of(o);
    assert_eq!(o.status.code(), Some(1), "mkfs was not refused: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("amaranth:")).collect();
    assert_eq!(lines.len(), 1, "one line of error: {err}");
    assert!(lines[0].contains("--force"), "names --force: {err}");
    assert!(lines[0].contains(what), "says {what:?}: {err}");
}

/// A tmpfs mounted on a new directory; unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn new(dir: PathBuf, size: &str) -> Tmpfs {
        fs::create_dir_all(&dir).unwrap();
        let t = Tmpfs(dir);
        sh_ok(&format!(
            "mount -t tmpfs -o size={size},mode=0755 tmpfs {}",
            q(&t.0)
        ));
        t
    }
    fn resize(&self, size: &str) {
        sh_ok(&format!("mount -o remount,size={size} {}", q(&self.0)));
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        detach(&self.0);
    }
}

/// A loop device over an image file; detached when dropped.
struct Loop(String);

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).output();
    }
}

#[test]
fn mkfs_refuses_to_overwrite_without_force() {
    if !mount_env_ok() {
        return;
    }
    let s = Scratch::new("mkfs-force");
    // An ext4 image file.
    let ext4 = s.path("ext4.img");
    sh_ok(&format!(
        "truncate -s 128M {0} && mkfs.ext4 -q -F {0}",
        q(&ext4)
    ));
    let before = head(&ext4);
    for args in [&[][..], &["--size", "128M"][..]] {
        assert_refused(&mkfs(&s, &ext4, args), "ext4");
        assert_eq!(head(&ext4), before, "the refused mkfs changed the image");
    }
    // The same as a block device.
    let dev = sh_ok(&format!("losetup --find --show {}", q(&ext4)));
    let lo = Loop(dev.trim().to_string());
    assert_refused(&mkfs(&s, Path::new(&lo.0), &[]), "ext4");
    drop(lo);
    assert_eq!(head(&ext4), before, "the refused mkfs changed the device");
    // An Amaranth image, and other data.
    let ours = s.mkfs("ours.img", "128M");
    assert_refused(&mkfs(&s, &ours, &["--size", "128M"]), "Amaranth");
    s.assert_fsck_clean(&ours);
    let data = s.path("data.img");
    fs::write(&data, vec![0x5a; 200 << 20]).unwrap();
    assert_refused(&mkfs(&s, &data, &[]), "data");
    assert_eq!(fs::metadata(&data).unwrap().len(), 200 << 20);
    // Zeros hold nothing: made without --force; the rest with --force.
    let zeros = s.path("zeros.img");
    sh_ok(&format!("truncate -s 128M {}", q(&zeros)));
    for (img, args) in [
        (&zeros, &[][..]),
        (&ext4, &["--force"][..]),
        (&data, &["--force", "--size", "128M"][..]),
    ] {
        let o = mkfs(&s, img, args);
        assert_eq!(o.status.code(), Some(0), "mkfs {args:?}: {}", stderr_of(&o));
        s.assert_fsck_clean(img);
    }
}

#[test]
fn mkfs_checks_host_space_and_leaves_nothing_when_it_fails() {
    if !mount_env_ok() {
        return;
    }
    let s = Scratch::new("mkfs-space");
    // 1P parses, and is more than this host has: refused before anything is made.
    let big = s.path("big.img");
    let o = mkfs(&s, &big, &["--size", "1P"]);
    let err = stderr_of(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("1 PiB") && err.contains("free"), "{err}");
    assert!(!big.exists(), "a refused mkfs left {}", big.display());
    // A nearly full host: refused, then forced: the engine's writes fail and the file goes.
    let host = Tmpfs::new(s.path("host"), "16k");
    let img = host.0.join("fs.img");
    let o = mkfs(&s, &img, &["--size", "128M"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr_of(&o).contains("free"), "{}", stderr_of(&o));
    assert!(!img.exists());
    let o = mkfs(&s, &img, &["--size", "128M", "--force"]);
    assert_eq!(o.status.code(), Some(1), "mkfs on a full host succeeded");
    assert!(!img.exists(), "a failed mkfs left {}", img.display());
    assert_eq!(fs::read_dir(&host.0).unwrap().count(), 0);
}

#[test]
fn mkfs_makes_a_sparse_private_image() {
    if !mount_env_ok() {
        return;
    }
    let s = Scratch::new("mkfs-sparse");
    let img = s.mkfs("fs.img", "8G");
    let m = fs::metadata(&img).unwrap();
    assert_eq!(m.len(), 8 << 30);
    // Its log (an 8 GiB image's is 256 MiB: a sixteenth of the image, at most 256 MiB) is
    // written at mkfs so that log writes allocate nothing on the host; the rest is a hole.
    let log = 256 << 20;
    assert!(
        m.blocks() * 512 >= log && m.blocks() * 512 < log + (1 << 20),
        "an 8 GiB image takes {} bytes of the host",
        m.blocks() * 512
    );
    assert_eq!(
        m.permissions().mode() & 0o777,
        0o600,
        "only its owner reads it"
    );
    s.assert_fsck_clean(&img);
    // A dangling link at the image path: not followed, nothing created where it points.
    let link = s.path("link.img");
    let target = s.path("made-through-the-link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let o = mkfs(&s, &link, &["--size", "128M"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr_of(&o));
    assert!(
        !target.exists(),
        "mkfs created a file through a dangling link"
    );
    // In a directory others can write into (like /tmp), what another user may have planted at the
    // image path is refused even with --force: a link, a hard link, a file of another user. The
    // victim is a file of zeros, which mkfs would otherwise take without asking.
    let shared = s.path("shared");
    fs::create_dir(&shared).unwrap();
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o1777)).unwrap();
    let victim = s.path("victim");
    sh_ok(&format!("truncate -s 128M {}", q(&victim)));
    let planted = shared.join("planted.img");
    let hard = shared.join("hard.img");
    let foreign = shared.join("foreign.img");
    std::os::unix::fs::symlink(&victim, &planted).unwrap();
    fs::hard_link(&victim, &hard).unwrap();
    sh_ok(&format!("truncate -s 128M {}", q(&foreign)));
    std::os::unix::fs::chown(&foreign, Some(65534), Some(65534)).unwrap();
    for (img, why) in [
        (&planted, "symbolic link"),
        (&hard, "hard links"),
        (&foreign, "belongs to uid 65534"),
    ] {
        for args in [&[][..], &["--force"][..]] {
            let o = mkfs(&s, img, args);
            assert_eq!(o.status.code(), Some(1), "{}", stderr_of(&o));
            assert!(stderr_of(&o).contains(why), "{}", stderr_of(&o));
        }
    }
    assert!(
        head(&victim).iter().all(|&b| b == 0),
        "the victim was written"
    );
    assert!(
        head(&foreign).iter().all(|&b| b == 0),
        "the foreign file was written"
    );
    // The user's own new image there is fine.
    let own = shared.join("own.img");
    assert_eq!(mkfs(&s, &own, &["--size", "128M"]).status.code(), Some(0));
}

#[test]
fn a_full_host_file_system_is_an_io_error_without_damage() {
    if !mount_env_ok() {
        return;
    }
    let _serial = serial();
    let s = Scratch::new("host-full");
    let host = Tmpfs::new(s.path("host"), "48M");
    let img = host.0.join("fs.img");
    let o = mkfs(&s, &img, &["--size", "256M", "--force"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
    let opts = MountOpts {
        cache_size: "64M".into(),
        ..MountOpts::default()
    };
    let m = s.mount(&img, "mnt", &opts);
    let chunk = |i: usize| pattern(i as u64, 1 << 20);
    let mut synced = 0;
    let err = loop {
        assert!(synced < 200, "200 MiB fit on a 48 MiB host");
        let r = File::create(m.p(&format!("f{synced}"))).and_then(|mut f| {
            f.write_all(&chunk(synced))?;
            f.sync_all()
        });
        match r {
            Ok(()) => synced += 1,
            Err(e) => break e,
        }
    };
    eprintln!("{synced} files synced, then: {err}");
    assert!(synced > 0, "nothing fit");
    let code = err.raw_os_error();
    assert!(
        matches!(code, Some(libc::EIO | libc::EROFS | libc::ENOSPC)),
        "the full host is an I/O error, not {err}"
    );
    // The daemon is alive and still serves what was written.
    assert!(alive(m.pid()), "the daemon died");
    assert_eq!(fs::read(m.p("f0")).unwrap(), chunk(0));
    let log = m.session_log();
    assert!(!log.contains("panicked"), "{log}");
    // Unmounting without room for a final checkpoint: the daemon still exits.
    let o = s.run(&[OsStr::new("umount"), m.mp.as_os_str()]);
    eprintln!("umount on a full host: {:?}", o.status);
    assert!(
        wait_gone(m.pid(), Duration::from_secs(60)),
        "the daemon hung"
    );
    drop(m);
    // With room again, the file system comes back with everything synced.
    host.resize("512M");
    s.assert_fsck_clean(&img);
    let m = s.mount(&img, "mnt", &opts);
    for i in 0..synced {
        assert_eq!(fs::read(m.p(&format!("f{i}"))).unwrap(), chunk(i), "f{i}");
    }
    fs::write(m.p("after"), b"room again").unwrap();
    s.finish(m);
}

/// A pipe whose reading end is already closed: writing to it fails with `EPIPE`.
fn closed_pipe() -> OwnedFd {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two fresh fds.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both fds are fresh and owned here.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(rd);
    wr
}

/// Which standard stream goes to a closed pipe.
#[derive(Clone, Copy, Debug)]
enum Closed {
    Stdout,
    Stderr,
}

/// Runs `amaranth ARGS` with stdout or stderr on a closed pipe.
fn run_into_closed_pipe(s: &Scratch, args: &[&OsStr], closed: Closed) -> Output {
    let mut c = s.amaranth();
    c.args(args);
    match closed {
        Closed::Stdout => c.stdout(Stdio::from(closed_pipe())).stderr(Stdio::piped()),
        Closed::Stderr => c.stderr(Stdio::from(closed_pipe())).stdout(Stdio::piped()),
    };
    let out = c.output().unwrap();
    eprintln!(
        "$ amaranth {args:?} ({closed:?} closed) -> {:?}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn assert_no_panic(out: &Output, what: &str) {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!text.contains("panicked"), "{what} panicked:\n{text}");
    assert_ne!(out.status.code(), Some(101), "{what} exited like a panic");
}

#[test]
fn closed_output_pipes_never_panic() {
    if !mount_env_ok() {
        return;
    }
    let _serial = serial();
    let s = Scratch::new("closed-pipes");
    let img = s.mkfs("fs.img", "256M");
    let img2 = s.path("fs2.img");
    let runs: Vec<(Vec<&OsStr>, Closed)> = vec![
        (vec![OsStr::new("stat"), img.as_os_str()], Closed::Stdout),
        (vec![OsStr::new("fsck"), img.as_os_str()], Closed::Stdout),
        (vec![OsStr::new("fsck"), img.as_os_str()], Closed::Stderr),
        (
            vec![
                OsStr::new("mkfs"),
                img2.as_os_str(),
                OsStr::new("--size"),
                OsStr::new("128M"),
            ],
            Closed::Stderr,
        ),
        (vec![OsStr::new("--help")], Closed::Stdout),
    ];
    for (args, closed) in runs {
        let out = run_into_closed_pipe(&s, &args, closed);
        assert_no_panic(&out, &format!("{args:?} with {closed:?} closed"));
        assert_eq!(out.status.code(), Some(0), "{args:?}: the work succeeded");
    }
    // The mkfs whose progress went nowhere still made a file system.
    s.assert_fsck_clean(&img2);
    // `amaranth stat MOUNT | head`.
    let m = s.mount(&img, "mnt", &MountOpts::default());
    for args in [
        vec![OsStr::new("stat"), m.mp.as_os_str()],
        vec![OsStr::new("stat"), m.mp.as_os_str(), OsStr::new("--json")],
    ] {
        let out = run_into_closed_pipe(&s, &args, Closed::Stdout);
        assert_no_panic(&out, "stat of a mount into a closed stdout");
        assert_eq!(out.status.code(), Some(0), "the report was ready: success");
    }
    s.finish(m);
}

#[test]
fn odd_input_never_panics() {
    if !mount_env_ok() {
        return;
    }
    use std::os::unix::ffi::OsStrExt;
    let s = Scratch::new("odd-input");
    let img = s.mkfs("fs.img", "128M");
    let mp = s.path("mnt");
    fs::create_dir(&mp).unwrap();
    let not_utf8 = OsStr::from_bytes(b"\xff\xfe");
    let bad_path = s.dir.join(not_utf8);
    let x = s.path("x.img");
    let (i, m, x) = (img.as_os_str(), mp.as_os_str(), x.as_os_str());
    let o = OsStr::new;
    let cases: Vec<Vec<&OsStr>> = vec![
        vec![o("mkfs"), o(""), o("--size"), o("1G")],
        vec![o("mkfs"), x, o("--size"), o("0")],
        vec![o("mkfs"), x, o("--size"), o("16E")],
        vec![o("mkfs"), x, o("--size"), o("15E")],
        vec![o("mkfs"), x, o("--size"), o("-1")],
        vec![
            o("mkfs"),
            x,
            o("--size"),
            o("128M"),
            o("--node-size"),
            o("0"),
        ],
        vec![
            o("mkfs"),
            x,
            o("--size"),
            o("128M"),
            o("--node-size"),
            o("15E"),
        ],
        vec![
            o("mkfs"),
            x,
            o("--size"),
            o("128M"),
            o("--compression"),
            not_utf8,
        ],
        vec![o("mkfs"), bad_path.as_os_str(), o("--size"), o("128M")],
        vec![o("mkfs"), o("/dev/null")],
        vec![o("mkfs"), o("/dev/zero"), o("--size"), o("1G")],
        vec![o("mkfs"), s.dir.as_os_str(), o("--size"), o("1G")],
        vec![o("mount"), i, m, o("--cache-size"), o("15E")],
        vec![o("mount"), i, m, o("--cache-size"), o("0")],
        vec![o("mount"), i, m, o("--threads"), o("0")],
        vec![o("mount"), i, m, o("--threads"), o("18446744073709551615")],
        vec![o("mount"), i, m, o("-o"), o("threads=-1")],
        vec![o("mount"), i, m, o("-o"), o("cache_size=")],
        vec![
            o("mount"),
            i,
            m,
            o("-o"),
            o("read_ahead_kb=99999999999999999999"),
        ],
        vec![o("mount"), i, m, o("-o"), o("=")],
        vec![o("mount"), i, m, o("-o"), not_utf8],
        vec![o("mount"), o(""), o("")],
        vec![o("mount"), i, o("/")],
        vec![o("mount"), i, i],
        vec![o("mount"), o("/dev/null"), m],
        vec![o("mount"), i, bad_path.as_os_str()],
        vec![o("umount"), o("")],
        vec![
            o("umount"),
            o("/"),
            o("--timeout"),
            o("18446744073709551615"),
        ],
        vec![o("stat"), o("")],
        vec![o("stat"), o("/")],
        vec![o("stat"), o("/dev/zero")],
        vec![o("stat"), bad_path.as_os_str()],
        vec![o("fsck"), o("")],
        vec![o("fsck"), o("/dev/null")],
        vec![o("fsck"), o("/dev/zero")],
        vec![o("mount-helper")],
        vec![o("mount-helper"), i],
        vec![o("mount-helper"), i, m, o("-o")],
        vec![
            o("mount-helper"),
            i,
            bad_path.as_os_str(),
            o("-o"),
            not_utf8,
        ],
        vec![o("mount-helper"), o("-x"), i, m],
        vec![not_utf8],
    ];
    for args in cases {
        let out = s.run(&args);
        if is_mounted(&mp) {
            detach(&mp);
            panic!("{args:?} mounted");
        }
        assert_no_panic(&out, &format!("{args:?}"));
        assert!(
            // 16: fsck's usage error; 32: mount(8)'s failed mount (the mount helper).
            matches!(out.status.code(), Some(0 | 1 | 2 | 8 | 16 | 32)),
            "{args:?}: an exit code of ours, not {:?}",
            out.status
        );
    }
    // A name that is not UTF-8 is a name like any other; the first image is unharmed.
    s.assert_fsck_clean(&bad_path);
    s.assert_fsck_clean(&img);
}
