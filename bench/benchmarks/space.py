"""Disk space: after writing incompressible files, after deleting half, after background work settles."""
from __future__ import annotations

import time

from . import Info, Metric, Param
from ..util import M
from ..util import PROGRESS

NAMES = ["space"]
GROUP = "main"  # see GROUPS in __init__.py
NEEDS: set[str] = set()
# Parameters (`--set name=value`; `quick`: the value under --quick, where it differs).
PARAMS = {
    "space_files": Param(8, quick=4),
    "space_file_size": Param(512 * M, quick=16 * M, size=True),
    "space_settle_max": Param(90, quick=6),
    "space_settle_interval": Param(3, quick=1),
    "space_settle_samples": Param(3, quick=2),  # this many equal readings in a row = settled
    "space_settle_min_amaranth": Param(65, quick=0),  # Amaranth checkpoints every 60 s: wait at least one period
}

INFO = {
    "space": Info(
        "space", "Space use after write, delete, settle",
        "`space_files` files of `space_file_size` random bytes (each fsynced), syncfs -> [written]; every other "
        "file deleted, syncfs -> [deleted]; then statfs polled every `space_settle_interval` s until "
        "`space_settle_samples` equal readings in a row or `space_settle_max` s (for Amaranth at least "
        "`space_settle_min_amaranth` s = one 60 s checkpoint period) -> [settled]. Each stage: statfs "
        "used bytes minus the empty FS's, the image file's allocated bytes, and used/live data",
        "FAST'15 Table 8 (BetrFS disk usage after writing large incompressible files, deleting half, flushing)",
        [Metric("written", "used_over_live", "after write", "x live", False),
         Metric("deleted", "used_over_live", "after deleting half", "x live", False),
         Metric("settled", "used_over_live", "after settling", "x live", False)],
        secondary=[m for st in ("written", "deleted", "settled") for m in (
            Metric(st, "live_bytes", f"{st}: live data", "MiB", None, 1 / (1 << 20)),
            Metric(st, "used_bytes", f"{st}: statfs used (minus empty FS)", "MiB", False, 1 / (1 << 20)),
            Metric(st, "image_bytes", f"{st}: image file allocated", "MiB", None, 1 / (1 << 20)))] +
        [Metric("settled", "settle_s", "time to settle", "s", None)]),
}


def check(env, names):
    pass


def run(ctx, names):
    p = ctx.p
    d = ctx.mnt / "space"
    d.mkdir()
    ctx.sync()
    base_used = ctx.statfs_used()
    base_img = ctx.loop.allocated_bytes()
    ctx.record("space", "empty", "used_bytes", base_used, "B")
    ctx.record("space", "empty", "image_bytes", base_img, "B")

    def measure(stage: str, live: int) -> int:
        ctx.sync()
        used = ctx.statfs_used()
        ctx.record("space", stage, "used_bytes", used - base_used, "B")
        ctx.record("space", stage, "image_bytes", ctx.loop.allocated_bytes(), "B")
        ctx.record("space", stage, "live_bytes", live, "B")
        ctx.record("space", stage, "used_over_live", (used - base_used) / live, "x")
        return used

    files = [d / f"file{i}" for i in range(p.space_files)]
    for f in files:
        ctx.untimed([str(ctx.helpers["seqio"]), "write", str(f), str(p.space_file_size), str(1 << 20)],
                    f"write {f.name} ({p.space_file_size >> 20} MiB, fsync)", logical_bytes=p.space_file_size,
                    in_cgroup=True)
    measure("written", p.space_files * p.space_file_size)
    with PROGRESS.step(f"delete {len(files[::2])} of {len(files)} files + syncfs"):
        for f in files[::2]:
            f.unlink()
    live = len(files[1::2]) * p.space_file_size
    last = measure("deleted", live)
    min_wait = p.space_settle_min_amaranth if ctx.is_amaranth else 0
    with PROGRESS.step(f"wait until used space settles (<= {max(p.space_settle_max, min_wait)}s)") as info:
        t0 = time.monotonic()
        same = 1
        while time.monotonic() - t0 < max(p.space_settle_max, min_wait) and (
                same < p.space_settle_samples or time.monotonic() - t0 < min_wait):
            time.sleep(p.space_settle_interval)
            ctx.sync()
            now = ctx.statfs_used()
            same = same + 1 if now == last else 1
            last = now
        waited = time.monotonic() - t0
        info["result"] = f"after {waited:.0f}s" + ("" if same >= p.space_settle_samples else " (not settled)")
    measure("settled", live)
    ctx.record("space", "settled", "settle_s", waited, "s")
    ctx.record("space", "settled", "settled", 1.0 if same >= p.space_settle_samples else 0.0, "")
