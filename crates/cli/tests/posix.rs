//! POSIX behaviour through the kernel on a real mount: every operation with its error cases, via
//! std::fs and libc. Each test mounts its own image, checks, unmounts (also on failure), runs fsck
//! (exit 0 required) and most remount to check that what they did persisted.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{CStr, CString, OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{
    DirBuilderExt, FileExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt,
};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use support::*;

/// The errno of a failed call (panics if it succeeded).
fn err<T: std::fmt::Debug>(r: io::Result<T>) -> i32 {
    match r {
        Ok(v) => panic!("expected an error, got Ok({v:?})"),
        Err(e) => e.raw_os_error().unwrap_or(-1),
    }
}

fn mode_of(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

/// A scratch directory, a fresh image and its mount.
fn setup(name: &str, size: &str) -> (Scratch, Mount) {
    let s = Scratch::new(name);
    let img = s.mkfs("fs.img", size);
    let m = s.mount(&img, "mnt", &MountOpts::default());
    (s, m)
}

/// Unmount (clean), fsck (clean), mount again.
fn remount(s: &Scratch, m: Mount) -> Mount {
    let img = m.image.clone();
    s.finish(m);
    s.mount(&img, "mnt", &MountOpts::default())
}

/// Makes directory `name` under `dir` and opens it: the next level of a deep chain built with
/// `*at` calls (paths longer than PATH_MAX cannot be named from the root). Err: mkdirat's errno.
fn mkdir_and_enter(dir: &OwnedFd, name: &CString) -> Result<OwnedFd, i32> {
    // SAFETY: valid fd and name.
    let r = rc(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), 0o755) });
    if r != 0 {
        return Err(r);
    }
    // SAFETY: valid fd and name.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    assert!(
        fd >= 0,
        "openat of a directory just made: errno {}",
        errno()
    );
    // SAFETY: fd was just opened and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn utimens(p: &Path, atime: (i64, i64), mtime: (i64, i64), flags: i32) -> i32 {
    let t = [
        libc::timespec {
            tv_sec: atime.0,
            tv_nsec: atime.1,
        },
        libc::timespec {
            tv_sec: mtime.0,
            tv_nsec: mtime.1,
        },
    ];
    let c = cstr(p);
    // SAFETY: a valid path and two timespecs.
    rc(unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), t.as_ptr(), flags) })
}

fn now_sec() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn mknod(p: &Path, mode: u32, dev: u64) -> i32 {
    let c = cstr(p);
    // SAFETY: a valid path.
    rc(unsafe { libc::mknod(c.as_ptr(), mode, dev as libc::dev_t) })
}

fn names_in(dir: &Path) -> BTreeSet<OsString> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect()
}

#[test]
fn open_create_flags_and_their_errors() {
    if !mount_env_ok() {
        return;
    }
    let (s, m) = setup("open", "256M");
    let f = m.p("f");
    fs::write(&f, b"hello world").unwrap();
    // O_CREAT|O_EXCL on an existing name.
    let r = OpenOptions::new().write(true).create_new(true).open(&f);
    assert_eq!(err(r), libc::EEXIST);
    // O_EXCL on a new name creates it, with the requested mode (umask 022 applies).
    let g = m.p("g");
    let h = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o640)
        .open(&g)
        .unwrap();
    drop(h);
    assert_eq!(mode_of(&g) & 0o777, 0o640);
    // Without O_CREAT: ENOENT.
    assert_eq!(err(File::open(m.p("missing"))), libc::ENOENT);
    // O_TRUNC empties.
    let t = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&f)
        .unwrap();
    assert_eq!(t.metadata().unwrap().len(), 0);
    drop(t);
    assert_eq!(fs::read(&f).unwrap(), b"");
    // O_TRUNC with O_RDONLY does not truncate on Linux... and is allowed; keep to O_WRONLY here.
    // O_APPEND: every write at the end, whatever the position.
    fs::write(&f, b"0123").unwrap();
    let mut a = OpenOptions::new().append(true).open(&f).unwrap();
    a.write_all(b"45").unwrap();
    a.seek(SeekFrom::Start(0)).unwrap();
    a.write_all(b"67").unwrap();
    drop(a);
    assert_eq!(fs::read(&f).unwrap(), b"01234567");
    // pwrite on an O_APPEND descriptor appends too (Linux).
    let a = OpenOptions::new().append(true).open(&f).unwrap();
    a.write_at(b"89", 0).unwrap();
    drop(a);
    assert_eq!(fs::read(&f).unwrap(), b"0123456789");
    // A directory: not for writing, O_DIRECTORY on a file, a file as a directory.
    fs::create_dir(m.p("d")).unwrap();
    assert_eq!(
        err(OpenOptions::new().write(true).open(m.p("d"))),
        libc::EISDIR
    );
    assert_eq!(
        err(OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY)
            .open(&f)),
        libc::ENOTDIR
    );
    assert_eq!(err(File::create(m.p("f/x"))), libc::ENOTDIR);
    assert_eq!(err(File::create(m.p("nodir/x"))), libc::ENOENT);
    // A read-only file is not writable for its owner... but root bypasses; the mode sticks.
    fs::set_permissions(&g, fs::Permissions::from_mode(0o444)).unwrap();
    assert_eq!(mode_of(&g), 0o444);
    // Reading past EOF gives nothing; writing far beyond EOF leaves a zero-filled gap.
    let mut w = OpenOptions::new().read(true).write(true).open(&f).unwrap();
    w.write_all_at(b"Z", 100_000).unwrap();
    let mut all = Vec::new();
    w.read_to_end(&mut all).unwrap();
    assert_eq!(all.len(), 100_001);
    assert_eq!(&all[..10], b"0123456789");
    assert!(all[10..100_000].iter().all(|&b| b == 0));
    assert_eq!(all[100_000], b'Z');
    let mut buf = [0u8; 10];
    assert_eq!(w.read_at(&mut buf, 200_000).unwrap(), 0);
    drop(w);
    let m = remount(&s, m);
    assert_eq!(fs::metadata(m.p("f")).unwrap().len(), 100_001);
    assert_eq!(mode_of(&m.p("g")), 0o444);
    s.finish(m);
}

#[test]
fn mkdir_rmdir_unlink_and_link_counts() {
    if !mount_env_ok() {
        return;
    }
    let (s, m) = setup("dirs", "256M");
    let root_links = fs::metadata(&m.mp).unwrap().nlink();
    fs::create_dir(m.p("a")).unwrap();
    assert_eq!(err(fs::create_dir(m.p("a"))), libc::EEXIST);
    assert_eq!(fs::metadata(&m.mp).unwrap().nlink(), root_links + 1);
    assert_eq!(fs::metadata(m.p("a")).unwrap().nlink(), 2);
    fs::create_dir(m.p("a/b")).unwrap();
    fs::create_dir(m.p("a/c")).unwrap();
    fs::write(m.p("a/file"), b"x").unwrap();
    assert_eq!(fs::metadata(m.p("a")).unwrap().nlink(), 4);
    assert_eq!(err(fs::create_dir(m.p("a/file/x"))), libc::ENOTDIR);
    assert_eq!(err(fs::create_dir(m.p("nope/x"))), libc::ENOENT);
    // rmdir: not empty, not a directory, missing, ".".
    assert_eq!(err(fs::remove_dir(m.p("a"))), libc::ENOTEMPTY);
    assert_eq!(err(fs::remove_dir(m.p("a/file"))), libc::ENOTDIR);
    assert_eq!(err(fs::remove_dir(m.p("a/zz"))), libc::ENOENT);
    assert_eq!(err(fs::remove_dir(m.p("a/b/."))), libc::EINVAL);
    // unlink: a directory, a missing name.
    assert_eq!(err(fs::remove_file(m.p("a/b"))), libc::EISDIR);
    assert_eq!(err(fs::remove_file(m.p("a/zz"))), libc::ENOENT);
    fs::remove_dir(m.p("a/b")).unwrap();
    assert_eq!(fs::metadata(m.p("a")).unwrap().nlink(), 3);
    fs::remove_file(m.p("a/file")).unwrap();
    assert!(!m.p("a/file").exists());
    // A directory emptied by removing its only file can go.
    fs::write(m.p("a/c/only"), b"1").unwrap();
    assert_eq!(err(fs::remove_dir(m.p("a/c"))), libc::ENOTEMPTY);
    fs::remove_file(m.p("a/c/only")).unwrap();
    fs::remove_dir(m.p("a/c")).unwrap();
    assert_eq!(fs::metadata(m.p("a")).unwrap().nlink(), 2);
    // mkdir: the umask applies and S_ISGID in the mode is ignored (Linux); set-gid directories
    // pass the bit (and their group) on to new subdirectories.
    // SAFETY: umask has no preconditions (all tests here want 022).
    unsafe {
        libc::umask(0o022);
    }
    fs::DirBuilder::new()
        .mode(0o2777)
        .create(m.p("a/sg"))
        .unwrap();
    assert_eq!(mode_of(&m.p("a/sg")), 0o755);
    fs::set_permissions(m.p("a/sg"), fs::Permissions::from_mode(0o2775)).unwrap();
    std::os::unix::fs::chown(m.p("a/sg"), None, Some(4321)).unwrap();
    assert_eq!(mode_of(&m.p("a/sg")), 0o2775);
    fs::create_dir(m.p("a/sg/child")).unwrap();
    assert_eq!(
        mode_of(&m.p("a/sg/child")) & 0o2000,
        0o2000,
        "subdirectories of a set-gid directory inherit the bit"
    );
    assert_eq!(fs::metadata(m.p("a/sg/child")).unwrap().gid(), 4321);
    fs::write(m.p("a/sg/file"), b"").unwrap();
    assert_eq!(fs::metadata(m.p("a/sg/file")).unwrap().gid(), 4321);
    assert_eq!(mode_of(&m.p("a/sg/file")) & 0o2000, 0);
    // A directory's mtime/ctime change when an entry is added.
    let before = fs::metadata(m.p("a")).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    fs::write(m.p("a/new"), b"").unwrap();
    let after = fs::metadata(m.p("a")).unwrap();
    assert!(
        (after.mtime(), after.mtime_nsec()) > (before.mtime(), before.mtime_nsec()),
        "parent mtime not updated by create"
    );
    let m = remount(&s, m);
    assert_eq!(fs::metadata(&m.mp).unwrap().nlink(), root_links + 1);
    assert_eq!(fs::metadata(m.p("a")).unwrap().nlink(), 3);
    assert_eq!(
        names_in(&m.p("a")),
        ["new", "sg"].iter().map(OsString::from).collect()
    );
    fs::remove_dir_all(m.p("a")).unwrap();
    assert_eq!(fs::metadata(&m.mp).unwrap().nlink(), root_links);
    s.finish(m);
}

#[test]
fn rename_files_directories_and_flags() {
    if !mount_env_ok() {
        return;
    }
    let (s, m) = setup("rename", "256M");
    let p = |x: &str| m.p(x);
    fs::write(p("a"), b"A").unwrap();
    fs::write(p("b"), b"B").unwrap();
    // Plain rename, then over an existing file (the old target is gone).
    fs::rename(p("a"), p("a2")).unwrap();
    assert!(!p("a").exists());
    assert_eq!(fs::read(p("a2")).unwrap(), b"A");
    let ino_b = fs::metadata(p("b")).unwrap().ino();
    let ino_a2 = fs::metadata(p("a2")).unwrap().ino();
    fs::rename(p("a2"), p("b")).unwrap();
    assert_eq!(fs::read(p("b")).unwrap(), b"A");
    assert_eq!(fs::metadata(p("b")).unwrap().ino(), ino_a2);
    assert_ne!(ino_a2, ino_b);
    assert!(!p("a2").exists());
    // Over an open file: the replaced file stays readable through its descriptor.
    fs::write(p("victim"), b"old contents").unwrap();
    let mut held = File::open(p("victim")).unwrap();
    fs::write(p("newer"), b"new").unwrap();
    fs::rename(p("newer"), p("victim")).unwrap();
    let mut s1 = String::new();
    held.read_to_string(&mut s1).unwrap();
    assert_eq!(s1, "old contents");
    drop(held);
    assert_eq!(fs::read(p("victim")).unwrap(), b"new");
    // Directories with contents, across parents; parents' link counts follow.
    fs::create_dir_all(p("d1/sub/deep")).unwrap();
    fs::write(p("d1/sub/deep/f"), b"deep").unwrap();
    fs::create_dir(p("d2")).unwrap();
    fs::rename(p("d1/sub"), p("d2/moved")).unwrap();
    assert_eq!(fs::read(p("d2/moved/deep/f")).unwrap(), b"deep");
    assert_eq!(fs::metadata(p("d1")).unwrap().nlink(), 2);
    assert_eq!(fs::metadata(p("d2")).unwrap().nlink(), 3);
    assert!(!p("d1/sub").exists());
    // A directory over an empty directory: allowed; over a non-empty one: ENOTEMPTY.
    fs::create_dir(p("empty")).unwrap();
    fs::rename(p("d2/moved"), p("empty")).unwrap();
    assert_eq!(fs::read(p("empty/deep/f")).unwrap(), b"deep");
    fs::create_dir_all(p("full/x")).unwrap();
    assert_eq!(err(fs::rename(p("empty"), p("full"))), libc::ENOTEMPTY);
    // File over directory, directory over file.
    assert_eq!(err(fs::rename(p("b"), p("full"))), libc::EISDIR);
    assert_eq!(err(fs::rename(p("full"), p("b"))), libc::ENOTDIR);
    // Into its own subtree.
    assert_eq!(err(fs::rename(p("full"), p("full/x/y"))), libc::EINVAL);
    assert_eq!(err(fs::rename(p("empty"), p("empty/deep/z"))), libc::EINVAL);
    // A missing source.
    assert_eq!(err(fs::rename(p("nothing"), p("z"))), libc::ENOENT);
    // RENAME_NOREPLACE.
    fs::write(p("c"), b"C").unwrap();
    assert_eq!(
        renameat2(&p("c"), &p("b"), libc::RENAME_NOREPLACE),
        libc::EEXIST
    );
    assert_eq!(fs::read(p("b")).unwrap(), b"A");
    assert_eq!(renameat2(&p("c"), &p("c2"), libc::RENAME_NOREPLACE), 0);
    assert_eq!(fs::read(p("c2")).unwrap(), b"C");
    // RENAME_EXCHANGE: two files, a file and a directory, across directories.
    assert_eq!(renameat2(&p("c2"), &p("b"), libc::RENAME_EXCHANGE), 0);
    assert_eq!(fs::read(p("b")).unwrap(), b"C");
    assert_eq!(fs::read(p("c2")).unwrap(), b"A");
    assert_eq!(renameat2(&p("c2"), &p("full"), libc::RENAME_EXCHANGE), 0);
    assert!(p("c2/x").is_dir());
    assert_eq!(fs::read(p("full")).unwrap(), b"A");
    assert_eq!(
        renameat2(&p("full"), &p("d1/none"), libc::RENAME_EXCHANGE),
        libc::ENOENT
    );
    fs::write(p("d1/inner"), b"inner").unwrap();
    assert_eq!(
        renameat2(&p("full"), &p("d1/inner"), libc::RENAME_EXCHANGE),
        0
    );
    assert_eq!(fs::read(p("full")).unwrap(), b"inner");
    assert_eq!(fs::read(p("d1/inner")).unwrap(), b"A");
    // Both flags at once.
    assert_eq!(
        renameat2(
            &p("full"),
            &p("b"),
            libc::RENAME_EXCHANGE | libc::RENAME_NOREPLACE
        ),
        libc::EINVAL
    );
    // Two names of one file: rename is a no-op and both stay.
    fs::hard_link(p("b"), p("b-link")).unwrap();
    fs::rename(p("b"), p("b-link")).unwrap();
    assert!(p("b").exists() && p("b-link").exists());
    // Renaming keeps xattrs and the inode number.
    assert_eq!(xattr_set(&p("b"), "user.k", b"v", 0), 0);
    let ino = fs::metadata(p("b")).unwrap().ino();
    fs::rename(p("b"), p("d1/b-moved")).unwrap();
    assert_eq!(xattr_get(&p("d1/b-moved"), "user.k"), Ok(b"v".to_vec()));
    assert_eq!(fs::metadata(p("d1/b-moved")).unwrap().ino(), ino);
    let m = remount(&s, m);
    let p = |x: &str| m.p(x);
    assert_eq!(fs::read(p("empty/deep/f")).unwrap(), b"deep");
    assert_eq!(fs::read(p("victim")).unwrap(), b"new");
    assert!(p("c2/x").is_dir());
    assert_eq!(fs::read(p("full")).unwrap(), b"inner");
    assert_eq!(fs::read(p("d1/inner")).unwrap(), b"A");
    assert_eq!(xattr_get(&p("d1/b-moved"), "user.k"), Ok(b"v".to_vec()));
    assert_eq!(fs::metadata(p("d1/b-moved")).unwrap().nlink(), 2);
    assert_eq!(fs::metadata(p("b-link")).unwrap().nlink(), 2);
    assert_eq!(fs::metadata(p("d1")).unwrap().nlink(), 2);
    s.finish(m);
}

/// Whether the image holds inode `ino` itself at `path` (not a redirect to its home) and no
/// record at its home: read with a read-only engine after the unmount.
fn lives_at_path(img: &Path, path: &[&[u8]], ino: u64) -> bool {
    use amaranth_engine::{Engine, Options};
    use amaranth_fs::{keys, Meta};
    use std::sync::Arc;
    let opts = Options {
        read_only: true,
        background_threads: false,
        ..Options::default()
    };
    let dev = amaranth_device::FileDevice::open_read_only(img).unwrap();
    let e = Engine::open(Arc::new(dev), opts).unwrap();
    let home = e.get(&keys::meta_key(&keys::home_key(ino))).unwrap();
    let meta = e.get(&keys::meta_key(&keys::path_key(path))).unwrap();
    let at =
        matches!(meta.map(|v| Meta::decode(&v).unwrap()), Some(Meta::Inode(i)) if i.ino == ino);
    home.is_none() && at
}

/// git's way of writing an object (a temporary name, `link()` to the final name, `unlink()` of
/// the temporary one), with the file open or not: it ends up at its final path, not at the
/// inode-keyed home hard-linked files live at (docs/AGING.md), and fsck is clean.
#[test]
fn a_file_linked_then_unlinked_lives_at_its_remaining_path() {
    if !mount_env_ok() {
        return;
    }
    let (s, m) = setup("unhome", "256M");
    let p = |x: &str| m.p(x);
    fs::create_dir_all(p("objects/ab")).unwrap();
    fs::write(p("objects/ab/tmp_obj_1"), b"closed object").unwrap();
    fs::hard_link(p("objects/ab/tmp_obj_1"), p("objects/ab/cdef")).unwrap();
    fs::remove_file(p("objects/ab/tmp_obj_1")).unwrap();
    let mut held = File::create(p("objects/ab/tmp_obj_2")).unwrap();
    held.write_all(b"open object").unwrap();
    fs::hard_link(p("objects/ab/tmp_obj_2"), p("objects/9876")).unwrap();
    fs::remove_file(p("objects/ab/tmp_obj_2")).unwrap();
    held.write_all(b", written on").unwrap();
    drop(held);
    assert_eq!(fs::read(p("objects/ab/cdef")).unwrap(), b"closed object");
    assert_eq!(
        fs::read(p("objects/9876")).unwrap(),
        b"open object, written on"
    );
    let closed = fs::metadata(p("objects/ab/cdef")).unwrap();
    let open = fs::metadata(p("objects/9876")).unwrap();
    assert_eq!((closed.nlink(), open.nlink()), (1, 1));
    let img = m.image.clone();
    s.finish(m);
    assert!(lives_at_path(
        &img,
        &[b"objects", b"ab", b"cdef"],
        closed.ino()
    ));
    assert!(lives_at_path(&img, &[b"objects", b"9876"], open.ino()));
    let m = s.mount(&img, "mnt", &MountOpts::default());
    assert_eq!(
        fs::read(m.p("objects/9876")).unwrap(),
        b"open object, written on"
    );
    s.finish(m);
}

#[test]
fn hard_links_symlinks_and_special_files() {
    if !mount_env_ok() {
        return;
    }
    let (s, m) = setup("links", "256M");
    let p = |x: &str| m.p(x);
    fs::write(p("f"), b"one").unwrap();
    fs::create_dir(p("d")).unwrap();
    fs::hard_link(p("f"), p("d/g")).unwrap();
    fs::hard_link(p("f"), p("h")).unwrap();
    let (a, b) = (
        fs::metadata(p("f")).unwrap(),
        fs::metadata(p("d/g")).unwrap(),
    );
    assert_eq!(a.ino(), b.ino());
    assert_eq!(a.nlink(), 3);
    // A write through one name shows through the others.
    fs::OpenOptions::new()
        .append(true)
        .open(p("h"))
        .unwrap()
        .write_all(b"+two")
        .unwrap();
    assert_eq!(fs::read(p("d/g")).unwrap(), b"one+two");
    // Errors: existing target, a directory, a missing source.
    assert_eq!(err(fs::hard_link(p("f"), p("h"))), libc::EEXIST);
    assert_eq!(err(fs::hard_link(p("d"), p("d2"))), libc::EPERM);
    assert_eq!(err(fs::hard_link(p("none"), p("x"))), libc::ENOENT);
    fs::remove_file(p("f")).unwrap();
    assert_eq!(fs::metadata(p("h")).unwrap().nlink(), 2);
    // Symlinks: relative, absolute, dangling, to a directory; lstat size = target length.
    std::os::unix::fs::symlink("d/g", p("sym")).unwrap();
    std::os::unix::fs::symlink("/nonexistent/target", p("dangling")).unwrap();
    std::os::unix::fs::symlink("d", p("dirlink")).unwrap();
    assert_eq!(fs::read_link(p("sym")).unwrap(), PathBuf::from("d/g"));
    assert_eq!(fs::read(p("sym")).unwrap(), b"one+two");
    assert_eq!(fs::symlink_metadata(p("sym")).unwrap().len(), 3);
    assert!(fs::symlink_metadata(p("sym"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(err(fs::metadata(p("dangling"))), libc::ENOENT);
    assert!(p("dirlink/g").exists());
    assert_eq!(err(std::os::unix::fs::symlink("x", p("sym"))), libc::EEXIST);
    // A long target (4095 bytes, the limit) works.
    let long_target = "t/".repeat(2047) + "x";
    assert_eq!(long_target.len(), 4095);
    std::os::unix::fs::symlink(&long_target, p("longlink")).unwrap();
    assert_eq!(
        fs::read_link(p("longlink")).unwrap(),
        PathBuf::from(&long_target)
    );
    // readlink of a non-symlink.
    assert_eq!(err(fs::read_link(p("h"))), libc::EINVAL);
    // A hard link to a symlink is a symlink.
    fs::hard_link(p("sym"), p("sym2")).unwrap();
    assert_eq!(fs::read_link(p("sym2")).unwrap(), PathBuf::from("d/g"));
    // Special files: fifo, socket node, character and block devices (root).
    assert_eq!(mknod(&p("fifo"), libc::S_IFIFO | 0o640, 0), 0);
    assert_eq!(mknod(&p("sock"), libc::S_IFSOCK | 0o600, 0), 0);
    let null = libc::makedev(1, 3);
    let loopdev = libc::makedev(7, 200);
    assert_eq!(mknod(&p("null"), libc::S_IFCHR | 0o666, null), 0);
    assert_eq!(mknod(&p("blk"), libc::S_IFBLK | 0o600, loopdev), 0);
    assert_eq!(mknod(&p("fifo"), libc::S_IFIFO | 0o640, 0), libc::EEXIST);
    let check_special = |m: &Mount| {
        let ft = |x: &str| fs::symlink_metadata(m.p(x)).unwrap();
        assert!(ft("fifo").file_type().is_fifo());
        assert_eq!(ft("fifo").mode() & 0o777, 0o640);
        assert!(ft("sock").file_type().is_socket());
        assert!(ft("null").file_type().is_char_device());
        assert_eq!(ft("null").rdev(), null);
        assert!(ft("blk").file_type().is_block_device());
        assert_eq!(ft("blk").rdev(), loopdev);
    };
    check_special(&m);
    // A fifo on the mount works as a fifo (the kernel handles it).
    let fifo = p("fifo");
    let writer = std::thread::spawn(move || fs::write(fifo, b"through the pipe").unwrap());
    assert_eq!(fs::read(p("fifo")).unwrap(), b"through the pipe");
    writer.join().unwrap();
    // The mount is nodev by default: opening the device node is refused.
    assert_eq!(err(File::open(p("null"))), libc::EACCES);
    let m = remount(&s, m);
    check_special(&m);
    assert_eq!(fs::read(m.p("d/g")).unwrap(), b"one+two");
    assert_eq!(fs::metadata(m.p("h")).unwrap().nlink(), 2);
    assert_eq!(fs::read_link(m.p("sym2")).unwrap(), PathBuf::from("d/g"));
    assert_eq!(fs::symlink_metadata(m.p("sym")).unwrap().nlink(), 2);
    assert_eq!(
        fs::read_link(m.p("longlink")).unwrap(),
        PathBuf::from(&long_target)
    );
    s.finish(m);
}

#[test]
fn chmod_chown_and_times_with_nanoseconds() {
    if !mount_env_ok() {
        return;
    }
    let (s, m) = setup("attrs", "256M");
    let f = m.p("f");
    fs::write(&f, b"x").unwrap();
    for mode in [0o000, 0o644, 0o4755, 0o2755, 0o1777, 0o7777, 0o600] {
        fs::set_permissions(&f, fs::Permissions::from_mode(mode)).unwrap();
        assert_eq!(mode_of(&f), mode, "chmod {mode:o}");
    }
    let before = fs::metadata(&f).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    std::os::unix::fs::chown(&f, Some(1234), Some(5678)).unwrap();
    let st = fs::metadata(&f).unwrap();
    assert_eq!((st.uid(), st.gid()), (1234, 5678));
    assert!(
        (st.ctime(), st.ctime_nsec()) > (before.ctime(), before.ctime_nsec()),
        "chown must change ctime"
    );
    std::os::unix::fs::lchown(&f, None, Some(42)).unwrap();
    assert_eq!(fs::metadata(&f).unwrap().gid(), 42);
    assert_eq!(fs::metadata(&f).unwrap().uid(), 1234);
    // chown of a symlink itself (lchown) leaves its target alone.
    std::os::unix::fs::symlink("f", m.p("l")).unwrap();
    std::os::unix::fs::lchown(m.p("l"), Some(7), Some(8)).unwrap();
    let l = fs::symlink_metadata(m.p("l")).unwrap();
    assert_eq!((l.uid(), l.gid()), (7, 8));
    assert_eq!(fs::metadata(&f).unwrap().uid(), 1234);
    // chown by root clears set-id bits of a file (as the kernel file systems do).
    fs::set_permissions(&f, fs::Permissions::from_mode(0o6755)).unwrap();
    std::os::unix::fs::chown(&f, Some(1000), None).unwrap();
    assert_eq!(mode_of(&f) & 0o6000, 0, "chown keeps set-id bits");
    // utimensat: exact nanoseconds, UTIME_OMIT, UTIME_NOW, on a symlink itself.
    assert_eq!(
        utimens(
            &f,
            (1_000_000_001, 999_999_999),
            (1_234_567_890, 123_456_789),
            0
        ),
        0
    );
    let st = fs::metadata(&f).unwrap();
    assert_eq!((st.atime(), st.atime_nsec()), (1_000_000_001, 999_999_999));
    assert_eq!((st.mtime(), st.mtime_nsec()), (1_234_567_890, 123_456_789));
    assert_eq!(utimens(&f, (0, libc::UTIME_OMIT), (2_000_000_000, 1), 0), 0);
    let st = fs::metadata(&f).unwrap();
    assert_eq!((st.atime(), st.atime_nsec()), (1_000_000_001, 999_999_999));
    assert_eq!((st.mtime(), st.mtime_nsec()), (2_000_000_000, 1));
    let t0 = now_sec();
    assert_eq!(
        utimens(&f, (0, libc::UTIME_NOW), (0, libc::UTIME_OMIT), 0),
        0
    );
    let st = fs::metadata(&f).unwrap();
    assert!(
        (st.atime() - t0).abs() <= 5,
        "UTIME_NOW atime {} vs now {t0}",
        st.atime()
    );
    assert_eq!((st.mtime(), st.mtime_nsec()), (2_000_000_000, 1));
    // Times before 1970 (whole seconds: see pre_epoch_times_keep_their_nanoseconds) and far in
    // the future.
    assert_eq!(utimens(&f, (-86_400, 0), (4_000_000_000, 7), 0), 0);
    let st = fs::metadata(&f).unwrap();
    assert_eq!((st.atime(), st.atime_nsec()), (-86_400, 0));
    assert_eq!((st.mtime(), st.mtime_nsec()), (4_000_000_000, 7));
    assert_eq!(
        utimens(&m.p("l"), (10, 20), (30, 40), libc::AT_SYMLINK_NOFOLLOW),
        0
    );
    let l = fs::symlink_metadata(m.p("l")).unwrap();
    assert_eq!((l.mtime(), l.mtime_nsec()), (30, 40));
    // A write sets mtime and ctime to now.
    let t0 = now_sec();
    fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .write_all(b"y")
        .unwrap();
    let st = fs::metadata(&f).unwrap();
    assert!((st.mtime() - t0).abs() <= 5 && (st.ctime() - t0).abs() <= 5);
    // Directories: chmod and times.
    fs::create_dir(m.p("d")).unwrap();
    fs::set_permissions(m.p("d"), fs::Permissions::from_mode(0o1733)).unwrap();
    assert_eq!(utimens(&m.p("d"), (5, 6), (7, 8), 0), 0);
    let keep = fs::metadata(&f).unwrap();
    let m = remount(&s, m);
    let st = fs::metadata(m.p("f")).unwrap();
    assert_eq!(
        (st.mode(), st.uid(), st.gid(), st.mtime(), st.mtime_nsec()),
        (
            keep.mode(),
            keep.uid(),
            keep.gid(),
            keep.mtime(),
            keep.mtime_nsec()
        )
    );
    assert_eq!(
        (st.ctime(), st.ctime_nsec()),
        (keep.ctime(), keep.ctime_nsec())
    );
    let d = fs::metadata(m.p("d")).unwrap();
    assert_eq!(d.mode() & 0o7777, 0o1733);
    assert_eq!(
        (d.mtime(), d.mtime_nsec(), d.atime(), d.atime_nsec()),
        (7, 8, 5, 6)
    );
    let l = fs::symlink_metadata(m.p("l")).unwrap();
    assert_eq!(
        (l.uid(), l.gid(), l.mtime(), l.mtime_nsec()),
        (7, 8, 30, 40)
    );
    s.finish(m);
}

/// fuser 0.18.0 decodes a time before 1970 with nanoseconds as `epoch - (sec, nsec)` instead of
/// `epoch - sec + nsec` (`touch -d '1969-12-31 23:59:59.0000005'` would store 23:59:58.9999995);
/// the adapter inverts that decoding exactly (`time_of` in crates/fuse/src/adapter.rs).
#[test]
fn pre_epoch_times_keep_their_nanoseconds() {
    if !mount_env_ok() {
        return;
    }
    let (s, m) = setup("preepoch", "256M");
    let f = m.p("f");
    fs::write(&f, b"x").unwrap();
    assert_eq!(utimens(&f, (-1, 500), (-1_000_000, 999_999_999), 0), 0);
    let st = fs::metadata(&f).unwrap();
    let got = ((st.atime(), st.atime_nsec()), (st.mtime(), st.mtime_nsec()));
    s.finish(m);
    assert_eq!(got, ((-1, 500), (-1_000_000, 999_999_999)));
}

/// An access ACL in the kernel's xattr encoding: version 2, then (tag, perm, id) entries.
fn acl_xattr(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

/// `system.posix_acl_access` and the mode are one thing (as on ext4): setting an ACL sets the
/// mode (what `cp -a` relies on: it creates files 0600 and sets the source's mode as an ACL), an
/// ACL that only restates the mode is not stored, chmod rewrites a stored ACL, and `stat` sees
/// the new mode at once.
#[test]
fn access_acls_and_the_mode_agree() {
    if !mount_env_ok() {
        return;
    }
    let (s, m) = setup("acl", "256M");
    let f = m.p("f");
    fs::write(&f, b"x").unwrap();
    fs::set_permissions(&f, fs::Permissions::from_mode(0o600)).unwrap();
    let _ = fs::metadata(&f).unwrap(); // the kernel caches the attributes
    const ANY: u32 = u32::MAX;
    let minimal = acl_xattr(&[(0x01, 6, ANY), (0x04, 4, ANY), (0x20, 4, ANY)]);
    assert_eq!(xattr_set(&f, "system.posix_acl_access", &minimal, 0), 0);
    assert_eq!(fs::metadata(&f).unwrap().mode() & 0o7777, 0o644);
    assert_eq!(
        xattr_list(&f),
        Vec::<String>::new(),
        "a minimal ACL is the mode"
    );
    assert_eq!(xattr_get(&f, "system.posix_acl_access"), Err(libc::ENODATA));
    // An extended ACL: the mask is the group's bits; it is stored; chmod rewrites it.
    let extended = acl_xattr(&[
        (0x01, 7, ANY),
        (0x02, 5, 1000),
        (0x04, 4, ANY),
        (0x10, 5, ANY),
        (0x20, 0, ANY),
    ]);
    assert_eq!(xattr_set(&f, "system.posix_acl_access", &extended, 0), 0);
    assert_eq!(fs::metadata(&f).unwrap().mode() & 0o7777, 0o750);
    fs::set_permissions(&f, fs::Permissions::from_mode(0o640)).unwrap();
    let want = acl_xattr(&[
        (0x01, 6, ANY),
        (0x02, 5, 1000),
        (0x04, 4, ANY),
        (0x10, 4, ANY),
        (0x20, 0, ANY),
    ]);
    let m = remount(&s, m);
    let f = m.p("f");
    assert_eq!(xattr_get(&f, "system.posix_acl_access"), Ok(want));
    assert_eq!(fs::metadata(&f).unwrap().mode() & 0o7777, 0o640);
    // cp -a of a 0644 file keeps 0644 and adds no ACL.
    fs::write(m.p("g"), b"g").unwrap();
    fs::set_permissions(m.p("g"), fs::Permissions::from_mode(0o644)).unwrap();
    sh_ok(&format!("cp -a {} {}", q(&m.p("g")), q(&m.p("h"))));
    assert_eq!(fs::metadata(m.p("h")).unwrap().mode() & 0o7777, 0o644);
    assert_eq!(xattr_list(&m.p("h")), Vec::<String>::new());
    s.finish(m);
}

#[test]
fn extended_attributes() {
    if !mount_env_ok() {
        return;
    }
    let (s, m) = setup("xattr", "256M");
    let f = m.p("f");
    fs::write(&f, b"x").unwrap();
    fs::create_dir(m.p("d")).unwrap();
    assert_eq!(xattr_list(&f), Vec::<String>::new());
    assert_eq!(xattr_get(&f, "user.none"), Err(libc::ENODATA));
    assert_eq!(xattr_remove(&f, "user.none"), libc::ENODATA);
    assert_eq!(xattr_set(&f, "user.a", b"1", 0), 0);
    assert_eq!(
        xattr_set(&f, "user.a", b"2", libc::XATTR_CREATE),
        libc::EEXIST
    );
    assert_eq!(
        xattr_set(&f, "user.b", b"2", libc::XATTR_REPLACE),
        libc::ENODATA
    );
    assert_eq!(xattr_set(&f, "user.a", b"22", libc::XATTR_REPLACE), 0);
    assert_eq!(xattr_get(&f, "user.a"), Ok(b"22".to_vec()));
    assert_eq!(xattr_set(&f, "user.b", b"", libc::XATTR_CREATE), 0);
    assert_eq!(xattr_get(&f, "user.b"), Ok(Vec::new()));
    // Binary values, a big value (64 KiB, the Linux limit), a 255-byte name, other namespaces.
    let bin: Vec<u8> = (0..=255u8).collect();
    assert_eq!(xattr_set(&f, "user.bin", &bin, 0), 0);
    let big = pattern(9, 65536);
    assert_eq!(xattr_set(&f, "user.big", &big, 0), 0);
    assert_eq!(xattr_get(&f, "user.big"), Ok(big.clone()));
    let long_name = format!("user.{}", "n".repeat(250));
    assert_eq!(long_name.len(), 255);
    assert_eq!(xattr_set(&f, &long_name, b"long", 0), 0);
    let too_long = format!("user.{}", "n".repeat(251));
    assert_eq!(xattr_set(&f, &too_long, b"x", 0), libc::ERANGE);
    assert_eq!(xattr_set(&f, "trusted.t", b"root only", 0), 0);
    assert_eq!(xattr_set(&f, "security.s", b"sec", 0), 0);
    // A buffer too small: ERANGE.
    {
        let (c, n) = (cstr(&f), CString::new("user.big").unwrap());
        let mut small = [0u8; 16];
        // SAFETY: valid pointers.
        let r = unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), small.as_mut_ptr().cast(), 16) };
        assert_eq!(r, -1);
        assert_eq!(errno(), libc::ERANGE);
        let mut small = [0u8; 8];
        // SAFETY: valid pointers.
        let r = unsafe { libc::listxattr(c.as_ptr(), small.as_mut_ptr().cast(), 8) };
        assert_eq!(r, -1);
        assert_eq!(errno(), libc::ERANGE);
    }
    let mut want = vec![
        "security.s".to_string(),
        "trusted.t".to_string(),
        "user.a".to_string(),
        "user.b".to_string(),
        "user.big".to_string(),
        "user.bin".to_string(),
        long_name.clone(),
    ];
    want.sort();
    assert_eq!(xattr_list(&f), want);
    assert_eq!(xattr_remove(&f, "user.a"), 0);
    assert_eq!(xattr_get(&f, "user.a"), Err(libc::ENODATA));
    want.retain(|n| n != "user.a");
    // On a directory and on a symlink itself (user.* is not allowed on symlinks: EPERM).
    assert_eq!(xattr_set(&m.p("d"), "user.dir", b"D", 0), 0);
    std::os::unix::fs::symlink("f", m.p("l")).unwrap();
    {
        let (c, n) = (cstr(&m.p("l")), CString::new("user.x").unwrap());
        // SAFETY: valid pointers.
        let r = unsafe { libc::lsetxattr(c.as_ptr(), n.as_ptr(), b"x".as_ptr().cast(), 1, 0) };
        assert_eq!(r, -1);
        assert_eq!(errno(), libc::EPERM);
        let t = CString::new("trusted.x").unwrap();
        // SAFETY: valid pointers.
        let r = unsafe { libc::lsetxattr(c.as_ptr(), t.as_ptr(), b"x".as_ptr().cast(), 1, 0) };
        assert_eq!(r, 0, "trusted.* on a symlink: errno {}", errno());
    }
    // xattrs survive a rename of the directory and the file inside it.
    fs::rename(&f, m.p("d/f")).unwrap();
    fs::rename(m.p("d"), m.p("d2")).unwrap();
    // Removing a file removes its xattrs: a new file by the same name has none.
    fs::write(m.p("g"), b"").unwrap();
    assert_eq!(xattr_set(&m.p("g"), "user.gone", b"1", 0), 0);
    fs::remove_file(m.p("g")).unwrap();
    fs::write(m.p("g"), b"").unwrap();
    assert_eq!(xattr_list(&m.p("g")), Vec::<String>::new());
    let m = remount(&s, m);
    let f = m.p("d2/f");
    assert_eq!(xattr_list(&f), want);
    assert_eq!(xattr_get(&f, "user.big"), Ok(big));
    assert_eq!(xattr_get(&f, "user.bin"), Ok(bin));
    assert_eq!(xattr_get(&f, &long_name), Ok(b"long".to_vec()));
    assert_eq!(xattr_get(&m.p("d2"), "user.dir"), Ok(b"D".to_vec()));
    assert_eq!(xattr_list(&m.p("g")), Vec::<String>::new());
    s.finish(m);
}

#[test]
fn statfs_follows_writes_and_deletes() {
    if !mount_env_ok() {
        return;
    }
    let (s, m) = setup("statfs", "1G");
    let st0 = statvfs(&m.mp);
    assert_eq!(st0.f_namemax, 255);
    assert!(st0.f_bsize > 0 && st0.f_frsize > 0);
    assert!(st0.f_blocks > 0 && st0.f_bfree <= st0.f_blocks && st0.f_bavail <= st0.f_bfree);
    let used0 = used_bytes(&m.mp);
    let data = pattern(3, 64 << 20);
    let mut f = File::create(m.p("big")).unwrap();
    f.write_all(&data).unwrap();
    f.sync_all().unwrap();
    drop(f);
    for i in 0..1000 {
        fs::write(m.p(&format!("small{i}")), b"s").unwrap();
    }
    syncfs(&m.mp).unwrap();
    // A checkpoint that is running (the timer's, or one the log's fill started) has written new
    // images of nodes whose old images stay allocated until it completes: space really in use
    // for that moment (+88 MiB was seen on a loaded machine). Measure once none holds any.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut used1 = used_bytes(&m.mp);
    while used1 > used0 + (72 << 20) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        used1 = used_bytes(&m.mp);
    }
    let st1 = statvfs(&m.mp);
    eprintln!("statfs used: {used0} -> {used1} after 64 MiB + 1000 files");
    // Data still in the log or in dirty nodes counts at the size it will take (it used to be
    // missing until a checkpoint: 12 KiB used after 116 MB copied and synced).
    assert!(
        used1 >= used0 + (64 << 20) && used1 <= used0 + (72 << 20),
        "statfs used grew by {} bytes after writing 64 MiB and 1000 small files",
        used1.saturating_sub(used0)
    );
    assert!(
        st1.f_ffree < st0.f_ffree || st1.f_files != st0.f_files,
        "inode counts did not change"
    );
    let m = remount(&s, m);
    let st2 = statvfs(&m.mp);
    let used2 = used_bytes(&m.mp);
    eprintln!("statfs used: {used0} before, {used1} after writing, {used2} after a remount");
    assert!(
        used2.abs_diff(used1) <= used1 / 50,
        "statfs used went from {used1} to {used2} bytes at the remount"
    );
    // Free and available differ by the reserve (64 MiB here, see DESIGN.md, Space).
    assert_eq!(
        (st2.f_bfree - st2.f_bavail) * st2.f_frsize,
        64 << 20,
        "reserve: {st2:?}"
    );
    s.finish(m);
}

/// `fallocate` beyond the free space is ENOSPC and changes nothing; what it reserves shows in
/// `st_blocks` and `df` at once; `st_blocks` of a sparse file is its real blocks.
#[test]
fn fallocate_and_st_blocks_tell_the_truth() {
    if !mount_env_ok() {
        return;
    }
    let (s, m) = setup("fallocst", "1G");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.p("f"))
        .unwrap();
    f.write_all_at(b"x", 0).unwrap();
    f.sync_all().unwrap();
    let used0 = used_bytes(&m.mp);
    let r = fallocate(&f, 0, 0, 5 << 30);
    assert_eq!(r, libc::ENOSPC, "fallocate of 5 GiB on a 1 GiB image");
    let md = f.metadata().unwrap();
    assert_eq!(
        (md.len(), md.blocks()),
        (1, 8),
        "the failed fallocate changed the file"
    );
    assert_eq!(used_bytes(&m.mp), used0);
    assert_eq!(fallocate(&f, 0, 0, 100 << 20), 0);
    let md = f.metadata().unwrap();
    assert_eq!((md.len(), md.blocks() * 512), (100 << 20, 100 << 20));
    assert!(
        used_bytes(&m.mp) >= used0 + (100 << 20),
        "df used {} -> {} after reserving 100 MiB",
        used0,
        used_bytes(&m.mp)
    );
    drop(f);
    // A sparse file: 4 KiB at 1 GiB, 4 KiB at 0. `du` used to show its size (1 GiB).
    let g = File::create(m.p("sparse")).unwrap();
    g.write_all_at(&[1u8; 4096], 1 << 30).unwrap();
    g.write_all_at(&[2u8; 4096], 0).unwrap();
    g.sync_all().unwrap();
    assert_eq!(g.metadata().unwrap().blocks() * 512, 8192);
    drop(g);
    let du = sh_ok(&format!("du -k {}", q(&m.p("sparse"))));
    assert!(du.starts_with("8\t"), "du: {du}");
    let m = remount(&s, m);
    assert_eq!(fs::metadata(m.p("sparse")).unwrap().blocks() * 512, 8192);
    assert_eq!(fs::metadata(m.p("f")).unwrap().blocks() * 512, 100 << 20);
    s.finish(m);
}

#[test]
fn name_and_path_limits_and_odd_bytes() {
    if !mount_env_ok() {
        return;
    }
    let (s, m) = setup("names", "512M");
    // 255 bytes: fine for every kind of name; 256: ENAMETOOLONG everywhere.
    let n255 = "a".repeat(255);
    let n256 = "b".repeat(256);
    fs::write(m.p(&n255), b"255").unwrap();
    fs::create_dir(m.p(&format!("d{}", &n255[1..]))).unwrap();
    assert_eq!(fs::read(m.p(&n255)).unwrap(), b"255");
    assert!(names_in(&m.mp).contains(OsStr::new(&n255)));
    assert_eq!(err(File::create(m.p(&n256))), libc::ENAMETOOLONG);
    assert_eq!(err(fs::create_dir(m.p(&n256))), libc::ENAMETOOLONG);
    assert_eq!(err(fs::metadata(m.p(&n256))), libc::ENAMETOOLONG);
    assert_eq!(err(fs::rename(m.p(&n255), m.p(&n256))), libc::ENAMETOOLONG);
    assert_eq!(
        err(fs::hard_link(m.p(&n255), m.p(&n256))),
        libc::ENAMETOOLONG
    );
    assert_eq!(
        err(std::os::unix::fs::symlink("x", m.p(&n256))),
        libc::ENAMETOOLONG
    );
    assert_eq!(
        mknod(&m.p(&n256), libc::S_IFIFO | 0o644, 0),
        libc::ENAMETOOLONG
    );
    // Names with bytes 0x01, 0x02, 0xff, newline, backslash, non-UTF-8; names that are prefixes
    // of each other (the key escaping must keep them apart and in order).
    let odd: Vec<Vec<u8>> = vec![
        b"\x01".to_vec(),
        b"\x02".to_vec(),
        b"\xff".to_vec(),
        b"a\x01".to_vec(),
        b"a\x01b".to_vec(),
        b"a\x02".to_vec(),
        b"a".to_vec(),
        b"a\xff\xfe".to_vec(),
        b"\x01\x01\x02\x02".to_vec(),
        b"new\nline".to_vec(),
        b"back\\slash".to_vec(),
        b"sp ace".to_vec(),
        b"\xc3\x28invalid-utf8".to_vec(),
        b"\xe2\x82\xac-euro".to_vec(),
        [b'x'; 254].iter().copied().chain([0xffu8]).collect(),
    ];
    fs::create_dir(m.p("odd")).unwrap();
    let odd_dir = m.p("odd");
    for (i, n) in odd.iter().enumerate() {
        let p = odd_dir.join(OsStr::from_bytes(n));
        fs::write(&p, format!("content {i}")).unwrap();
        // Each name is also a directory prefix: a subdirectory with a file.
        let d = odd_dir.join(OsStr::from_bytes(&[n.as_slice(), b".d"].concat()));
        if n.len() <= 253 {
            fs::create_dir(&d).unwrap();
            fs::write(d.join(OsStr::from_bytes(n)), format!("inner {i}")).unwrap();
        }
    }
    let check_odd = |m: &Mount| {
        let dir = m.p("odd");
        let listed: BTreeSet<Vec<u8>> = names_in(&dir).into_iter().map(|n| n.into_vec()).collect();
        let mut want = BTreeSet::new();
        for (i, n) in odd.iter().enumerate() {
            want.insert(n.clone());
            assert_eq!(
                fs::read(dir.join(OsStr::from_bytes(n))).unwrap(),
                format!("content {i}").as_bytes(),
                "name {n:?}"
            );
            if n.len() <= 253 {
                let d = [n.as_slice(), b".d"].concat();
                want.insert(d.clone());
                let inner = dir.join(OsStr::from_bytes(&d)).join(OsStr::from_bytes(n));
                assert_eq!(fs::read(inner).unwrap(), format!("inner {i}").as_bytes());
                assert_eq!(
                    names_in(&dir.join(OsStr::from_bytes(&d))).len(),
                    1,
                    "directory {d:?} holds one entry"
                );
            }
        }
        assert_eq!(listed, want, "readdir of odd names");
    };
    check_odd(&m);
    // Rename among odd names.
    fs::rename(
        odd_dir.join(OsStr::from_bytes(b"a\x01")),
        odd_dir.join(OsStr::from_bytes(b"renamed\x02\xff")),
    )
    .unwrap();
    fs::rename(
        odd_dir.join(OsStr::from_bytes(b"renamed\x02\xff")),
        odd_dir.join(OsStr::from_bytes(b"a\x01")),
    )
    .unwrap();
    // A path of 4095 bytes (PATH_MAX with its NUL) below the mount, through nested directories,
    // used as one relative path; one byte more is refused by the kernel.
    let root = File::open(&m.mp).unwrap();
    let comp = "p".repeat(200);
    let mut rel = String::new();
    while rel.len() + comp.len() + 1 < 4095 - 10 {
        if !rel.is_empty() {
            rel.push('/');
        }
        rel.push_str(&comp);
        let c = CString::new(rel.clone()).unwrap();
        // SAFETY: a valid fd and path.
        assert_eq!(
            rc(unsafe { libc::mkdirat(root.as_raw_fd(), c.as_ptr(), 0o755) }),
            0,
            "mkdirat at depth {}",
            rel.len()
        );
    }
    let fill = 4095 - rel.len() - 1;
    let file_rel = format!("{rel}/{}", "f".repeat(fill));
    assert_eq!(file_rel.len(), 4095);
    let c = CString::new(file_rel.clone()).unwrap();
    // SAFETY: a valid fd and path.
    let fd = unsafe {
        libc::openat(
            root.as_raw_fd(),
            c.as_ptr(),
            libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
            0o644,
        )
    };
    assert!(fd >= 0, "openat of a 4095-byte path: errno {}", errno());
    // SAFETY: fd was just opened.
    let mut deep = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    deep.write_all(b"deep file").unwrap();
    drop(deep);
    let too_long = CString::new(format!("{file_rel}x")).unwrap();
    // SAFETY: a valid fd and path.
    let r = unsafe { libc::openat(root.as_raw_fd(), too_long.as_ptr(), libc::O_RDONLY) };
    assert_eq!(r, -1);
    assert_eq!(errno(), libc::ENAMETOOLONG);
    drop(root);
    // Deeper than PATH_MAX in total, walking down with directory descriptors: the full-path keys
    // grow; creating must either work or fail cleanly with ENAMETOOLONG, never break the FS.
    let mut dirfd: OwnedFd = File::open(m.p(&rel)).unwrap().into();
    let mut depth_bytes = m.mp.as_os_str().len() + 1 + rel.len();
    let mut deepest_ok = depth_bytes;
    let mut refused = None;
    for _ in 0..200 {
        let c = CString::new(comp.clone()).unwrap();
        match mkdir_and_enter(&dirfd, &c) {
            Ok(fd) => dirfd = fd,
            Err(r) => {
                refused = Some(r);
                break;
            }
        }
        depth_bytes += 1 + comp.len();
        deepest_ok = depth_bytes;
    }
    eprintln!(
        "deep directories: created down to a path of {deepest_ok} bytes; then {:?}",
        refused.map(|e| io::Error::from_raw_os_error(e).to_string())
    );
    if let Some(e) = refused {
        assert_eq!(e, libc::ENAMETOOLONG, "deep mkdir failed with errno {e}");
    }
    drop(dirfd);
    // The file system still works.
    fs::write(m.p("after-deep"), b"ok").unwrap();
    let m = remount(&s, m);
    check_odd(&m);
    assert_eq!(fs::read(m.p(&n255)).unwrap(), b"255");
    let root = File::open(&m.mp).unwrap();
    let c = CString::new(file_rel).unwrap();
    // SAFETY: a valid fd and path.
    let fd = unsafe {
        libc::openat(
            root.as_raw_fd(),
            c.as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    assert!(fd >= 0, "the deep file after a remount: errno {}", errno());
    // SAFETY: fd was just opened.
    let mut deep = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let mut got = String::new();
    deep.read_to_string(&mut got).unwrap();
    assert_eq!(got, "deep file");
    drop(deep);
    drop(root);
    // rm -rf of the deep tree works (relative paths; rm walks with descriptors).
    sh_ok(&format!("cd {} && rm -rf {}", q(&m.mp), comp));
    assert!(!m.p(&comp).exists());
    s.finish(m);
}

/// Renaming a directory whose subtree is deep into a place with a longer path: some descendant's
/// key would pass the engine's limit (16 KiB), so the rename fails with ENAMETOOLONG before
/// anything changes (it used to write over-long keys and corrupt the image); a shorter move of
/// the same tree works. The file system stays consistent (fsck) throughout.
#[test]
fn rename_of_a_deep_tree_to_a_longer_path() {
    if !mount_env_ok() {
        return;
    }
    let (s, m) = setup("deeprename", "512M");
    let comp = "q".repeat(250);
    fs::create_dir(m.p("top")).unwrap();
    let mut dirfd: OwnedFd = File::open(m.p("top")).unwrap().into();
    let mut depth = 0;
    let mut last_err = 0;
    // Go as deep as the file system allows.
    for _ in 0..200 {
        let c = CString::new(comp.clone()).unwrap();
        match mkdir_and_enter(&dirfd, &c) {
            Ok(fd) => dirfd = fd,
            Err(r) => {
                last_err = r;
                break;
            }
        }
        depth += 1;
    }
    eprintln!("depth {depth} x 251 bytes, then errno {last_err}");
    // A file at the bottom.
    let c = CString::new("leaf").unwrap();
    // SAFETY: valid fd and name.
    let fd = unsafe {
        libc::openat(
            dirfd.as_raw_fd(),
            c.as_ptr(),
            libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
            0o644,
        )
    };
    let leaf_ok = fd >= 0;
    if leaf_ok {
        // SAFETY: fd was just opened.
        let mut f = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        f.write_all(b"leaf").unwrap();
    }
    drop(dirfd);
    // Move the whole tree under a directory with a long name.
    fs::create_dir(m.p(&"L".repeat(255))).unwrap();
    let target = m.p(&format!("{}/{}", "L".repeat(255), "M".repeat(255)));
    let r = fs::rename(m.p("top"), &target);
    eprintln!("rename of the deep tree to a longer path: {r:?}");
    assert_eq!(
        r.map_err(|e| e.raw_os_error()),
        Err(Some(libc::ENAMETOOLONG)),
        "the tree is as deep as keys allow: a longer path cannot fit"
    );
    // Nothing changed, and the file system keeps working.
    assert!(m.p("top").is_dir());
    assert!(!target.exists());
    fs::write(m.p("after"), b"still writable").unwrap();
    assert_eq!(fs::read(m.p("after")).unwrap(), b"still writable");
    let m = remount(&s, m);
    // A shorter name for the same tree works; the whole tree moved (as many directories).
    let count = |m: &Mount, d: &str| {
        sh_ok(&format!("cd {} && find {d} | wc -l", q(&m.mp)))
            .trim()
            .parse::<usize>()
            .unwrap()
    };
    let before = count(&m, "top");
    assert_eq!(before, depth + 1 + usize::from(leaf_ok));
    fs::rename(m.p("top"), m.p("t")).unwrap();
    let m = remount(&s, m);
    assert_eq!(count(&m, "t"), before);
    assert!(!m.p("top").exists());
    sh_ok(&format!("cd {} && rm -rf t {}", q(&m.mp), "L".repeat(255)));
    s.finish(m);
}

/// Creates `name` in the directory `dir` (an empty file); Err: the errno.
fn create_at(dir: &OwnedFd, name: &str) -> Result<(), i32> {
    let c = CString::new(name).unwrap();
    // SAFETY: valid fd and name.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
            0o644,
        )
    };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: fd was just opened and is owned by nobody else.
    drop(unsafe { OwnedFd::from_raw_fd(fd) });
    Ok(())
}

/// The issue's reproduction: under `/a` a chain of 200-byte directory names as deep as the file
/// system allows, 1,500 files with the longest accepted names at the bottom, an empty `/b`, then
/// `renameat2(a, b, RENAME_EXCHANGE)` and a sync. The final names are as long as before, so it
/// must work; it used to pass the tree through a longer temporary name and write keys past the
/// limit (fsck then found entries out of bounds, or the image no longer opened).
#[test]
fn exchange_of_a_deep_tree_with_a_name_as_short() {
    if !mount_env_ok() {
        return;
    }
    let (s, m) = setup("deepexchange", "512M");
    fs::create_dir(m.p("a")).unwrap();
    let comp = "d".repeat(200);
    let mut dirfd: OwnedFd = File::open(m.p("a")).unwrap().into();
    let mut depth = 0;
    for _ in 0..200 {
        match mkdir_and_enter(&dirfd, &CString::new(comp.clone()).unwrap()) {
            Ok(fd) => dirfd = fd,
            Err(e) => {
                assert_eq!(e, libc::ENAMETOOLONG);
                break;
            }
        }
        depth += 1;
    }
    assert!(depth >= 60, "depth {depth}");
    let longest = (1..=255usize)
        .rev()
        .find(|&n| match create_at(&dirfd, &"f".repeat(n)) {
            Ok(()) => true,
            Err(e) => {
                assert_eq!(e, libc::ENAMETOOLONG);
                false
            }
        })
        .expect("some file name fits at the bottom");
    for i in 0..1499 {
        let name = format!("{i:04}{}", "g".repeat(longest - 4));
        create_at(&dirfd, &name).unwrap();
    }
    drop(dirfd);
    fs::create_dir(m.p("b")).unwrap();
    eprintln!("depth {depth} x 201 bytes, 1,500 files of {longest} bytes at the bottom");
    assert_eq!(
        renameat2(&m.p("a"), &m.p("b"), libc::RENAME_EXCHANGE),
        0,
        "exchange of names of one length"
    );
    syncfs(&m.mp).unwrap();
    let count = |m: &Mount, d: &str| {
        sh_ok(&format!("cd {} && find {d} | wc -l", q(&m.mp)))
            .trim()
            .parse::<usize>()
            .unwrap()
    };
    assert_eq!(count(&m, "b"), 1 + depth + 1500);
    assert_eq!(count(&m, "a"), 1);
    let m = remount(&s, m);
    assert_eq!(count(&m, "b"), 1 + depth + 1500);
    assert_eq!(count(&m, "a"), 1);
    // And back: the tree returns to its name.
    assert_eq!(renameat2(&m.p("a"), &m.p("b"), libc::RENAME_EXCHANGE), 0);
    let m = remount(&s, m);
    assert_eq!(count(&m, "a"), 1 + depth + 1500);
    sh_ok(&format!("cd {} && rm -rf a b", q(&m.mp)));
    s.finish(m);
}

/// A 1 MiB `write()` to a file whose path is long enough (about 5 KiB here) that the request's
/// block keys do not fit in one log record with the data (2 MiB with mkfs's 16 MiB log): the
/// daemon writes what fits as one batch and the kernel hands the short count to the
/// application; the rest goes in the next call, and the file is whole. With the blocks out of
/// line (the default for a 1 MiB write) the record holds a 12-byte reference per block instead
/// of its data, and the whole write fits in one record.
#[test]
fn a_request_too_large_for_one_log_record_is_a_short_write() {
    if !mount_env_ok() {
        return;
    }
    short_write_case(true);
    short_write_case(false);
}

fn short_write_case(inline: bool) {
    let s = Scratch::new(if inline { "shortwrite" } else { "fullwrite" });
    let img = s.mkfs("fs.img", "256M");
    let opts = MountOpts {
        extra: if inline {
            vec!["-o".into(), "out_of_line_min=0".into()]
        } else {
            Vec::new()
        },
        ..MountOpts::default()
    };
    let m = s.mount(&img, "mnt", &opts);
    let mut dirfd: OwnedFd = File::open(&m.mp).unwrap().into();
    for _ in 0..20 {
        dirfd = mkdir_and_enter(&dirfd, &CString::new("p".repeat(250)).unwrap()).unwrap();
    }
    let c = CString::new("f").unwrap();
    // SAFETY: valid fd and name.
    let fd = unsafe {
        libc::openat(
            dirfd.as_raw_fd(),
            c.as_ptr(),
            libc::O_CREAT | libc::O_RDWR | libc::O_CLOEXEC,
            0o644,
        )
    };
    assert!(fd >= 0, "create: errno {}", errno());
    // SAFETY: fd was just opened and is owned by nobody else.
    let mut f = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let data = pattern(7, 1 << 20);
    let n = f.write(&data).unwrap();
    eprintln!("a 1 MiB write() at a 5 KiB path wrote {n} bytes (inline: {inline})");
    if inline {
        assert!(n > 0 && n < data.len() && n % 4096 == 0, "wrote {n}");
    } else {
        assert_eq!(
            n,
            data.len(),
            "out of line, the whole write fits in one record"
        );
    }
    f.write_all(&data[n..]).unwrap();
    f.sync_all().unwrap();
    drop(f);
    drop(dirfd);
    let m = remount(&s, m);
    let path = (0..20)
        .map(|_| "p".repeat(250))
        .collect::<Vec<_>>()
        .join("/");
    let mut dirfd: OwnedFd = File::open(&m.mp).unwrap().into();
    for comp in path.split('/') {
        let c = CString::new(comp).unwrap();
        // SAFETY: valid fd and name.
        let fd = unsafe {
            libc::openat(
                dirfd.as_raw_fd(),
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        assert!(fd >= 0);
        // SAFETY: fd was just opened.
        dirfd = unsafe { OwnedFd::from_raw_fd(fd) };
    }
    // SAFETY: valid fd and name.
    let fd = unsafe {
        libc::openat(
            dirfd.as_raw_fd(),
            c.as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    assert!(fd >= 0);
    // SAFETY: fd was just opened.
    let mut f = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let mut got = Vec::new();
    f.read_to_end(&mut got).unwrap();
    assert!(got == data, "the file holds the whole write");
    drop(f);
    drop(dirfd);
    sh_ok(&format!("cd {} && rm -rf {}", q(&m.mp), "p".repeat(250)));
    s.finish(m);
}

#[test]
fn readdir_while_the_directory_changes() {
    if !mount_env_ok() {
        return;
    }
    let (s, m) = setup("readdir", "512M");
    let dir = m.p("d");
    fs::create_dir(&dir).unwrap();
    let pad = "x".repeat(120);
    // Stable entries exist throughout; volatile ones come and go while the listing runs.
    let stable: BTreeSet<String> = (0..3000).map(|i| format!("s{i:05}-{pad}")).collect();
    for n in &stable {
        fs::write(dir.join(n), b"").unwrap();
    }
    for i in 0..1000 {
        fs::write(dir.join(format!("v{i:05}-{pad}")), b"").unwrap();
    }
    let mut rng = Rng::new(seed("readdir"));
    for round in 0..5 {
        let c = cstr(&dir);
        // SAFETY: opendir/readdir/closedir on a valid path; entries are copied before the next call.
        let seen = unsafe {
            let d = libc::opendir(c.as_ptr());
            assert!(!d.is_null());
            let mut seen: Vec<String> = Vec::new();
            let mut next_volatile = 10_000 * (round + 1);
            loop {
                *libc::__errno_location() = 0;
                let e = libc::readdir(d);
                if e.is_null() {
                    assert_eq!(errno(), 0, "readdir failed");
                    break;
                }
                let name = CStr::from_ptr((*e).d_name.as_ptr())
                    .to_string_lossy()
                    .into_owned();
                seen.push(name);
                // Every 50 entries: add volatile entries and delete some (on both sides of the
                // cursor), and rename a volatile one.
                if seen.len().is_multiple_of(50) {
                    for _ in 0..5 {
                        fs::write(dir.join(format!("v{next_volatile:05}-{pad}")), b"").unwrap();
                        next_volatile += 1;
                    }
                    let vols: Vec<String> = fs::read_dir(&dir)
                        .unwrap()
                        .map(|e| e.unwrap().file_name().into_string().unwrap())
                        .filter(|n| n.starts_with('v'))
                        .collect();
                    for _ in 0..3 {
                        if vols.is_empty() {
                            break;
                        }
                        let victim = rng.pick(&vols);
                        let _ = fs::remove_file(dir.join(victim));
                    }
                }
            }
            libc::closedir(d);
            seen
        };
        let mut dup = BTreeMap::new();
        for n in &seen {
            *dup.entry(n.clone()).or_insert(0) += 1;
        }
        let dups: Vec<_> = dup.iter().filter(|(_, &c)| c > 1).collect();
        assert!(
            dups.is_empty(),
            "round {round}: duplicates in readdir: {dups:?}"
        );
        let seen: BTreeSet<String> = seen.into_iter().collect();
        let missing: Vec<_> = stable.difference(&seen).collect();
        assert!(
            missing.is_empty(),
            "round {round}: {} stable entries missing, e.g. {:?}",
            missing.len(),
            &missing[..missing.len().min(5)]
        );
        assert!(seen.contains(".") && seen.contains(".."));
    }
    // Seeking back with telldir/seekdir (rewinddir) lists everything again.
    let before = names_in(&dir).len();
    assert!(before >= 3000);
    s.finish(m);
}

fn many_entries(n: usize) {
    let t0 = Instant::now();
    let (s, m) = setup("many", "4G");
    let dir = m.p("big");
    fs::create_dir(&dir).unwrap();
    for i in 0..n {
        let p = dir.join(format!("entry-{i:07}"));
        assert_eq!(
            mknod(&p, libc::S_IFREG | 0o644, 0),
            0,
            "create {}",
            p.display()
        );
    }
    let t_create = t0.elapsed();
    let t = Instant::now();
    let names = names_in(&dir);
    assert_eq!(names.len(), n);
    let t_list = t.elapsed();
    let mut rng = Rng::new(seed("many"));
    for _ in 0..1000 {
        let i = rng.below(n as u64);
        assert!(dir.join(format!("entry-{i:07}")).exists());
    }
    assert!(!dir.join(format!("entry-{n:07}")).exists());
    // Delete every other entry, list again.
    let t = Instant::now();
    for i in (0..n).step_by(2) {
        fs::remove_file(dir.join(format!("entry-{i:07}"))).unwrap();
    }
    let t_delete = t.elapsed();
    assert_eq!(names_in(&dir).len(), n / 2);
    let m = remount(&s, m);
    let dir = m.p("big");
    let t = Instant::now();
    let names = names_in(&dir);
    let t_cold = t.elapsed();
    assert_eq!(names.len(), n / 2);
    assert!(names.contains(OsStr::new(&format!("entry-{:07}", 1))));
    assert!(!names.contains(OsStr::new(&format!("entry-{:07}", 0))));
    let t = Instant::now();
    sh_ok(&format!("rm -rf {}", q(&dir)));
    let t_rm = t.elapsed();
    assert!(!dir.exists());
    report(&format!(
        "many entries: {n} in one directory: create {:.1} s, list {:.1} s, delete half {:.1} s, \
         cold list {:.1} s, rm -rf {:.1} s",
        t_create.as_secs_f64(),
        t_list.as_secs_f64(),
        t_delete.as_secs_f64(),
        t_cold.as_secs_f64(),
        t_rm.as_secs_f64()
    ));
    s.finish(m);
}

#[test]
fn directory_with_100k_entries() {
    if !mount_env_ok() {
        return;
    }
    let _serial = serial();
    many_entries(100_000);
}

/// A million entries: run by hand (`cargo test --release -p amaranth-cli --test posix --
/// --ignored --nocapture million`).
#[test]
#[ignore]
fn directory_with_a_million_entries() {
    if !mount_env_ok() {
        return;
    }
    let _serial = serial();
    many_entries(1_000_000);
}

#[test]
fn unlinked_open_file_lives_until_close() {
    if !mount_env_ok() {
        return;
    }
    let (s, m) = setup("unlinkopen", "1G");
    let data = pattern(11, 32 << 20);
    fs::write(m.p("f"), &data).unwrap();
    syncfs(&m.mp).unwrap();
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.p("f"))
        .unwrap();
    fs::remove_file(m.p("f")).unwrap();
    assert!(!m.p("f").exists());
    assert_eq!(f.metadata().unwrap().nlink(), 0);
    // Still readable (also through the daemon, with the page cache dropped) and writable.
    drop_cache(&f);
    let mut back = Vec::new();
    f.read_to_end(&mut back).unwrap();
    assert!(back == data, "unlinked file's data differs");
    f.write_all_at(b"more", data.len() as u64).unwrap();
    drop_cache(&f);
    let mut tail = [0u8; 4];
    f.read_exact_at(&mut tail, data.len() as u64).unwrap();
    assert_eq!(&tail, b"more");
    // A new file by the same name is a different file.
    fs::write(m.p("f"), b"new").unwrap();
    assert_eq!(fs::read(m.p("f")).unwrap(), b"new");
    let mut first = [0u8; 8];
    f.read_exact_at(&mut first, 0).unwrap();
    assert_eq!(&first, &data[..8]);
    drop(f);
    // After the last close the data is deleted (fsck after the unmount finds no orphan; whether
    // statfs shows the space again is space_from_deletes_comes_back).
    let m = remount(&s, m);
    assert_eq!(fs::read(m.p("f")).unwrap(), b"new");
    assert_eq!(names_in(&m.mp).len(), 1);
    s.finish(m);
}

/// `rm` then `df`: the space of deleted files must come back (ext4 shows it at once; here a
/// checkpoint after the deletes reach the leaves may be needed, so allow two minutes).
/// (The idle cleaner pushes range deletes down to the leaves and checkpoints; measured: back 7 s
/// after the delete.)
#[test]
fn space_from_deletes_comes_back() {
    if !mount_env_ok() {
        return;
    }
    let (s, m) = setup("reclaim", "1G");
    let used0 = used_bytes(&m.mp);
    fs::write(m.p("f"), pattern(5, 64 << 20)).unwrap();
    let m = remount(&s, m);
    let used1 = used_bytes(&m.mp);
    fs::remove_file(m.p("f")).unwrap();
    syncfs(&m.mp).unwrap();
    let t = Instant::now();
    let mut used2 = used_bytes(&m.mp);
    while used2 > used0 + (8 << 20) && t.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_secs(1));
        used2 = used_bytes(&m.mp);
    }
    eprintln!(
        "used: {used0} empty, {used1} with 64 MiB, {used2} {:.0} s after the delete",
        t.elapsed().as_secs_f64()
    );
    let m = remount(&s, m);
    let used3 = used_bytes(&m.mp);
    s.finish(m);
    assert!(
        used2 <= used0 + (8 << 20) || used3 <= used0 + (8 << 20),
        "the 64 MiB of a deleted file did not come back: used {used1} -> {used2} (after 120 s) \
         -> {used3} (after a remount)"
    );
}

#[test]
fn copy_file_range_keeps_holes_and_contents() {
    if !mount_env_ok() {
        return;
    }
    let (s, m) = setup("cfr", "1G");
    // Source: data, a 1 MiB hole, data, a hole to the end (size not block-aligned).
    let a = pattern(1, 300_000);
    let b = pattern(2, 100_000);
    let src = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.p("src"))
        .unwrap();
    src.write_all_at(&a, 0).unwrap();
    let b_off = 300_000 + (1 << 20) + 4096 * 3;
    src.write_all_at(&b, b_off).unwrap();
    let size = b_off + 100_000 + 2_000_123;
    src.set_len(size).unwrap();
    let mut want = vec![0u8; size as usize];
    want[..a.len()].copy_from_slice(&a);
    want[b_off as usize..b_off as usize + b.len()].copy_from_slice(&b);
    let copy = |from: &File, to: &File, off_in: i64, off_out: i64, len: usize| -> usize {
        let (mut i, mut o) = (off_in, off_out);
        let mut done = 0;
        while done < len {
            // SAFETY: valid fds and offset pointers.
            let n = unsafe {
                libc::copy_file_range(
                    from.as_raw_fd(),
                    &mut i,
                    to.as_raw_fd(),
                    &mut o,
                    len - done,
                    0,
                )
            };
            assert!(n >= 0, "copy_file_range: errno {}", errno());
            if n == 0 {
                break;
            }
            done += n as usize;
        }
        done
    };
    // Whole file, aligned: equal contents, and the 1 MiB hole is still a hole.
    let dst = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.p("dst"))
        .unwrap();
    assert_eq!(copy(&src, &dst, 0, 0, size as usize + 5000), size as usize);
    assert_eq!(dst.metadata().unwrap().len(), size);
    drop_cache(&dst);
    assert!(fs::read(m.p("dst")).unwrap() == want, "copy differs");
    let hole = seek_data_hole(&dst, 0, libc::SEEK_HOLE).unwrap();
    assert!(
        hole < 300_000 + 4096,
        "the copy lost the hole after the first extent (SEEK_HOLE = {hole})"
    );
    let data2 = seek_data_hole(&dst, hole, libc::SEEK_DATA).unwrap();
    assert!(
        data2 >= 300_000 + (1 << 20) - 4096 && data2 <= b_off,
        "SEEK_DATA after the hole = {data2}"
    );
    // Unaligned source and destination offsets: contents only.
    let dst2 = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.p("dst2"))
        .unwrap();
    dst2.write_all_at(b"prefix", 0).unwrap();
    let n = copy(&src, &dst2, 1234, 777, 500_000);
    assert_eq!(n, 500_000);
    let mut w2 = vec![0u8; 777 + 500_000];
    w2[..6].copy_from_slice(b"prefix");
    w2[777..].copy_from_slice(&want[1234..1234 + 500_000]);
    drop_cache(&dst2);
    assert!(
        fs::read(m.p("dst2")).unwrap() == w2,
        "unaligned copy differs"
    );
    // Into the middle of an existing file (overwrite, size unchanged).
    let n = copy(&src, &dst2, 0, 4096, 8192);
    assert_eq!(n, 8192);
    w2[4096..4096 + 8192].copy_from_slice(&want[..8192]);
    drop_cache(&dst2);
    assert!(
        fs::read(m.p("dst2")).unwrap() == w2,
        "overwriting copy differs"
    );
    // At or past the end of the source: nothing.
    assert_eq!(copy(&src, &dst2, size as i64, 0, 100), 0);
    // Overlapping ranges of one file: EINVAL.
    let mut i = 0i64;
    let mut o = 4096i64;
    // SAFETY: valid fds and pointers.
    let r = unsafe {
        libc::copy_file_range(src.as_raw_fd(), &mut i, src.as_raw_fd(), &mut o, 65536, 0)
    };
    assert_eq!(r, -1);
    assert_eq!(errno(), libc::EINVAL);
    // Destination opened O_APPEND: EBADF.
    let app = OpenOptions::new().append(true).open(m.p("dst2")).unwrap();
    let mut i = 0i64;
    // SAFETY: valid fds and pointers.
    let r = unsafe {
        libc::copy_file_range(
            src.as_raw_fd(),
            &mut i,
            app.as_raw_fd(),
            std::ptr::null_mut(),
            100,
            0,
        )
    };
    assert_eq!(r, -1);
    assert_eq!(errno(), libc::EBADF);
    drop((src, dst, dst2, app));
    let m = remount(&s, m);
    assert!(fs::read(m.p("dst")).unwrap() == want);
    assert!(fs::read(m.p("dst2")).unwrap() == w2);
    s.finish(m);
}

/// Runs `sh -c script` as uid/gid 65534 (nobody), returning whether it succeeded.
fn as_nobody(script: &str, arg: &Path) -> bool {
    let out = Command::new("sh")
        .args(["-c", script, "sh"])
        .arg(arg)
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    if !out.status.success() {
        eprintln!(
            "as nobody: `{script}` failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out.status.success()
}

#[test]
fn setuid_and_setgid_are_cleared_when_others_write() {
    if !mount_env_ok() {
        return;
    }
    let (s, m) = setup("suid", "256M");
    // The scratch path must be reachable for nobody.
    let mut p = m.mp.clone();
    while let Some(parent) = p.parent() {
        let mode = fs::metadata(parent).unwrap().mode();
        assert!(
            mode & 0o001 != 0,
            "{} is not searchable by others",
            parent.display()
        );
        if parent == Path::new("/") {
            break;
        }
        p = parent.to_path_buf();
    }
    fs::set_permissions(&m.mp, fs::Permissions::from_mode(0o777)).unwrap();
    let f = m.p("prog");
    fs::write(&f, b"#!/bin/sh\n").unwrap();
    // A write by another user (nobody, with write permission) clears set-uid and set-gid (the
    // latter because group-execute is set).
    fs::set_permissions(&f, fs::Permissions::from_mode(0o6777)).unwrap();
    assert!(as_nobody("printf x >> \"$1\"", &f));
    assert_eq!(fs::read(&f).unwrap(), b"#!/bin/sh\nx");
    assert_eq!(mode_of(&f), 0o0777, "set-id bits after a write by nobody");
    // Set-gid without group-execute (mandatory-locking marker) stays.
    fs::set_permissions(&f, fs::Permissions::from_mode(0o6766)).unwrap();
    assert!(as_nobody("printf y >> \"$1\"", &f));
    assert_eq!(mode_of(&f), 0o2766, "set-gid without g+x must stay");
    // A truncate by nobody clears them too.
    fs::set_permissions(&f, fs::Permissions::from_mode(0o6777)).unwrap();
    assert!(as_nobody("truncate -s 3 \"$1\"", &f));
    assert_eq!(fs::metadata(&f).unwrap().len(), 3);
    assert_eq!(
        mode_of(&f),
        0o0777,
        "set-id bits after a truncate by nobody"
    );
    // Root writing keeps them.
    fs::set_permissions(&f, fs::Permissions::from_mode(0o6777)).unwrap();
    OpenOptions::new()
        .append(true)
        .open(&f)
        .unwrap()
        .write_all(b"root")
        .unwrap();
    assert_eq!(mode_of(&f), 0o6777, "a write by root keeps set-id bits");
    // Permissions are enforced for nobody (default_permissions): no write to a 0644 root file,
    // no create in a 0755 root directory.
    fs::write(m.p("ro"), b"r").unwrap();
    fs::set_permissions(m.p("ro"), fs::Permissions::from_mode(0o644)).unwrap();
    assert!(!as_nobody("printf x >> \"$1\" 2>/dev/null", &m.p("ro")));
    fs::create_dir(m.p("closed")).unwrap();
    assert!(!as_nobody("touch \"$1\"/x 2>/dev/null", &m.p("closed")));
    assert!(as_nobody("cat \"$1\" >/dev/null", &m.p("ro")));
    // Files nobody creates belong to nobody.
    assert!(as_nobody("printf mine > \"$1\"", &m.p("nobodys")));
    let st = fs::metadata(m.p("nobodys")).unwrap();
    assert_eq!((st.uid(), st.gid()), (65534, 65534));
    let m = remount(&s, m);
    assert_eq!(mode_of(&m.p("prog")), 0o6777);
    s.finish(m);
}

/// A varied tree with every kind of object, compared in full (metadata, contents, xattrs) after
/// an unmount and a mount.
#[test]
fn everything_persists_across_unmount_and_mount() {
    if !mount_env_ok() {
        return;
    }
    let (s, m) = setup("persist", "512M");
    let mut rng = Rng::new(seed("persist"));
    let mut files: Vec<PathBuf> = Vec::new();
    for d in 0..20 {
        let dir = m.p(&format!("dir{d}/sub{}", d % 3));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..30 {
            let p = dir.join(format!("file{f}"));
            let len = rng.below(200_000) as usize;
            let mut data = rng.bytes(len);
            if rng.chance(0.3) {
                data.clear();
            }
            fs::write(&p, &data).unwrap();
            if rng.chance(0.2) {
                let fh = OpenOptions::new().write(true).open(&p).unwrap();
                fh.set_len(len as u64 + rng.below(1 << 20)).unwrap();
            }
            if rng.chance(0.2) {
                assert_eq!(
                    xattr_set(&p, "user.tag", format!("{d}-{f}").as_bytes(), 0),
                    0
                );
            }
            if rng.chance(0.1) {
                utimens(
                    &p,
                    (rng.below(1 << 31) as i64, 5),
                    (rng.below(1 << 31) as i64, 999),
                    0,
                );
            }
            fs::set_permissions(
                &p,
                fs::Permissions::from_mode(0o600 | (rng.below(0o100) as u32)),
            )
            .unwrap();
            files.push(p);
        }
        std::os::unix::fs::symlink(format!("sub{}/file1", d % 3), m.p(&format!("dir{d}/link")))
            .unwrap();
        fs::hard_link(dir.join("file2"), m.p(&format!("dir{d}/hard"))).unwrap();
        mknod(&m.p(&format!("dir{d}/fifo")), libc::S_IFIFO | 0o600, 0);
    }
    let snapshot = |m: &Mount| {
        let w = walk(&m.mp);
        let mut contents = BTreeMap::new();
        for (rel, e) in &w {
            if e.kind == 'f' {
                let p = m.mp.join(rel);
                contents.insert(rel.clone(), (fs::read(&p).unwrap(), xattr_list(&p)));
            }
        }
        (w, contents)
    };
    let before = snapshot(&m);
    let m = remount(&s, m);
    let after = snapshot(&m);
    assert_eq!(before.0.len(), after.0.len());
    for (k, v) in &before.0 {
        assert_eq!(Some(v), after.0.get(k), "{}", k.display());
    }
    assert!(before.1 == after.1, "contents or xattr names differ");
    report(&format!(
        "persist: {} entries ({} files) identical after remount",
        before.0.len(),
        files.len()
    ));
    s.finish(m);
}
