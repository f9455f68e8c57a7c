"""Small shared pieces: sizes, progress lines, and running commands (logged, in cgroups, killable)."""
from __future__ import annotations

import os
import re
import resource
import shlex
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

from . import cleanup

G, M, K = 1 << 30, 1 << 20, 1 << 10  # binary units, for parameters

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(s: str | int) -> int:
    """'2G', '512MiB', '4k', '1048576' -> bytes (binary units)."""
    if isinstance(s, int):
        return s
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(?:i?[bB])?\s*", s)
    if not m:
        raise ValueError(f"bad size {s!r} (use e.g. 512M, 2G, 4096)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def fmt_size(n: float) -> str:
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" or n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def fmt_secs(s: float) -> str:
    if s < 60:
        return f"{s:.1f}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{int(m)}m{s:04.1f}s"
    h, m = divmod(m, 60)
    return f"{int(h)}h{int(m):02d}m{int(s):02d}s"


class Progress:
    """One line per step: '[ +elapsed ] step text ... result (duration)'."""

    def __init__(self, stream=sys.stdout):
        self.t0 = time.monotonic()
        self.stream = stream
        self.context = ""

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def _prefix(self) -> str:
        return f"[{fmt_secs(self.elapsed()):>9}]"

    def log(self, msg: str) -> None:
        ctx = f"{self.context} | " if self.context else ""
        print(f"{self._prefix()} {ctx}{msg}", file=self.stream, flush=True)

    @contextmanager
    def step(self, msg: str):
        """Prints the step when it starts (without newline on a tty) and its outcome when it ends."""
        ctx = f"{self.context} | " if self.context else ""
        tty = self.stream.isatty()
        head = f"{self._prefix()} {ctx}{msg} ..."
        print(head, end="" if tty else "\n", file=self.stream, flush=True)
        t = time.monotonic()
        info: dict = {}
        try:
            yield info
        except BaseException as e:
            tail = f" FAILED after {fmt_secs(time.monotonic() - t)}: {str(e).splitlines()[0][:200] if str(e) else type(e).__name__}"
            if tty:
                print(tail, file=self.stream, flush=True)
            else:
                print(f"{self._prefix()} {ctx}{msg}{tail}", file=self.stream, flush=True)
            raise
        extra = f" {info['result']}" if info.get("result") else ""
        tail = f" done{extra} ({fmt_secs(time.monotonic() - t)})"
        if tty:
            print(tail, file=self.stream, flush=True)
        else:
            print(f"{self._prefix()} {ctx}{msg}{tail}", file=self.stream, flush=True)


PROGRESS = Progress()


class CommandLog:
    """Every command the harness runs, with time, cwd and cgroups, appended to commands.log."""

    def __init__(self):
        self.path: Path | None = None
        self.context = ""
        self.entries: list[tuple[str, str]] = []  # (context, command line)

    def open(self, path: Path) -> None:
        self.path = path

    def add(self, line: str) -> None:
        self.entries.append((self.context, line))
        if self.path:
            with open(self.path, "a") as f:
                f.write(f"{time.strftime('%H:%M:%S')} [{self.context}] {line}\n")


CMDLOG = CommandLog()


class CommandError(RuntimeError):
    def __init__(self, cmd: str, rc: int | None, stderr: str, timeout: bool = False):
        self.cmd, self.rc, self.stderr, self.timeout = cmd, rc, stderr, timeout
        if timeout:
            what = "timed out"
        elif rc is not None and rc < 0:
            sig = signal.Signals(-rc).name if -rc in signal.valid_signals() else str(-rc)
            what = f"killed by {sig}" + (" (out of memory in the cgroup?)" if rc == -9 else "")
        else:
            what = f"exit status {rc}"
        msg = f"`{cmd}` {what}"
        tail = stderr.strip()
        if tail:
            msg += ": " + tail[-600:]
        super().__init__(msg)


@dataclass
class Result:
    cmd: str
    rc: int
    stdout: str
    stderr: str
    elapsed: float
    cpu_user: float = 0.0
    cpu_sys: float = 0.0
    extra: dict = field(default_factory=dict)


_active: set[subprocess.Popen] = set()


def _kill_group(p: subprocess.Popen) -> None:
    if p.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


def cmd_str(cmd: Sequence[str] | str) -> str:
    return cmd if isinstance(cmd, str) else shlex.join(str(c) for c in cmd)


def run(
    cmd: Sequence[str] | str,
    *,
    cgroups: Iterable = (),
    timeout: float | None = None,
    cwd: str | Path | None = None,
    env: dict | None = None,
    stdout: str | Path = "pipe",
    stderr: str | Path = "pipe",
    stdin_data: str | None = None,
    check: bool = True,
    log: bool = True,
    user: tuple[int, int] | None = None,
) -> Result:
    """Run a command (list = exec, str = `bash -c` with pipefail) in its own process group.

    cgroups: objects with .procs_path (cgroup.procs files) the child joins before exec.
    stdout: 'pipe' (captured), 'null', or a file path to write to.
    stderr: 'pipe' or a file path (append). Use files for commands that leave a daemon behind which
    inherits the descriptors (a pipe would never reach EOF).
    The child is killed (whole process group) on timeout or if the harness is interrupted.
    """
    shell = isinstance(cmd, str)
    argv = ["bash", "-c", "set -o pipefail; " + cmd] if shell else [str(c) for c in cmd]
    text = cmd_str(cmd)
    procs_files = [cg.procs_path for cg in cgroups]
    if log:
        where = f" (in cgroup {', '.join(str(cg) for cg in cgroups)})" if procs_files else ""
        CMDLOG.add(f"{'cd ' + str(cwd) + ' && ' if cwd else ''}{text}{where}")

    def preexec():
        pid = str(os.getpid())
        for pf in procs_files:
            with open(pf, "w") as f:
                f.write(pid)
        if user:
            os.setgroups([])
            os.setgid(user[1])
            os.setuid(user[0])

    out_f = None
    if stdout == "pipe":
        out = subprocess.PIPE
    elif stdout == "null":
        out = subprocess.DEVNULL
    else:
        out_f = open(stdout, "wb")
        out = out_f
    err_f = None
    if stderr == "pipe":
        err = subprocess.PIPE
    else:
        err_f = open(stderr, "ab")
        err = err_f
    full_env = None
    if env is not None:
        full_env = dict(os.environ)
        full_env.update(env)
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    try:
        p = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if stdin_data is not None else subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            cwd=cwd,
            env=full_env,
            preexec_fn=preexec if (procs_files or user) else None,
            start_new_session=True,
        )
    except OSError as e:
        for fh in (out_f, err_f):
            if fh:
                fh.close()
        raise CommandError(text, None, str(e)) from e
    _active.add(p)
    tok = cleanup.register(f"kill process group {p.pid} ({text[:60]})", lambda: _kill_group(p))
    try:
        try:
            so, se = p.communicate(stdin_data.encode() if stdin_data is not None else None, timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(p)
            so, se = p.communicate()
            raise CommandError(text, None, (se or b"").decode(errors="replace"), timeout=True)
        elapsed = time.perf_counter() - t0
    finally:
        _active.discard(p)
        cleanup.release(tok, run=True)  # kills leftovers of the group if any (e.g. on Ctrl-C)
        for fh in (out_f, err_f):
            if fh:
                fh.close()
    if err_f is not None:
        se = _tail_bytes(stderr, 4000)
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = Result(
        text,
        p.returncode,
        (so or b"").decode(errors="replace"),
        (se or b"").decode(errors="replace"),
        elapsed,
        ru1.ru_utime - ru0.ru_utime,
        ru1.ru_stime - ru0.ru_stime,
    )
    if check and p.returncode != 0:
        raise CommandError(text, p.returncode, res.stderr or res.stdout)
    return res


def _tail_bytes(path: str | Path, n: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - n))
            return f.read()
    except OSError:
        return b""


def write_file(path: str | Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def read_file(path: str | Path, default: str | None = None) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        if default is None:
            raise
        return default


def retry(fn: Callable, attempts: int = 5, delay: float = 0.5):
    for i in range(attempts):
        try:
            return fn()
        except Exception:
            if i == attempts - 1:
                raise
            time.sleep(delay * (i + 1))
