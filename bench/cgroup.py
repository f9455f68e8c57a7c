"""cgroup v1 groups for the workload (and the Amaranth daemon): memory limit, optional blkio throttle.

Groups are created as children of the harness's own cgroup in each hierarchy (so they nest inside
whatever limits the harness already runs under) and removed when released; processes still in a
group at removal are killed by the caller first (they are children the harness started).
"""
from __future__ import annotations

import itertools
import os
import signal
import time
from pathlib import Path

from . import cleanup
from .util import read_file, write_file

ROOT = Path("/sys/fs/cgroup")
PREFIX = "amaranth-bench"
_seq = itertools.count(1)


def _own_path(controller: str) -> str:
    """This process's cgroup path in the v1 hierarchy that has `controller`."""
    for line in read_file("/proc/self/cgroup").splitlines():
        _, ctrls, path = line.split(":", 2)
        if controller in ctrls.split(","):
            return path
    return "/"


def available(controller: str) -> bool:
    return (ROOT / controller / "cgroup.procs").exists()


class Cgroup:
    controller = ""

    def __init__(self, label: str = ""):
        if not available(self.controller):
            raise RuntimeError(f"cgroup v1 {self.controller} controller not mounted at {ROOT / self.controller}")
        name = f"{PREFIX}-{os.getpid()}-{next(_seq)}{'-' + label if label else ''}"
        self.path = ROOT / self.controller / _own_path(self.controller).lstrip("/") / name
        self.path.mkdir()
        self._tok = cleanup.register(f"remove cgroup {self.path}", self.remove)

    def __str__(self) -> str:
        return f"{self.controller}:{self.path.name}"

    @property
    def procs_path(self) -> Path:
        return self.path / "cgroup.procs"

    def pids(self) -> list[int]:
        try:
            return [int(x) for x in read_file(self.procs_path).split()]
        except OSError:
            return []

    def add(self, pid: int) -> None:
        write_file(self.procs_path, str(pid))

    def remove(self) -> None:
        """Kill leftover member processes (all started by the harness) and rmdir the group."""
        if not self.path.exists():
            cleanup.release(self._tok)
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            for _ in range(50):
                if not self.pids():
                    break
                time.sleep(0.1)
        for _ in range(50):
            try:
                self.path.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)
        else:
            self.path.rmdir()
        cleanup.release(self._tok)


class MemoryCgroup(Cgroup):
    controller = "memory"

    def __init__(self, limit_bytes: int, label: str = ""):
        super().__init__(label)
        write_file(self.path / "memory.limit_in_bytes", str(limit_bytes))
        # no swap on this machine; set memsw too when the file exists so swap cannot extend the limit
        memsw = self.path / "memory.memsw.limit_in_bytes"
        if memsw.exists():
            try:
                write_file(memsw, str(limit_bytes))
            except OSError:
                pass
        self.limit = limit_bytes

    def stats(self) -> dict[str, int]:
        out = {}
        for f in ("memory.max_usage_in_bytes", "memory.failcnt"):
            try:
                out[f.split(".", 1)[1]] = int(read_file(self.path / f))
            except (OSError, ValueError):
                pass
        try:
            for line in read_file(self.path / "memory.oom_control").splitlines():
                k, v = line.split()
                if k == "oom_kill":
                    out["oom_kill"] = int(v)
        except (OSError, ValueError):
            pass
        return out


class BlkioCgroup(Cgroup):
    """Throttles every read and write request to the given device at `iops` (approximates a disk)."""

    controller = "blkio"

    def __init__(self, devno: str, iops: int, bps: int | None = None, label: str = ""):
        super().__init__(label)
        write_file(self.path / "blkio.throttle.read_iops_device", f"{devno} {iops}")
        write_file(self.path / "blkio.throttle.write_iops_device", f"{devno} {iops}")
        if bps:
            write_file(self.path / "blkio.throttle.read_bps_device", f"{devno} {bps}")
            write_file(self.path / "blkio.throttle.write_bps_device", f"{devno} {bps}")


def leftovers() -> list[Path]:
    """Groups of earlier (crashed) harness runs, for `--cleanup`."""
    found = []
    for ctrl in ("memory", "blkio"):
        base = ROOT / ctrl
        if base.exists():
            found += [p for p in base.rglob(f"{PREFIX}-*") if p.is_dir()]
    return found
