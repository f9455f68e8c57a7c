"""Directory rename of the Linux source tree."""
from __future__ import annotations

from . import Info, Metric, Param
from ._common import need, untar_tree

NAMES = ["dirrename"]
GROUP = "main"  # see GROUPS in __init__.py
NEEDS = {"tree"}
# Parameters (`--set name=value`; `quick`: the value under --quick, where it differs).
PARAMS = {
    "dirrename_count": Param(100, quick=10),
}

INFO = {
    "dirrename": Info(
        "dirrename", "Directory rename (Linux tree)",
        "the Linux tree copied in (untimed), cold cache, then `dirrename_count` x (rename of the tree's top "
        "directory + fsync of the parent), alternating names (C helper `renamebench`); renames/s, and the "
        "first (cold) rename's latency",
        "BetrFS micro/rename (`mv linux-3.11.10 copydir`, cold); FAST'18/FAST'20 directory-rename figure",
        [Metric("rename", "renames_per_s", "dir renames/s", "renames/s", True),
         Metric("rename", "first_rename_ms", "first (cold) rename", "ms", False)],
        ["rename"],
        secondary=[Metric("rename", "seconds", "all renames", "s", False)]),
}


def check(env, names):
    need(env, "tree")


def run(ctx, names):
    tree = need(ctx.env, "tree")
    untar_tree(ctx, tree, ctx.mnt)
    a, b = ctx.mnt / tree.root.name, ctx.mnt / "linux-renamed"
    r = ctx.timed("dirrename", "rename", [str(ctx.helpers["renamebench"]), str(a), str(b),
                                          str(ctx.p.dirrename_count)],
                  cold=True, record_seconds=False, label=f"{ctx.p.dirrename_count} directory renames")
    j = ctx.helper_json(r)
    ctx.record("dirrename", "rename", "renames_per_s", j["renames_per_s"], "renames/s")
    ctx.record("dirrename", "rename", "seconds", j["total_s"], "s")
    ctx.record("dirrename", "rename", "first_rename_ms", j["latency_us"][0] / 1000, "ms")
