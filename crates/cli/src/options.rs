//! Mount options as `mount(8)`, fstab lines and `amaranth mount -o` give them: every option is
//! either honoured or refused in one line that names it.
//!
//! `mount(8)` does not pass the options that are its defaults (`dev`, `suid`, `exec`, `rw`,
//! `relatime`), only their negations, so a mount made through it (`Origin::MountCommand`) starts
//! from `mount(8)`'s defaults: devices and set-id bits honoured, as on a kernel file system. A
//! mount made with `amaranth mount` keeps FUSE's defaults: `nodev,nosuid`. On a remount `mount(8)`
//! passes the mount's current options merged with the new ones, including the FUSE kernel options
//! it read from `/proc/mounts` (`user_id=`, `group_id=`, ...), which are accepted and left alone.

use std::path::PathBuf;

use amaranth_fuse::MountOptions;

use crate::util::{parse_size, CliResult, Failure};

/// Who asked for the mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// `amaranth mount`.
    Cli,
    /// `mount(8)` through the mount helper.
    MountCommand,
}

/// Everything the options decide.
#[derive(Clone, Debug)]
pub struct Parsed {
    /// What goes to the kernel and the FUSE layer.
    pub mount: MountOptions,
    /// `remount` was given.
    pub remount: bool,
    /// `cache_size=`.
    pub cache_size: Option<u64>,
    /// `read_ahead_kb=` (otherwise the mount chooses from the cache size: `mount.rs`).
    pub read_ahead_kb: Option<u32>,
    /// `threads=`.
    pub threads: Option<usize>,
    /// `log=` / `log_file=`.
    pub log_file: Option<PathBuf>,
    /// `pid_file=`.
    pub pid_file: Option<PathBuf>,
    /// `foreground`.
    pub foreground: bool,
    /// `transport=` (uring, dev or auto).
    pub transport: Option<String>,
    /// `fsync=ordered`: fsync is an ordering point that returns at once (docs/PATCHGROUPS.md).
    pub ordered_fsync: bool,
    /// `out_of_line_min=N`: a write's run of whole blocks of at least N bytes goes out of line
    /// (`0`: never; default 64 KiB, docs/WRITEONCE.md).
    pub out_of_line_min: Option<usize>,
    /// `rename_copy_max=BYTES`: renames copy ranges up to this size, move larger ones by tree
    /// surgery (`FsOptions::rename_copy_max`; for measuring the crossover).
    pub rename_copy_max: Option<u32>,
    /// `discard` (the default) / `nodiscard`: give freed space back to the image file or block
    /// device after each checkpoint (engine `Options::discard`).
    pub discard: bool,
}

impl Parsed {
    /// The starting point for `origin` (see the module documentation).
    pub fn defaults(origin: Origin, root: bool) -> Parsed {
        let kernel_like = origin == Origin::MountCommand && root;
        Parsed {
            mount: MountOptions {
                // Other users may use a mount root made (the kernel checks permissions); for others
                // fusermount3 refuses allow_other unless /etc/fuse.conf has user_allow_other.
                allow_other: root,
                dev: kernel_like,
                suid: kernel_like,
                ..MountOptions::default()
            },
            remount: false,
            cache_size: None,
            read_ahead_kb: None,
            threads: None,
            log_file: None,
            pid_file: None,
            foreground: false,
            transport: None,
            ordered_fsync: false,
            out_of_line_min: None,
            rename_copy_max: None,
            discard: true,
        }
    }

    /// Applies the comma-separated lists `lists`.
    pub fn apply(&mut self, lists: &[String]) -> CliResult {
        let mut kernel_options = Vec::new();
        for opt in lists.iter().flat_map(|l| l.split(',')) {
            let opt = opt.trim();
            if opt.is_empty() {
                continue;
            }
            let (key, val) = match opt.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (opt, None),
            };
            if let Some(k) = self.apply_one(key, val, opt)? {
                kernel_options.push(k);
            }
        }
        if !self.remount {
            if let Some(k) = kernel_options.first() {
                return Err(Failure::new(format!(
                    "mount option {k:?} is set by amaranth itself (it is accepted only with remount, \
                     where mount(8) passes the mount's current options back)"
                )));
            }
        }
        Ok(())
    }

    /// Applies one option. Returns the option if it is a FUSE kernel option (only accepted on a
    /// remount).
    fn apply_one<'a>(
        &mut self,
        key: &str,
        val: Option<&str>,
        opt: &'a str,
    ) -> CliResult<Option<&'a str>> {
        let m = &mut self.mount;
        let flag = |v: Option<&str>| match v {
            None => Ok(()),
            Some(_) => Err(Failure::new(format!("mount option {key} takes no value"))),
        };
        match key {
            "cache_size" | "cache-size" => {
                self.cache_size = Some(parse_size(need(key, val)?).map_err(Failure::new)?)
            }
            "threads" => self.threads = Some(number(key, val)?),
            "log" | "log_file" => self.log_file = Some(PathBuf::from(need(key, val)?)),
            "pid_file" | "pidfile" => self.pid_file = Some(PathBuf::from(need(key, val)?)),
            "transport" => self.transport = Some(need(key, val)?.to_string()),
            "fsync" => {
                self.ordered_fsync = match need(key, val)? {
                    "ordered" => true,
                    "durable" => false,
                    v => {
                        return Err(Failure::new(format!(
                            "fsync={v}: use fsync=durable or fsync=ordered"
                        )))
                    }
                }
            }
            "read_ahead_kb" => self.read_ahead_kb = Some(number(key, val)?),
            "ring_threads" => {
                let n: usize = number(key, val)?;
                if n == 0 || n > 64 {
                    return Err(Failure::new("mount option ring_threads must be 1 to 64"));
                }
                m.ring_threads = n;
            }
            "ring_affinity" => {
                m.ring_pinned = match need(key, val)? {
                    "cpu" => true,
                    "any" => false,
                    v => {
                        return Err(Failure::new(format!(
                            "ring_affinity={v}: use ring_affinity=cpu (threads wait on their \
                             queue's CPU) or ring_affinity=any"
                        )))
                    }
                }
            }
            "ring_wake" => {
                m.ring_wake_here = match need(key, val)? {
                    "cpu" => true,
                    "any" => false,
                    v => {
                        return Err(Failure::new(format!(
                            "ring_wake={v}: use ring_wake=cpu (a reply wakes its caller on the \
                             serving CPU) or ring_wake=any"
                        )))
                    }
                }
            }
            "out_of_line_min" => {
                self.out_of_line_min =
                    Some(parse_size(need(key, val)?).map_err(Failure::new)? as usize)
            }
            "rename_copy_max" => {
                let v = parse_size(need(key, val)?).map_err(Failure::new)?;
                self.rename_copy_max = Some(v.min(u32::MAX as u64) as u32);
            }
            // FUSE options the kernel shows in /proc/mounts (mount(8) passes them on a remount).
            "user_id" | "group_id" | "rootmode" | "max_read" | "blksize" | "fd" => {
                return Ok(Some(opt))
            }
            _ => {
                flag(val)?;
                return self.apply_flag(key, opt);
            }
        }
        Ok(None)
    }

    fn apply_flag<'a>(&mut self, key: &str, opt: &'a str) -> CliResult<Option<&'a str>> {
        let m = &mut self.mount;
        match key {
            "foreground" => self.foreground = true,
            "discard" => self.discard = true,
            "nodiscard" => self.discard = false,
            "remount" => self.remount = true,
            "ro" => m.read_only = true,
            "rw" => m.read_only = false,
            "dev" => m.dev = true,
            "nodev" => m.dev = false,
            "suid" => m.suid = true,
            "nosuid" => m.suid = false,
            "exec" => m.noexec = false,
            "noexec" => m.noexec = true,
            "noatime" => (m.noatime, m.strictatime) = (true, false),
            // norelatime: the kernel's default without relatime is relatime too.
            "atime" | "relatime" | "norelatime" => (m.noatime, m.strictatime) = (false, false),
            "strictatime" => (m.noatime, m.strictatime) = (false, true),
            "nostrictatime" => m.strictatime = false,
            "lazytime" => m.lazytime = true,
            "nolazytime" => m.lazytime = false,
            // Directory access times are never updated (listing a directory writes nothing).
            "nodiratime" => {}
            "sync" => m.sync = true,
            "dirsync" => m.dirsync = true,
            "async" => (m.sync, m.dirsync) = (false, false),
            "allow_other" | "allow_root" => m.allow_other = true,
            "default_permissions" => m.default_permissions = true,
            // mount(8) and fstab options that mount(8) acts on itself.
            "defaults" | "auto" | "noauto" | "user" | "users" | "nouser" | "owner" | "group"
            | "_netdev" | "nofail" | "loop" => {}
            k if k.starts_with("x-") || k == "comment" => {}
            "diratime" => {
                return Err(Failure::new(
                    "mount option diratime is not supported: directory access times are never \
                     updated (as with nodiratime)",
                ))
            }
            _ => return Err(unknown(opt)),
        }
        Ok(None)
    }
}

fn unknown(opt: &str) -> Failure {
    Failure::new(format!(
        "unknown mount option {opt:?} (see `amaranth mount --help` for the options amaranth \
         honours)"
    ))
}

fn need<'a>(key: &str, v: Option<&'a str>) -> CliResult<&'a str> {
    v.filter(|v| !v.is_empty())
        .ok_or_else(|| Failure::new(format!("mount option {key} needs a value ({key}=...)")))
}

fn number<T: std::str::FromStr>(key: &str, v: Option<&str>) -> CliResult<T> {
    let v = need(key, v)?;
    v.parse()
        .map_err(|_| Failure::new(format!("mount option {key}: bad value {v:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(origin: Origin, s: &str) -> CliResult<Parsed> {
        let mut p = Parsed::defaults(origin, true);
        p.apply(&[s.to_string()])?;
        Ok(p)
    }

    #[test]
    fn mount_command_defaults_are_a_kernel_file_system_s() {
        let p = parse(Origin::MountCommand, "rw").unwrap();
        assert!(p.mount.dev && p.mount.suid && !p.mount.noexec);
        let p = parse(Origin::Cli, "rw").unwrap();
        assert!(!p.mount.dev && !p.mount.suid);
        let p = parse(Origin::MountCommand, "nodev,nosuid,noexec").unwrap();
        assert!(!p.mount.dev && !p.mount.suid && p.mount.noexec);
        let p = parse(Origin::Cli, "dev,suid").unwrap();
        assert!(p.mount.dev && p.mount.suid);
    }

    #[test]
    fn atime_sync_and_read_only() {
        let p = parse(Origin::Cli, "ro,noatime,lazytime,sync").unwrap();
        assert!(p.mount.read_only && p.mount.noatime && p.mount.lazytime && p.mount.sync);
        assert!(!p.ordered_fsync);
        assert!(parse(Origin::Cli, "fsync=ordered").unwrap().ordered_fsync);
        assert_eq!(
            parse(Origin::Cli, "out_of_line_min=256k")
                .unwrap()
                .out_of_line_min,
            Some(256 << 10)
        );
        assert!(
            !parse(Origin::Cli, "fsync=ordered,fsync=durable")
                .unwrap()
                .ordered_fsync
        );
        assert!(parse(Origin::Cli, "fsync=sometimes").is_err());
        assert!(
            parse(Origin::Cli, "ro").unwrap().discard,
            "discard is the default"
        );
        assert!(!parse(Origin::Cli, "nodiscard").unwrap().discard);
        assert!(parse(Origin::Cli, "nodiscard,discard").unwrap().discard);
        assert!(parse(Origin::Cli, "discard=1").is_err());
        assert_eq!(
            parse(Origin::Cli, "rename_copy_max=64K")
                .unwrap()
                .rename_copy_max,
            Some(64 << 10)
        );
        assert_eq!(parse(Origin::Cli, "rw").unwrap().rename_copy_max, None);
        assert_eq!(
            parse(Origin::Cli, "ring_threads=3")
                .unwrap()
                .mount
                .ring_threads,
            3
        );
        assert!(parse(Origin::Cli, "ring_threads=0").is_err());
        assert!(parse(Origin::Cli, "rw").unwrap().mount.ring_pinned);
        assert!(
            !parse(Origin::Cli, "ring_affinity=any")
                .unwrap()
                .mount
                .ring_pinned
        );
        assert!(parse(Origin::Cli, "ring_affinity=some").is_err());
        assert!(parse(Origin::Cli, "rw").unwrap().mount.ring_wake_here);
        assert!(
            !parse(Origin::Cli, "ring_wake=any")
                .unwrap()
                .mount
                .ring_wake_here
        );
        assert!(parse(Origin::Cli, "ring_wake=here").is_err());
        let p = parse(Origin::Cli, "noatime,strictatime").unwrap();
        assert!(!p.mount.noatime && p.mount.strictatime);
        let p = parse(Origin::Cli, "strictatime,relatime,dirsync").unwrap();
        assert!(!p.mount.noatime && !p.mount.strictatime && p.mount.dirsync);
    }

    #[test]
    fn unknown_and_impossible_options_are_refused_in_one_line() {
        for bad in [
            "bogus",
            "cache_size=lots",
            "cache_size=",
            "threads=x",
            "ro=1",
            "diratime",
            "user_id=0",
            "fsname=x",
        ] {
            let e = parse(Origin::MountCommand, bad).unwrap_err();
            assert!(!e.message.contains('\n'), "{bad}: {}", e.message);
        }
        // What mount(8) passes back on a remount is accepted there.
        let p = parse(
            Origin::MountCommand,
            "ro,nosuid,nodev,relatime,remount,user_id=0,group_id=0,default_permissions,allow_other",
        )
        .unwrap();
        assert!(p.remount && p.mount.read_only && !p.mount.dev);
    }
}
