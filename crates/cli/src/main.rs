//! `amaranth`: make, mount, unmount, check and inspect Amaranth file systems.
//!
//! ```text
//! amaranth mkfs IMAGE --size 8G [-L LABEL] [-U UUID]  # a new image file (or a block device)
//! amaranth mount IMAGE DIR [-o OPTIONS]  # daemonizes once the mount is live
//! amaranth umount DIR [-l] [--timeout S] # returns after the daemon's final checkpoint
//! amaranth fsck IMAGE [-n|-y|-p] [-f]    # 0 clean, 1 corrected, 4 left, 8 operational, 16 usage
//! amaranth stat IMAGE|DIR [--json]
//! amaranth upgrade IMAGE                 # makes an older image format 4 (format 1/2: nodes rewritten once)
//! amaranth install-helper                # /usr/local/bin/amaranth + helpers in /sbin
//! amaranth pg depend "CMD1" "CMD2"       # CMD2's changes reach the disk after CMD1's (no fsync)
//! amaranth clone SRC DST                 # a directory tree (or file) cloned on its mount, atomically
//! amaranth snapshot create|delete NAME MOUNTPOINT  # a snapshot of the whole mount (root only)
//! amaranth snapshot list MOUNTPOINT
//! amaranth snapshot mount NAME MOUNTPOINT DIR   # read-only beside the live tree
//! ```
//!
//! Installed under the helper names (`mount.fuse.amaranth`, `umount.fuse.amaranth`,
//! `fsck.amaranth`, `mkfs.amaranth`: links to this binary), it is what `mount(8)`, `umount(8)`,
//! `fsck(8)` and `mkfs(8)` run for Amaranth (see `helpers.rs`).

// The `amaranth stat` JSON object has more fields than serde_json's macro expands by default.
#![recursion_limit = "256"]

#[macro_use]
mod out;

mod clone;
mod control;
mod failstop;
mod files;
mod fsck;
mod fsck_cmd;
mod helpers;
mod idle;
mod image;
mod install;
mod memlimit;
mod mkfs;
mod mount;
mod options;
mod pg;
mod probe;
mod release;
mod remount;
mod rundir;
mod snapshot;
mod stat;
mod umount;
mod upgrade;
mod utab;
mod util;

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};

use crate::util::{parse_size, CliResult};

/// Amaranth: a write-optimized file system (a Bε-tree under full-path keys), mounted with FUSE.
#[derive(Parser, Debug)]
#[command(name = "amaranth", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create a new file system on an image file or a block device.
    Mkfs {
        /// Image file (created sparse, or an existing one resized to --size) or block device.
        image: PathBuf,
        /// Size of the image file, e.g. 8G, 512M or 1T (not for block devices).
        #[arg(long, value_parser = parse_size)]
        size: Option<u64>,
        /// Node size of the Bε-tree (a power of two, default 4M).
        #[arg(long, value_parser = parse_size)]
        node_size: Option<u64>,
        /// Compression of nodes: none, lz4 or zstd.
        #[arg(long, default_value = "none")]
        compression: String,
        /// Overwrite what the target holds (a file system blkid recognises, an Amaranth one, or
        /// other data), or make an image larger than the host's free space.
        #[arg(short = 'f', long)]
        force: bool,
        /// Label of the file system (at most 64 bytes), shown by `amaranth stat`.
        #[arg(short = 'L', long, default_value = "")]
        label: String,
        /// UUID of the file system (default: random).
        #[arg(short = 'U', long, value_parser = mkfs::parse_uuid_arg)]
        uuid: Option<Option<[u8; 16]>>,
    },
    /// Mount a file system (returns once mounted; the daemon stays in the background).
    Mount {
        /// Image file or block device.
        image: PathBuf,
        /// Mount point: an existing directory (what it holds is hidden while mounted).
        dir: PathBuf,
        /// Stay in the foreground and log to stderr.
        #[arg(short, long)]
        foreground: bool,
        /// Engine cache size (default: 1/4 of RAM, at most 2 GiB and 1/4 of the image).
        #[arg(long, value_parser = parse_size)]
        cache_size: Option<u64>,
        /// Threads serving FUSE requests over /dev/fuse (default: 16).
        #[arg(long)]
        threads: Option<usize>,
        /// How FUSE requests travel: `uring` (FUSE-over-io_uring, one queue per CPU; fails when
        /// the kernel lacks it), `dev` (/dev/fuse), or `auto` (uring when available; default).
        /// As root, `uring` and `auto` turn on the fuse module's enable_uring parameter, and
        /// /dev/fuse turns on its wake_here parameter where the kernel has one (docs/DESIGN.md §3).
        #[arg(long, value_name = "uring|dev|auto")]
        transport: Option<String>,
        /// Also write the daemon's pid to this file.
        #[arg(long)]
        pid_file: Option<PathBuf>,
        /// Log file of the background daemon (default: /var/log/amaranth-NAME.log as root, NAME.log
        /// in the run directory otherwise; NAME is the mount point's path with its slashes as
        /// dashes, e.g. mnt-data for /mnt/data).
        #[arg(long)]
        log_file: Option<PathBuf>,
        /// Mount options: ro, rw, dev, nodev, suid, nosuid, exec, noexec, noatime, relatime,
        /// strictatime, lazytime, sync, dirsync, allow_other, default_permissions, cache_size=,
        /// threads=, ring_threads=, ring_affinity=cpu|any, ring_wake=cpu|any, read_ahead_kb=,
        /// out_of_line_min=, log=, pid_file=; unknown ones are refused.
        #[arg(short = 'o', value_name = "OPTIONS")]
        options: Vec<String>,
    },
    /// Unmount and wait until the daemon has written its final checkpoint and exited.
    #[command(alias = "unmount")]
    Umount {
        /// Mount point.
        dir: PathBuf,
        /// Detach even if files are open and return at once (the daemon finishes when the last
        /// of them is closed).
        #[arg(short, long)]
        lazy: bool,
        /// Give up after this many seconds (the unmount and the wait for the daemon).
        #[arg(long)]
        timeout: Option<u64>,
    },
    /// Check an unmounted file system (exit 0 clean, 1 corrected, 4 errors left, 8 operational,
    /// 16 usage), with e2fsck's flags.
    Fsck {
        /// Image file or block device.
        image: PathBuf,
        /// Fix what can be fixed: rebuild a damaged tree from its intact parts, rewrite damaged
        /// superblock copies, move entries whose directory is gone to /lost+found, fix counts.
        #[arg(long)]
        repair: bool,
        /// Repair (as e2fsck -y: a cleanly closed image is not checked without -f).
        #[arg(short = 'y')]
        yes: bool,
        /// Repair automatically (as e2fsck -p, -a).
        #[arg(short = 'p', short_alias = 'a')]
        preen: bool,
        /// Change nothing (the image is opened read-only).
        #[arg(short = 'n')]
        no_changes: bool,
        /// With -n, -y or -p: check even an image that was closed cleanly.
        #[arg(short = 'f')]
        force: bool,
        /// Accept an older superblock copy that no backup vouches for when the newer one is
        /// damaged (operations since that checkpoint may be lost).
        #[arg(long)]
        fallback_superblock: bool,
    },
    /// Show an image's parameters, or a mounted file system's live statistics.
    Stat {
        /// Image file (offline) or mount point (asks the running daemon).
        target: PathBuf,
        /// Machine-readable JSON.
        #[arg(long)]
        json: bool,
    },
    /// Make an image of an older format this build's format 4 (formats 1 and 2: every node rewritten once).
    /// The image must have been unmounted cleanly; an interrupted upgrade can be run again.
    Upgrade {
        /// Image file or block device (not mounted).
        image: PathBuf,
    },
    /// Install this binary as /usr/local/bin/amaranth and the helpers mount.fuse.amaranth,
    /// umount.fuse.amaranth, fsck.amaranth, fsck.fuse.amaranth and mkfs.amaranth in /sbin (for
    /// mount, umount, fsck and mkfs with -t, and /etc/fstab).
    InstallHelper {
        /// Where the binary goes.
        #[arg(long, default_value = "/usr/local/bin")]
        bin_dir: PathBuf,
        /// Where the helpers go.
        #[arg(long, default_value = "/sbin")]
        sbin_dir: PathBuf,
        /// The type: amaranth, or amaranth-NAME to install a second build beside the first
        /// (mounts are then of type fuse.amaranth-NAME).
        #[arg(long = "type", default_value = "amaranth")]
        subtype: String,
        /// Remove the helper links of that type instead.
        #[arg(long)]
        remove: bool,
    },
    /// Patchgroups for shells: order commands' changes without fsync (docs/PATCHGROUPS.md).
    Pg {
        #[command(subcommand)]
        command: pg::PgCommand,
    },
    /// Clone a directory tree (or a regular file) to a new name on the same mount, atomically:
    /// the copy shares its data with the source until either is written, and costs one small
    /// record per inode plus a few tree operations, whatever the size of the data.
    ///
    /// Any user may clone what they may read (every file under SRC, and every directory with
    /// search permission) into a directory they may write. A clone by a user other than root
    /// keeps owners and modes but clears the set-user-id and set-group-id bits and the file
    /// capabilities of everything that user does not own; root's clone keeps everything. Hard
    /// links under SRC become separate files (as with `cp -r`). After a crash, the clone is
    /// either all there or not there at all. Errors change nothing.
    #[command(
        after_help = "Examples:\n  amaranth clone /mnt/src/linux /mnt/src/linux-work\n  amaranth clone -v big.img big-copy.img"
    )]
    Clone {
        /// The directory or regular file to clone (on an Amaranth mount).
        src: PathBuf,
        /// The new name: must not exist; its parent must be on the same mount.
        dst: PathBuf,
        /// Say how many inodes were made and how long the metadata copy and the commit took.
        #[arg(short, long)]
        verbose: bool,
    },
    /// Snapshots of a whole mounted file system: read-only, point-in-time, taken in the time of
    /// one small copy while the file system is in use, kept until deleted (docs/SURGERY.md
    /// §4.7). Creating and deleting need root. A snapshot holds every change acknowledged
    /// before it and none after (after a crash too); changes still in the kernel's page cache
    /// are not acknowledged: `sync` first to include them. Errors change nothing.
    #[command(
        after_help = "Examples:\n  amaranth snapshot create nightly /mnt/data\n  amaranth snapshot list /mnt/data\n  amaranth snapshot delete nightly /mnt/data"
    )]
    Snapshot {
        #[command(subcommand)]
        command: snapshot::SnapshotCommand,
    },
    /// The mount helper: `IMAGE DIR -o OPTIONS` as mount(8) passes them.
    #[command(hide = true)]
    MountHelper {
        /// Arguments as mount(8) passes them.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
}

fn exit_with(r: CliResult<i32>) -> ! {
    let code = match r {
        Ok(code) => code,
        Err(f) => {
            note!("amaranth: {}", f.message);
            f.code
        }
    };
    match out::finish() {
        Some(e) => {
            note!("amaranth: cannot write the output: {e}");
            std::process::exit(if code == 0 { 1 } else { code })
        }
        None => std::process::exit(code),
    }
}

fn main() {
    // Before any thread starts.
    memlimit::bound_allocator();
    failstop::install();
    // Not `env::args()`: it panics on arguments that are not UTF-8.
    let argv: Vec<OsString> = std::env::args_os().collect();
    let argv0 = argv
        .first()
        .map(|a| {
            Path::new(a)
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned()
        })
        .unwrap_or_default();
    if let Some(h) = helpers::from_name(&argv0) {
        exit_with(helpers::run(h, &argv[1..]));
    }
    let cli = Cli::parse();
    let r = match cli.command {
        Command::Mkfs {
            image,
            size,
            node_size,
            compression,
            force,
            label,
            uuid,
        } => mkfs::run(mkfs::MkfsArgs {
            image: &image,
            size,
            node_size,
            compression: &compression,
            force,
            label: &label,
            uuid: uuid.flatten(),
        })
        .map(|()| 0),
        Command::Mount {
            image,
            dir,
            foreground,
            cache_size,
            threads,
            transport,
            pid_file,
            log_file,
            options,
        } => mount::run(mount::MountArgs {
            image,
            dir,
            foreground,
            cache_size,
            threads,
            transport,
            pid_file,
            options,
            log_file,
            ..mount::MountArgs::default()
        })
        .map(|()| 0),
        Command::Umount { dir, lazy, timeout } => umount::run(&dir, lazy, timeout).map(|()| 0),
        Command::Fsck {
            image,
            repair,
            yes,
            preen,
            no_changes,
            force,
            fallback_superblock,
        } => {
            let e2fsck_style = yes || preen || no_changes;
            fsck_cmd::run(&fsck_cmd::FsckRequest {
                image,
                repair: repair || yes || preen,
                no_changes,
                // Plain `amaranth fsck IMG` (and --repair) always checks in full.
                force: force || !e2fsck_style,
                fallback_superblock,
            })
        }
        Command::Stat { target, json } => stat::run(&target, json).map(|()| 0),
        Command::Upgrade { image } => upgrade::run(&image),
        Command::InstallHelper {
            bin_dir,
            sbin_dir,
            subtype,
            remove,
        } => if remove {
            install::remove(&sbin_dir, &subtype)
        } else {
            install::run(&bin_dir, &sbin_dir, &subtype)
        }
        .map(|()| 0),
        Command::MountHelper { args } => {
            helpers::run(helpers::Helper::Mount(amaranth_fuse::SUBTYPE.into()), &args)
        }
        Command::Pg { command } => pg::run(command),
        Command::Clone { src, dst, verbose } => clone::run(&src, &dst, verbose),
        Command::Snapshot { command } => snapshot::run(command),
    };
    exit_with(r)
}
