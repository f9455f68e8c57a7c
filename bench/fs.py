"""File-system drivers: make, mount, unmount, and the cold-cache remount, for ext4/XFS/Btrfs and
Amaranth (a FUSE daemon driven through its CLI)."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from . import cleanup
from .device import LoopDevice
from .util import CommandError, run, read_file, write_file


class FsUnavailable(RuntimeError):
    """The file system cannot be used at all (missing tool or binary)."""


def is_mounted(mnt: Path) -> bool:
    target = str(mnt.resolve())
    for line in read_file("/proc/self/mountinfo").splitlines():
        f = line.split()
        if len(f) > 4 and f[4].replace("\\040", " ") == target:
            return True
    return False


def mount_fstype(mnt: Path) -> str:
    target = str(mnt.resolve())
    for line in read_file("/proc/self/mountinfo").splitlines():
        left, _, right = line.partition(" - ")
        f = left.split()
        if len(f) > 4 and f[4] == target:
            return right.split()[0]
    return ""


def drop_caches() -> None:
    os.sync()
    write_file("/proc/sys/vm/drop_caches", "3")


def syncfs(mnt: Path, cgroups=()) -> float:
    """syncfs(2) on the mounted file system (via `sync -f`); returns seconds.

    The kernel does not pass syncfs(2) on to a FUSE daemon (only virtiofs asks for it), so on a FUSE
    mount `sync -f` only flushes the kernel's side and Amaranth would not make anything durable. There
    the mount's root directory is fsync()ed as well (`sync DIR`, FUSE_FSYNCDIR), which Amaranth turns
    into a sync of its whole log, so "+ sync" costs every file system a real flush."""
    secs = run(["sync", "-f", str(mnt)], cgroups=cgroups, timeout=3600).elapsed
    if mount_fstype(mnt).startswith("fuse"):
        secs += run(["sync", str(mnt)], cgroups=cgroups, timeout=3600).elapsed
    return secs


class Driver:
    name = ""
    kernel = True

    def check(self) -> None:
        """Raise FsUnavailable if this FS cannot run here."""

    def version(self) -> str:
        return ""

    def mkfs(self, loop: LoopDevice, log: Path) -> None:
        raise NotImplementedError

    def mount(self, loop: LoopDevice, mnt: Path, cgroups, log: Path) -> None:
        raise NotImplementedError

    def umount(self, mnt: Path, log: Path) -> None:
        raise NotImplementedError

    def force_umount(self, mnt: Path) -> None:
        raise NotImplementedError


class KernelFs(Driver):
    mkfs_cmd: list[str] = []
    fstype = ""

    def check(self) -> None:
        from shutil import which

        if not which(self.mkfs_cmd[0]):
            raise FsUnavailable(f"{self.mkfs_cmd[0]} not installed (scripts/install-deps.sh --bench)")

    def version(self) -> str:
        try:
            r = run([self.mkfs_cmd[0], "-V"], log=False, check=False)
            return (r.stdout + r.stderr).strip().splitlines()[0]
        except (CommandError, IndexError):
            return ""

    def mkfs(self, loop, log):
        run(self.mkfs_cmd + [loop.dev], timeout=600)

    def mount(self, loop, mnt, cgroups, log):
        run(["mount", "-t", self.fstype, loop.dev, str(mnt)], timeout=300)

    def umount(self, mnt, log):
        last = None
        for attempt in range(10):
            try:
                run(["umount", str(mnt)], timeout=600)
                return
            except CommandError as e:  # EBUSY right after a workload exits: retry
                last = e
                time.sleep(0.3 * (attempt + 1))
        raise last

    def force_umount(self, mnt):
        if is_mounted(mnt):
            try:
                run(["umount", str(mnt)], timeout=600, check=True)
            except CommandError:
                run(["umount", "-l", str(mnt)], check=False)


class Ext4(KernelFs):
    name = "ext4"
    fstype = "ext4"
    # no lazy inode-table / journal init: no background writes after mkfs (as BetrFS's scripts do)
    mkfs_cmd = ["mkfs.ext4", "-F", "-q", "-E", "lazy_itable_init=0,lazy_journal_init=0"]


class Xfs(KernelFs):
    name = "xfs"
    fstype = "xfs"
    mkfs_cmd = ["mkfs.xfs", "-f", "-q"]


class Btrfs(KernelFs):
    name = "btrfs"
    fstype = "btrfs"
    mkfs_cmd = ["mkfs.btrfs", "-f", "-q"]

    def version(self) -> str:
        try:
            return run(["mkfs.btrfs", "--version"], log=False).stdout.strip().splitlines()[0]
        except (CommandError, IndexError):
            return ""


class Amaranth(Driver):
    """The CLI contract: `amaranth mkfs DEV`, `amaranth mount DEV DIR --cache-size BYTES --pid-file F`
    (returns once mounted, daemon stays), `amaranth umount DIR` (returns after the daemon wrote
    everything and exited), `amaranth stat DIR --json`."""

    name = "amaranth"
    kernel = False

    def __init__(self, binary: Path, cache_size: int, pid_dir: Path, compression: str = "",
                 mount_options: str = ""):
        self.bin = binary
        self.cache_size = cache_size
        self.compression = compression  # `mkfs --compression`; '' = the mkfs default
        self.pid_dir = pid_dir
        self.pid: int | None = None
        self.hwm_kb = 0  # highest VmHWM seen over daemons since reset_stats()
        self.daemon_cpu_s = 0.0
        self._log_file_opt: bool | None = None
        self.extra_mount_args: list[str] = []  # e.g. ["-o", "fsync=ordered"] (imapmove)
        self.mount_options = ["-o", mount_options] if mount_options else []  # every mount

    def check(self) -> None:
        if not self.bin.exists():
            raise FsUnavailable(f"amaranth binary not found at {self.bin} (build it with `cargo build --release`)")
        if not os.access(self.bin, os.X_OK):
            raise FsUnavailable(f"{self.bin} is not executable")
        if not Path("/dev/fuse").exists():
            raise FsUnavailable("/dev/fuse missing")

    def version(self) -> str:
        try:
            r = run([str(self.bin), "--version"], log=False, check=False, timeout=10)
            return (r.stdout or r.stderr).strip().splitlines()[0] if r.rc == 0 else f"(--version failed: rc {r.rc})"
        except (CommandError, IndexError, OSError) as e:
            return f"(unknown: {e})"

    @property
    def pid_file(self) -> Path:
        return self.pid_dir / "amaranth.pid"

    def mkfs(self, loop, log):
        comp = ["--compression", self.compression] if self.compression else []
        run([str(self.bin), "mkfs"] + comp + [loop.dev], timeout=600, stdout=log, stderr=log)

    def _supports_log_file(self) -> bool:
        """Newer CLIs take --log-file for the daemon's log (beyond the contract): use it when offered,
        so the daemon log lands in the results' logs/ directory."""
        if self._log_file_opt is None:
            try:
                r = run([str(self.bin), "mount", "--help"], log=False, check=False, timeout=10)
                self._log_file_opt = "--log-file" in (r.stdout + r.stderr)
            except (CommandError, OSError):
                self._log_file_opt = False
        return self._log_file_opt

    def mount(self, loop, mnt, cgroups, log):
        self.pid_file.unlink(missing_ok=True)
        extra = ["--log-file", str(log.with_suffix(".daemon.log"))] if self._supports_log_file() else []
        run([str(self.bin), "mount", loop.dev, str(mnt), "--cache-size", str(self.cache_size),
             "--pid-file", str(self.pid_file)] + extra + self.mount_options + self.extra_mount_args,
            cgroups=cgroups, timeout=300,
            stdout=log, stderr=log)
        if not is_mounted(mnt):
            raise RuntimeError(f"`amaranth mount` returned 0 but {mnt} is not a mount point")
        try:
            self.pid = int(read_file(self.pid_file).strip())
        except (OSError, ValueError) as e:
            raise RuntimeError(f"no usable pid file {self.pid_file} after mount: {e}") from e
        self._cpu0 = self._daemon_cpu()

    def _daemon_alive(self) -> bool:
        if not self.pid:
            return False
        try:
            cmdline = read_file(f"/proc/{self.pid}/cmdline")
        except OSError:
            return False
        return "amaranth" in cmdline

    def _daemon_cpu(self) -> float:
        try:
            f = read_file(f"/proc/{self.pid}/stat").rsplit(")", 1)[1].split()
            return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError, TypeError):
            return 0.0

    def sample_daemon(self) -> None:
        """Fold the running daemon's VmHWM and CPU time into the totals."""
        if not self._daemon_alive():
            return
        for line in read_file(f"/proc/{self.pid}/status", "").splitlines():
            if line.startswith("VmHWM:"):
                self.hwm_kb = max(self.hwm_kb, int(line.split()[1]))

    def reset_stats(self) -> None:
        self.hwm_kb = 0
        self.daemon_cpu_s = 0.0

    def daemon_cpu_now(self) -> float:
        return self._daemon_cpu() if self._daemon_alive() else 0.0

    def stat_json(self, mnt: Path) -> dict:
        r = run([str(self.bin), "stat", str(mnt), "--json"], timeout=60)
        return json.loads(r.stdout)

    def umount(self, mnt, log):
        self.sample_daemon()
        if self._daemon_alive():
            self.daemon_cpu_s += max(0.0, self._daemon_cpu() - getattr(self, "_cpu0", 0.0))
        run([str(self.bin), "umount", str(mnt)], timeout=1800, stdout=log, stderr=log)
        for _ in range(600):
            if not self._daemon_alive():
                break
            time.sleep(0.1)
        else:
            raise RuntimeError(f"daemon {self.pid} still running 60 s after `amaranth umount`")
        if is_mounted(mnt):
            raise RuntimeError(f"{mnt} still mounted after `amaranth umount`")
        self.pid = None

    def force_umount(self, mnt):
        if is_mounted(mnt):
            try:
                run([str(self.bin), "umount", str(mnt)], timeout=120, check=True)
            except (CommandError, OSError):
                run(["fusermount3", "-u", "-z", str(mnt)], check=False)
        if self._daemon_alive():  # the daemon we started (pid from its pid file)
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.kill(self.pid, sig)
                except ProcessLookupError:
                    break
                for _ in range(50):
                    if not self._daemon_alive():
                        break
                    time.sleep(0.1)
                if not self._daemon_alive():
                    break
        if is_mounted(mnt):
            run(["umount", "-l", str(mnt)], check=False)
        self.pid = None


class Mounted:
    """A file system on a fresh loop device, mounted at `mnt`; undone by close() or cleanup."""

    def __init__(self, driver: Driver, loop: LoopDevice, mnt: Path, cgroups, log: Path):
        self.driver, self.loop, self.mnt, self.cgroups, self.log = driver, loop, mnt, list(cgroups), log
        self.mounted = False
        self._tok = cleanup.register(f"unmount {mnt}", self._force)

    def _force(self) -> None:
        self.driver.force_umount(self.mnt)
        self.mounted = False

    def mkfs_and_mount(self) -> None:
        self.mnt.mkdir(parents=True, exist_ok=True)
        self.driver.mkfs(self.loop, self.log)
        self.mount()

    def mount(self) -> None:
        self.driver.mount(self.loop, self.mnt, self.cgroups, self.log)
        self.mounted = True

    def umount(self) -> None:
        if self.mounted:
            self.driver.umount(self.mnt, self.log)
            self.mounted = False

    def cold(self) -> None:
        """Cold cache as in the papers: sync, unmount, drop the page cache, mount again."""
        os.sync()
        self.umount()
        drop_caches()
        self.mount()

    def close(self) -> None:
        try:
            self.umount()
        finally:
            if is_mounted(self.mnt):
                self._force()
            cleanup.release(self._tok)


def make_driver(name: str, args) -> Driver:
    if name == "ext4":
        return Ext4()
    if name == "xfs":
        return Xfs()
    if name == "btrfs":
        return Btrfs()
    if name in ("amaranth", "amaranth-base"):
        binary = args.amaranth_bin if name == "amaranth" else args.amaranth_base_bin
        d = Amaranth(Path(binary), args.amaranth_cache_size, args.workdir,
                     getattr(args, "amaranth_compression", ""), getattr(args, "amaranth_mount_options", ""))
        d.name = name
        return d
    raise ValueError(f"unknown file system {name!r}")
