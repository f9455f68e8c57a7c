"""Inputs prepared once and cached in the work dir (never on the FS under test): compiled helpers,
the Linux source tree (+ an uncompressed tar of it), and a git repository with a real history."""
from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

from .util import PROGRESS, fmt_size, run

LINUX_TXZ = Path("/usr/src/linux-source-6.1.tar.xz")
TOP = "linux-source-6.1"
HELPERS = ["seqio", "randwrite", "tokubench", "renamebench", "nanobench", "poke"]
HELPER_DIR = Path(__file__).parent / "helpers"


def build_helpers(workdir: Path) -> dict[str, Path]:
    """gcc -O2 each helper into <workdir>/helpers/<hash of the sources>/ (rebuilt when they change)."""
    h = hashlib.sha256()
    for p in sorted(HELPER_DIR.glob("*.[ch]")):
        h.update(p.name.encode() + p.read_bytes())
    out = workdir / "helpers" / h.hexdigest()[:12]
    out.mkdir(parents=True, exist_ok=True)
    bins = {}
    for name in HELPERS:
        b = out / name
        if not b.exists():
            with PROGRESS.step(f"compile helper {name}"):
                run(["gcc", "-O2", "-Wall", "-pthread", "-o", str(b) + ".tmp", str(HELPER_DIR / f"{name}.c")])
                os.replace(str(b) + ".tmp", b)
        bins[name] = b
    return bins


@dataclass
class Tree:
    """The Linux source tree as a directory and as an uncompressed tar with top directory TOP."""

    root: Path  # .../linux-source-6.1
    tar: Path
    files: int
    dirs: int
    bytes: int  # sum of regular file sizes
    subset: str
    exclude: str = ""

    @property
    def description(self) -> str:
        what = f"subdirectories {self.subset} of" if self.subset else "the whole"
        if self.exclude:
            what += f" (without {', '.join(e + '/' for e in self.exclude.split(','))})"
        return (f"{what} Debian linux-source-6.1 ({LINUX_TXZ}): {self.files:,} files, {self.dirs:,} directories, "
                f"{fmt_size(self.bytes)}")


def _scan(root: Path) -> tuple[int, int, int]:
    files = dirs = size = 0
    for dp, dn, fn in os.walk(root):
        dirs += 1
        for f in fn:
            st = os.lstat(os.path.join(dp, f))
            if not os.path.islink(os.path.join(dp, f)):
                files += 1
                size += st.st_size
    return files, dirs, size


def _parts(spec: str) -> list[str]:
    return [s.strip().strip("/") for s in spec.split(",") if s.strip().strip("/")]


def linux_tree(cache: Path, subset: str, exclude: str = "") -> Tree:
    """The tree, extracted once: whole, only `subset` (comma-separated subdirectories), and/or without
    `exclude` (comma-separated subdirectories). The whole tree's uncompressed tar is kept too."""
    subset, exclude = ",".join(_parts(subset)), ",".join(_parts(exclude))
    variant = subset or exclude
    key = "full" if not variant else "var-" + hashlib.sha256(f"{subset}|{exclude}".encode()).hexdigest()[:8]
    base = cache / f"linux-{key}"
    meta = base / "meta.json"
    if meta.exists():
        m = json.loads(meta.read_text())
        return Tree(base / "tree" / TOP, base / "linux.tar", m["files"], m["dirs"], m["bytes"], subset, exclude)
    if not LINUX_TXZ.exists():
        raise FileNotFoundError(f"{LINUX_TXZ} missing: install the Debian package linux-source-6.1 "
                                "(scripts/install-deps.sh --bench)")
    if base.exists():
        shutil.rmtree(base)
    (base / "tree").mkdir(parents=True)
    label = "whole" if not variant else (f"only {subset}" if subset else "") + (f" without {exclude}" if exclude else "")
    with PROGRESS.step(f"prepare Linux tree ({label.strip()}) in {base}"):
        if not variant:
            run(f"xz -T0 -dc {LINUX_TXZ} > {base / 'linux.tar.part'}", timeout=3600)
            os.replace(base / "linux.tar.part", base / "linux.tar")
            run(["tar", "-xf", str(base / "linux.tar"), "-C", str(base / "tree")], timeout=3600)
        else:
            members = [f"{TOP}/{s}" for s in _parts(subset)] or [TOP]
            excl = [f"--exclude={TOP}/{e}" for e in _parts(exclude)]
            full_tar = cache / "linux-full" / "linux.tar"
            if (cache / "linux-full" / "meta.json").exists():
                src = ["tar", "-xf", str(full_tar)]
            else:
                src = ["tar", "-xJf", str(LINUX_TXZ)]
            run(src + ["-C", str(base / "tree")] + excl + members, timeout=3600)
            run(["tar", "-C", str(base / "tree"), "-cf", str(base / "linux.tar"), TOP], timeout=3600)
        files, dirs, size = _scan(base / "tree" / TOP)
        meta.write_text(json.dumps({"files": files, "dirs": dirs, "bytes": size, "subset": subset,
                                    "exclude": exclude}))
    return Tree(base / "tree" / TOP, base / "linux.tar", files, dirs, size, subset, exclude)


def tmpfs_copy(workdir: Path, tree: Tree) -> Tree:
    """The tree on a tmpfs in the work dir, as a read source that `drop_caches` cannot evict (the
    rsync benchmark reads it after every cold-cache step). Unmounted by the cleanup registry."""
    from . import cleanup

    mnt = workdir / f"src-tmpfs-{os.getpid()}"
    mnt.mkdir(parents=True, exist_ok=True)
    size = int(tree.bytes * 1.3) + (256 << 20)
    with PROGRESS.step(f"copy the Linux tree to a tmpfs ({fmt_size(size)} limit) at {mnt}"):
        run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(mnt)])

        def undo():
            run(["umount", str(mnt)], check=False)
            try:
                mnt.rmdir()
            except OSError:
                pass

        cleanup.register(f"umount tmpfs {mnt}", undo)
        run(["tar", "-xf", str(tree.tar), "-C", str(mnt)], timeout=3600)
    return Tree(mnt / TOP, tree.tar, tree.files, tree.dirs, tree.bytes, tree.subset, tree.exclude)


# ---------------------------------------------------------------------------------------------
# git repository with a history


@dataclass
class GitRepo:
    path: Path  # bare repository
    tags: list[str]
    description: str
    pack_bytes: int


def _stage_units(root: Path) -> list[str]:
    """Units that enter the history at different tags: second-level directories (arch/x86,
    drivers/net, fs/ext4, ...) and top-level files, in sorted order."""
    units = []
    for top in sorted(os.listdir(root)):
        p = root / top
        if p.is_dir() and not p.is_symlink():
            subs = sorted(os.listdir(p))
            files_here = [s for s in subs if not (p / s).is_dir() or (p / s).is_symlink()]
            if files_here:
                units.append(top + "/.")  # the files directly in the top-level directory
            units += [f"{top}/{s}" for s in subs if (p / s).is_dir() and not (p / s).is_symlink()]
        else:
            units.append(top)
    return units


def _copy_unit(src_root: Path, dst_root: Path, unit: str) -> None:
    if unit.endswith("/."):
        d = unit[:-2]
        (dst_root / d).mkdir(parents=True, exist_ok=True)
        for name in os.listdir(src_root / d):
            s = src_root / d / name
            if not s.is_dir() or s.is_symlink():
                shutil.copy2(s, dst_root / d / name, follow_symlinks=False)
        return
    s, d = src_root / unit, dst_root / unit
    d.parent.mkdir(parents=True, exist_ok=True)
    if s.is_dir() and not s.is_symlink():
        shutil.copytree(s, d, symlinks=True)
    else:
        shutil.copy2(s, d, follow_symlinks=False)


def _modify(path: Path, rng: random.Random, tag: str) -> bool:
    """Deterministic edit of a source file: insert a comment line and drop another line."""
    try:
        lines = path.read_bytes().split(b"\n")
    except OSError:
        return False
    if len(lines) < 4:
        return False
    i = rng.randrange(1, len(lines) - 1)
    lines.insert(i, f"/* amaranth-bench {tag}: change {rng.getrandbits(32):08x} */".encode())
    del lines[rng.randrange(1, len(lines) - 1)]
    path.write_bytes(b"\n".join(lines))
    return True


def git_repo(cache: Path, tree: Tree, stages: int) -> GitRepo:
    """A repository with tags v1..vN built from the Linux tree: v1 holds ~70% of the second-level
    directories; each later tag adds an equal share of the rest (like new subsystems arriving),
    edits ~2% of the .c/.h files committed so far and deletes ~0.3% of them. vN holds the whole
    tree (minus the deleted files). Built once, repacked (`git gc`), kept as a bare repository."""
    key = hashlib.sha256(f"{tree.root}|{tree.files}|{tree.bytes}|{stages}|v3".encode()).hexdigest()[:10]
    bare = cache / f"git-history-{key}.git"
    meta = cache / f"git-history-{key}.json"
    if meta.exists() and bare.exists():
        m = json.loads(meta.read_text())
        return GitRepo(bare, m["tags"], m["description"], m["pack_bytes"])
    work = cache / f"git-history-{key}.work"
    for p in (work, bare):
        if p.exists():
            shutil.rmtree(p)
    rng = random.Random(42)
    units = _stage_units(tree.root)
    order = list(units)
    rng.shuffle(order)
    n_first = int(len(order) * 0.7)
    rest = order[n_first:]
    groups = [order[:n_first]] + [rest[i::max(1, stages - 1)] for i in range(max(1, stages - 1))]
    groups = groups[:stages]
    env = {"GIT_AUTHOR_NAME": "amaranth-bench", "GIT_AUTHOR_EMAIL": "bench@amaranth.invalid",
           "GIT_COMMITTER_NAME": "amaranth-bench", "GIT_COMMITTER_EMAIL": "bench@amaranth.invalid",
           "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z"}
    tags = []
    edits = deletes = 0
    with PROGRESS.step(f"build git history ({stages} tags) from the Linux tree in {bare}") as info:
        work.mkdir(parents=True)
        run(["git", "init", "-q", "-b", "main", str(work)])
        run(["git", "-C", str(work), "config", "core.autocrlf", "false"])
        run(["git", "-C", str(work), "config", "gc.auto", "0"])  # no background auto-gc while building
        for k, group in enumerate(groups, start=1):
            tag = f"v{k}"
            if k > 1:
                sources = sorted(str(p.relative_to(work)) for p in work.rglob("*.[ch]")
                                 if p.is_file() and not p.is_symlink() and ".git" not in p.parts)
                for rel in rng.sample(sources, k=max(1, len(sources) // 50)):
                    edits += _modify(work / rel, rng, tag)
                for rel in rng.sample(sources, k=max(1, len(sources) * 3 // 1000)):
                    (work / rel).unlink(missing_ok=True)
                    deletes += 1
            for unit in group:
                _copy_unit(tree.root, work, unit)
            # -f: the Debian tree's top-level .gitignore ignores everything ("/*")
            run(["git", "-C", str(work), "add", "-A", "-f"], timeout=7200, env=env)
            run(["git", "-C", str(work), "commit", "-q", "-m", f"{tag}: stage {k} of {stages}"], timeout=7200,
                env=env)
            run(["git", "-C", str(work), "tag", tag], env=env)
            tags.append(tag)
        run(["git", "-C", str(work), "gc", "-q"], timeout=7200)
        run(["git", "clone", "-q", "--bare", str(work), str(bare)], timeout=7200)
        shutil.rmtree(work)
        pack = sum(p.stat().st_size for p in (bare / "objects").rglob("*") if p.is_file())
        info["result"] = f"pack {fmt_size(pack)}"
    desc = (f"built from {tree.description}: {stages} tags v1..v{stages}; v1 holds 70% of the second-level "
            f"directories (shuffled, seed 42), each later tag adds 1/{max(1, stages - 1)} of the rest, edits 2% "
            f"and deletes 0.3% of the .c/.h files committed so far ({edits:,} edits, {deletes:,} deletions in "
            f"total); repacked with `git gc`; {fmt_size(pack)} of objects")
    meta.write_text(json.dumps({"tags": tags, "description": desc, "pack_bytes": pack}))
    return GitRepo(bare, tags, desc, pack)


def ensure_user(name: str) -> tuple[int, int]:
    """A system user for the Dovecot mailserver benchmark (created once, kept)."""
    import pwd

    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        with PROGRESS.step(f"create system user {name} for the mailserver benchmark"):
            run(["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent", "--shell",
                 "/usr/sbin/nologin", name])
        pw = pwd.getpwnam(name)
    return pw.pw_uid, pw.pw_gid
