"""The git history the git-aging experiment pulls from: successive real releases of a large project,
one commit per release, built once from the package registry and cached in the work dir.

Default source: the AWS CLI v1 (`awscli` on PyPI, about 2,500 releases, almost one a working day since
2013). Each release's wheel (the project's Python package: ~1,000 modules plus thousands of small
reStructuredText examples; releases from 1.10.0 on have wheels) becomes one commit: files that changed are
rewritten, new ones created, vanished ones deleted. So a pull brings in what one real release changed.
Downloads use `pip download` (the registry's ordinary client); the wheels are kept in the cache, so the
history is downloaded once and built once per (package, first version, length)."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .util import PROGRESS, CommandError, fmt_size, run

GIT_ENV = {"GIT_AUTHOR_NAME": "amaranth-bench", "GIT_AUTHOR_EMAIL": "bench@amaranth.invalid",
           "GIT_COMMITTER_NAME": "amaranth-bench", "GIT_COMMITTER_EMAIL": "bench@amaranth.invalid"}
_RELEASE = re.compile(r"^\d+(\.\d+)*$")


@dataclass
class History:
    path: Path  # bare repository; allows fetching any reachable commit by id
    commits: list[str]  # first-parent order, oldest first
    versions: list[str]  # the release each commit holds
    description: str


def version_key(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split("."))


def select_versions(available: list[str], first: str, count: int) -> list[str]:
    """Final releases (no pre-releases) from `first` on, in release order, at most `count`."""
    rel = sorted((v for v in available if _RELEASE.match(v)), key=version_key)
    start = version_key(first)
    return [v for v in rel if version_key(v) >= start][:count]


def list_versions(package: str) -> list[str]:
    r = run(["python3", "-m", "pip", "index", "versions", package], timeout=300)
    for line in r.stdout.splitlines():
        if line.startswith("Available versions:"):
            return [v.strip() for v in line.split(":", 1)[1].split(",") if v.strip()]
    raise RuntimeError(f"`pip index versions {package}` listed no versions: {r.stdout[-300:]}")


def _download(package: str, version: str, dest: Path) -> Path | None:
    """The wheel of one release (cached); None if the release has no wheel."""
    for f in dest.glob(f"{package.replace('-', '_')}-{version}-*.whl"):
        return f
    tmp = dest / f".dl-{version}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        run(["python3", "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:", "--no-cache-dir",
             "-d", str(tmp), f"{package}=={version}"], timeout=600, log=False)
    except CommandError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if "No matching distribution" in str(e):
            return None
        raise
    wheels = list(tmp.glob("*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"pip download {package}=={version} gave {wheels}")
    out = dest / wheels[0].name
    os.replace(wheels[0], out)
    shutil.rmtree(tmp, ignore_errors=True)
    return out


def download(package: str, versions: list[str], dest: Path, jobs: int = 2) -> dict[str, Path]:
    """Wheels of `versions` (those that have one), `jobs` downloads at a time, with progress."""
    dest.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}
    with PROGRESS.step(f"download {len(versions)} releases of {package} from PyPI (pip download, cached in "
                       f"{dest})") as info:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            for i, (v, w) in enumerate(zip(versions, pool.map(lambda v: _download(package, v, dest), versions))):
                if w is not None:
                    out[v] = w
                if (i + 1) % 100 == 0:
                    PROGRESS.log(f"  {i + 1}/{len(versions)} releases downloaded")
        info["result"] = f"{len(out)} wheels"
    return out


def apply_release(work: Path, wheel: Path) -> tuple[int, int, int]:
    """Make the work tree hold exactly the wheel's files (the repository's .git aside): write the files
    whose content changed or that are new, delete the ones the release no longer has. Returns
    (created, modified, deleted)."""
    created = modified = 0
    seen: set[str] = set()
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            name = info.filename
            if name.endswith("/") or name.startswith(".git/") or name == ".git" or ".." in name.split("/"):
                continue
            seen.add(name)
            data = z.read(info)
            p = work / name
            if p.exists():
                if p.read_bytes() == data:
                    continue
                modified += 1
            else:
                created += 1
                p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
    deleted = 0
    for dp, dn, fn in os.walk(work, topdown=True):
        if Path(dp) == work and ".git" in dn:
            dn.remove(".git")
        for f in fn:
            rel = os.path.relpath(os.path.join(dp, f), work)
            if rel not in seen:
                os.unlink(os.path.join(dp, f))
                deleted += 1
    for dp, dn, fn in os.walk(work, topdown=False):  # remove directories left empty
        if Path(dp) != work and ".git" not in Path(dp).relative_to(work).parts and not os.listdir(dp):
            os.rmdir(dp)
    return created, modified, deleted


def build_history(cache: Path, package: str, first: str, count: int) -> History:
    """A bare repository with one commit per release (`count` releases from `first` on), built once."""
    key = hashlib.sha256(f"{package}|{first}|{count}|v1".encode()).hexdigest()[:10]
    bare = cache / f"history-{package}-{key}.git"
    meta = cache / f"history-{package}-{key}.json"
    if meta.exists() and bare.exists():
        m = json.loads(meta.read_text())
        return History(bare, m["commits"], m["versions"], m["description"])
    versions = select_versions(list_versions(package), first, count)
    if len(versions) < count:
        raise RuntimeError(f"{package} has {len(versions)} releases from {first} on; {count} are needed "
                           f"(aging_git_pulls + 1)")
    wheels = download(package, versions, cache / f"wheels-{package}")
    versions = [v for v in versions if v in wheels]
    if len(versions) < count:
        raise RuntimeError(f"only {len(versions)} of the {count} releases of {package} from {first} on have a "
                           f"wheel; choose a later aging_git_from")
    work = cache / f"history-{package}-{key}.work"
    for p in (work, bare):
        shutil.rmtree(p, ignore_errors=True)
    run(["git", "init", "-q", "-b", "main", str(work)])
    for k, v in (("core.autocrlf", "false"), ("gc.auto", "0")):
        run(["git", "-C", str(work), "config", k, v])
    totals = [0, 0, 0]
    with PROGRESS.step(f"build a git history of {len(versions)} {package} releases ({versions[0]} .. "
                       f"{versions[-1]}) in {bare}") as info:
        for i, v in enumerate(versions):
            c = apply_release(work, wheels[v])
            totals = [a + b for a, b in zip(totals, c)]
            date = f"@{1_450_000_000 + i * 86_400} +0000"  # one release a day, deterministic
            env = dict(GIT_ENV, GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)
            run(["git", "-C", str(work), "add", "-A", "-f"], env=env, timeout=3600, log=False)
            run(["git", "-C", str(work), "commit", "-q", "--allow-empty", "-m", f"{package} {v}"], env=env,
                timeout=3600, log=False)
            if (i + 1) % 100 == 0:
                PROGRESS.log(f"  {i + 1}/{len(versions)} commits")
        run(["git", "-C", str(work), "gc", "-q"], timeout=7200)
        run(["git", "clone", "-q", "--bare", str(work), str(bare)], timeout=7200)
        run(["git", "-C", str(bare), "config", "uploadpack.allowReachableSHA1InWant", "true"])
        shutil.rmtree(work)
        commits = run(["git", "-C", str(bare), "rev-list", "--first-parent", "--reverse", "main"]).stdout.split()
        pack = sum(p.stat().st_size for p in (bare / "objects").rglob("*") if p.is_file())
        info["result"] = f"{len(commits)} commits, {fmt_size(pack)} of objects"
    assert len(commits) == len(versions), (len(commits), len(versions))
    desc = (f"{len(commits)} successive releases of `{package}` from PyPI ({versions[0]} .. {versions[-1]}), "
            f"one commit per release (the release's wheel contents; {totals[0]:,} file creations, {totals[1]:,} "
            f"modifications, {totals[2]:,} deletions in total), first-parent history, {fmt_size(pack)} of "
            f"objects after `git gc`")
    meta.write_text(json.dumps({"commits": commits, "versions": versions, "description": desc}))
    return History(bare, commits, versions, desc)
