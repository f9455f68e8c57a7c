"""Directory clone (FAST'20 "How to copy files"): copy a directory of files again and again."""
from __future__ import annotations

from . import Info, Metric, Param
from ..util import M

NAMES = ["dirclone"]
GROUP = "main"  # see GROUPS in __init__.py
ALIASES = {"clone": "dirclone"}
NEEDS: set[str] = set()
# Parameters (`--set name=value`; `quick`: the value under --quick, where it differs).
PARAMS = {
    "clone_dirs": Param(8, quick=2),
    "clone_files": Param(8, quick=2),
    "clone_file_size": Param(4 * M, quick=1 * M, size=True),
    "clone_copies": Param(8, quick=3),
}

INFO = {
    "dirclone": Info(
        "dirclone", "Directory clone (cp -r --reflink=auto)",
        "a directory of `clone_dirs` x `clone_files` files of `clone_file_size` random bytes (untimed), then "
        "`clone_copies` times: copy the *previous copy* with `cp -r --reflink=auto` (+syncfs) [copy]; write 16 "
        "random bytes at a random offset into every file of the new copy, then syncfs (C helper `poke`) "
        "[write]; cold remount and `grep -r` of a string that does not occur, over the whole FS [grep]; "
        "statfs used bytes after syncfs, and the growth over the previous copy [space]. Curves by copy number",
        "FAST'20 (BetrFS 0.5) directory-clone figure: clone time, small-write latency, grep time and space "
        "per clone number; 8 dirs x 8 files x 4 MiB copied 8 times in a row",
        [Metric("copy", "seconds_incl_sync", "copy + sync", "s", False),
         Metric("write", "seconds", "16-byte writes + sync", "s", False),
         Metric("grep", "seconds", "cold grep -r of the FS", "s", False)],
        ["grep"], ["clone"],
        secondary=[Metric("space", "added_bytes", "space added by the copy (statfs)", "MiB", False, 1 / (1 << 20))]),
}


def check(env, names):
    pass


def run(ctx, names):
    p = ctx.p
    src = ctx.mnt / "clone.0"
    total = p.clone_dirs * p.clone_files * p.clone_file_size
    seqio = str(ctx.helpers["seqio"])
    from ..util import PROGRESS, run as run_cmd

    with PROGRESS.step(f"create {p.clone_dirs}x{p.clone_files} files of {p.clone_file_size >> 10} KiB (untimed)"):
        for d in range(p.clone_dirs):
            (src / f"dir{d}").mkdir(parents=True)
            for f in range(p.clone_files):
                run_cmd([seqio, "write", str(src / f"dir{d}" / f"file{f}"), str(p.clone_file_size),
                         str(min(p.clone_file_size, 1 << 20))], timeout=p.timeout)
    ctx.note_written(total)
    ctx.sync()
    used0 = ctx.statfs_used()
    ctx.record("dirclone", "space", "used_bytes", used0, "B", x=0)
    prev = src
    for i in range(1, p.clone_copies + 1):
        dst = ctx.mnt / f"clone.{i}"
        ctx.timed("dirclone", "copy", ["cp", "-r", "--reflink=auto", str(prev), str(dst)], kind="write", x=i,
                  logical_bytes=total, label=f"copy {i}: cp -r --reflink=auto")
        r = ctx.timed("dirclone", "write", [str(ctx.helpers["poke"]), str(dst), "16", str(i)], x=i,
                      record_seconds=False, label=f"copy {i}: 16-byte write into every file + syncfs")
        j = ctx.helper_json(r)
        ctx.note_written(16 * j["files"])
        ctx.record("dirclone", "write", "seconds", j["total_s"], "s", x=i)
        r = ctx.timed("dirclone", "grep", f"grep -r -q amaranth-no-such-string {ctx.mnt}; test $? -eq 1",
                      cold=True, x=i, label=f"copy {i}: cold grep -r of the FS")
        ctx.sync()
        used = ctx.statfs_used()
        ctx.record("dirclone", "space", "used_bytes", used, "B", x=i)
        ctx.record("dirclone", "space", "added_bytes", used - used0, "B", x=i)
        used0 = used
        prev = dst
