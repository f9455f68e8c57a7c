"""Interfile fragmentation (FAST'17 section 5): a real directory structure with every file replaced by
4 KiB of random data, copied in sorted order, then with a growing share of the files in random order."""
from __future__ import annotations

import os
import random
from pathlib import Path

from . import Info, Metric, Param
from ..util import K
from ._common import need
from ..aging import Eta, fresh_fs, grep_point, point_log, point_rng
from ..resume import Points

NAMES = ["aging-interfile"]
GROUP = "aging"  # see GROUPS in __init__.py
RESUME = "points"  # every round on a fresh FS: --resume skips the completed rounds (bench/resume.py)
NEEDS = {"tree"}
# Parameters (`--set name=value`; `quick`: the value under --quick, where it differs).
PARAMS = {
    "aging_inter_step": Param(10, quick=50),  # percent of the files in random order added per round (the Linux tree: tree_subset / tree_exclude)
    "aging_inter_file_size": Param(4 * K, size=True),
}

INFO = {
    "aging-interfile": Info(
        "aging-interfile", "Aging: interfile fragmentation (creation order)",
        "the file list of the Linux tree (see Inputs), sorted, and one random permutation of it; for x = 0, "
        "`aging_inter_step`, ... 100 (%): on a freshly made FS, every file created (directories as needed, as "
        "`cp --parents` does) with `aging_inter_file_size` random bytes, in sorted order except that the files "
        "among the first x% of the permutation take each other's places in permutation order (x = 100: fully "
        "random) (+syncfs); cold remount, wait until the device is quiet, `grep -r` for a string found "
        "nowhere [grep]",
        "FAST'17 interfile benchmark (TensorFlow's repository, every file replaced by 4 KiB of random data, "
        "copied with the first n% of a random permutation swapped; grep after each round); here the Linux tree "
        "from Debian",
        [Metric("grep", "s_per_gib", "grep cost", "s/GiB", False)],
        ["grep"], ["aging"]),
}


def check(env, names):
    need(env, "tree")


def file_list(root: Path) -> list[str]:
    out = []
    for dp, dn, fn in os.walk(root):
        for f in fn:
            full = os.path.join(dp, f)
            if not os.path.islink(full):
                out.append(os.path.relpath(full, root))
    return sorted(out)


def creation_order(files: list[str], perm: list[str], pct: float) -> list[str]:
    """`files` (sorted) with the first pct% of `perm` put into the places those files hold, in `perm` order."""
    n = round(len(files) * pct / 100)
    moved = perm[:n]
    chosen = set(moved)
    slots = [i for i, f in enumerate(files) if f in chosen]
    out = list(files)
    for i, f in zip(slots, moved):
        out[i] = f
    return out


def write_tree(dest: Path, order: list[str], size: int, rng: random.Random) -> int:
    made: set[str] = set()
    for rel in order:
        parent = os.path.dirname(rel)
        if parent not in made:
            (dest / parent).mkdir(parents=True, exist_ok=True)
            made.add(parent)
        (dest / rel).write_bytes(rng.randbytes(size))
    return len(order) * size


def run(ctx, names):
    p = ctx.p
    bench = "aging-interfile"
    tree = need(ctx.env, "tree")
    files = file_list(tree.root)
    rng = random.Random(p.rand_seed + ctx.rep)
    perm = list(files)
    rng.shuffle(perm)
    steps = list(range(0, 101, max(1, p.aging_inter_step)))
    steps = steps if steps[-1] == 100 else steps + [100]
    points = Points(ctx, bench, steps, [f"round {pct} %" for pct in steps], image=False)
    eta = Eta(len(steps), points.start)
    for n, pct in enumerate(steps, start=1):
        if n <= points.start:
            continue  # done by the run this one resumes
        with fresh_fs(ctx, f"p{pct}") as f:
            d = f.mnt / "tree"
            f.note_written(write_tree(d, creation_order(files, perm, pct), p.aging_inter_file_size,
                                      point_rng(ctx, bench, "data", pct)))
            f.sync()
            f.phase = "write"
            res = grep_point(f, bench, "grep", d, pct)
        point_log(bench, pct, res, None, eta, n)
        points.done(n - 1)
