"""Cold-cache scans of the Linux tree: recursive grep, find, and recursive delete."""
from __future__ import annotations

from . import Info, Metric
from ._common import need, untar_tree

NAMES = ["linuxtree"]
GROUP = "main"  # see GROUPS in __init__.py
ALIASES = {"grep": "linuxtree"}
NEEDS = {"tree"}

INFO = {
    "linuxtree": Info(
        "linuxtree", "Linux tree: grep, find, rm (cold)",
        "the Linux tree copied in (untimed), then, each after a cold remount: `grep -r cpu_to_be64 DIR`, "
        "`find DIR -name wait.c`, `rm -rf DIR` (+syncfs, reported separately); seconds",
        "BetrFS micro/recursive-grep, recursive-scan-find, recursive-dir-delete (Linux 3.11.10; the delete "
        "benchmark used 2 copies); FAST'15/'16/'18 directory-scan figures",
        [Metric("grep", "seconds", "grep -r", "s", False),
         Metric("find", "seconds", "find -name", "s", False),
         Metric("rm", "seconds", "rm -rf", "s", False),
         Metric("rm", "seconds_incl_sync", "rm -rf + syncfs", "s", False)],
        ["grep", "find", "rm"]),
}


def check(env, names):
    need(env, "tree")


def run(ctx, names):
    tree = need(ctx.env, "tree")
    untar_tree(ctx, tree, ctx.mnt)
    d = ctx.mnt / tree.root.name
    r = ctx.timed("linuxtree", "grep", ["grep", "-r", "cpu_to_be64", str(d)], cold=True, stdout="null",
                  check=False, label="grep -r cpu_to_be64")
    # on the whole tree the pattern must be found (a cheap correctness check); on a subset it may not be
    if r.rc > 1 or (r.rc == 1 and not tree.subset):
        raise RuntimeError(f"grep -r exited {r.rc}: {r.stderr[-300:]}")
    r = ctx.timed("linuxtree", "find", ["find", str(d), "-name", "wait.c"], cold=True, label="find -name wait.c")
    if "wait.c" not in r.stdout and not tree.subset:
        raise RuntimeError("find found no wait.c")
    ctx.timed("linuxtree", "rm", ["rm", "-rf", str(d)], cold=True, kind="write", label="rm -rf")
    if d.exists():
        raise RuntimeError(f"{d} still exists after rm -rf")
