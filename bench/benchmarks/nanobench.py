"""Warm-cache system-call latencies (FAST'15 Table 7)."""
from __future__ import annotations

from . import Info, Metric, Param

NAMES = ["nanobench"]
GROUP = "main"  # see GROUPS in __init__.py
ALIASES = {"nano": "nanobench"}
NEEDS: set[str] = set()
# Parameters (`--set name=value`; `quick`: the value under --quick, where it differs).
PARAMS = {
    "nano_iters": Param(100_000, quick=5_000),
    "nano_meta_iters": Param(10_000, quick=500),
}
OPS = ["open", "read", "stat", "chmod", "mkdir", "rmdir", "unlink", "write"]

INFO = {
    "nanobench": Info(
        "nanobench", "System-call nanobenchmark (warm cache)",
        "C helper `nanobench`: each call timed on its own after 100 warm-up calls; open/read(4 KiB)/stat/"
        "chmod/write(4 KiB overwrite) on one cached 1 MiB file `nano_iters` times; mkdir/rmdir/unlink "
        "`nano_meta_iters` times; mean ns per call (median, p99 and the share of the time spent in calls "
        "over twice the median, `slow_share`, in the CSV)",
        "FAST'15 Table 7 (cycles per call) and the EuroSys'22 misc-syscalls benchmark",
        [Metric(op, "mean_ns", op, "ns", False) for op in OPS]),
}


def check(env, names):
    pass


def run(ctx, names):
    p = ctx.p
    d = ctx.mnt / "nano"
    d.mkdir()
    r = ctx.timed("nanobench", "all", [str(ctx.helpers["nanobench"]), str(d), str(p.nano_iters),
                                       str(p.nano_meta_iters)], label="syscall latencies")
    j = ctx.helper_json(r)
    for op in OPS:
        ctx.record("nanobench", op, "mean_ns", j[op]["mean_ns"], "ns")
        ctx.record("nanobench", op, "median_ns", j[op]["median_ns"], "ns")
        ctx.record("nanobench", op, "p99_ns", j[op]["p99_ns"], "ns")
        if "slow_share" in j[op]:
            ctx.record("nanobench", op, "slow_share", j[op]["slow_share"], "")
