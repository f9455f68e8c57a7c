//! Directory offsets on a real mount: a position from `telldir` (or a `getdents64` entry's
//! `d_off`), given back to `seekdir` (or `lseek`), resumes at the entry after it — in the same
//! open directory, in another one, after entries were added and removed (the entry itself too),
//! and after a remount.

mod support;

use std::collections::BTreeSet;
use std::ffi::CStr;
use std::fs;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use support::*;

/// An open `DIR*`, closed on drop.
struct Dir(*mut libc::DIR);

impl Dir {
    fn open(p: &Path) -> Dir {
        let c = cstr(p);
        // SAFETY: a valid path.
        let d = unsafe { libc::opendir(c.as_ptr()) };
        assert!(!d.is_null(), "opendir {}: errno {}", p.display(), errno());
        Dir(d)
    }
    /// The next name (without `.` and `..`) and `telldir` after it; `None` at the end.
    fn next(&mut self) -> Option<(String, i64)> {
        loop {
            // SAFETY: a valid DIR*; the entry is copied before the next call.
            unsafe {
                *libc::__errno_location() = 0;
                let e = libc::readdir(self.0);
                if e.is_null() {
                    assert_eq!(errno(), 0, "readdir failed");
                    return None;
                }
                let name = CStr::from_ptr((*e).d_name.as_ptr())
                    .to_string_lossy()
                    .into_owned();
                if name != "." && name != ".." {
                    return Some((name, libc::telldir(self.0)));
                }
            }
        }
    }
    fn seek(&mut self, pos: i64) {
        // SAFETY: a valid DIR*.
        unsafe { libc::seekdir(self.0, pos) }
    }
    fn rest(&mut self) -> Vec<String> {
        std::iter::from_fn(|| self.next()).map(|(n, _)| n).collect()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        // SAFETY: opened by opendir, closed once.
        unsafe { libc::closedir(self.0) };
    }
}

/// The names and `d_off`s of one `getdents64` call on `fd` (a small buffer: a few entries).
fn getdents(fd: &OwnedFd) -> Vec<(String, i64)> {
    let mut buf = vec![0u8; 512];
    // SAFETY: the buffer is valid for its length.
    let n = unsafe {
        libc::syscall(
            libc::SYS_getdents64,
            fd.as_raw_fd(),
            buf.as_mut_ptr(),
            buf.len(),
        )
    };
    assert!(n >= 0, "getdents64: errno {}", errno());
    let mut out = Vec::new();
    let mut at = 0;
    while at < n as usize {
        // linux_dirent64: ino u64, off i64, reclen u16, type u8, name NUL-terminated.
        let off = i64::from_ne_bytes(buf[at + 8..at + 16].try_into().unwrap());
        let reclen = u16::from_ne_bytes(buf[at + 16..at + 18].try_into().unwrap()) as usize;
        let name = CStr::from_bytes_until_nul(&buf[at + 19..at + reclen]).unwrap();
        out.push((name.to_string_lossy().into_owned(), off));
        at += reclen;
    }
    out
}

fn lseek(fd: &OwnedFd, pos: i64) {
    // SAFETY: a valid descriptor.
    let r = unsafe { libc::lseek(fd.as_raw_fd(), pos, libc::SEEK_SET) };
    assert_eq!(r, pos, "lseek on a directory: errno {}", errno());
}

fn names(l: &[(String, i64)]) -> Vec<String> {
    l.iter().map(|(n, _)| n.clone()).collect()
}

#[test]
fn seekdir_and_lseek_resume_after_the_entry_in_any_open() {
    if !mount_env_ok() {
        return;
    }
    let s = Scratch::new("dir-offsets");
    let img = s.mkfs("fs.img", "256M");
    let m = s.mount(&img, "mnt", &MountOpts::default());
    let dir = m.p("d");
    fs::create_dir(&dir).unwrap();
    for i in 0..300 {
        fs::write(dir.join(format!("entry-{i:04}")), b"").unwrap();
    }
    let mut a = Dir::open(&dir);
    let full: Vec<(String, i64)> = std::iter::from_fn(|| a.next()).collect();
    assert_eq!(full.len(), 300);
    let mut rng = Rng::new(seed("dir-offsets"));
    // telldir/seekdir in the same DIR*, backwards and forwards, and in another DIR*.
    for round in 0..40 {
        let i = rng.below(full.len() as u64) as usize;
        let mut other = Dir::open(&dir);
        let d = if round % 2 == 0 { &mut a } else { &mut other };
        d.seek(full[i].1);
        assert_eq!(
            d.rest(),
            names(&full[i + 1..]),
            "round {round}: seekdir after entry {i} ({:?})",
            full[i].0
        );
    }
    // lseek on a plain descriptor with the offsets getdents64 hands out, also from another open.
    let open = || -> OwnedFd {
        fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY)
            .open(&dir)
            .unwrap()
            .into()
    };
    let fd = open();
    let mut raw = Vec::new();
    loop {
        let batch = getdents(&fd);
        if batch.is_empty() {
            break;
        }
        raw.extend(batch.into_iter().filter(|(n, _)| n != "." && n != ".."));
    }
    let diff = raw.iter().zip(&full).position(|(a, b)| a != b);
    assert!(
        raw.len() == full.len() && diff.is_none(),
        "getdents64 d_off and telldir differ at {diff:?}: {:?} vs {:?}",
        diff.map(|i| &raw[i]),
        diff.map(|i| &full[i])
    );
    for i in [0, 10, 49, 50, 51, 120, 298] {
        let fd2 = open();
        lseek(&fd2, full[i].1);
        let first = getdents(&fd2);
        assert_eq!(first[0].0, full[i + 1].0, "lseek after entry {i}");
        lseek(&fd, full[i].1);
        assert_eq!(getdents(&fd)[0].0, full[i + 1].0, "lseek back after {i}");
    }
    drop((a, fd));
    // Remove a third (among them entries whose offsets are used below), add 100: every offset
    // still resumes after its entry, in a new open.
    let mut removed = BTreeSet::new();
    for (k, (n, _)) in full.iter().enumerate() {
        if k % 3 == 1 {
            fs::remove_file(dir.join(n)).unwrap();
            removed.insert(n.clone());
        }
    }
    for i in 0..100 {
        fs::write(dir.join(format!("later-{i:04}")), b"").unwrap();
    }
    let check = |when: &str| {
        for i in [0, 1, 2, 57, 100, 151, 299] {
            let mut d = Dir::open(&dir);
            d.seek(full[i].1);
            let got = d.rest();
            let got_set: BTreeSet<&String> = got.iter().collect();
            assert_eq!(got.len(), got_set.len(), "{when}: duplicates");
            for (k, (n, _)) in full.iter().enumerate() {
                let want = k > i && !removed.contains(n);
                assert_eq!(
                    got_set.contains(n),
                    want,
                    "{when}: seekdir after entry {i} {:?} (removed: {}): entry {k} {n:?}",
                    full[i].0,
                    removed.contains(&full[i].0)
                );
            }
        }
    };
    check("after changes");
    let img = m.image.clone();
    s.finish(m);
    let m = s.mount(&img, "mnt", &MountOpts::default());
    check("after a remount");
    s.finish(m);
}
