//! Amaranth's FUSE transport: mounts an [`amaranth_fs::Fs`] and serves kernel requests with it.
//!
//! The adapter is thin on purpose: each request becomes one call on [`Fs`](amaranth_fs::Fs) and
//! one reply, whichever transport carried it. Two transports speak the FUSE protocol (this crate
//! implements it; no FUSE library is used):
//! - FUSE-over-io_uring ([`Transport::Uring`], the default where the kernel offers it): one ring
//!   queue per CPU, served by threads pinned to that CPU, so a request is answered on the CPU that
//!   issued it (a wake-up across vCPUs costs 30–80 µs on the VMs measured,
//!   `shared/notes/fuse.md`); several threads per queue, so a request that blocks does not hold
//!   up the others of its CPU;
//! - `/dev/fuse` ([`Transport::Dev`]): threads reading requests and writing replies, the fallback
//!   when the kernel does not offer io_uring, and the faster choice for one program calling in a
//!   loop where the kernel's fuse module has the `wake_here` parameter (turned on when this
//!   transport is used: a request wakes its thread on the calling CPU and the reply wakes the
//!   caller there). FORGET, INTERRUPT and notifications use it always.
//!
//! The public surface is [`mount`], [`MountOptions`], [`MountHandle`] and [`Unmounter`].
//!
//! Settings (see `shared/notes/fuse.md` for the measurements behind them):
//! - kernel writeback cache off: operations reach the daemon in application order and small writes
//!   stay small;
//! - no OPEN, RELEASE or FLUSH round trips (OPEN and FLUSH answered `ENOSYS` once): files need no
//!   handle in the daemon, a file unlinked while in use lives until the kernel forgets its inode;
//!   the page cache is kept across opens. OPENDIR is served (handle 0, no kernel readdir cache:
//!   see the adapter);
//! - 1 MiB requests, `FUSE_HANDLE_KILLPRIV_V2` (set-id bits cleared by the daemon),
//!   readdirplus (`FUSE_DO_READDIRPLUS | FUSE_READDIRPLUS_AUTO`), `FUSE_PARALLEL_DIROPS`,
//!   `FUSE_CACHE_SYMLINKS` (not `FUSE_ATOMIC_O_TRUNC`: an `O_TRUNC` open truncates with SETATTR);
//! - long entry and attribute lifetimes plus negative entries;
//! - read-ahead of the mount's bdi raised to 1 MiB after mounting.
//!
//! As root the mount is made with `mount(2)` directly (type `fuse.amaranth`, source the image
//! path), so unmounting is entirely in our hands; other users go through `fusermount3`.

mod abi;
mod adapter;
pub mod clone_ioctl;
mod counters;
mod dev;
mod forget;
pub mod pg_ioctl;
mod reaper;
mod reply;
mod session;
pub mod snapshot_ioctl;
mod uring;
mod wake;

pub use counters::RequestCounts;

use std::ffi::CString;
use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use amaranth_fs::{Fs, ROOT_INO};

use crate::adapter::Adapter;

/// The file-system type shown in `/proc/mounts` is `fuse.` followed by this (or by this, a dash
/// and a name: helpers installed under another type, `install-helper --type amaranth-NAME`).
pub const SUBTYPE: &str = "amaranth";

/// The kernel module parameter that lets FUSE connections use io_uring.
const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Test hook: with this environment variable set to 1 the daemon acts as if the kernel had no
/// FUSE-over-io_uring (to test the fallback on kernels that have it).
pub const NO_URING_ENV: &str = "AMARANTH_FUSE_NO_URING";

/// The kernel module parameter (present in some kernels, this machine's among them) that has a
/// `/dev/fuse` request wake the daemon thread on the requesting CPU and the reply wake the
/// requester on the daemon thread's, so that a call and its reply stay on one CPU.
const WAKE_HERE: &str = "/sys/module/fuse/parameters/wake_here";

/// Test hook: with this environment variable set to 1 the daemon acts as if the kernel had no
/// `wake_here` parameter (the /dev/fuse transport then runs as on kernels without it).
pub const NO_WAKE_HERE_ENV: &str = "AMARANTH_FUSE_NO_WAKE_HERE";

/// Threads serving `/dev/fuse` by default: each request that waits for the device (a READ, an
/// fsync) holds one, and a sequential reader keeps 16 READs of 1 MiB in flight (`read_ahead_kb`
/// 16 MiB); only two of them wait for requests at once (`dev.rs` `READERS`). With two threads in
/// all, 16 random readers went 8,300-9,300 reads/s against 14,700-15,200 (docs/BENCHMARKS.md,
/// "Calls kept on their CPU").
pub const DEFAULT_DEV_THREADS: usize = 16;

/// Test hook: with this environment variable naming a path, every FSYNC, FSYNCDIR and SYNCFS
/// waits (at most a minute) while that path exists before it syncs: a request that blocks in the
/// daemon for as long as a test wants (tests that other requests are served meanwhile).
pub const HOLD_FSYNC_ENV: &str = "AMARANTH_TEST_HOLD_FSYNC";

/// How requests travel between the kernel and the daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// FUSE-over-io_uring when the kernel offers it, `/dev/fuse` otherwise.
    Auto,
    /// FUSE-over-io_uring; the mount fails when the kernel does not offer it.
    Uring,
    /// `read(2)`/`write(2)` on `/dev/fuse`.
    Dev,
}

impl Transport {
    /// The name used on the command line and in `amaranth stat`.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Auto => "auto",
            Transport::Uring => "uring",
            Transport::Dev => "dev",
        }
    }

    /// Parses `auto`, `uring` or `dev`.
    pub fn parse(s: &str) -> Option<Transport> {
        match s {
            "auto" => Some(Transport::Auto),
            "uring" | "io_uring" => Some(Transport::Uring),
            "dev" => Some(Transport::Dev),
            _ => None,
        }
    }
}

/// Whether a type from `/proc/mounts` is one of ours: `fuse.amaranth` or `fuse.amaranth-NAME`.
pub fn is_amaranth_type(fstype: &str) -> bool {
    fstype
        .strip_prefix("fuse.")
        .is_some_and(is_amaranth_subtype)
}

/// Whether `subtype` is `amaranth` or `amaranth-NAME` (NAME: letters, digits, `_`, `-`, `.`).
pub fn is_amaranth_subtype(subtype: &str) -> bool {
    match subtype.strip_prefix(SUBTYPE) {
        Some("") => true,
        Some(rest) => rest.strip_prefix('-').is_some_and(|n| {
            !n.is_empty()
                && n.len() <= 64
                && n.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
        }),
        None => false,
    }
}

/// How to mount.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// Name shown as the mount's source (the image path).
    pub fsname: String,
    /// Type shown as `fuse.SUBTYPE` (`amaranth`, or `amaranth-NAME`).
    pub subtype: String,
    /// Threads serving `/dev/fuse` (each with its own descriptor when more than one; default
    /// [`DEFAULT_DEV_THREADS`]); with io_uring, `ring_threads` threads per CPU serve the ring and
    /// one thread `/dev/fuse`.
    pub threads: usize,
    /// Which transport to use.
    pub transport: Transport,
    /// Threads per io_uring queue (one queue per CPU), each with one registered entry: the
    /// requests one CPU serves at once. A request that blocks (an fsync waiting for the log's
    /// flush, a read from the device) holds one thread; the others keep serving that CPU. The
    /// default, 16, serves a sequential reader's whole read-ahead at once (its READs all come from
    /// its CPU: 16 with `read_ahead_kb` 16 MiB) and gives each of 16 random readers on two CPUs a
    /// device read in flight (with 4, READs waited for a thread while the device idled;
    /// docs/BENCHMARKS.md, 2026-11-27).
    pub ring_threads: usize,
    /// Whether ring threads wait pinned to their queue's CPU (`true`, the default; a thread of a
    /// busy queue may still run anywhere, see `uring.rs` `QueueLoad`) or run wherever the
    /// scheduler puts them (`-o ring_affinity=any`). Pinned serves requests on the CPU that made
    /// them; measured faster where several processes use the mount (rsync 1.4-2.2x, IMAP 1.2x,
    /// TokuBench 1.15x); it was slower for one process issuing calls in a loop on an otherwise
    /// idle machine (untar 1.3x, chmod 1.7-4.9x), where the caller then moved between the two
    /// CPUs, until replies kept the caller on the serving CPU ([`MountOptions::ring_wake_here`];
    /// docs/BENCHMARKS.md, "Ring threads that wait on their CPU").
    pub ring_pinned: bool,
    /// Whether ring threads commit replies at `SCHED_IDLE` so that the caller wakes on the
    /// serving CPU (`true`, the default, where the daemon may return from that policy: as root;
    /// `-o ring_wake=any` leaves the caller's CPU to the scheduler). A serial caller otherwise
    /// moves between the CPUs on every reply once it has moved once (`wake.rs`; untar and
    /// `git clone` 2x faster in the harness, docs/BENCHMARKS.md "Replies that keep the caller on
    /// its CPU").
    pub ring_wake_here: bool,
    /// Let other users use the mount (`allow_other`).
    pub allow_other: bool,
    /// Let the kernel check permissions from the mode bits (`default_permissions`).
    pub default_permissions: bool,
    /// Mount read-only.
    pub read_only: bool,
    /// Honor device nodes (`dev`; default `nodev`).
    pub dev: bool,
    /// Honor set-id bits (`suid`; default `nosuid`).
    pub suid: bool,
    /// Forbid executing programs (`noexec`).
    pub noexec: bool,
    /// Do not update access times (`noatime`).
    pub noatime: bool,
    /// Update access times on every access (`strictatime`; default relatime).
    pub strictatime: bool,
    /// Access times kept in memory for a while (`lazytime`).
    pub lazytime: bool,
    /// Every write synchronous (`sync`).
    pub sync: bool,
    /// Directory changes synchronous (`dirsync`).
    pub dirsync: bool,
    /// Entry and attribute lifetime in the kernel.
    pub ttl: Duration,
    /// Lifetime of cached misses (negative entries); zero turns them off.
    pub negative_ttl: Duration,
    /// Read-ahead of the mount's bdi in KiB (`None`: leave the kernel's default of 128 KiB; the
    /// INIT reply cannot raise it, the kernel takes the smaller of its offer and ours). The default,
    /// 16 MiB, keeps up to 16 1 MiB READs of a sequential reader in flight, one per ring thread
    /// of its CPU (4 MiB: about five; 1 MiB: two).
    pub read_ahead_kb: Option<u32>,
}

impl Default for MountOptions {
    fn default() -> MountOptions {
        MountOptions {
            fsname: "amaranth".into(),
            subtype: SUBTYPE.into(),
            threads: DEFAULT_DEV_THREADS,
            transport: Transport::Auto,
            ring_threads: 16,
            ring_pinned: true,
            ring_wake_here: true,
            allow_other: true,
            default_permissions: true,
            read_only: false,
            dev: false,
            suid: false,
            noexec: false,
            noatime: false,
            strictatime: false,
            lazytime: false,
            sync: false,
            dirsync: false,
            ttl: Duration::from_secs(3600),
            negative_ttl: Duration::from_secs(3600),
            read_ahead_kb: Some(16384),
        }
    }
}

/// A live mount. [`MountHandle::join`] waits until it is unmounted.
pub struct MountHandle {
    mountpoint: PathBuf,
    dev: Option<(u32, u32)>,
    counts: Arc<RequestCounts>,
    transport: Transport,
    threads: Vec<JoinHandle<io::Result<()>>>,
    direct: bool,
    /// Keeps the inode table within its memory limit (stopped before `join` returns).
    forgetter: Option<forget::Forgetter>,
    /// Deletes the files the kernel forgot, in batches (stopped before `join` returns).
    reaper: Option<reaper::Reaper>,
}

/// Unmounts a mount from any thread (for example a signal handler thread).
#[derive(Clone, Debug)]
pub struct Unmounter {
    mountpoint: PathBuf,
    dev: Option<(u32, u32)>,
    direct: bool,
}

/// Whether FUSE-over-io_uring may be used: the module parameter is on, or we (root) turn it on.
/// Returns why not otherwise.
fn uring_available() -> Result<(), String> {
    module_switch_on(ENABLE_URING, NO_URING_ENV, "FUSE-over-io_uring")
}

/// Whether `/dev/fuse` requests and replies wake their thread on the CPU that sent them: the
/// module's `wake_here` parameter is on, or we (root) turn it on. Returns why not otherwise.
/// The parameter is the fuse module's, so it applies to every FUSE mount of the machine; it
/// changes where a woken thread runs, nothing a request does.
fn wake_here_available() -> Result<(), String> {
    module_switch_on(WAKE_HERE, NO_WAKE_HERE_ENV, "wake_here")
}

/// How ring threads commit replies (`wake.rs`): on the caller's CPU when `-o ring_wake=cpu` (the
/// default) and the daemon may return from `SCHED_IDLE`; says which in the log.
fn reply_wake(options: &MountOptions) -> wake::ReplyWake {
    if !options.ring_wake_here {
        log::info!(
            "amaranth: ring replies leave the caller's CPU to the scheduler (ring_wake=any)"
        );
        return wake::ReplyWake::plain();
    }
    match wake::probe() {
        Ok(w) => {
            log::info!("amaranth: ring replies wake their callers on the serving CPU");
            w
        }
        Err(why) => {
            log::info!(
                "amaranth: ring replies leave the caller's CPU to the scheduler ({why}): a caller \
                 may move between CPUs on every reply"
            );
            wake::ReplyWake::plain()
        }
    }
}

/// Turns on the fuse module's boolean parameter at `path` (`what` names it in messages) unless
/// it is on already; `test_hook` set to 1 in the environment acts as if the kernel lacked it.
fn module_switch_on(path: &str, test_hook: &str, what: &str) -> Result<(), String> {
    if std::env::var(test_hook).as_deref() == Ok("1") {
        return Err(format!("{test_hook}=1"));
    }
    let v = std::fs::read_to_string(path)
        .map_err(|e| format!("the kernel has no {what} ({path}: {e})"))?;
    if v.trim() == "Y" {
        return Ok(());
    }
    match std::fs::write(path, "Y") {
        Ok(()) => {
            log::info!("amaranth: turned on {path}");
            Ok(())
        }
        Err(e) => Err(format!("{path} is off and cannot be turned on: {e}")),
    }
}

/// Mounts `fs` on `mountpoint` and starts serving requests on background threads. Returns once
/// the kernel has completed the FUSE handshake, so the mount is usable.
pub fn mount(fs: Arc<Fs>, mountpoint: &Path, options: &MountOptions) -> io::Result<MountHandle> {
    let mountpoint = mountpoint.canonicalize()?;
    let want_uring = match options.transport {
        Transport::Dev => false,
        t => match uring_available() {
            Ok(()) => true,
            Err(why) if t == Transport::Uring => {
                return Err(io::Error::other(format!("--transport uring: {why}")))
            }
            Err(why) => {
                log::info!("amaranth: using /dev/fuse: {why}");
                false
            }
        },
    };
    if !want_uring {
        // Over /dev/fuse a call's request and reply then wake their threads on one CPU
        // (docs/BENCHMARKS.md "Calls kept on their CPU").
        match wake_here_available() {
            Ok(()) => log::info!("amaranth: {WAKE_HERE} is on"),
            Err(why) => log::info!(
                "amaranth: /dev/fuse without {WAKE_HERE} ({why}): a call may wake a thread on \
                 another CPU"
            ),
        }
    }
    // SAFETY: geteuid has no preconditions.
    let direct = unsafe { libc::geteuid() } == 0;
    let fd = if direct {
        let root_mode = fs
            .getattr(ROOT_INO)
            .map_err(|e| io::Error::from_raw_os_error(e.0))?;
        mount_direct(&mountpoint, options, root_mode.mode())?
    } else {
        mount_fusermount(&mountpoint, options)?
    };
    let fd = Arc::new(fd);
    let detach = |e: io::Error| {
        let _ = umount_any(&mountpoint, direct);
        e
    };
    let negotiated = session::handshake(&fd, want_uring).map_err(detach)?;
    log::info!(
        "amaranth: FUSE protocol 7.{}, flags {:#x} (kernel offered {:#x})",
        negotiated.minor,
        negotiated.flags,
        negotiated.offered
    );
    let counts = Arc::new(RequestCounts::default());
    let adapter = Arc::new(Adapter {
        fs: fs.clone(),
        ttl: options.ttl,
        negative_ttl: options.negative_ttl,
        dev: fd.clone(),
        counts: counts.clone(),
        generation: fs.generation(),
        hold_fsync: std::env::var_os(HOLD_FSYNC_ENV).map(PathBuf::from),
    });
    let mut threads = Vec::new();
    let mut transport = Transport::Dev;
    let mut dev_threads = options.threads.max(1);
    if want_uring && !negotiated.uring() {
        let why = "the kernel did not offer FUSE_OVER_IO_URING in INIT";
        if options.transport == Transport::Uring {
            return Err(detach(io::Error::other(format!(
                "--transport uring: {why}"
            ))));
        }
        log::info!("amaranth: using /dev/fuse: {why}");
    }
    if negotiated.uring() {
        // The /dev/fuse thread first: it serves whatever comes before the ring is complete.
        threads.push(spawn_dev(
            fd.clone(),
            adapter.clone(),
            Arc::new(dev::Gate::new(1)),
            0,
        )?);
        let payload = (negotiated.max_write as usize).max(session::MAX_REQUEST as usize);
        match uring::start(
            fd.clone(),
            adapter.clone(),
            options.ring_threads.max(1),
            options.ring_pinned,
            reply_wake(options),
            payload,
        ) {
            Ok(t) => {
                threads.extend(t);
                transport = Transport::Uring;
                dev_threads = 0;
            }
            Err(e) if options.transport == Transport::Uring => {
                return Err(detach(io::Error::other(format!("--transport uring: {e}"))))
            }
            Err(e) => {
                log::warn!("amaranth: FUSE-over-io_uring failed ({e}); using /dev/fuse");
                dev_threads -= 1;
            }
        }
    }
    let gate = Arc::new(dev::Gate::new(dev::READERS));
    for i in 0..dev_threads {
        let f = if threads.is_empty() {
            fd.clone()
        } else {
            Arc::new(dev::clone_fd(&fd).map_err(detach)?)
        };
        threads.push(spawn_dev(f, adapter.clone(), gate.clone(), i)?);
    }
    log::info!(
        "amaranth: serving requests over {} ({} threads)",
        match transport {
            Transport::Uring => "FUSE-over-io_uring",
            _ => "/dev/fuse",
        },
        threads.len()
    );
    let forgetter = forget::Forgetter::start(fs.clone(), fd.clone());
    let reaper = reaper::Reaper::start(fs.clone());
    let dev = find_mount(&mountpoint).map(|m| m.dev);
    let handle = MountHandle {
        mountpoint,
        dev,
        counts,
        transport,
        threads,
        direct,
        forgetter: Some(forgetter),
        reaper: Some(reaper),
    };
    if let (Some(kb), Some((major, minor))) = (options.read_ahead_kb, dev) {
        let path = format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb");
        if let Err(e) = std::fs::write(&path, kb.to_string()) {
            log::warn!("amaranth: cannot set {path} to {kb}: {e}");
        }
    }
    Ok(handle)
}

fn spawn_dev(
    fd: Arc<OwnedFd>,
    adapter: Arc<Adapter>,
    gate: Arc<dev::Gate>,
    i: usize,
) -> io::Result<JoinHandle<io::Result<()>>> {
    std::thread::Builder::new()
        .name(format!("amaranth-dev{i}"))
        .spawn(move || dev::serve(fd, adapter, gate))
}

fn umount_any(mountpoint: &Path, direct: bool) -> io::Result<()> {
    if direct {
        umount2(mountpoint, libc::MNT_DETACH)
    } else {
        std::process::Command::new("fusermount3")
            .args(["-u", "-q", "-z", "--"])
            .arg(mountpoint)
            .status()
            .map(|_| ())
    }
}

/// Mounts through `fusermount3` (not root): it mounts and passes the `/dev/fuse` descriptor
/// back over a socket named by `_FUSE_COMMFD`.
fn mount_fusermount(mountpoint: &Path, o: &MountOptions) -> io::Result<OwnedFd> {
    let mut fds = [0; 2];
    // SAFETY: socketpair fills two descriptors.
    if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, fds.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh descriptors owned here.
    let (ours, theirs) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: marks our end close-on-exec; theirs stays inheritable for fusermount3.
    unsafe { libc::fcntl(ours.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
    let mut opts = vec![
        format!("fsname={}", o.fsname.replace(',', "\\,")),
        format!("subtype={}", o.subtype),
        if o.read_only { "ro" } else { "rw" }.to_string(),
    ];
    for (on, name) in [
        (o.default_permissions, "default_permissions"),
        (o.allow_other, "allow_other"),
        (!o.dev, "nodev"),
        (!o.suid, "nosuid"),
        (o.noexec, "noexec"),
        (o.noatime, "noatime"),
        (!o.noatime && o.strictatime, "strictatime"),
        (o.lazytime, "lazytime"),
        (o.sync, "sync"),
        (o.dirsync, "dirsync"),
    ] {
        if on {
            opts.push(name.to_string());
        }
    }
    let status = std::process::Command::new("fusermount3")
        .arg("-o")
        .arg(opts.join(","))
        .arg("--")
        .arg(mountpoint)
        .env("_FUSE_COMMFD", theirs.as_raw_fd().to_string())
        .status()
        .map_err(|e| io::Error::new(e.kind(), format!("cannot run fusermount3: {e}")))?;
    drop(theirs);
    if !status.success() {
        return Err(io::Error::other(format!("fusermount3 failed ({status})")));
    }
    receive_fd(&ours)
}

/// Receives one descriptor sent with `SCM_RIGHTS` on `sock`.
fn receive_fd(sock: &OwnedFd) -> io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // Room for one cmsghdr carrying one int.
    let mut control = [0u64; 8];
    // SAFETY: msghdr zeroed, then pointed at live buffers; recvmsg fills them.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control);
        if libc::recvmsg(sock.as_raw_fd(), &mut msg, 0) < 0 {
            return Err(io::Error::last_os_error());
        }
        let c = libc::CMSG_FIRSTHDR(&msg);
        if c.is_null() || (*c).cmsg_type != libc::SCM_RIGHTS {
            return Err(io::Error::other("fusermount3 sent no descriptor"));
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>());
        libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

/// Mounts with `mount(2)` (root only): type `fuse.amaranth`, the image path as the source.
fn mount_direct(mountpoint: &Path, o: &MountOptions, root_mode: u32) -> io::Result<OwnedFd> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/fuse")
        .map_err(|e| io::Error::new(e.kind(), format!("cannot open /dev/fuse: {e}")))?;
    let fd: OwnedFd = file.into();
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let mut data = format!(
        "fd={},rootmode={:o},user_id={uid},group_id={gid}",
        fd.as_raw_fd(),
        root_mode & libc::S_IFMT
    );
    if o.default_permissions {
        data.push_str(",default_permissions");
    }
    if o.allow_other {
        data.push_str(",allow_other");
    }
    let mut flags: libc::c_ulong = 0;
    if !o.dev {
        flags |= libc::MS_NODEV;
    }
    if !o.suid {
        flags |= libc::MS_NOSUID;
    }
    if o.noexec {
        flags |= libc::MS_NOEXEC;
    }
    flags |= mount_flags(o);
    let cstr = |s: &[u8]| {
        CString::new(s).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in a name"))
    };
    let source = cstr(o.fsname.as_bytes())?;
    let target = cstr(mountpoint.as_os_str().as_bytes())?;
    let fstype = cstr(format!("fuse.{}", o.subtype).as_bytes())?;
    let cdata = cstr(data.as_bytes())?;
    // SAFETY: all pointers are valid NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags,
            cdata.as_ptr().cast(),
        )
    };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("mount(2) of {} failed: {e}", mountpoint.display()),
        ));
    }
    Ok(fd)
}

/// The `mount(2)` flags for the access-time, synchronous and read-only options (the `dev`, `suid`
/// and `exec` ones are added by the caller).
pub fn mount_flags(o: &MountOptions) -> libc::c_ulong {
    let mut flags: libc::c_ulong = 0;
    if o.noatime {
        flags |= libc::MS_NOATIME;
    } else if o.strictatime {
        flags |= libc::MS_STRICTATIME;
    } else {
        flags |= libc::MS_RELATIME;
    }
    if o.lazytime {
        flags |= libc::MS_LAZYTIME;
    }
    if o.sync {
        flags |= libc::MS_SYNCHRONOUS;
    }
    if o.dirsync {
        flags |= libc::MS_DIRSYNC;
    }
    if o.read_only {
        flags |= libc::MS_RDONLY;
    }
    flags
}

fn umount2(mountpoint: &Path, flags: libc::c_int) -> io::Result<()> {
    let target = CString::new(mountpoint.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in the mount point"))?;
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::umount2(target.as_ptr(), flags) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl MountHandle {
    /// The (canonical) mount point.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// The mount's device number (`major`, `minor`): it names the FUSE connection and the bdi.
    pub fn device(&self) -> Option<(u32, u32)> {
        self.dev
    }

    /// Requests served so far, by opcode.
    pub fn counts(&self) -> Arc<RequestCounts> {
        self.counts.clone()
    }

    /// The transport serving requests ([`Transport::Uring`] or [`Transport::Dev`]).
    pub fn transport(&self) -> Transport {
        self.transport
    }

    /// Something that can unmount this mount from another thread.
    pub fn unmounter(&self) -> Unmounter {
        Unmounter {
            mountpoint: self.mountpoint.clone(),
            dev: self.dev,
            direct: self.direct,
        }
    }

    /// Waits until the file system is unmounted and every request thread has finished. The
    /// adapter's reference to the [`Fs`] is dropped before this returns.
    pub fn join(mut self) -> io::Result<()> {
        let mut result = Ok(());
        for t in self.threads.drain(..) {
            let r = t
                .join()
                .map_err(|_| io::Error::other("a FUSE request thread panicked"))
                .and_then(|r| r);
            if result.is_ok() {
                result = r;
            }
        }
        drop(self.forgetter.take());
        drop(self.reaper.take());
        result
    }
}

impl Unmounter {
    /// Unmounts. `lazy` detaches the mount even while files on it are open (the daemon keeps
    /// serving them until they are closed); otherwise a busy mount fails with `EBUSY`.
    pub fn unmount(&self, lazy: bool) -> io::Result<()> {
        if !self.still_ours() {
            return Ok(());
        }
        if self.direct {
            umount2(&self.mountpoint, if lazy { libc::MNT_DETACH } else { 0 })
        } else {
            let mut cmd = std::process::Command::new("fusermount3");
            cmd.arg("-u").arg("-q");
            if lazy {
                cmd.arg("-z");
            }
            let out = cmd.arg("--").arg(&self.mountpoint).output()?;
            if out.status.success() {
                Ok(())
            } else {
                Err(io::Error::other(
                    String::from_utf8_lossy(&out.stderr).trim().to_string(),
                ))
            }
        }
    }

    /// Aborts the FUSE connection: pending and future requests fail with `ENOTCONN`, and the
    /// session ends at once. Everything already acknowledged stays in the engine.
    pub fn abort(&self) -> io::Result<()> {
        let Some((major, minor)) = self.dev else {
            return Err(io::Error::other("the mount's device number is unknown"));
        };
        // The connection directory is named by the kernel's dev_t (major 0 for FUSE).
        let id = (major << 20) | minor;
        std::fs::write(format!("/sys/fs/fuse/connections/{id}/abort"), "1")
    }

    /// Whether our mount is still the one at the mount point (so we never unmount another).
    fn still_ours(&self) -> bool {
        match (find_mount(&self.mountpoint), self.dev) {
            (Some(m), Some(dev)) => m.dev == dev,
            (Some(_), None) => true,
            (None, _) => false,
        }
    }
}

/// A mount found in `/proc/self/mountinfo`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountInfo {
    /// Device number (`major`, `minor`).
    pub dev: (u32, u32),
    /// Mount point.
    pub mountpoint: PathBuf,
    /// File-system type (`fuse.amaranth` for ours).
    pub fstype: String,
    /// Source (our image path).
    pub source: String,
}

/// Decodes the octal escapes (`\040` for a space...) of mountinfo fields.
fn unescape_mountinfo(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() {
            let oct = &b[i + 1..i + 4];
            if oct.iter().all(|c| (b'0'..=b'7').contains(c)) {
                let v = oct
                    .iter()
                    .fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
                if let Ok(v) = u8::try_from(v) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// Every mount of this process's mount namespace (the last one for a path is on top).
pub fn mounts() -> Vec<MountInfo> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in text.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let l: Vec<&str> = left.split(' ').collect();
        let r: Vec<&str> = right.split(' ').collect();
        if l.len() < 5 || r.len() < 2 {
            continue;
        }
        let Some((major, minor)) = l[2].split_once(':') else {
            continue;
        };
        let (Ok(major), Ok(minor)) = (major.parse(), minor.parse()) else {
            continue;
        };
        out.push(MountInfo {
            dev: (major, minor),
            mountpoint: PathBuf::from(std::ffi::OsStr::from_bytes(&unescape_mountinfo(l[4]))),
            fstype: r[0].to_string(),
            source: String::from_utf8_lossy(&unescape_mountinfo(r[1])).into_owned(),
        });
    }
    out
}

/// The mount on top at `mountpoint`, if any.
pub fn find_mount(mountpoint: &Path) -> Option<MountInfo> {
    mounts()
        .into_iter()
        .rev()
        .find(|m| m.mountpoint == mountpoint)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape_mountinfo(r"/mnt/a\040b"), b"/mnt/a b");
        assert_eq!(unescape_mountinfo(r"/x\134y"), b"/x\\y");
        assert_eq!(unescape_mountinfo(r"/plain"), b"/plain");
        assert_eq!(unescape_mountinfo(r"/end\04"), b"/end\\04");
    }

    #[test]
    fn root_is_mounted() {
        assert!(find_mount(Path::new("/")).is_some());
    }
}
