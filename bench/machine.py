"""Description of the machine and software the run used."""
from __future__ import annotations

import os
import platform
import re
from pathlib import Path

from .util import read_file, run


def _first(cmd) -> str:
    try:
        r = run(cmd, log=False, check=False, timeout=20)
        out = (r.stdout or r.stderr).strip().splitlines()
        return out[0] if out else ""
    except Exception:  # noqa: BLE001
        return ""


def describe(workdir: Path, repo: Path) -> dict[str, str]:
    d: dict[str, str] = {}
    cpuinfo = read_file("/proc/cpuinfo", "")
    m = re.search(r"model name\s*:\s*(.+)", cpuinfo)
    d["CPU"] = f"{m.group(1).strip() if m else platform.processor()} x {os.cpu_count()} logical CPUs"
    mem = re.search(r"MemTotal:\s*(\d+) kB", read_file("/proc/meminfo", ""))
    d["RAM"] = f"{int(mem.group(1)) / (1 << 20):.1f} GiB" if mem else "?"
    d["Kernel"] = f"{platform.release()} ({platform.version()})"
    osr = re.search(r'PRETTY_NAME="(.+)"', read_file("/etc/os-release", ""))
    d["OS"] = osr.group(1) if osr else "?"
    src = _first(["findmnt", "-n", "-o", "SOURCE,FSTYPE,OPTIONS", "-T", str(workdir)])
    d["Work dir"] = f"{workdir} on {src}"
    dev = src.split()[0] if src else ""
    name = os.path.basename(dev)
    base = re.sub(r"p?\d+$", "", name) if not Path(f"/sys/block/{name}").exists() else name
    sysb = Path(f"/sys/block/{base}")
    if sysb.exists():
        size = int(read_file(sysb / "size", "0")) * 512
        rot = read_file(sysb / "queue/rotational", "?").strip()
        model = read_file(sysb / "device/model", "").strip() or read_file(sysb / "device/vendor", "").strip()
        sched = read_file(sysb / "queue/scheduler", "").strip()
        d["Disk"] = (f"/dev/{base}: {size / 1e9:.0f} GB, rotational={rot}"
                     f"{', model ' + model if model else ''}{', scheduler ' + sched if sched else ''}"
                     f"{' (virtio)' if base.startswith('vd') else ''}")
    d["CPU idle"] = cpu_idle()
    d["Python"] = platform.python_version()
    for label, cmd in [("fio", ["fio", "--version"]), ("mkfs.ext4", ["mkfs.ext4", "-V"]),
                       ("mkfs.xfs", ["mkfs.xfs", "-V"]), ("mkfs.btrfs", ["mkfs.btrfs", "--version"]),
                       ("git", ["git", "--version"]), ("rsync", ["rsync", "--version"]),
                       ("tar", ["tar", "--version"]), ("grep", ["grep", "--version"]),
                       ("coreutils", ["cp", "--version"]), ("dovecot", ["dovecot", "--version"]),
                       ("gcc", ["gcc", "--version"])]:
        v = _first(cmd)
        if v:
            d[label] = v
    commit = _first(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"])
    d["Repository commit"] = commit if re.fullmatch(r"[0-9a-f]{4,40}", commit or "") else "(none yet)"
    return d


HALT_POLL = Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns")


def cpu_idle() -> str:
    """How this machine's idle CPUs wait: the cpuidle driver and governor, and for a guest's `haltpoll`
    driver how long an idle vCPU polls before it halts. On a VM whose idle vCPUs halt at once
    (`guest_halt_poll_ns` 0), waking a task on the other, idle, vCPU costs tens of microseconds, and a FUSE
    round trip that crosses CPUs pays it (docs/BENCHMARKS.md, "An idle vCPU's wake-up")."""
    base = Path("/sys/devices/system/cpu/cpuidle")
    driver = read_file(base / "current_driver", "").strip() or "none"
    governor = read_file(base / "current_governor_ro", "").strip() or read_file(base / "current_governor", "").strip()
    text = f"cpuidle driver {driver}" + (f", governor {governor}" if governor else "")
    poll = read_file(HALT_POLL, "").strip()
    if poll:
        text += f", guest_halt_poll_ns {poll}"
    return text


def set_halt_poll(ns: int) -> int:
    """Sets how long an idle vCPU polls before it halts (the `haltpoll` driver's `guest_halt_poll_ns`, a
    machine-wide setting) and returns the previous value. Raises when the machine has no such setting."""
    if ns < 0:
        raise ValueError(f"a negative poll time: {ns} ns")
    if not HALT_POLL.exists():
        raise RuntimeError(f"{HALT_POLL} does not exist: this machine's idle CPUs are not driven by haltpoll")
    before = int(HALT_POLL.read_text().strip())
    HALT_POLL.write_text(f"{ns}\n")
    now = int(HALT_POLL.read_text().strip())
    if now != ns:
        raise RuntimeError(f"{HALT_POLL} reads {now} after writing {ns}")
    return before


def amaranth_build(binary: Path, repo: Path, commit: str | None) -> str:
    """Which build of Amaranth was measured: the commit (given, or the repository's HEAD when the binary is
    the repository's own build, marked when crates/ has uncommitted changes) and the binary's SHA-256."""
    import hashlib

    try:
        h = hashlib.sha256(binary.read_bytes()).hexdigest()[:16]
    except OSError:
        h = "unreadable"
    if not commit:
        if binary.resolve() == (repo / "target/release/amaranth").resolve():
            head = _first(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"])
            dirty = _first(["git", "-C", str(repo), "status", "--porcelain", "--", "crates", "Cargo.lock"])
            commit = f"{head} (repository HEAD{', with uncommitted changes in crates/' if dirty else ''})"
        else:
            commit = "unknown (pass --amaranth-commit)"
    return f"commit {commit}, binary {binary} sha256 {h}"
