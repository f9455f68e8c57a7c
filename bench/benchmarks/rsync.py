"""rsync of the Linux tree into the FS, then within the FS, with and without --inplace."""
from __future__ import annotations

from . import Info, Metric
from ._common import need

NAMES = ["rsync"]
GROUP = "main"  # see GROUPS in __init__.py
NEEDS = {"tree", "tree_tmpfs"}

INFO = {
    "rsync": Info(
        "rsync", "rsync (Linux tree)",
        "`rsync -a -W SRC/ DIR/a/` from a copy of the cached tree on a tmpfs (so the source is in memory "
        "even after the cold-cache steps) (+syncfs); cold remount, `rsync -a -W DIR/a/ DIR/b/` (+syncfs); `DIR/b` removed (untimed), cold "
        "remount, `rsync -a -W --inplace DIR/a/ DIR/c/` (+syncfs); MB/s = tree bytes / seconds incl. syncfs",
        "BetrFS application/rsync (rsync -r -t -S into the FS; in-FS rsync -r -t -W --inplace); FAST'15 "
        "abstract: in-place rsync 1.6-22x faster",
        [Metric("rsync_in", "mb_per_s", "into the FS", "MB/s", True),
         Metric("copy", "mb_per_s", "within the FS", "MB/s", True),
         Metric("copy_inplace", "mb_per_s", "within, --inplace", "MB/s", True)],
        ["copy", "copy_inplace"],
        secondary=[Metric(ph, "mb_per_s_excl_sync", f"{ph}, excluding the syncfs", "MB/s", True)
                   for ph in ("rsync_in", "copy", "copy_inplace")]),
}


def check(env, names):
    need(env, "tree")


def run(ctx, names):
    tree = need(ctx.env, "tree")
    src = ctx.env.data.get("tree_tmpfs")
    warm = []
    if not hasattr(src, "root"):  # no tmpfs copy: read the work dir copy into the page cache first
        src, warm = tree, [tree.root]
    a, b, c = ctx.mnt / "a", ctx.mnt / "b", ctx.mnt / "c"

    def phase(name, cmd, **kw):
        r = ctx.timed("rsync", name, cmd, kind="write", logical_bytes=tree.bytes, **kw)
        ctx.record("rsync", name, "mb_per_s", tree.bytes / 1e6 / (r.elapsed + r.extra["sync_s"]), "MB/s")
        ctx.record("rsync", name, "mb_per_s_excl_sync", tree.bytes / 1e6 / r.elapsed, "MB/s")

    phase("rsync_in", ["rsync", "-a", "-W", f"{src.root}/", f"{a}/"], warm=warm, label="rsync -a into the FS")
    phase("copy", ["rsync", "-a", "-W", f"{a}/", f"{b}/"], cold=True, label="rsync -a within the FS")
    ctx.untimed(["rm", "-rf", str(b)], "remove the first copy (untimed)")
    ctx.sync()
    phase("copy_inplace", ["rsync", "-a", "-W", "--inplace", f"{a}/", f"{c}/"], cold=True,
          label="rsync -a --inplace within the FS")
