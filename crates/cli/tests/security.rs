//! Nothing a user does reaches another user's files (issue 16): the run directory, the daemon's
//! log and pid files, the control socket and `install-helper`, attacked the way another local user
//! could.
//!
//! - `a_run_directory_that_is_not_private_is_refused`: a user without `XDG_RUNTIME_DIR` mounts
//!   while `/tmp/amaranth-<uid>` was made by another user (with the log planted as a link to the
//!   victim's file), is a link to another directory, or is the user's own but writable by others:
//!   every mount is refused with a clear error and the victim's file is untouched;
//! - `planted_links_at_log_and_pid_files_are_refused`: root mounts with `--log-file`/`--pid-file`
//!   naming a symbolic link, a hard link or a FIFO: refused before anything is written through it;
//! - `only_the_owner_and_root_reach_the_control_socket`: another user gets nothing from the
//!   socket, even when the run directory and the socket are opened to everyone;
//! - `install_helper_writes_no_foreign_files`: a directory others can write into is refused, and a
//!   stale link at the temporary name does not redirect the copy.
//!
//! They run as root and act as other users through spare user ids (no account needed).

mod support;

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use support::*;

/// Two user ids that no account has, distinct for each test process.
fn spare_uids() -> (u32, u32) {
    let base = 3_000_000 + (std::process::id() % 400_000) * 2;
    let passwd = fs::read_to_string("/etc/passwd").unwrap_or_default();
    for uid in [base, base + 1] {
        assert!(
            !passwd
                .lines()
                .any(|l| l.split(':').nth(2) == Some(&uid.to_string())),
            "uid {uid} has an account"
        );
    }
    (base, base + 1)
}

/// Removes a path (a directory tree or a link) when dropped.
struct Remove(PathBuf);

impl Drop for Remove {
    fn drop(&mut self) {
        match fs::symlink_metadata(&self.0) {
            Ok(m) if m.is_dir() => {
                let _ = fs::remove_dir_all(&self.0);
            }
            Ok(_) => {
                let _ = fs::remove_file(&self.0);
            }
            Err(_) => {}
        }
    }
}

/// Detaches a mount that an attack made succeed (the daemon then exits), when dropped.
struct Detach(PathBuf);

impl Drop for Detach {
    fn drop(&mut self) {
        detach(&self.0);
    }
}

fn show(what: &str, out: &Output) -> String {
    let text = format!(
        "{what} -> {:?}\n  stdout: {}\n  stderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout).trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    eprintln!("{text}");
    text
}

fn chown(p: &Path, uid: u32) {
    std::os::unix::fs::lchown(p, Some(uid), Some(uid)).unwrap();
}

fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

/// `amaranth ARGS` as user `uid`, in a session without `XDG_RUNTIME_DIR` or `AMARANTH_RUN_DIR`.
fn amaranth_as(uid: u32, args: &[&OsStr]) -> Output {
    let mut c = Command::new(BIN);
    c.args(args)
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("AMARANTH_RUN_DIR")
        .uid(uid)
        .gid(uid);
    c.output().unwrap()
}

#[test]
fn a_run_directory_that_is_not_private_is_refused() {
    if !mount_env_ok() {
        return;
    }
    let _serial = serial();
    let (victim, attacker) = spare_uids();
    let s = Scratch::new("rundir");
    let img = s.mkfs("fs.img", "128M");
    let mp = s.path("mnt");
    fs::create_dir(&mp).unwrap();
    for p in [&s.dir, &img, &mp] {
        chown(p, victim);
    }
    // The victim's file that a planted link points at.
    let precious = s.path("precious");
    fs::write(&precious, "the victim's data\n").unwrap();
    chown(&precious, victim);
    chmod(&precious, 0o600);
    let run_dir = PathBuf::from(format!("/tmp/amaranth-{victim}"));
    let _gone = Remove(run_dir.clone());
    let elsewhere = s.path("attacker-dir");
    let cases: [(&str, &str); 3] = [
        ("owned by the attacker, log planted", "owned by uid"),
        ("a link to the attacker's directory", "symbolic link"),
        (
            "the victim's, writable by others, log planted",
            "others can write",
        ),
    ];
    for (case, expected) in cases {
        let _ = fs::remove_dir_all(&run_dir);
        let _ = fs::remove_file(&run_dir);
        let _ = fs::remove_dir_all(&elsewhere);
        let planted_in = if case.starts_with("a link") {
            fs::create_dir(&elsewhere).unwrap();
            chown(&elsewhere, attacker);
            std::os::unix::fs::symlink(&elsewhere, &run_dir).unwrap();
            chown(&run_dir, attacker);
            elsewhere.clone()
        } else {
            fs::create_dir(&run_dir).unwrap();
            let owner = if case.starts_with("owned") {
                attacker
            } else {
                victim
            };
            chown(&run_dir, owner);
            run_dir.clone()
        };
        chmod(&planted_in, 0o777);
        // Every name the daemon could write, as a link to the victim's file.
        let name = mp.to_str().unwrap()[1..]
            .replace('-', "%2D")
            .replace('/', "-");
        for ext in ["log", "pid", "sock"] {
            let link = planted_in.join(format!("{name}.{ext}"));
            std::os::unix::fs::symlink(&precious, &link).unwrap();
            chown(&link, attacker);
        }
        let out = amaranth_as(
            victim,
            &[OsStr::new("mount"), img.as_os_str(), mp.as_os_str()],
        );
        let _undo = Detach(mp.clone());
        let text = show(
            &format!("mount as uid {victim}, run directory {case}"),
            &out,
        );
        assert_eq!(
            fs::read_to_string(&precious).unwrap(),
            "the victim's data\n",
            "{case}: the daemon wrote into the victim's file"
        );
        let left: Vec<_> = fs::read_dir(&planted_in)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left.len(), 3, "{case}: files appeared: {left:?}");
        assert!(!out.status.success(), "{case}: the mount was not refused");
        assert!(!is_mounted(&mp), "{case}: mounted");
        assert!(
            text.contains("refusing to use the run directory") && text.contains(expected),
            "{case}: the refusal does not say why ({expected:?})"
        );
    }
}

#[test]
fn planted_links_at_log_and_pid_files_are_refused() {
    if !mount_env_ok() {
        return;
    }
    let _serial = serial();
    let s = Scratch::new("planted");
    let img = s.mkfs("fs.img", "128M");
    let mp = s.path("mnt");
    fs::create_dir(&mp).unwrap();
    let target = s.path("root-owned-file");
    let original = "root's data\n";
    let fifo = s.path("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
    let symlink = s.path("link");
    let dangling = s.path("dangling");
    let hardlink = s.path("hardlink");
    let missing = s.path("created-through-the-link");
    std::os::unix::fs::symlink(&target, &symlink).unwrap();
    std::os::unix::fs::symlink(&missing, &dangling).unwrap();
    for opt in ["--log-file", "--pid-file"] {
        for (path, why) in [
            (&symlink, "symbolic link"),
            (&dangling, "symbolic link"),
            (&hardlink, "hard links"),
            (&fifo, "not a regular file"),
        ] {
            fs::write(&target, original).unwrap();
            let _ = fs::remove_file(&hardlink);
            fs::hard_link(&target, &hardlink).unwrap();
            let out = s.run(&[
                OsStr::new("mount"),
                img.as_os_str(),
                mp.as_os_str(),
                OsStr::new(opt),
                path.as_os_str(),
            ]);
            let _undo = Detach(mp.clone());
            let text = show(&format!("mount {opt} {}", path.display()), &out);
            assert!(
                !out.status.success(),
                "{opt} {}: not refused",
                path.display()
            );
            assert!(
                text.contains(why),
                "{opt} {}: says why ({why})",
                path.display()
            );
            assert!(!is_mounted(&mp));
            assert_eq!(
                fs::read_to_string(&target).unwrap(),
                original,
                "written through"
            );
            assert!(
                !missing.exists(),
                "a file was created through a dangling link"
            );
        }
    }
}

#[test]
fn only_the_owner_and_root_reach_the_control_socket() {
    if !mount_env_ok() {
        return;
    }
    let _serial = serial();
    let (other, _) = spare_uids();
    let s = Scratch::new("socket");
    let img = s.mkfs("fs.img", "128M");
    let m = s.mount(&img, "mnt", &MountOpts::default());
    let run = s.path("run");
    let sock = fs::read_dir(&run)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension() == Some(OsStr::new("sock")))
        .expect("a control socket");
    let modes = [&run, &sock].map(|p| fs::metadata(p).unwrap().mode() & 0o777);
    // Another user's `amaranth stat` cannot reach it.
    let mut c = s.amaranth();
    c.args([OsStr::new("stat"), m.mp.as_os_str(), OsStr::new("--json")])
        .uid(other)
        .gid(other);
    let out = c.output().unwrap();
    show(&format!("stat as uid {other}"), &out);
    assert!(!out.status.success(), "another user read the statistics");
    assert!(out.stdout.is_empty());
    // Even with the directory and the socket opened to everyone, the daemon answers nothing.
    chmod(&run, 0o755);
    chmod(&sock, 0o777);
    let script = "import os, socket, sys\n\
                  d = os.open(sys.argv[1], os.O_RDONLY)\n\
                  s = socket.socket(socket.AF_UNIX)\n\
                  s.connect('/proc/self/fd/%d/%s' % (d, sys.argv[2]))\n\
                  data = b''\n\
                  while True:\n\
                  \x20   b = s.recv(65536)\n\
                  \x20   if not b: break\n\
                  \x20   data += b\n\
                  print(len(data))\n";
    let name = sock.file_name().unwrap();
    let read_as = |uid: u32| -> usize {
        let out = Command::new("python3")
            .args([OsStr::new("-c"), OsStr::new(script), run.as_os_str(), name])
            .uid(uid)
            .gid(uid)
            .output()
            .unwrap();
        show(&format!("connect as uid {uid}"), &out);
        assert!(out.status.success(), "the client failed");
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    };
    assert_eq!(read_as(other), 0, "the daemon answered uid {other}");
    assert!(read_as(0) > 100, "root is answered");
    assert!(
        m.session_log()
            .contains(&format!("refused a connection from uid {other}")),
        "the refusal is logged"
    );
    // The file layers: a private directory and a socket only its owner may open.
    assert_eq!(
        modes,
        [0o700, 0o600],
        "modes of the run directory and the socket"
    );
    chmod(&run, 0o700);
    let out = s.run(&[OsStr::new("stat"), m.mp.as_os_str(), OsStr::new("--json")]);
    assert!(out.status.success(), "the owner (root) is answered");
    s.finish(m);
}

#[test]
fn install_helper_writes_no_foreign_files() {
    if !mount_env_ok() {
        return;
    }
    let s = Scratch::new("install");
    let bin = s.path("bin");
    let sbin = s.path("sbin");
    fs::create_dir(&bin).unwrap();
    fs::create_dir(&sbin).unwrap();
    let install = |bin: &Path| {
        s.run(&[
            OsStr::new("install-helper"),
            OsStr::new("--bin-dir"),
            bin.as_os_str(),
            OsStr::new("--sbin-dir"),
            sbin.as_os_str(),
        ])
    };
    // A directory that others can write into: they could replace what root runs.
    chmod(&bin, 0o777);
    let out = install(&bin);
    let text = show("install-helper into a 0777 directory", &out);
    assert!(
        !out.status.success(),
        "installed into a world-writable directory"
    );
    assert!(text.contains("others can write"), "says why");
    assert!(!bin.join("amaranth").exists());
    // A stale link at the temporary name: the copy does not go through it.
    chmod(&bin, 0o755);
    let target = s.path("precious");
    fs::write(&target, "root's data\n").unwrap();
    std::os::unix::fs::symlink(&target, bin.join(".amaranth.new")).unwrap();
    let out = install(&bin);
    show("install-helper with a link at the temporary name", &out);
    assert!(out.status.success(), "install-helper failed");
    assert_eq!(fs::read_to_string(&target).unwrap(), "root's data\n");
    let installed = fs::symlink_metadata(bin.join("amaranth")).unwrap();
    assert!(installed.is_file(), "the binary is a regular file");
    assert_eq!(installed.mode() & 0o777, 0o755);
    assert_eq!(installed.len(), fs::metadata(BIN).unwrap().len());
    assert_eq!(
        fs::read_link(sbin.join("mount.fuse.amaranth")).unwrap(),
        bin.join("amaranth")
    );
}
