//! File handles on a real mount (issue 17): `name_to_handle_at` and `open_by_handle_at`, which the
//! kernel's NFS server uses for every request, keep working after the kernel forgot the inode
//! (`echo 2 > drop_caches`) and after the daemon itself restarted (umount and mount: its inode
//! table is empty), through renames of the directories above; a deleted file's handle is `ESTALE`.
//!
//! - `handles_survive_forgetting_and_remounting`.

mod support;

use std::fs;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use support::{cstr, errno, mount_env_ok, serial, MountOpts, Scratch};

/// `struct file_handle` with room for any handle.
#[repr(C)]
struct Handle {
    bytes: u32,
    kind: i32,
    data: [u8; 128],
}

fn name_to_handle(p: &Path) -> Handle {
    let mut h = Handle {
        bytes: 128,
        kind: 0,
        data: [0; 128],
    };
    let mut mount_id = 0i32;
    let c = cstr(p);
    // SAFETY: a valid path and a handle buffer of the size it says.
    let r = unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            libc::AT_FDCWD,
            c.as_ptr(),
            &mut h as *mut Handle,
            &mut mount_id as *mut i32,
            0,
        )
    };
    assert_eq!(r, 0, "name_to_handle_at {}: errno {}", p.display(), errno());
    h
}

/// `open_by_handle_at(mount_fd, h, flags)`: the descriptor or the errno.
fn open_by_handle(mount: &Path, h: &Handle, flags: i32) -> Result<OwnedFd, i32> {
    let m = fs::File::open(mount).unwrap();
    let mut copy = Handle {
        bytes: h.bytes,
        kind: h.kind,
        data: h.data,
    };
    // SAFETY: a valid directory descriptor and handle.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_by_handle_at,
            m.as_raw_fd(),
            &mut copy as *mut Handle,
            flags,
        )
    };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: a fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn read_all(fd: OwnedFd) -> Vec<u8> {
    use std::io::Read;
    let mut v = Vec::new();
    fs::File::from(fd).read_to_end(&mut v).unwrap();
    v
}

fn drop_caches() {
    // Dentries and inodes: the kernel forgets every inode nobody holds (FORGET to the daemon).
    fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
}

#[test]
fn handles_survive_forgetting_and_remounting() {
    if !mount_env_ok() {
        return;
    }
    let _serial = serial();
    let s = Scratch::new("export");
    let img = s.mkfs("fs.img", "256M");
    let m = s.mount(&img, "mnt", &MountOpts::default());
    fs::create_dir_all(m.p("a/b/c")).unwrap();
    fs::write(m.p("a/b/c/file"), b"by handle").unwrap();
    fs::write(m.p("a/gone"), b"deleted soon").unwrap();
    let file = name_to_handle(&m.p("a/b/c/file"));
    let dir = name_to_handle(&m.p("a/b"));
    let gone = name_to_handle(&m.p("a/gone"));
    fs::remove_file(m.p("a/gone")).unwrap();
    fs::rename(m.p("a"), m.p("a2")).unwrap();
    drop_caches();
    let fd = open_by_handle(&m.mp, &file, libc::O_RDONLY).expect("handle after drop_caches");
    assert_eq!(read_all(fd), b"by handle");
    let fd = open_by_handle(&m.mp, &dir, libc::O_RDONLY | libc::O_DIRECTORY).unwrap();
    let st = fs::metadata(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
    assert!(st.is_dir());
    drop(fd);
    assert_eq!(
        open_by_handle(&m.mp, &gone, libc::O_RDONLY).err(),
        Some(libc::ESTALE)
    );
    // A new daemon: its inode table starts with the root only.
    let mp = m.mp.clone();
    m.umount();
    let m = s.mount(&img, "mnt", &MountOpts::default());
    assert_eq!(m.mp, mp);
    let fd = open_by_handle(&m.mp, &file, libc::O_RDONLY).expect("handle after a remount");
    assert_eq!(read_all(fd), b"by handle");
    // The path through the renamed directories works from the found inode too (`..`).
    let fd = open_by_handle(&m.mp, &dir, libc::O_RDONLY | libc::O_DIRECTORY).unwrap();
    let parent = fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
    eprintln!("the directory's handle opens {}", parent.display());
    drop(fd);
    s.finish(m);
}
