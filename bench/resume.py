"""Per-point resume of the aging experiments (`python3 -m bench --resume DIR`).

An aging run is a series of points (mail cycles, git pulls, micro-benchmark rounds). After each completed point
(its rows already in results.csv) a small state file `DIR/resume/<bench>-<fs>-<view>-r<rep>.json` is written
atomically (temp file + fsync + rename). For aging-git and aging-mail, whose points share one aged file system,
the state names a copy of the aged image taken at that point with the file system unmounted, so that a resumed
run continues on exactly the file system the interrupted one had after its last completed point; a point that
was cut short left the live image in a later state and is redone from that copy.

The images live outside the per-run directory that cleanup deletes: `<workdir>/aging-resume/<results-dir name>-
<hash>/<bench>-<fs>-<view>-r<rep>/`, holding `aged-<x>.img` (the copy after point x) and `aged-live-<pid>.img`
(the image the harness with that pid mounts; the pid keeps `--cleanup` of other harness runs away from it).

Snapshot protocol after point x (FS unmounted, loop device flushed, image fsynced):
  1. state {x, image = the live image, kind "live"}: the unmounted live image *is* the state after x;
  2. the copy of the previous point is deleted (so at most two images besides the fresh copy's are on disk);
  3. the live image is copied (sparse, reflink where the work dir's FS has it) to aged-<x>.img.tmp, fsynced,
     renamed to aged-<x>.img;
  4. state {x, image = aged-<x>.img, kind "snapshot"};
  5. the live image is mounted again and the next point starts.
A kill anywhere leaves a state naming an image in exactly the state after the last completed point: before 1 the
previous state (and its copy, deleted only in 2) holds; between 1 and 4 the live image is unmounted and untouched.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

from .util import PROGRESS, fmt_secs, fmt_size, run

VERSION = 1
LIVE_PREFIX = "aged-live-"  # + pid: cleanup.owned_by_live_run knows it


def key_name(bench: str, fs: str, view: str, rep: int) -> str:
    return f"{bench}-{fs}-{view}-r{rep}"


def state_path(results: Path, bench: str, fs: str, view: str, rep: int) -> Path:
    return results / "resume" / f"{key_name(bench, fs, view, rep)}.json"


def images_root(workdir: Path, results: Path) -> Path:
    """Where the aged images of one results directory's runs are kept (stable across resumes)."""
    h = hashlib.sha1(str(results.resolve()).encode()).hexdigest()[:8]
    return workdir / "aging-resume" / f"{results.resolve().name}-{h}"


def image_dir(workdir: Path, results: Path, bench: str, fs: str, view: str, rep: int) -> Path:
    return images_root(workdir, results) / key_name(bench, fs, view, rep)


def write_json_atomic(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(p: Path) -> None:
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def copy_image(src: Path, dst: Path) -> float:
    """Sparse copy of an image file (`cp --sparse=auto --reflink=auto`: holes stay holes, only the allocated
    extents are read; a reflink where the work dir's FS has them), fsynced, put in place atomically. Seconds."""
    t0 = time.monotonic()
    tmp = dst.with_name(dst.name + ".tmp")
    tmp.unlink(missing_ok=True)
    run(["cp", "--sparse=auto", "--reflink=auto", str(src), str(tmp)], timeout=3600, log=False)
    fsync_file(tmp)
    os.replace(tmp, dst)
    fsync_dir(dst.parent)
    return time.monotonic() - t0


def binary_id(path: Path) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return "unreadable"


def fs_identity(fs: str, args) -> dict:
    """What must not change between the interrupted and the resumed part: the Amaranth binary (its bytes)."""
    if fs in ("amaranth", "amaranth-base"):
        b = Path(args.amaranth_bin if fs == "amaranth" else args.amaranth_base_bin).resolve()
        return {"binary": str(b), "binary_sha256": binary_id(b)}
    return {}


def keeps_row(state: dict | None, row) -> bool:
    """A row of an interrupted run is kept if it belongs to a point up to the state's (the half-done point's
    rows, the run's failure row and its whole-run rows are dropped)."""
    if not state:
        return False
    return row.x is not None and not row.error and row.phase != "run" and row.x <= state["x"] + 1e-9


def describe(state: dict) -> str:
    """'aging-mail on amaranth: points 0–7 kept (8 of 21), continuing at cycle 8 from /…/aged-7.img'."""
    i, x0, x = state["point"], state["x_first"], state["x"]
    pts = f"point {x:g}" if i == 0 else f"points {x0:g}–{x:g}"
    src = f" from {state['image']}" if state.get("image") else ""
    if state["point"] + 1 >= state["points_total"]:
        return (f"{state['benchmark']} on {state['fs']}: all {state['points_total']} points kept; the run's totals are "
                f"recorded{src}")
    return (f"{state['benchmark']} on {state['fs']}: {pts} kept ({i + 1} of {state['points_total']}), continuing at "
            f"{state['next']}{src}")


def load(results: Path, bench: str, fs: str, view: str, rep: int) -> dict | None:
    try:
        return json.loads(state_path(results, bench, fs, view, rep).read_text())
    except (OSError, ValueError):
        return None


def forget(results: Path, workdir: Path, bench: str, fs: str, view: str, rep: int) -> None:
    """Remove a run's state file and its images."""
    sp = state_path(results, bench, fs, view, rep)
    sp.unlink(missing_ok=True)
    idir = image_dir(workdir, results, bench, fs, view, rep)
    shutil.rmtree(idir, ignore_errors=True)
    for d in (sp.parent, idir.parent, idir.parent.parent):  # and the directories left empty
        try:
            d.rmdir()
        except OSError:
            pass


def prepare(results: Path, workdir: Path, params: dict, args, done: set, resuming: bool) -> dict:
    """The resume states of `results`, keyed (bench, fs, view, rep): on a new run (not resuming) every old state
    and image is removed; on a resume the states that cannot be continued (another Amaranth binary, other
    parameters, a missing image, a run that completed) are removed with a message, so their runs start over."""
    out: dict = {}
    d = results / "resume"
    for p in sorted(d.glob("*.json")) if d.exists() else []:
        try:
            st = json.loads(p.read_text())
            key = (st["benchmark"], st["fs"], st["view"], int(st["rep"]))
        except (OSError, ValueError, KeyError) as e:
            PROGRESS.log(f"resume: unreadable state {p} ({e}): removed")
            p.unlink(missing_ok=True)
            continue
        why = ""
        if not resuming:
            why = "a new run in this results directory"
        elif key in done:
            why = "the run completed"
        elif st.get("version") != VERSION:
            why = f"state version {st.get('version')} (this harness writes {VERSION})"
        elif (st.get("identity") or {}).get("binary_sha256") != fs_identity(st["fs"], args).get("binary_sha256"):
            was, now = st.get("identity") or {}, fs_identity(st["fs"], args)
            why = (f"the {st['fs']} binary changed (was {was.get('binary')} sha256 {was.get('binary_sha256', '')[:16]}, "
                   f"now {now.get('binary')} sha256 {now.get('binary_sha256', '')[:16]}): the run starts over from "
                   f"its first point")
        elif st.get("image") and not Path(st["image"]).exists():
            why = f"its image {st['image']} is gone: the run starts over from its first point"
        else:
            old = st.get("params", {})
            diff = sorted(k for k in set(old) & set(params) if old[k] != params[k])
            if diff:
                why = f"parameters changed ({', '.join(diff)}): the run starts over from its first point"
        if why:
            if resuming and key not in done:
                PROGRESS.log(f"resume: {key_name(*key)}: not continued: {why}")
            forget(results, workdir, *key)
            continue
        out[key] = st
    if not resuming and images_root(workdir, results).exists():
        PROGRESS.log(f"resume: removing the aged images of an earlier run in {results}: "
                     f"{images_root(workdir, results)}")
        shutil.rmtree(images_root(workdir, results), ignore_errors=True)
    return out


def remove_stale_images(idir: Path, keep: set[Path]) -> None:
    """Files in a run's image dir that no state names: live images of dead harness runs, older copies,
    half-written copies."""
    from .cleanup import owned_by_live_run

    if not idir.exists():
        return
    for f in idir.iterdir():
        if f in keep or (f.name.startswith(LIVE_PREFIX) and owned_by_live_run(f.name)):
            continue
        f.unlink(missing_ok=True)


def restore(state: dict, results: Path, live: Path) -> float:
    """Make `live` a copy of the state's image (the aged FS after its last completed point). A state of kind
    'live' (killed while copying) first gets its copy made and recorded, as the snapshot would have. Seconds."""
    t0 = time.monotonic()
    src = Path(state["image"])
    if state["kind"] == "live":
        snap = src.with_name(f"aged-{state['x']:g}.img")
        state["copy_s"] = copy_image(src, snap)
        state.update(image=str(snap), kind="snapshot")
        write_json_atomic(state_path(results, state["benchmark"], state["fs"], state["view"], state["rep"]), state)
        src = snap
    remove_stale_images(live.parent, {src})
    copy_image(src, live)
    return time.monotonic() - t0


class Points:
    """The points of one aging run (x values and what each one's work is called): which of them a resumed run
    skips, and the state written after each one. `image`: the points share the run's aged FS (aging-git,
    aging-mail), whose image is copied after each one; otherwise each point is on a fresh FS and only the point
    number is kept."""

    def __init__(self, ctx, bench: str, xs: list[float], labels: list[str], image: bool):
        assert len(xs) == len(labels) and xs == sorted(xs)
        self.ctx, self.bench, self.xs, self.labels = ctx, bench, list(xs), labels
        self.image = image
        self.enabled = bool(ctx.p.aging_snapshot) or not image
        st = ctx.resume_state
        if st is not None and (st["benchmark"] != bench or st["points_total"] != len(xs) or
                               abs(st["x"] - xs[st["point"]]) > 1e-9):
            raise RuntimeError(f"the resume state {st} does not fit this run's points {xs}")
        self.start = st["point"] + 1 if st else 0
        if self.start:
            ctx.recorded.add(bench)  # its rows are in the CSV: the run's totals are recorded at the end

    def done(self, i: int, info: dict | None = None) -> None:
        """Point i is complete and its rows are in the CSV: save the state (and for image runs the image)."""
        ctx = self.ctx
        if not self.enabled:
            return
        x = self.xs[i]
        st = {"version": VERSION, "benchmark": self.bench, "fs": ctx.fs, "view": ctx.view, "rep": ctx.rep,
              "point": i, "x": x, "x_first": self.xs[0], "points_total": len(self.xs),
              "next": self.labels[i + 1] if i + 1 < len(self.xs) else "",
              "identity": fs_identity(ctx.fs, ctx.env.args), "params": ctx.env.params_dict,
              "rand_seed": ctx.p.rand_seed, "written": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
              "info": info or {}, "image": None, "kind": "none"}
        path = state_path(ctx.env.results, self.bench, ctx.fs, ctx.view, ctx.rep)
        if not self.image:
            st["totals"] = ctx.totals()
            write_json_atomic(path, st)
            return
        with PROGRESS.step(f"keep the aged image of point {x:g} for --resume: unmount, copy, mount"):
            if ctx.is_amaranth:
                ctx.m.driver.sample_daemon()
                ctx.save_amaranth_stat(f"before-snapshot-{x:g}")
            ctx.m.umount()
            run(["blockdev", "--flushbufs", ctx.loop.dev], log=False)
            live = ctx.loop.image
            fsync_file(live)
            st.update(image=str(live), kind="live", totals=ctx.totals())
            write_json_atomic(path, st)
            snap = live.with_name(f"aged-{x:g}.img")
            remove_stale_images(live.parent, {live})
            st["copy_s"] = copy_image(live, snap)
            st.update(image=str(snap), kind="snapshot", image_bytes=os.stat(snap).st_blocks * 512)
            write_json_atomic(path, st)
            ctx.m.mount()
        PROGRESS.log(f"state after point {x:g} kept: {snap} ({fmt_size(st['image_bytes'])} allocated, copied in "
                     f"{fmt_secs(st['copy_s'])})")
