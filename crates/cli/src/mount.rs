//! `amaranth mount`: checks, daemonizes, serves the file system until it is unmounted or the
//! daemon is signalled, then closes the engine (a final checkpoint).

use std::io::{self, Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use amaranth_device::{BlockDevice, FileDevice};
use amaranth_engine::{Engine, Error, Format, ImageInfo, Options};
use amaranth_fs::{Fs, FsOptions};
use amaranth_fuse::{MountOptions, Transport, Unmounter};

use crate::files::{self, Create};
use crate::image::superblock_error;
use crate::options::{Origin, Parsed};
use crate::release;
use crate::rundir::{self, RunDir};
use crate::util::{self, human, CliResult, Failure};

/// What `mount` was asked for.
#[derive(Clone, Debug)]
pub struct MountArgs {
    /// Image file or block device.
    pub image: PathBuf,
    /// Mount point.
    pub dir: PathBuf,
    /// Stay in the foreground (log to stderr).
    pub foreground: bool,
    /// Engine cache size.
    pub cache_size: Option<u64>,
    /// Request threads.
    pub threads: Option<usize>,
    /// Transport (`uring`, `dev` or `auto`).
    pub transport: Option<String>,
    /// Extra pid file to write.
    pub pid_file: Option<PathBuf>,
    /// `-o` option lists.
    pub options: Vec<String>,
    /// Log file (background mode).
    pub log_file: Option<PathBuf>,
    /// Who asked (decides the defaults of `dev`, `suid`, `exec`).
    pub origin: Origin,
    /// Print nothing on success (as `mount(8)` helpers do).
    pub quiet: bool,
    /// The type's name after `fuse.` (`amaranth`, or `amaranth-NAME` for helpers installed so).
    pub subtype: String,
}

impl Default for MountArgs {
    fn default() -> MountArgs {
        MountArgs {
            image: PathBuf::new(),
            dir: PathBuf::new(),
            foreground: false,
            cache_size: None,
            threads: None,
            transport: None,
            pid_file: None,
            options: Vec::new(),
            log_file: None,
            origin: Origin::Cli,
            quiet: false,
            subtype: amaranth_fuse::SUBTYPE.to_string(),
        }
    }
}

/// Everything decided before the daemon starts.
struct Plan {
    image: PathBuf,
    mountpoint: PathBuf,
    dev: FileDevice,
    format: Format,
    engine_opts: Options,
    mount_opts: MountOptions,
    fs_opts: FsOptions,
    pid_file: Option<PathBuf>,
    log_file: PathBuf,
    /// The log file lives in the run directory (opened through it).
    log_in_run_dir: bool,
    run: RunDir,
    foreground: bool,
    /// Why the cache is smaller than asked (logged at startup).
    cache_note: Option<String>,
    quiet: bool,
}

/// Checks that `dir` can be mounted on: exists, a directory, not a mount point of ours already.
/// A directory that holds files is fine (they are hidden while mounted, as with any file system).
fn check_mountpoint(dir: &Path) -> CliResult<PathBuf> {
    let mp = util::absolute(dir).map_err(|e| Failure::new(format!("{}: {e}", dir.display())))?;
    if mp == Path::new("/") {
        return Err(Failure::new(
            "refusing to mount on /: it would hide the whole system (and the daemon's own files)",
        ));
    }
    if let Some(m) = amaranth_fuse::find_mount(&mp) {
        if amaranth_fuse::is_amaranth_type(&m.fstype) {
            return Err(Failure::new(format!(
                "{} is already a mount point ({} of type {}); unmount it first",
                mp.display(),
                m.source,
                m.fstype
            )));
        }
    }
    let meta = std::fs::metadata(&mp).map_err(|e| {
        Failure::new(match e.kind() {
            io::ErrorKind::NotFound => format!("mount point {} does not exist", mp.display()),
            _ => format!("mount point {}: {e}", mp.display()),
        })
    })?;
    if !meta.is_dir() {
        return Err(Failure::new(format!(
            "mount point {} is not a directory",
            mp.display()
        )));
    }
    Ok(mp)
}

/// Opens the image (before forking, so errors reach the terminal). A read-only mount still opens
/// a writable image for writing (nothing is written until a `remount,rw`); only an image that
/// cannot be written is opened read-only.
fn open_device(abs: &Path, read_only: bool) -> io::Result<FileDevice> {
    if !read_only {
        return FileDevice::open(abs);
    }
    match FileDevice::open(abs) {
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EACCES | libc::EROFS | libc::EPERM)
            ) =>
        {
            FileDevice::open_read_only(abs)
        }
        r => r,
    }
}

/// Opens and validates the image; waits (bounded) for a daemon still releasing it.
fn open_image(image: &Path, read_only: bool) -> CliResult<(PathBuf, FileDevice, Format)> {
    let abs =
        util::absolute(image).map_err(|e| Failure::new(format!("{}: {e}", image.display())))?;
    let dev = release::wait_while_released(&abs, "mount", || open_device(&abs, read_only))
        .map_err(|e| {
            Failure::new(match e.kind() {
                io::ErrorKind::NotFound => format!(
                    "image {} does not exist (create one with `amaranth mkfs {} --size 8G`)",
                    abs.display(),
                    abs.display()
                ),
                io::ErrorKind::ResourceBusy => {
                    let src = abs.display().to_string();
                    match amaranth_fuse::mounts()
                        .into_iter()
                        .find(|m| m.source == src)
                    {
                        Some(m) => format!(
                            "image {} is already mounted at {}",
                            abs.display(),
                            m.mountpoint.display()
                        ),
                        None => format!("image {} is in use: {e}", abs.display()),
                    }
                }
                _ => format!("cannot open image {}: {e}", abs.display()),
            })
        })?;
    let located = ImageInfo::read(&dev, false)
        .map_err(|e| Failure::new(superblock_error(&abs, &dev, &e, "cannot mount")))?;
    // A fallback to a backup copy, or damaged copies: say so here (the terminal); the daemon says
    // it again in its log.
    for line in located.describe() {
        note!("amaranth: {}: {line}", abs.display());
    }
    let sb = located;
    if sb.damaged() && !read_only {
        let e = Error::Damaged(format!(
            "recorded by checkpoint {} when a read found a damaged node",
            sb.generation()
        ));
        return Err(Failure::new(superblock_error(
            &abs,
            &dev,
            &e,
            "cannot mount",
        )));
    }
    let format = sb.format().map_err(|e| {
        Failure::new(format!(
            "cannot mount {}: {e}; check it with `amaranth fsck {}`",
            abs.display(),
            abs.display()
        ))
    })?;
    Ok((abs, dev, format))
}

/// The default engine cache: a quarter of memory, at most 2 GiB and a quarter of the image.
fn default_cache(image_len: u64, format: &Format) -> u64 {
    let min = (format.node_size * 8) as u64;
    (util::total_memory() / 4)
        .min(2 << 30)
        .min(image_len / 4)
        .max(min)
}

/// The kernel's read-ahead for the mount when `read_ahead_kb=` is not given: 16 MiB (up to 16
/// 1 MiB READs of a sequential reader in flight, one per ring thread of its CPU), but at most an
/// eighth of the cache, in whole MiB, at least 1 MiB. The leaves holding the READs in flight stay
/// in the cache while they are read, beside the engine's own read-ahead; with 16 MiB in flight, a
/// 64 MiB cache (eviction at 32 MiB: eight 4 MiB nodes) shed and read again leaves a reader was
/// still reading (1.05-1.34x the file's bytes read; with 8 MiB, see docs/DESIGN.md §3).
pub(crate) fn kernel_read_ahead_kb(cache: u64) -> u32 {
    let mib = (cache >> 20) / 8;
    (mib.clamp(1, 16) as u32) * 1024
}

/// Checks, before anything else happens, that this user can open `/dev/fuse`: a mount that would
/// fail there says why and what to do, once.
fn check_dev_fuse() -> CliResult {
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse");
    match opened {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(Failure::new(
            "/dev/fuse does not exist: load the fuse module (`modprobe fuse`) or, in a container, \
             pass the device in",
        )),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)) => {
            let meta = std::fs::metadata("/dev/fuse").ok();
            let (mode, gid) = meta
                .map(|m| {
                    use std::os::unix::fs::MetadataExt;
                    (m.mode() & 0o777, m.gid())
                })
                .unwrap_or((0, 0));
            Err(Failure::new(format!(
                "cannot open /dev/fuse: {e} (mode {mode:04o}, group id {gid}): this user may not \
                 use FUSE; as root, make /dev/fuse usable by it (most distributions use mode 0666, \
                 or add the user to the group that owns it), or mount as root; sharing the mount \
                 with other users (allow_other) also needs `user_allow_other` in /etc/fuse.conf"
            )))
        }
        Err(e) => Err(Failure::new(format!("cannot open /dev/fuse: {e}"))),
    }
}

/// A path given relative to the caller's directory, made absolute (the daemon runs in `/`).
fn from_caller(p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir().unwrap_or_default().join(p)
    }
}

fn plan(args: MountArgs) -> CliResult<Plan> {
    let mut parsed = Parsed::defaults(args.origin, util::is_root());
    parsed.apply(&args.options)?;
    if parsed.remount {
        return Err(Failure::new(
            "remount is handled by the mount helper (mount -o remount,... DIR)",
        ));
    }
    let Parsed {
        mount: mut mount_opts,
        ..
    } = parsed.clone();
    let cache_size = parsed.cache_size.or(args.cache_size);
    let threads = parsed.threads.or(args.threads);
    let log_file = parsed.log_file.or(args.log_file).map(|p| from_caller(&p));
    let pid_file = parsed.pid_file.or(args.pid_file).map(|p| from_caller(&p));
    let foreground = parsed.foreground || args.foreground;
    let threads = threads.unwrap_or(amaranth_fuse::DEFAULT_DEV_THREADS);
    if threads == 0 || threads > 64 {
        return Err(Failure::new("threads must be between 1 and 64"));
    }
    // A cache larger than the machine is impossible: refused. One that fits the machine but not
    // the memory cgroup (or with the daemon's overhead) is shrunk below, with a message.
    if let Some(c) = cache_size.filter(|&c| c > util::total_memory()) {
        return Err(Failure::new(format!(
            "cache_size {} is more than this machine's memory ({})",
            human(c),
            human(util::total_memory())
        )));
    }
    let mountpoint = check_mountpoint(&args.dir)?;
    let run = RunDir::create()?;
    check_dev_fuse()?;
    let (image, dev, format) = open_image(&args.image, mount_opts.read_only)?;
    let cache = cache_size.unwrap_or_else(|| default_cache(dev.len(), &format));
    // Shrink the cache to what the memory cgroup or physical memory allows (said on stderr and,
    // at startup, in the log).
    let (allowed, what) = crate::memlimit::memory_limit();
    let (cache, cache_note) =
        crate::memlimit::fit_cache(cache, (format.node_size * 8) as u64, allowed, &what);
    if let Some(m) = &cache_note {
        eprintln!("amaranth: {m}");
    }
    let engine_opts = Options {
        cache_size: cache as usize,
        read_only: mount_opts.read_only,
        discard: parsed.discard,
        ..Options::default()
    };
    engine_opts
        .validate(&format)
        .map_err(|e| Failure::new(format!("bad cache size: {e}")))?;
    mount_opts.threads = threads;
    mount_opts.read_ahead_kb = Some(
        parsed
            .read_ahead_kb
            .unwrap_or_else(|| kernel_read_ahead_kb(cache)),
    );
    if let Some(t) = parsed.transport.as_ref().or(args.transport.as_ref()) {
        mount_opts.transport = Transport::parse(t).ok_or_else(|| {
            Failure::new(format!(
                "bad --transport {t:?}: expected uring, dev or auto"
            ))
        })?;
    }
    mount_opts.fsname = image.display().to_string();
    mount_opts.subtype = args.subtype.clone();
    let fs_opts = FsOptions {
        relatime: !mount_opts.noatime,
        strictatime: mount_opts.strictatime,
        lazytime: mount_opts.lazytime,
        // dirsync: every change is made durable, directory changes among them.
        sync: mount_opts.sync || mount_opts.dirsync,
        durable_fsync: !parsed.ordered_fsync,
        out_of_line_min: parsed
            .out_of_line_min
            .unwrap_or(amaranth_fs::OUT_OF_LINE_MIN),
        rename_copy_max: parsed
            .rename_copy_max
            .unwrap_or(amaranth_fs::RENAME_COPY_MAX),
        ..FsOptions::default()
    };
    let name = rundir::mount_name(&mountpoint);
    let log_in_run_dir = log_file.is_none() && !util::is_root();
    let log_file = log_file.unwrap_or_else(|| {
        if util::is_root() {
            PathBuf::from(format!("/var/log/amaranth-{name}.log"))
        } else {
            run.path().join(format!("{name}.log"))
        }
    });
    if let Some(p) = &pid_file {
        files::check_writable(p)
            .map_err(|e| Failure::new(format!("bad --pid-file {}: {e}", p.display())))?;
    }
    Ok(Plan {
        image,
        mountpoint,
        dev,
        format,
        engine_opts,
        mount_opts,
        fs_opts,
        pid_file,
        log_file,
        log_in_run_dir,
        run,
        foreground,
        quiet: args.quiet,
        cache_note,
    })
}

/// Signals the daemon handles (blocked in every thread, taken by `sigwait` in one).
fn signal_set() -> libc::sigset_t {
    // SAFETY: sigset manipulation on a local, initialized by sigemptyset.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGHUP);
        set
    }
}

fn block_signals() {
    let set = signal_set();
    // SAFETY: blocks signals for this thread (and the threads it creates later).
    unsafe {
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Runs `mount`: returns once the file system is mounted (background) or unmounted (foreground).
pub fn run(args: MountArgs) -> CliResult {
    let plan = plan(args)?;
    // Block the shutdown signals before any thread exists, so every thread inherits the mask and
    // only the signal thread (sigwait) sees them.
    block_signals();
    if plan.foreground {
        init_logging(None);
        return serve(plan, None);
    }
    let log = open_log(&plan)?;
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two fds.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(Failure::new(format!(
            "pipe: {}",
            io::Error::last_os_error()
        )));
    }
    // SAFETY: fds are fresh and owned here.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let mountpoint = plan.mountpoint.clone();
    let image = plan.image.clone();
    let log_file = plan.log_file.clone();
    let quiet = plan.quiet;
    // SAFETY: the process is single-threaded here (no thread was started yet).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(Failure::new(format!(
            "fork: {}",
            io::Error::last_os_error()
        )));
    }
    if pid > 0 {
        drop(wr);
        return wait_for_child(rd, pid, &image, &mountpoint, &log_file, quiet);
    }
    // The daemon.
    drop(rd);
    // SAFETY: plain syscalls in the child.
    unsafe {
        libc::setsid();
    }
    let _ = std::env::set_current_dir("/");
    if let Err(e) = redirect_stdio(log) {
        let mut w = std::fs::File::from(wr);
        let _ = writeln!(w, "ERR cannot redirect the output to the log file: {e}");
        std::process::exit(1);
    }
    init_logging(Some(&plan.log_file));
    let code = match serve(plan, Some(wr)) {
        Ok(()) => 0,
        Err(f) => {
            log::error!("amaranth: {f}");
            f.code
        }
    };
    std::process::exit(code);
}

/// The parent: waits for the daemon's word, prints it, exits.
fn wait_for_child(
    rd: OwnedFd,
    pid: i32,
    image: &Path,
    mountpoint: &Path,
    log_file: &Path,
    quiet: bool,
) -> CliResult {
    let mut msg = String::new();
    let _ = std::fs::File::from(rd).read_to_string(&mut msg);
    let msg = msg.trim();
    if let Some(transport) = msg.strip_prefix("OK ") {
        if quiet {
            return Ok(());
        }
        say!(
            "mounted {} on {} (daemon pid {pid}, log {}, transport {})",
            image.display(),
            mountpoint.display(),
            log_file.display(),
            transport_text(transport)
        );
        say!("unmount with: amaranth umount {}", mountpoint.display());
        if let Some(n) = crate::idle::halt_poll_note() {
            note!("{n}");
        }
        return Ok(());
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe {
        libc::waitpid(pid, &mut status, 0);
    }
    match msg.strip_prefix("ERR ") {
        Some(m) => Err(Failure::new(m.to_string())),
        None => Err(Failure::new(format!(
            "the daemon exited during startup (status {status}); see {}",
            log_file.display()
        ))),
    }
}

/// Opens the daemon's log (before forking, so a refusal reaches the terminal): appended to,
/// created mode 0600, never through a symbolic link (see `files`).
fn open_log(plan: &Plan) -> CliResult<std::fs::File> {
    let opened = if plan.log_in_run_dir {
        let name = plan.log_file.file_name().unwrap_or_default();
        plan.run
            .open_for_writing(&name.to_string_lossy(), Create::Append, 0o600)
    } else {
        files::open_for_writing(&plan.log_file, Create::Append, 0o600)
    };
    opened.map_err(|e| {
        Failure::new(format!(
            "cannot open the log file {}: {e}",
            plan.log_file.display()
        ))
    })
}

/// How `mount` names a transport to the user.
fn transport_text(name: &str) -> &str {
    match name {
        "uring" => "FUSE-over-io_uring",
        "dev" => "/dev/fuse",
        other => other,
    }
}

fn redirect_stdio(log: std::fs::File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    // SAFETY: dup2 onto the standard descriptors.
    unsafe {
        libc::dup2(null.as_raw_fd(), 0);
        libc::dup2(null.as_raw_fd(), 1);
        libc::dup2(log.as_raw_fd(), 2);
    }
    Ok(())
}

fn init_logging(_file: Option<&Path>) {
    // Both modes log to stderr: the terminal in the foreground, the log file in the background.
    let env = env_logger::Env::default().default_filter_or("info");
    let _ = env_logger::Builder::from_env(env)
        .format_timestamp_millis()
        .try_init();
}

/// Tells the parent (or the terminal) how startup went.
struct Ready(Option<OwnedFd>);

impl Ready {
    /// Mounted; `transport` is the one serving requests.
    fn ok(&mut self, transport: Transport) {
        if let Some(fd) = self.0.take() {
            let mut w = std::fs::File::from(fd);
            let _ = writeln!(w, "OK {}", transport.name());
        }
    }
    fn fail(&mut self, f: &Failure) {
        if let Some(fd) = self.0.take() {
            let mut w = std::fs::File::from(fd);
            let _ = writeln!(w, "ERR {}", f.message.replace('\n', " "));
        }
    }
}

/// The daemon proper.
fn serve(plan: Plan, ready: Option<OwnedFd>) -> CliResult {
    let mut ready = Ready(ready);
    let r = serve_inner(plan, &mut ready);
    if let Err(f) = &r {
        ready.fail(f);
    }
    r
}

fn serve_inner(plan: Plan, ready: &mut Ready) -> CliResult {
    let started = Instant::now();
    let Plan {
        image,
        mountpoint,
        dev,
        format,
        engine_opts,
        mount_opts,
        fs_opts,
        pid_file,
        run,
        foreground,
        cache_note,
        ..
    } = plan;
    if let Some(m) = cache_note {
        log::warn!("amaranth: {m}");
    }
    log::info!(
        "amaranth: opening {} ({}, {} nodes), cache {}, {} threads",
        image.display(),
        human(dev.len()),
        human(format.node_size as u64),
        human(engine_opts.cache_size as u64),
        mount_opts.threads
    );
    let engine = Arc::new(Engine::open(Arc::new(dev), engine_opts).map_err(|e| {
        Failure::new(match e {
            Error::Io { .. } | Error::InUse(_) | Error::InvalidConfig(_) => {
                format!("cannot open {}: {e}", image.display())
            }
            Error::UnsupportedVersion { .. } => format!(
                "cannot open {}: {}",
                image.display(),
                crate::image::engine_error(&image, &e)
            ),
            _ => format!(
                "cannot open {}: the image is damaged ({e}); check it with `amaranth fsck {}`",
                image.display(),
                image.display()
            ),
        })
    })?);
    let st = engine.stats();
    if st.opened_after_crash {
        log::warn!(
            "amaranth: {} was not closed cleanly; replayed {} log records ({})",
            image.display(),
            st.recovered_records,
            st.recovery_stop
        );
    }
    if st.needs_check {
        log::error!(
            "amaranth: {} is flagged for a check: log records that could not be applied were \
             skipped ({} now); unmount and run `amaranth fsck --repair`",
            image.display(),
            st.skipped_records
        );
    }
    let fs = match Fs::new(engine.clone(), fs_opts) {
        Ok(fs) => Arc::new(fs),
        Err(e) => {
            let damage = engine.stats().known_damage;
            let _ = close_engine(engine);
            return Err(Failure::new(match damage {
                // The damage is in what every mount reads (the root directory, the counters), so
                // even a read-only mount cannot go on: say what the read found.
                Some(_) => format!(
                    "cannot mount {}: the image is damaged where every mount reads ({e}); repair \
                     it with `amaranth fsck --repair {}`",
                    image.display(),
                    image.display()
                ),
                None => format!(
                    "{} does not hold a usable file system: {e}",
                    image.display()
                ),
            }));
        }
    };
    let handle = match amaranth_fuse::mount(fs.clone(), &mountpoint, &mount_opts) {
        Ok(h) => h,
        Err(e) => {
            drop(fs);
            let _ = close_engine(engine);
            return Err(Failure::new(format!(
                "cannot mount on {}: {e}",
                mountpoint.display()
            )));
        }
    };
    log::info!(
        "amaranth: mounted {} on {} (device {:?}, transport {})",
        image.display(),
        mountpoint.display(),
        handle.device(),
        handle.transport().name()
    );
    let pid = std::process::id();
    let run_pid = rundir::pid_name(&mountpoint);
    let written = run
        .open_for_writing(&run_pid, Create::Replace, 0o644)
        .and_then(|f| files::write_pid(&f, pid));
    if let Err(e) = written {
        log::warn!(
            "amaranth: cannot write the pid file {run_pid} in {}: {e}",
            run.path().display()
        );
    }
    if let Some(p) = &pid_file {
        let written = files::open_for_writing(p, Create::Replace, 0o644)
            .and_then(|f| files::write_pid(&f, pid));
        if let Err(e) = written {
            log::warn!("amaranth: cannot write the pid file {}: {e}", p.display());
        }
    }
    let control = crate::control::Control::start(
        fs.clone(),
        handle.counts(),
        handle.transport(),
        &image,
        &mountpoint,
        started,
        &run,
    );
    spawn_signal_thread(handle.unmounter());
    crate::failstop::panic_later_for_tests();
    ready.ok(handle.transport());
    let idle_note = crate::idle::halt_poll_note();
    if let Some(n) = &idle_note {
        log::info!("amaranth: {n}");
    }
    if foreground {
        note!(
            "mounted {} on {} (transport {}); unmount with `amaranth umount {}` or Ctrl-C",
            image.display(),
            mountpoint.display(),
            transport_text(handle.transport().name()),
            mountpoint.display()
        );
        if let Some(n) = &idle_note {
            note!("{n}");
        }
    }
    // Serve until unmounted.
    if let Err(e) = handle.join() {
        log::warn!("amaranth: the FUSE session ended with: {e}");
    }
    // The snapshots this daemon serves go with it.
    let left = amaranth_fuse::snapshot_ioctl::unmount_snapshots(std::time::Duration::from_secs(10));
    if left > 0 {
        log::warn!("amaranth: {left} snapshot mounts are still busy; closing anyway");
    }
    log::info!("amaranth: {} unmounted; closing", mountpoint.display());
    if let Err(e) = fs.end_session() {
        log::warn!("amaranth: deleting files unlinked while in use: {e} (the next mount does)");
    }
    drop(control);
    let leftover = Arc::strong_count(&fs) - 1;
    drop(fs);
    if leftover > 0 {
        log::error!("amaranth: {leftover} references to the file system remain at shutdown");
    }
    let r = close_engine(engine);
    if run.read_pid(&run_pid) == Some(pid as i32) {
        run.remove(&run_pid);
    }
    if let Some(p) = &pid_file {
        if files::read_pid(p) == Some(pid as i32) {
            let _ = std::fs::remove_file(p);
        }
    }
    r
}

/// Closes the engine (final checkpoint) once nothing else holds it.
fn close_engine(engine: Arc<Engine>) -> CliResult {
    let t = Instant::now();
    match Arc::try_unwrap(engine) {
        Ok(e) => match e.close() {
            Ok(()) => {
                log::info!(
                    "amaranth: final checkpoint written in {:.2} s; image closed cleanly",
                    t.elapsed().as_secs_f64()
                );
                Ok(())
            }
            Err(e) => Err(Failure::new(format!(
                "closing the engine failed: {e} (the log keeps everything acknowledged; \
                 the next mount replays it)"
            ))),
        },
        Err(e) => {
            let _ = e.sync();
            Err(Failure::new(
                "the engine is still referenced at shutdown; synced the log without a final \
                 checkpoint",
            ))
        }
    }
}

/// First SIGTERM/SIGINT/SIGHUP: unmount (lazily when busy: the daemon serves open files until
/// they are closed). A second one: abort the connection.
fn spawn_signal_thread(unmounter: Unmounter) {
    let set = signal_set();
    let _ = std::thread::Builder::new()
        .name("amaranth-signals".into())
        .spawn(move || {
            let mut count = 0;
            loop {
                let mut sig = 0;
                // SAFETY: waits for one of the blocked signals.
                let rc = unsafe { libc::sigwait(&set, &mut sig) };
                if rc != 0 {
                    continue;
                }
                count += 1;
                log::info!("amaranth: signal {sig}: unmounting");
                if count == 1 {
                    match unmounter.unmount(false) {
                        Ok(()) => {}
                        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                            log::warn!(
                                "amaranth: the mount is busy; detaching it (the daemon exits when \
                                 the last open file is closed; signal again to abort)"
                            );
                            if let Err(e) = unmounter.unmount(true) {
                                log::error!("amaranth: lazy unmount failed: {e}");
                            }
                        }
                        Err(e) => log::error!("amaranth: unmount failed: {e}"),
                    }
                } else if let Err(e) = unmounter.abort() {
                    log::error!("amaranth: aborting the connection failed: {e}");
                }
            }
        });
}
