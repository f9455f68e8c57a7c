"""Rename by file size: rename + fsync(dir) throughput as a function of the file size."""
from __future__ import annotations

from . import Info, Metric, Param
from ..util import M, K

NAMES = ["rename"]
GROUP = "main"  # see GROUPS in __init__.py
ALIASES = {"rename-by-size": "rename"}
NEEDS: set[str] = set()
# Parameters (`--set name=value`; `quick`: the value under --quick, where it differs).
PARAMS = {
    "rename_min": Param(4 * K, size=True),
    "rename_max": Param(64 * M, quick=1 * M, size=True),
    "rename_step": Param(2, quick=4),  # multiply the size by this
    "rename_count": Param(100, quick=20),
}

INFO = {
    "rename": Info(
        "rename", "Rename by file size",
        "for each size from `rename_min` to `rename_max` (x `rename_step`): a file of random data is written "
        "and fsynced (untimed), then `rename_count` x (rename(a,b) + fsync of the directory), alternating "
        "a->b and b->a (C helper `renamebench`); renames/s",
        "BetrFS micro/circlingtradeoff file-rename.c / rename-by-size.sh (2^12..2^22 bytes, 100 renames + "
        "fsync(dir)); FAST'18 range rename",
        [Metric("rename", "renames_per_s", "renames/s", "renames/s", True)],
        ["rename"], ["rename"],
        secondary=[Metric("rename", "median_latency_us", "median rename+fsync latency", "µs", False)]),
}


def sizes(p):
    s = p.rename_min
    while s <= p.rename_max:
        yield s
        s *= p.rename_step


def check(env, names):
    if env.params.rename_step < 2:
        raise ValueError("rename_step must be >= 2")


def run(ctx, names):
    p = ctx.p
    d = ctx.mnt / "rename"
    d.mkdir()
    for size in sizes(p):
        a, b = d / f"file.{size}.a", d / f"file.{size}.b"
        ctx.untimed([str(ctx.helpers["seqio"]), "write", str(a), str(size), str(min(size, 1 << 20))],
                    f"write a {size} B file (untimed)", logical_bytes=size)
        r = ctx.timed("rename", "rename", [str(ctx.helpers["renamebench"]), str(a), str(b), str(p.rename_count)],
                      x=size, record_seconds=False, label=f"{p.rename_count} renames of a {size} B file")
        j = ctx.helper_json(r)
        ctx.record("rename", "rename", "renames_per_s", j["renames_per_s"], "renames/s", x=size)
        lat = sorted(j["latency_us"])
        ctx.record("rename", "rename", "median_latency_us", lat[len(lat) // 2], "us", x=size)
