"""Cleanup of everything the harness attaches, mounts or creates, also after Ctrl-C.

Resources register an undo callback when they are acquired and unregister it when they are released
normally. `run_all()` undoes whatever is still registered, newest first; it runs from `finally`
blocks, from `atexit`, and after SIGINT/SIGTERM/SIGHUP (which the harness turns into an
`Interrupted` exception so that every `finally` on the stack runs first).
"""
from __future__ import annotations

import atexit
import os
import re
import signal
import sys
import threading
import traceback
from typing import Callable


class Interrupted(BaseException):
    """Raised in the main thread when SIGINT/SIGTERM/SIGHUP arrives."""

    def __init__(self, signum: int):
        super().__init__(f"interrupted by signal {signal.Signals(signum).name}")
        self.signum = signum


_lock = threading.RLock()
_stack: list[tuple[int, str, Callable[[], None]]] = []
_next_id = 0
_installed = False


def register(what: str, undo: Callable[[], None]) -> int:
    """Register an undo action; returns a token for `release`."""
    global _next_id
    with _lock:
        _next_id += 1
        _stack.append((_next_id, what, undo))
        return _next_id


def release(token: int | None, run: bool = False) -> None:
    """Forget (and with run=True first execute) the undo action of `token`."""
    if token is None:
        return
    with _lock:
        for i, (tok, what, undo) in enumerate(_stack):
            if tok == token:
                del _stack[i]
                break
        else:
            return
    if run:
        _safe(what, undo)


def _safe(what: str, undo: Callable[[], None]) -> None:
    try:
        undo()
    except BaseException as e:  # noqa: BLE001 - cleanup must go on
        print(f"cleanup: {what}: {e}", file=sys.stderr)
        if not isinstance(e, Exception):
            traceback.print_exc()


def pending() -> list[str]:
    with _lock:
        return [what for _, what, _ in _stack]


def run_all() -> None:
    """Undo everything still registered (newest first). Signals are ignored meanwhile."""
    old = {}
    if threading.current_thread() is threading.main_thread():
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            old[s] = signal.signal(s, signal.SIG_IGN)
    try:
        while True:
            with _lock:
                if not _stack:
                    break
                tok, what, undo = _stack.pop()
            print(f"cleanup: {what}", file=sys.stderr)
            _safe(what, undo)
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _handler(signum, frame):  # noqa: ARG001
    raise Interrupted(signum)


def install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, _handler)
    atexit.register(run_all)


# leftovers carry the harness pid in their names: run-<pid>/, src-tmpfs-<pid>, amaranth-bench-<pid>-*
# (cgroups), amaranth_bench_<pid> (tracing instances), aged-live-<pid>.img (an aging run's image kept for --resume)
_PID_IN_NAME = re.compile(r"(?:run-|src-tmpfs-|amaranth-bench-|amaranth_bench_|aged-live-)(\d+)")


def owned_by_live_run(name: str) -> bool:
    """True if `name` (a path, cgroup or tracing instance) belongs to a harness process that is still
    running: `--cleanup` must not tear down a run in progress (e.g. `make test` beside a full run)."""
    m = _PID_IN_NAME.search(name)
    if not m or int(m.group(1)) == os.getpid():
        return False
    try:
        with open(f"/proc/{m.group(1)}/cmdline", "rb") as f:
            return b"bench" in f.read()
    except OSError:
        return False
