"""git clone of a local repository with history, then git diff between two far-apart tags."""
from __future__ import annotations

import os

from . import Info, Metric, Param
from ._common import need

NAMES = ["git"]
GROUP = "main"  # see GROUPS in __init__.py
NEEDS = {"tree", "git"}
# Parameters (`--set name=value`; `quick`: the value under --quick, where it differs).
PARAMS = {
    "git_stages": Param(8, quick=3),  # tags of the git repository built from the Linux tree
}

INFO = {
    "git": Info(
        "git", "git clone + git diff (cold)",
        "cold cache (the source repository, on the work dir's disk, is then read into the host page cache), "
        "`git clone SRC DIR` of the cached repository into the FS (+syncfs); cold remount, "
        "`git diff --patch v1 vN > DIR/../patch` (the patch is written into the FS, +syncfs); seconds",
        "BetrFS application/git (git clone of a local linux.git, git diff --patch v4.7 v4.14 > patch); "
        "FAST'18/'20 git figure. No Linux history is available offline, so the repository is built from "
        "linux-source-6.1 in stages (see the report's inputs section)",
        [Metric("clone", "seconds", "git clone", "s", False),
         Metric("diff", "seconds", "git diff", "s", False)],
        ["diff"],
        secondary=[Metric("clone", "seconds_incl_sync", "git clone + syncfs", "s", False),
                   Metric("diff", "patch_bytes", "patch size", "MiB", None, 1 / (1 << 20))]),
}


def check(env, names):
    need(env, "git")


def _bytes_under(path) -> int:
    total = 0
    for dp, dn, fn in os.walk(path):
        for f in fn:
            try:
                st = os.lstat(os.path.join(dp, f))
                total += st.st_size
            except OSError:
                pass
    return total


def run(ctx, names):
    repo = need(ctx.env, "git")
    dst = ctx.mnt / "linux"
    ctx.timed("git", "clone", ["git", "clone", "-q", str(repo.path), str(dst)], kind="write", cold=True,
              warm=[repo.path], label="git clone")
    ctx.note_written(_bytes_under(dst))  # working tree + .git: what the benchmark wrote
    first, last = repo.tags[0], repo.tags[-1]
    patch = ctx.mnt / "patch"
    ctx.timed("git", "diff", f"git -C {dst} diff --patch {first} {last} > {patch}", kind="write", cold=True,
              label=f"git diff --patch {first} {last}")
    size = patch.stat().st_size
    ctx.note_written(size)
    ctx.record("git", "diff", "patch_bytes", size, "B")
    if size == 0:
        raise RuntimeError("git diff produced an empty patch")
