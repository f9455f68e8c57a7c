"""Shared machinery of the aging experiments (FAST'17 "File Systems Fated for Senescence?"): a second,
freshly made file system of the same kind (for the unaged copy, or one per round of a micro-benchmark),
waiting for a file system to quiesce, and the cold recursive grep that every aging point measures."""
from __future__ import annotations

import gzip
import json
import os
import random
import time
from contextlib import contextmanager
from pathlib import Path

from . import fs as fsmod
from .cgroup import BlkioCgroup, MemoryCgroup
from .device import LoopDevice, analyze_requests
from .util import PROGRESS, fmt_secs

GiB = 1 << 30


@contextmanager
def fresh_fs(ctx, tag: str):
    """A new image + loop device (direct I/O) + mkfs + mount of the same file system as `ctx`, with its own
    memory cgroup of the same limit (and blkio throttle in the throttle view), as a RunContext of its own.
    Everything is undone on exit, also on failure; the tracer is pointed back at `ctx`'s device."""
    from .runner import RunContext

    env, p = ctx.env, ctx.p
    rundir = ctx.mnt.parent
    driver = fsmod.make_driver(ctx.fs, env.args)
    if isinstance(driver, fsmod.Amaranth):
        driver.pid_dir = rundir / f"pid-{tag}"  # its own pid file: the aged FS's daemon keeps running
        driver.pid_dir.mkdir(parents=True, exist_ok=True)
    log = env.results / "logs" / f"{ctx.fs}-{ctx.group_label}-r{ctx.rep}-{ctx.view}-{tag}.log"
    memcg = blkcg = loop = mounted = None
    try:
        memcg = MemoryCgroup(p.mem_limit, label=f"{ctx.fs}-{tag}")
        loop = LoopDevice(rundir / f"{ctx.fs}-{tag}.img", p.image_size)
        cgroups = [memcg]
        if ctx.view == "throttle":
            blkcg = BlkioCgroup(loop.devno, env.args.hdd_throttle, label=f"{ctx.fs}-{tag}")
            cgroups.append(blkcg)
        mounted = fsmod.Mounted(driver, loop, rundir / f"mnt-{tag}", cgroups, log)
        mounted.mkfs_and_mount()
        sub = RunContext(env, ctx.fs, ctx.rep, ctx.view, mounted, loop, cgroups, memcg)
        sub.group_label = f"{ctx.group_label}-{tag}"
        sub.recorded = ctx.recorded
        yield sub
        if sub.is_amaranth:
            sub.save_amaranth_stat("end")
    finally:
        try:
            if mounted is not None:
                mounted.close()
        finally:
            for thing in (loop, blkcg, memcg):
                if thing is not None:
                    thing.detach() if isinstance(thing, LoopDevice) else thing.remove()
            env.tracer.set_device(ctx.loop.kdev)


def wait_quiet(ctx, quiet_s: float, max_s: float) -> float:
    """Wait until the loop device has done no I/O for `quiet_s` seconds (at most `max_s`): the paper waited
    90 s after mounting because some file systems work in the background then. Returns the seconds waited."""
    if quiet_s <= 0:
        return 0.0
    t0 = time.monotonic()
    last = ctx.loop.stat()
    still_since = t0
    while True:
        time.sleep(min(0.5, quiet_s))
        now = time.monotonic()
        st = ctx.loop.stat()
        if st != last:
            last, still_since = st, now
        if now - still_since >= quiet_s or now - t0 >= max_s:
            return now - t0


def tree_size(root: Path) -> tuple[int, int]:
    """(regular files, their total bytes) under root, symlinks not followed."""
    files = size = 0
    for dp, dn, fn in os.walk(root):
        for f in fn:
            st = os.lstat(os.path.join(dp, f))
            if not os.path.islink(os.path.join(dp, f)):
                files += 1
                size += st.st_size
    return files, size


def seek_profile(reqs) -> dict:
    """Where a traced phase's requests went: median request size, median distance of the jumps between
    requests that do not continue the previous one, and how many of those jumps went backwards."""
    sizes = sorted(n * 512 for _, _, n in reqs)
    jumps, back = [], 0
    for (_, s0, n0), (_, s1, _) in zip(reqs, reqs[1:]):
        if s1 != s0 + n0:
            jumps.append(abs(s1 - (s0 + n0)) * 512)
            back += s1 < s0 + n0
    jumps.sort()
    mid = lambda v: v[len(v) // 2] if v else 0  # noqa: E731
    return {"median_request_bytes": mid(sizes), "median_jump_bytes": mid(jumps), "jumps": len(jumps),
            "backward_jumps": back}


def save_trace(ctx, bench: str, phase: str, x: float, reqs) -> None:
    """The phase's block requests (issue order) as raw/<fs>/trace-<bench>-<phase>-x<x>.json.gz: the evidence
    behind a layout score."""
    d = ctx.env.results / "raw" / ctx.fs
    d.mkdir(parents=True, exist_ok=True)
    view = "" if ctx.view == "disk" else f"-{ctx.view}"
    with gzip.open(d / f"trace-{bench}-{phase}-x{x:g}-r{ctx.rep}{view}.json.gz", "wt") as f:
        json.dump({"fields": ["rwbs", "sector", "sectors"], "requests": reqs}, f)


def point_rng(ctx, bench: str, what: str, x: float) -> random.Random:
    """The random numbers of one point, derived from (rand_seed, repetition, benchmark, what, point) alone and not
    drawn from a stream shared by the points, so that a run resumed at a point draws what the uninterrupted run
    drew there. (Before per-point resume, one stream seeded with rand_seed + repetition served every point in
    turn: the strings and random bytes differ from that version's, their distribution does not.)"""
    return random.Random(f"{ctx.p.rand_seed}/{ctx.rep}/{bench}/{what}/{x:g}")


def needle(ctx, bench: str, phase: str, x: float) -> str:
    rng = point_rng(ctx, bench, f"grep-{phase}", x)
    return "AMARANTH-AGING-" + "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ23456789") for _ in range(20))


def grep_point(ctx, bench: str, phase: str, root: Path, x: float) -> dict:
    """The grep test: remount (cold cache), wait for the FS to quiesce, then `grep -r` of `root` for a random
    string that occurs nowhere (so every byte is read; the string is drawn from the point's own seed, see
    `point_rng`). Records the suite's metrics for the phase plus the data size and the grep cost per GiB
    (measured and on the modeled hard disk)."""
    p = ctx.p
    # what the FS reads while remounting and settling, before the grep, is traced too: a FS that loads much at
    # mount would otherwise look faster at the grep than it is
    tracer = ctx.env.tracer
    tracer.set_device(ctx.loop.kdev)
    tracer.start()
    try:
        ctx.cold(ctx.phase)
        with PROGRESS.step("wait until the device is quiet"):
            wait_quiet(ctx, p.aging_quiesce_s, p.aging_quiesce_max_s)
    finally:
        tm = tracer.stop(p.hdd_seek_ms, p.hdd_mb_s)
    mount = analyze_requests([q for q in tm.reqs if "R" in q[0]], p.hdd_seek_ms, p.hdd_mb_s)
    ctx.record(bench, phase, "mount_read_bytes", mount.bytes, "B", x)
    ctx.record(bench, phase, "mount_read_requests", mount.requests, "", x)
    ctx.record(bench, phase, "mount_hdd_model_s", mount.hdd_model_s, "s", x)
    r = ctx.timed(bench, phase, f"grep -r -q -F {needle(ctx, bench, phase, x)} {root}; test $? -eq 1", x=x,
                  label=f"{phase} @ {x:g}: cold grep -r")
    files, size = tree_size(root)
    if size <= 0:
        raise RuntimeError(f"nothing to grep under {root}")
    tr = r.extra["trace"]
    save_trace(ctx, bench, phase, x, tr.reqs)
    for k, v in seek_profile(tr.reqs).items():
        ctx.record(bench, phase, k, v, "B" if k.endswith("bytes") else "", x)
    ctx.record(bench, phase, "data_bytes", size, "B", x)
    ctx.record(bench, phase, "files", files, "", x)
    ctx.record(bench, phase, "s_per_gib", r.elapsed / (size / GiB), "s/GiB", x)
    ctx.record(bench, phase, "hdd_s_per_gib", tr.hdd_model_s / (size / GiB), "s/GiB", x)
    ctx.record(bench, phase, "hdd_s_per_gib_incl_mount", (tr.hdd_model_s + mount.hdd_model_s) / (size / GiB),
               "s/GiB", x)
    return {"seconds": r.elapsed, "bytes": size, "files": files, "layout": tr.layout_score,
            "read_requests": tr.read_requests, "s_per_gib": r.elapsed / (size / GiB)}


def aged_and_unaged(ctx, bench: str, root: Path, x: float) -> tuple[dict, dict]:
    """Grep `root` on the aged FS, then `cp -a` it onto a freshly made FS of the same kind and grep it there."""
    aged = grep_point(ctx, bench, "aged", root, x)
    with fresh_fs(ctx, f"unaged-{int(x)}") as f:
        dst = f.mnt / root.name
        f.untimed(["cp", "-a", str(root), str(dst)], f"copy {root.name} onto a fresh {ctx.fs} (untimed): cp -a")
        f.sync()
        f.phase = "unaged"
        unaged = grep_point(f, bench, "unaged", dst, x)
    if unaged["bytes"] != aged["bytes"] or unaged["files"] != aged["files"]:
        raise RuntimeError(f"the fresh copy differs: {unaged['files']} files / {unaged['bytes']} B vs "
                           f"{aged['files']} / {aged['bytes']} on the aged FS")
    return aged, unaged


class Eta:
    """Progress of a long series: 'point k/n, elapsed, about T left'. `before`: points done by an interrupted
    run that this one resumes (not in this process's elapsed time)."""

    def __init__(self, total: int, before: int = 0):
        self.total, self.before, self.t0 = max(1, total), before, time.monotonic()

    def line(self, done: int) -> str:
        el = time.monotonic() - self.t0
        here = done - self.before
        left = el / here * (self.total - done) if here > 0 else float("nan")
        return f"{done}/{self.total} done, {fmt_secs(el)} elapsed" + (
            f" (resumed after {self.before})" if self.before else "") + (
            f", about {fmt_secs(left)} left" if here > 0 else "")


def point_log(bench: str, x: float, aged: dict, unaged: dict | None, eta: Eta, done: int) -> None:
    s = f"{bench} @ {x:g}: aged {aged['s_per_gib']:.2f} s/GiB, layout {aged['layout']:.2f}"
    if unaged:
        ratio = aged["seconds"] / unaged["seconds"] if unaged["seconds"] else float("nan")
        s += f"; unaged {unaged['s_per_gib']:.2f} s/GiB, layout {unaged['layout']:.2f}; aged/unaged {ratio:.2f}"
    PROGRESS.log(f"{s} ({aged['files']:,} files, {aged['bytes'] / (1 << 20):.1f} MiB) | {eta.line(done)}")
