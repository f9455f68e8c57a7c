"""TokuBench: many small files in a balanced directory tree, 4 threads."""
from __future__ import annotations

from . import Info, Metric, Param

NAMES = ["tokubench"]
GROUP = "main"  # see GROUPS in __init__.py
NEEDS: set[str] = set()
# Parameters (`--set name=value`; `quick`: the value under --quick, where it differs).
PARAMS = {
    "toku_files": Param(500_000, quick=20_000),
    "toku_threads": Param(4),
    "toku_fanout": Param(128),
    "toku_iosize": Param(200),
    "toku_sample": Param(10_000, quick=2_000),
}

INFO = {
    "tokubench": Info(
        "tokubench", "TokuBench small-file creation",
        "`toku_files` files named benchfile.<random u64>, one 200-byte pwrite each, in a balanced tree of "
        "benchdir.<i> directories with fanout 128, created by 4 threads (C helper `tokubench`); cumulative "
        "files/s sampled every `toku_sample` files; final files/s without and with the final syncfs",
        "BetrFS micro/tokubench (benchmark-fs-threaded --files N -d 128 --iosize 200 --threads 4); FAST'15 "
        "Fig. 3 used 500,000 files",
        [Metric("create", "files_per_s", "create", "files/s", True),
         Metric("create", "files_per_s_incl_sync", "create + syncfs", "files/s", True)],
        ["create"], ["tokubench"],
        secondary=[Metric("create", "seconds", "create time", "s", False),
                   Metric("create", "syncfs_s", "final syncfs", "s", False)]),
}


def check(env, names):
    pass


def run(ctx, names):
    p = ctx.p
    r = ctx.timed("tokubench", "create",
                  [str(ctx.helpers["tokubench"]), str(ctx.mnt / "tokubench"), str(p.toku_files), str(p.toku_threads),
                   str(p.toku_fanout), str(p.toku_iosize), str(p.toku_sample), "42"],
                  kind="write", logical_bytes=p.toku_files * p.toku_iosize, record_seconds=False,
                  label=f"{p.toku_files:,} files, {p.toku_threads} threads")
    j = ctx.helper_json(r)
    ctx.save_json("tokubench", j)
    ctx.record("tokubench", "create", "files_per_s", j["files_per_s"], "files/s")
    ctx.record("tokubench", "create", "files_per_s_incl_sync", j["files_per_s_incl_sync"], "files/s")
    ctx.record("tokubench", "create", "seconds", j["create_s"], "s")
    ctx.record("tokubench", "create", "syncfs_s", j["syncfs_s"], "s")
    for n, t in j["curve"]:
        ctx.record("tokubench", "create", "cum_files_per_s", n / t, "files/s", x=n)
