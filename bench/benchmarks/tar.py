"""tar: unpack the Linux tree into the FS, then pack it again (reading every file)."""
from __future__ import annotations

from . import Info, Metric
from ._common import need

NAMES = ["tar"]
GROUP = "main"  # see GROUPS in __init__.py
NEEDS = {"tree"}

INFO = {
    "tar": Info(
        "tar", "tar: untar and tar (Linux tree)",
        "`tar -xf linux.tar -C DIR` from an *uncompressed* tar prepared once (so xz does not dominate; the tar "
        "is read into the host page cache first) (+syncfs, reported separately); cold remount, "
        "`tar -cf - linux-source-6.1 | wc -c` (tar to /dev/null would skip reading data); seconds",
        "BetrFS application/tar (tar -xf linux-3.11.10.tar.xz; tar -zcvf); here uncompressed in both "
        "directions",
        [Metric("untar", "seconds", "untar", "s", False),
         Metric("untar", "seconds_incl_sync", "untar + syncfs", "s", False),
         Metric("tar", "seconds", "tar (cold)", "s", False)],
        ["tar"]),
}


def check(env, names):
    need(env, "tree")


def run(ctx, names):
    tree = need(ctx.env, "tree")
    ctx.timed("tar", "untar", ["tar", "-xf", str(tree.tar), "-C", str(ctx.mnt)], kind="write", warm=[tree.tar],
              logical_bytes=tree.bytes, label="tar -xf (uncompressed)")
    r = ctx.timed("tar", "tar", f"tar -C {ctx.mnt} -cf - {tree.root.name} | wc -c", cold=True,
                  label="tar -cf - | wc -c")
    n = int(r.stdout.strip())
    if n < tree.bytes:
        raise RuntimeError(f"tar produced {n} bytes, less than the tree's {tree.bytes}")
