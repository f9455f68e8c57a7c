"""Intrafile fragmentation (FAST'17 section 5): 10 files written whole, then with more and more of each
written as 4 KiB round-robin appends; a cold read of all of them after each round."""
from __future__ import annotations

import os
import random

from . import Info, Metric, Param
from ..util import K
from ..aging import Eta, fresh_fs, grep_point, point_log, point_rng
from ..resume import Points

NAMES = ["aging-intrafile"]
GROUP = "aging"  # see GROUPS in __init__.py
RESUME = "points"  # every round on a fresh FS: --resume skips the completed rounds (bench/resume.py)
ALIASES = {"aging-micro": "aging-intrafile,aging-interfile"}
NEEDS: set[str] = set()
# Parameters (`--set name=value`; `quick`: the value under --quick, where it differs).
PARAMS = {
    "aging_intra_files": Param(10),
    "aging_intra_size": Param(400 * K, size=True),
    "aging_intra_chunk": Param(4 * K, size=True),
    "aging_intra_step": Param(10, quick=50),  # round-robin chunks added per round
}

INFO = {
    "aging-intrafile": Info(
        "aging-intrafile", "Aging: intrafile fragmentation (round-robin appends)",
        "for k = 0, `aging_intra_step`, ... up to `aging_intra_size`/`aging_intra_chunk` (x = k): on a freshly made "
        "FS, `aging_intra_files` files of `aging_intra_size` random bytes: each file's first size − k × chunk "
        "bytes written whole, one file after the other, then k rounds of one `aging_intra_chunk` append to every "
        "file in turn (+syncfs); cold remount, wait until the device is quiet, `grep -r` of the files for a "
        "string found nowhere [read]",
        "FAST'17 intrafile benchmark (10 files of 400 KiB, 0 to 100 round-robin 4 KiB chunks, remount, wait "
        "90 s, read); here the wait ends once the device has been idle for `aging_quiesce_s`",
        [Metric("read", "s_per_gib", "read cost", "s/GiB", False)],
        ["read"], ["aging"]),
}


def check(env, names):
    pass


def rounds(size: int, chunk: int, step: int) -> list[int]:
    """Round-robin chunk counts per round: 0, step, 2·step, ..., always ending with size // chunk."""
    last = size // chunk
    out = list(range(0, last + 1, max(1, step)))
    return out if out[-1] == last else out + [last]


def write_files(d, files: int, size: int, chunk: int, k: int, rng: random.Random) -> int:
    """Each file's head (size − k·chunk bytes) whole, one file at a time, then k round-robin chunk appends."""
    d.mkdir()
    head = size - k * chunk
    assert 0 <= head <= size
    paths = [d / f"file{i}" for i in range(files)]
    for p in paths:
        p.write_bytes(rng.randbytes(head))
    fds = [os.open(p, os.O_WRONLY | os.O_APPEND) for p in paths]
    try:
        for _ in range(k):
            for fd in fds:
                os.write(fd, rng.randbytes(chunk))
    finally:
        for fd in fds:
            os.close(fd)
    for p in paths:
        assert p.stat().st_size == size, (p, p.stat().st_size)
    return files * size


def run(ctx, names):
    p = ctx.p
    bench = "aging-intrafile"
    ks = rounds(p.aging_intra_size, p.aging_intra_chunk, p.aging_intra_step)
    points = Points(ctx, bench, ks, [f"round k={k}" for k in ks], image=False)
    eta = Eta(len(ks), points.start)
    for n, k in enumerate(ks, start=1):
        if n <= points.start:
            continue  # done by the run this one resumes
        with fresh_fs(ctx, f"k{k}") as f:
            d = f.mnt / "intra"
            f.note_written(write_files(d, p.aging_intra_files, p.aging_intra_size, p.aging_intra_chunk, k,
                                       point_rng(ctx, bench, "data", k)))
            f.sync()
            f.phase = "write"
            res = grep_point(f, bench, "read", d, k)
        point_log(bench, k, res, None, eta, n)
        points.done(n - 1)
