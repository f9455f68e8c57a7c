//! `amaranth pg`: patchgroups for shells (docs/PATCHGROUPS.md).
//!
//! ```text
//! amaranth pg depend "CMD1" "CMD2" ...   # every change of CMD2 reaches the disk after every change of CMD1
//! amaranth pg run [--atomic] -- CMD ...  # one command in a group (atomic: all of it or nothing)
//! amaranth pg sync                       # everything so far durable, whatever the fsync mode
//! ```
//!
//! A command's group is engaged in the child between fork and exec (the daemon sees the child
//! for the first time there and gives it this process's groups), so every process the command
//! starts inherits it. This process is a child subreaper: it waits for the command's whole
//! process tree, so that the next command's group depends on all of the first one's changes.

use std::ffi::OsString;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::Command;

use amaranth_fuse::pg_ioctl::{Args, Cmd};
use clap::Subcommand;

use crate::util::{CliResult, Failure};

/// `PG_ATOMIC` of the ioctl interface.
const ATOMIC: u32 = 1;

/// The `pg` subcommands.
#[derive(Subcommand, Debug)]
pub enum PgCommand {
    /// Run the commands in order (`sh -c`); every change of each one (and of every process it
    /// starts) reaches the disk after every change of the one before, without fsync. Stops at
    /// the first command that fails and exits with its status.
    Depend {
        #[command(flatten)]
        common: Common,
        /// Make each command's changes an atomic group: after a crash, all of them or none.
        #[arg(long)]
        atomic: bool,
        /// At least two shell commands.
        #[arg(required = true, num_args = 2..)]
        commands: Vec<OsString>,
    },
    /// Run one command (and every process it starts) in a new group.
    Run {
        #[command(flatten)]
        common: Common,
        /// Make the group atomic: after a crash, all of the command's changes or none.
        #[arg(long)]
        atomic: bool,
        /// The program and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<OsString>,
    },
    /// Make everything done on the mount so far durable (also on a mount with fsync=ordered).
    Sync {
        #[command(flatten)]
        common: Common,
    },
}

/// Options every `pg` subcommand takes.
#[derive(clap::Args, Debug)]
pub struct Common {
    /// Any file or directory on the mount (default: $AMARANTH_PG_PATH, else the current
    /// directory).
    #[arg(long, short = 'C')]
    path: Option<PathBuf>,
    /// Wait until the changes are durable before exiting (depend, run).
    #[arg(long)]
    sync: bool,
    /// Append every patchgroup call and its result to this file.
    #[arg(long)]
    trace: Option<PathBuf>,
}

/// The patchgroup calls on one mount.
struct Ctl {
    fd: OwnedFd,
    trace: Option<File>,
}

fn errno_text(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ENOTTY) => "not an Amaranth mount (or a version without patchgroups)".into(),
        _ => e.to_string(),
    }
}

impl Ctl {
    fn open(common: &Common) -> CliResult<Ctl> {
        let path = common
            .path
            .clone()
            .or_else(|| std::env::var_os("AMARANTH_PG_PATH").map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from("."));
        let fd = File::open(&path)
            .map_err(|e| Failure::new(format!("{}: {e}", path.display())))?
            .into();
        let trace = match &common.trace {
            Some(t) => Some(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(t)
                    .map_err(|e| Failure::new(format!("trace file {}: {e}", t.display())))?,
            ),
            None => None,
        };
        Ok(Ctl { fd, trace })
    }

    fn call(&mut self, cmd: Cmd, mut args: Args) -> CliResult<Args> {
        let mut buf = args.encode();
        // SAFETY: the request's argument is a 24-byte buffer we own, as its number says.
        let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), cmd.number() as _, buf.as_mut_ptr()) };
        let err = std::io::Error::last_os_error();
        if r == 0 {
            args = Args::decode(&buf).unwrap_or(args);
        }
        if let Some(t) = &mut self.trace {
            let result = if r == 0 {
                format!("{}", args.group)
            } else {
                format!("-1 {err}")
            };
            let _ = writeln!(
                t,
                "{} {cmd:?} {} {} -> {result}",
                std::process::id(),
                args.group,
                args.other
            );
        }
        if r != 0 {
            return Err(Failure::new(format!(
                "patchgroup {cmd:?} of group {}: {}",
                args.group,
                errno_text(&err)
            )));
        }
        Ok(args)
    }

    fn create(&mut self, atomic: bool) -> CliResult<u64> {
        let flags = if atomic { ATOMIC } else { 0 };
        Ok(self
            .call(
                Cmd::Create,
                Args {
                    flags,
                    ..Args::default()
                },
            )?
            .group)
    }

    fn simple(&mut self, cmd: Cmd, group: u64) -> CliResult {
        self.call(
            cmd,
            Args {
                group,
                ..Args::default()
            },
        )
        .map(|_| ())
    }

    /// Runs `argv` with `group` engaged in it and in everything it starts; waits for all of them.
    fn run_in(&mut self, group: u64, argv: &[OsString]) -> CliResult<i32> {
        let fd = self.fd.as_raw_fd();
        let number = Cmd::Engage.number();
        let arg = Args {
            group,
            ..Args::default()
        }
        .encode();
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..]);
        // SAFETY: the closure only makes one ioctl system call on a descriptor that stays open
        // until exec (async-signal-safe), on a copy of a buffer.
        unsafe {
            cmd.pre_exec(move || {
                let mut b = arg;
                if libc::ioctl(fd, number as _, b.as_mut_ptr()) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let status = cmd
            .spawn()
            .map_err(|e| {
                Failure::new(format!(
                    "cannot start {:?} in patchgroup {group}: {}",
                    argv[0],
                    errno_text(&e)
                ))
            })?
            .wait()
            .map_err(|e| Failure::new(format!("waiting for {:?}: {e}", argv[0])))?;
        wait_for_descendants();
        if let Some(t) = &mut self.trace {
            let _ = writeln!(
                t,
                "{} ran {argv:?} in {group}: {status}",
                std::process::id()
            );
        }
        Ok(status
            .code()
            .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)))
    }
}

/// Becomes a child subreaper: orphans of the commands become our children, so we can wait for
/// the whole tree.
fn become_subreaper() {
    // SAFETY: prctl with an integer argument.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    }
}

/// Waits for every remaining child (orphaned descendants included).
fn wait_for_descendants() {
    loop {
        let mut status = 0;
        // SAFETY: waitpid on any child with a valid status pointer.
        let r = unsafe { libc::waitpid(-1, &mut status, 0) };
        if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return; // ECHILD: none left
        }
    }
}

fn shell(cmd: &OsString) -> Vec<OsString> {
    vec!["/bin/sh".into(), "-c".into(), cmd.clone()]
}

/// `amaranth pg ...`.
pub fn run(command: PgCommand) -> CliResult<i32> {
    match command {
        PgCommand::Depend {
            common,
            atomic,
            commands,
        } => {
            let argvs: Vec<Vec<OsString>> = commands.iter().map(shell).collect();
            chain(&common, atomic, &argvs)
        }
        PgCommand::Run {
            common,
            atomic,
            command,
        } => chain(&common, atomic, &[command]),
        PgCommand::Sync { common } => {
            let mut ctl = Ctl::open(&common)?;
            ctl.simple(Cmd::Sync, 0)?;
            Ok(0)
        }
    }
}

/// Runs each command in its own group, each depending on the one before.
fn chain(common: &Common, atomic: bool, argvs: &[Vec<OsString>]) -> CliResult<i32> {
    let mut ctl = Ctl::open(common)?;
    become_subreaper();
    let mut prev: Option<u64> = None;
    for argv in argvs {
        let g = ctl.create(atomic)?;
        if let Some(p) = prev {
            ctl.call(
                Cmd::Depend,
                Args {
                    group: g,
                    other: p,
                    flags: 0,
                },
            )?;
            ctl.simple(Cmd::Abandon, p)?;
        }
        ctl.simple(Cmd::Release, g)?;
        let code = ctl.run_in(g, argv)?;
        prev = Some(g);
        if code != 0 {
            let _ = ctl.simple(Cmd::Abandon, g);
            return Ok(code);
        }
    }
    let last = prev.expect("at least one command");
    if common.sync {
        ctl.simple(Cmd::Sync, last)?;
    }
    ctl.simple(Cmd::Abandon, last)?;
    Ok(0)
}
