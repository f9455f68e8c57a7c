"""Git aging (FAST'17 section 6): pull a real project's history one commit at a time; every N pulls, a cold
grep of the repository on the aged FS and on a fresh copy of it."""
from __future__ import annotations

from . import Info, Metric, Param
from ._common import need
from ..aging import Eta, aged_and_unaged, point_log
from ..resume import Points
from ..runner import BenchFailure
from ..util import CMDLOG, PROGRESS, run as sh

NAMES = ["aging-git"]
GROUP = "aging"  # see GROUPS in __init__.py
RESUME = "image"  # --resume continues after the last completed point, on a copy of the aged image (bench/resume.py)
NEEDS = {"git_history"}
# Parameters (`--set name=value`; `quick`: the value under --quick, where it differs).
PARAMS = {
    "aging_git_package": Param("awscli"),  # history = successive releases of a PyPI package (one commit each), see bench/gitsource.py
    "aging_git_from": Param("1.10.0"),  # the first awscli release with a wheel
    "aging_git_pulls": Param(1000, quick=6),
    "aging_git_every": Param(100, quick=3),
    "aging_git_gc": Param(0),  # 1 = git's automatic gc on (as git's default)
}

INFO = {
    "aging-git": Info(
        "aging-git", "Aging: git pulls (cold grep, aged vs. fresh copy)",
        "`git init` + `git fetch` of the first commit of a real project's history (see Inputs) into the FS, "
        "then `aging_git_pulls` × `git pull --ff-only SRC <next first-parent commit>` (gc off unless "
        "`aging_git_gc=1`; a pull fetches only the new objects, over git's pack protocol from a bare repository "
        "in the work dir). At 0 and every `aging_git_every` pulls: cold remount, wait until the device is "
        "quiet, `grep -r` of the repository (working tree + .git) for a string found nowhere [aged]; then "
        "`cp -a` of the repository onto a freshly made FS of the same kind, cold, quiet, same grep [unaged]. "
        "Grep cost = seconds per GiB of file data; also block read requests, layout score, modeled hard disk",
        "FAST'17 'File Systems Fated for Senescence?' git workload (10,000 pulls of Linux from the initial "
        "commit, grep every 100 pulls, aged vs. a copy on a fresh partition, gc on and off); here the history "
        "of a project from PyPI (no Linux history is reachable)",
        [Metric("aged", "s_per_gib", "grep cost, aged", "s/GiB", False),
         Metric("unaged", "s_per_gib", "grep cost, fresh copy", "s/GiB", False)],
        ["aged", "unaged"], ["aging"],
        secondary=[Metric("pull", "seconds", "time of the pulls since the previous point", "s", False)]),
}


def check(env, names):
    need(env, "git_history")


def _git(ctx, repo, *args, **kw):
    return sh(["git", "-C", str(repo), *args], cgroups=ctx.cgroups, timeout=ctx.p.timeout, **kw)


def run(ctx, names):
    p = ctx.p
    hist = need(ctx.env, "git_history")
    n, every = p.aging_git_pulls, max(1, p.aging_git_every)
    if len(hist.commits) < n + 1:
        raise BenchFailure(f"the history has {len(hist.commits)} commits; {n} pulls need {n + 1}")
    bench = "aging-git"
    repo = ctx.mnt / "repo"
    src = f"file://{hist.path}"
    points = [0] + [i for i in range(every, n + 1, every)] + ([n] if n % every else [])
    labels = ["the clone"] + [f"pull {a + 1} (of {n})" for a in points[:-1]]
    pts = Points(ctx, bench, points, labels, image=True)
    eta = Eta(len(points), pts.start)
    if pts.start == 0:
        with PROGRESS.step(f"clone at the first commit ({hist.versions[0]}) into the FS"):
            sh(["git", "init", "-q", "-b", "main", str(repo)], cgroups=ctx.cgroups)
            conf = {"user.name": "amaranth-bench", "user.email": "bench@amaranth.invalid", "pull.ff": "only",
                    "gc.autoDetach": "false", "maintenance.auto": "false"}
            if not p.aging_git_gc:
                conf["gc.auto"] = "0"
            for k, v in conf.items():
                _git(ctx, repo, "config", k, v)
            _git(ctx, repo, "fetch", "-q", src, hist.commits[0])
            _git(ctx, repo, "reset", "-q", "--hard", "FETCH_HEAD")
        ctx.sync()
        aged, unaged = aged_and_unaged(ctx, bench, repo, 0)
        point_log(bench, 0, aged, unaged, eta, 1)
        pts.done(0, {"files": aged["files"], "bytes": aged["bytes"], "head": hist.commits[0]})
    elif not (repo / ".git").is_dir():
        raise RuntimeError(f"resumed on an image without the repository {repo}")
    first = points[pts.start - 1] + 1 if pts.start else 1  # the first pull still to do
    CMDLOG.add(f"git -C {repo} pull -q --ff-only {src} <commit k>   (for k = {first} .. {n}, in the cgroup; not "
               f"logged one by one)")
    pull_s, done = 0.0, max(1, pts.start)
    for i in range(first, n + 1):
        pull_s += _git(ctx, repo, "pull", "-q", "--ff-only", src, hist.commits[i], log=False).elapsed
        if i not in points:
            continue
        head = _git(ctx, repo, "rev-parse", "HEAD", log=False).stdout.strip()
        if head != hist.commits[i]:
            raise RuntimeError(f"after pull {i} HEAD is {head}, expected {hist.commits[i]}")
        ctx.sync()
        ctx.record(bench, "pull", "seconds", pull_s, "s", x=i)
        pull_s = 0.0
        ctx.phase = "pull"
        aged, unaged = aged_and_unaged(ctx, bench, repo, i)
        done += 1
        point_log(bench, i, aged, unaged, eta, done)
        pts.done(done - 1, {"files": aged["files"], "bytes": aged["bytes"], "head": head})
