//! An NFS export of a mount (issue 17), on loopback, in user space: NFS-Ganesha's VFS back end
//! serves the mount point (it keeps `name_to_handle_at` handles in its cache and opens them with
//! `open_by_handle_at`, as the kernel's NFS server would), and libnfs's command-line client
//! (`nfs-ls`, `nfs-cat`, `nfs-cp`) talks NFSv4 to it. Neither needs a kernel NFS module, rpcbind
//! or dbus. The client lists directories, reads files and writes files; then the kernel forgets
//! every inode nobody holds (`drop_caches`) and the reads must still work through the server's
//! cached handles; then the server stops, Amaranth remounts, the server starts again and
//! everything, the files written over NFS included, reads back.
//!
//! - `nfs_export_reads_and_writes_after_forgetting_and_remounting`.
//!
//! Needs `ganesha.nfsd`, its VFS back end and libnfs's tools (`scripts/install-deps.sh` installs
//! `nfs-ganesha`, `nfs-ganesha-vfs`, `libnfs-utils`).

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use support::{mount_env_ok, pattern, serial, wait_gone, MountOpts, Scratch};

/// The export's NFSv4 pseudo path.
const PSEUDO: &str = "/amaranth";

/// libnfs 4.0's NFSv4 client cannot encode a request of more than about 4 KiB (`ZDR error: Failed
/// to encode COMPOUND4args`, before anything is sent; a WRITE of 3,944 bytes fits on one export,
/// not on another whose file handles are longer): files written over NFS stay well below.
const NFS_WRITE_MAX: usize = 3000;

/// Panics with what to install when the NFS programs are missing (a test that cannot run must
/// not pass).
fn nfs_tools_ok() {
    let missing: Vec<&str> = ["ganesha.nfsd", "nfs-ls", "nfs-cat", "nfs-cp"]
        .into_iter()
        .filter(|p| {
            Command::new("sh")
                .args(["-c", &format!("command -v {p}")])
                .stdout(Stdio::null())
                .status()
                .map(|s| !s.success())
                .unwrap_or(true)
        })
        .collect();
    // /usr/lib/<multiarch triplet>/ganesha on Debian, /usr/lib64/ganesha elsewhere.
    let mut libs: Vec<PathBuf> = vec!["/usr/lib".into(), "/usr/lib64".into()];
    if let Ok(dirs) = fs::read_dir("/usr/lib") {
        libs.extend(dirs.flatten().map(|e| e.path()));
    }
    let vfs = libs
        .iter()
        .any(|d| d.join("ganesha/libfsalvfs.so").exists());
    assert!(
        missing.is_empty() && vfs,
        "the NFS export test needs {missing:?}{}: run scripts/install-deps.sh (nfs-ganesha, \
         nfs-ganesha-vfs, libnfs-utils)",
        if vfs {
            ""
        } else {
            " and ganesha's VFS back end"
        }
    );
}

/// A free TCP port on loopback (free when asked; the server binds it a moment later).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running `ganesha.nfsd` exporting one directory over NFSv4 on 127.0.0.1:`port`. Dropping it
/// stops it (SIGTERM, then SIGKILL), whatever happened.
struct Ganesha {
    child: Option<Child>,
    port: u16,
    log: PathBuf,
}

impl Ganesha {
    /// Writes the configuration under `dir` and starts the server in the foreground; returns
    /// once it accepts connections. A server that exits at start is tried again on another port
    /// (twice: the free port it was given can be taken in between).
    fn start(dir: &Path, export: &Path) -> Ganesha {
        fs::create_dir_all(dir.join("recovery")).unwrap();
        let conf = dir.join("ganesha.conf");
        let log = dir.join("ganesha.log");
        for attempt in 1..=3 {
            let port = free_port();
            fs::write(&conf, config(dir, export, port)).unwrap();
            // A fresh log: readiness is read from it.
            let _ = fs::remove_file(&log);
            let child = Command::new("ganesha.nfsd")
                .arg("-F")
                .arg("-f")
                .arg(&conf)
                .arg("-L")
                .arg(&log)
                .arg("-p")
                .arg(dir.join("ganesha.pid"))
                .args(["-N", "NIV_EVENT"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start ganesha.nfsd");
            let mut g = Ganesha {
                child: Some(child),
                port,
                log: log.clone(),
            };
            if g.wait_ready() {
                eprintln!(
                    "ganesha.nfsd {} serves {} on port {port}",
                    g.pid(),
                    export.display()
                );
                return g;
            }
            eprintln!(
                "ganesha.nfsd exited at start (attempt {attempt}, port {port}):\n{}",
                g.log_tail(30)
            );
        }
        panic!("ganesha.nfsd did not start in 3 attempts");
    }

    fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    /// Waits until the server serves (true) or exits (false); panics after 30 s.
    fn wait_ready(&mut self) -> bool {
        let t = Instant::now();
        loop {
            if self.child.as_mut().unwrap().try_wait().unwrap().is_some() {
                self.child = None;
                return false;
            }
            let up = fs::read_to_string(&self.log)
                .unwrap_or_default()
                .contains("NFS SERVER INITIALIZED");
            if up && TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return true;
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "ganesha.nfsd not serving after 30 s:\n{}",
                self.log_tail(30)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `nfs://` URL of `rel` (relative to the export's root).
    fn url(&self, rel: &str) -> String {
        format!(
            "nfs://127.0.0.1{PSEUDO}/{rel}?version=4&nfsport={}",
            self.port
        )
    }

    /// The inodes under `mp` other than its root that the server's open descriptors pin in the
    /// kernel's cache: the files it holds open and the directories above them.
    fn pinned_under(&self, mp: &Path) -> BTreeSet<PathBuf> {
        let mut v = BTreeSet::new();
        for e in fs::read_dir(format!("/proc/{}/fd", self.pid())).unwrap() {
            let Ok(target) = fs::read_link(e.unwrap().path()) else {
                continue;
            };
            for p in target.ancestors() {
                if p.starts_with(mp) && p != mp {
                    v.insert(p.to_path_buf());
                }
            }
        }
        v
    }

    fn log_tail(&self, lines: usize) -> String {
        let s = fs::read_to_string(&self.log).unwrap_or_default();
        let v: Vec<&str> = s
            .lines()
            // Each client's disconnect, and the missing dbus and Kerberos it does not need.
            .filter(|l| {
                !["recv errno 104", ":DBUS :", "krb5", "keytab"]
                    .iter()
                    .any(|n| l.contains(n))
            })
            .collect();
        v[v.len().saturating_sub(lines)..].join("\n")
    }

    /// Stops the server and asserts that it exited within 20 s.
    fn stop(mut self) {
        let mut child = self.child.take().unwrap();
        // SAFETY: signals the server this guard started.
        unsafe {
            libc::kill(child.id() as i32, libc::SIGTERM);
        }
        let t = Instant::now();
        while child.try_wait().unwrap().is_none() {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "ganesha.nfsd alive 20 s after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Ganesha {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if std::thread::panicking() {
            eprintln!(
                "--- ganesha log {} ---\n{}\n---",
                self.log.display(),
                self.log_tail(40)
            );
        }
        let pid = child.id() as i32;
        // SAFETY: signals the server this guard started.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        if !wait_gone(pid, Duration::from_secs(10)) {
            let _ = child.kill();
        }
        let _ = child.wait();
    }
}

/// The server's configuration: NFSv4 only (no MOUNT protocol, so no rpcbind), TCP on loopback,
/// no lock manager or quota service, no grace period (it serves at once), its recovery files
/// under `dir`; one read-write export of `export` through the VFS back end.
fn config(dir: &Path, export: &Path, port: u16) -> String {
    format!(
        "NFS_CORE_PARAM {{\n  NFS_Port = {port};\n  Bind_addr = 127.0.0.1;\n  Protocols = 4;\n  \
         Enable_NLM = false;\n  Enable_RQUOTA = false;\n  Enable_UDP = false;\n}}\n\
         NFSV4 {{\n  Graceless = true;\n  RecoveryRoot = {};\n}}\n\
         EXPORT {{\n  Export_Id = 17;\n  Path = {};\n  Pseudo = {PSEUDO};\n  Protocols = 4;\n  \
         Access_Type = RW;\n  Squash = No_Root_Squash;\n  SecType = sys;\n  \
         Filesystem_id = 17.17;\n  FSAL {{ Name = VFS; }}\n}}\n",
        dir.join("recovery").display(),
        export.display(),
    )
}

/// Runs a libnfs tool (at most 60 s); asserts success and returns its stdout.
fn nfs_tool(args: &[&str]) -> Vec<u8> {
    let out = Command::new("timeout")
        .arg("60")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?} failed ({:?}): {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// `nfs-ls`: name → (is a directory, size).
fn nfs_ls(g: &Ganesha, rel: &str) -> BTreeMap<String, (bool, u64)> {
    let out = String::from_utf8(nfs_tool(&["nfs-ls", &g.url(rel)])).unwrap();
    let mut m = BTreeMap::new();
    for line in out.lines() {
        // "drwxr-xr-x  3 65534 65534            0 name"
        let f: Vec<&str> = line.split_whitespace().collect();
        assert!(f.len() >= 6, "nfs-ls line {line:?}");
        let size = f[4].parse().unwrap();
        m.insert(f[5..].join(" "), (f[0].starts_with('d'), size));
    }
    m
}

fn nfs_cat(g: &Ganesha, rel: &str) -> Vec<u8> {
    nfs_tool(&["nfs-cat", &g.url(rel)])
}

/// Writes `data` to `rel` over NFS (`nfs-cp` of a local copy under `tmp`).
fn nfs_put(g: &Ganesha, tmp: &Path, rel: &str, data: &[u8]) {
    assert!(data.len() <= NFS_WRITE_MAX);
    let local = tmp.join("upload");
    fs::File::create(&local).unwrap().write_all(data).unwrap();
    nfs_tool(&["nfs-cp", local.to_str().unwrap(), &g.url(rel)]);
}

/// From the daemon's statistics (`amaranth stat`): how many inodes the kernel holds ("N inodes
/// cached") and how many LOOKUP requests it sent ("LOOKUP N").
fn stat_counts(s: &Scratch, mp: &Path) -> (u64, u64) {
    let out = s.run(&["stat".as_ref(), mp.as_os_str()]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let words: Vec<&str> = text.split_whitespace().collect();
    let cached = words
        .windows(3)
        .find(|w| w[1] == "inodes" && w[2] == "cached");
    let lookups = words
        .windows(2)
        .find(|w| w[0] == "LOOKUP" || w[0] == "(LOOKUP");
    match (cached, lookups) {
        (Some(c), Some(l)) => (
            c[0].parse().unwrap(),
            l[1].trim_end_matches([',', ')']).parse().unwrap(),
        ),
        _ => panic!("no inode or LOOKUP count in:\n{text}"),
    }
}

/// What the test puts in the file system first (relative path → contents).
fn first_files() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("big.bin", pattern(17, 3 << 20)),
        ("docs/readme.txt", b"served over NFS\n".to_vec()),
        ("docs/deep/er/leaf.bin", pattern(18, 70_000)),
    ]
}

/// Reads every file over NFS and compares it with what it should hold.
fn check_all(g: &Ganesha, files: &[(&str, Vec<u8>)]) {
    for (rel, data) in files {
        let got = nfs_cat(g, rel);
        assert!(
            got == *data,
            "{rel}: {} bytes over NFS, {} expected",
            got.len(),
            data.len()
        );
    }
}

#[test]
fn nfs_export_reads_and_writes_after_forgetting_and_remounting() {
    if !mount_env_ok() {
        return;
    }
    nfs_tools_ok();
    let _serial = serial();
    let s = Scratch::new("nfs");
    let img = s.mkfs("fs.img", "256M");
    let m = s.mount(&img, "mnt", &MountOpts::default());
    let mut files = first_files();
    fs::create_dir_all(m.p("docs/deep/er")).unwrap();
    for (rel, data) in &files {
        fs::write(m.p(rel), data).unwrap();
    }
    let gdir = s.path("ganesha");
    let g = Ganesha::start(&gdir, &m.mp);

    // Listing and reading.
    let root = nfs_ls(&g, "");
    assert_eq!(root.keys().collect::<Vec<_>>(), ["big.bin", "docs"]);
    assert_eq!(root["big.bin"], (false, 3 << 20));
    assert!(root["docs"].0, "docs is not a directory: {root:?}");
    let leafdir = nfs_ls(&g, "docs/deep/er");
    assert_eq!(leafdir.len(), 1);
    assert_eq!(leafdir["leaf.bin"], (false, 70_000));
    check_all(&g, &files);

    // Writing: the files appear in the mount with their bytes and a current time.
    for (rel, seed) in [("from-nfs.bin", 19), ("docs/deep/from-nfs.bin", 20)] {
        let data = pattern(seed, NFS_WRITE_MAX);
        nfs_put(&g, &gdir, rel, &data);
        assert!(fs::read(m.p(rel)).unwrap() == data, "{rel} through FUSE");
        let age = SystemTime::now()
            .duration_since(fs::metadata(m.p(rel)).unwrap().modified().unwrap())
            .unwrap_or_default();
        assert!(age < Duration::from_secs(600), "{rel}: mtime {age:?} ago");
        files.push((rel, data));
    }
    assert_eq!(nfs_ls(&g, "docs/deep").len(), 2);

    // The kernel forgets every inode nobody holds; the server then finds them by handle.
    fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
    let pinned = g.pinned_under(&m.mp);
    let (cached, lookups) = stat_counts(&s, &m.mp);
    eprintln!("after drop_caches: {cached} inodes cached, the server pins {pinned:?}");
    assert!(
        cached <= 1 + pinned.len() as u64,
        "the kernel still holds {cached} inodes (the root and {pinned:?} expected)"
    );
    for rel in [
        "big.bin",
        "docs/readme.txt",
        "docs/deep/er",
        "docs/deep/er/leaf.bin",
    ] {
        assert!(!pinned.contains(&m.p(rel)), "the server pins {rel}");
    }
    check_all(&g, &files);
    assert_eq!(nfs_ls(&g, "docs/deep/er")["leaf.bin"], (false, 70_000));
    // The kernel had to ask the daemon for the forgotten inodes (by handle: LOOKUP of ".").
    let (_, lookups_after) = stat_counts(&s, &m.mp);
    assert!(lookups_after > lookups, "no LOOKUP after drop_caches");

    // A new daemon under a new server: what was written over NFS is on the image.
    g.stop();
    let mp = m.mp.clone();
    m.umount();
    let m = s.mount(&img, "mnt", &MountOpts::default());
    assert_eq!(m.mp, mp);
    let g = Ganesha::start(&gdir, &m.mp);
    assert_eq!(nfs_ls(&g, "").len(), 3);
    check_all(&g, &files);
    g.stop();
    s.finish(m);
}
