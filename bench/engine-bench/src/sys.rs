//! Linux plumbing: loop devices with a fresh ext4, cgroup v1 memory groups, /proc and /sys
//! counters, page-cache eviction.

use std::fs;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;

pub fn run(cmd: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd} {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A sparse file attached to a loop device (direct I/O to the backing file, so the host page
/// cache holds nothing of it), formatted ext4 and mounted. Dropping it unmounts and detaches.
pub struct LoopFs {
    pub backing: PathBuf,
    pub dev: String,
    pub mnt: PathBuf,
    mounted: bool,
    attached: bool,
}

impl LoopFs {
    pub fn create(backing: &Path, mnt: &Path, bytes: u64) -> Result<LoopFs, String> {
        let f = fs::File::create(backing).map_err(|e| format!("{}: {e}", backing.display()))?;
        f.set_len(bytes).map_err(|e| e.to_string())?;
        drop(f);
        let mut l = LoopFs {
            backing: backing.to_path_buf(),
            dev: String::new(),
            mnt: mnt.to_path_buf(),
            mounted: false,
            attached: false,
        };
        let b = backing.to_str().unwrap();
        let dev = run("losetup", &["--find", "--show", "--direct-io=on", b])?;
        l.dev = dev.trim().to_string();
        l.attached = true;
        run(
            "mkfs.ext4",
            &[
                "-q",
                "-F",
                "-m",
                "0",
                "-E",
                "lazy_itable_init=0,lazy_journal_init=0,nodiscard",
                &l.dev,
            ],
        )?;
        fs::create_dir_all(mnt).map_err(|e| e.to_string())?;
        run("mount", &["-o", "noatime", &l.dev, mnt.to_str().unwrap()])?;
        l.mounted = true;
        Ok(l)
    }

    /// The name under /sys/block (e.g. `loop3`).
    pub fn name(&self) -> String {
        self.dev.trim_start_matches("/dev/").to_string()
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        if self.mounted {
            if let Err(e) = run("umount", &[self.mnt.to_str().unwrap()]) {
                eprintln!("cleanup: {e}; retrying lazily");
                let _ = run("umount", &["-l", self.mnt.to_str().unwrap()]);
            }
            let _ = fs::remove_dir(&self.mnt);
        }
        if self.attached {
            if let Err(e) = run("losetup", &["-d", &self.dev]) {
                eprintln!("cleanup: {e}");
            }
        }
        let _ = fs::remove_file(&self.backing);
    }
}

/// Sectors read and written by a block device (from /sys/block/NAME/stat), in bytes.
pub fn block_bytes(name: &str) -> (u64, u64) {
    let s = fs::read_to_string(format!("/sys/block/{name}/stat")).unwrap_or_default();
    let f: Vec<u64> = s
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    if f.len() < 7 {
        return (0, 0);
    }
    (f[2] * 512, f[6] * 512)
}

fn own_cgroup(controller: &str) -> String {
    let s = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    for line in s.lines() {
        let mut p = line.splitn(3, ':');
        let (_, ctrls, path) = (p.next(), p.next().unwrap_or(""), p.next().unwrap_or("/"));
        if ctrls.split(',').any(|c| c == controller) {
            return path.to_string();
        }
    }
    "/".to_string()
}

/// A cgroup v1 memory group (a child of this process's own group). Dropping it kills nothing:
/// the caller ends its child first; removal is retried while the kernel drains it.
pub struct MemCgroup {
    pub path: PathBuf,
}

impl MemCgroup {
    pub fn create(name: &str, limit: u64) -> Result<MemCgroup, String> {
        let root = Path::new("/sys/fs/cgroup/memory");
        if !root.join("cgroup.procs").exists() {
            return Err(
                "the cgroup v1 memory controller is not mounted at /sys/fs/cgroup/memory".into(),
            );
        }
        let path = root
            .join(own_cgroup("memory").trim_start_matches('/'))
            .join(name);
        fs::create_dir(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let g = MemCgroup { path };
        fs::write(g.path.join("memory.limit_in_bytes"), limit.to_string())
            .map_err(|e| format!("memory.limit_in_bytes: {e}"))?;
        Ok(g)
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        // Move any page cache charge out of the way and remove the group.
        let _ = fs::write(self.path.join("memory.force_empty"), "0");
        for _ in 0..50 {
            if fs::remove_dir(&self.path).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        eprintln!("cleanup: could not remove cgroup {}", self.path.display());
    }
}

/// Moves the calling process into a cgroup.
pub fn join_cgroup(path: &Path) -> Result<(), String> {
    fs::write(path.join("cgroup.procs"), std::process::id().to_string())
        .map_err(|e| format!("joining {}: {e}", path.display()))
}

pub fn cgroup_peak_and_reset(path: &Path) -> u64 {
    let v = fs::read_to_string(path.join("memory.max_usage_in_bytes"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    let _ = fs::write(path.join("memory.max_usage_in_bytes"), "0");
    v
}

pub fn cgroup_failcnt(path: &Path) -> u64 {
    fs::read_to_string(path.join("memory.failcnt"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// VmHWM (peak resident set) of this process in bytes.
pub fn vm_hwm() -> u64 {
    proc_status_kb("VmHWM:") * 1024
}

pub fn proc_status_kb(field: &str) -> u64 {
    let s = fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|x| x.parse().ok())
        .unwrap_or(0)
}

/// Resets VmHWM to the current RSS (Linux >= 4.0).
pub fn reset_hwm() {
    let _ = fs::write("/proc/self/clear_refs", "5");
}

/// Writes back dirty pages of the file system holding `dir` and waits.
pub fn syncfs(dir: &Path) {
    if let Ok(f) = fs::File::open(dir) {
        // SAFETY: plain syscall on a valid fd.
        unsafe { libc::syncfs(f.as_raw_fd()) };
    }
}

/// Drops every file under `dir` from the page cache (after a syncfs, so nothing is dirty): cold
/// reads without dropping the whole machine's caches.
pub fn evict_page_cache(dir: &Path) {
    syncfs(dir);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(p),
                Ok(t) if t.is_file() => {
                    if let Ok(f) = fs::File::open(&p) {
                        // SAFETY: plain syscall on a valid fd.
                        unsafe {
                            libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED)
                        };
                    }
                }
                _ => {}
            }
        }
    }
}

/// Bytes allocated to the files under `dir` (st_blocks).
pub fn du(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            if let Ok(m) = e.metadata() {
                if m.is_dir() {
                    stack.push(e.path());
                } else {
                    total += m.blocks() * 512;
                }
            }
        }
    }
    total
}
