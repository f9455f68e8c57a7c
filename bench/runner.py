"""Runs benchmark groups on file systems: fresh image + loop device + mkfs per run, cgroups, timed
phases with block traces and device counters, and the per-run bookkeeping."""
from __future__ import annotations

import json
import math
import os
import shutil
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from . import fs as fsmod
from .cgroup import BlkioCgroup, MemoryCgroup
from .device import LoopDevice, Tracer
from .results import ResultWriter, Row
from .util import CMDLOG, PROGRESS, CommandError, Result, fmt_secs, fmt_size, run

if TYPE_CHECKING:  # config builds Params from the benchmark modules, which import this one
    from .config import Params


class BenchFailure(RuntimeError):
    pass


@dataclass
class Env:
    """Everything shared by all runs."""

    params: Params
    workdir: Path
    results: Path
    writer: ResultWriter
    tracer: Tracer
    helpers: dict[str, Path]
    data: dict  # prepared datasets: "tree", "git", "mail_user"
    args: object
    resume: dict = field(default_factory=dict)  # (bench, fs, view, rep) -> resume state (bench/resume.py)
    params_dict: dict = field(default_factory=dict)  # the parameters as run.json has them (JSON types)


class RunContext:
    """What a benchmark module sees: the mounted FS and ways to time phases on it."""

    def __init__(self, env: Env, fs_name: str, rep: int, view: str, mounted: fsmod.Mounted,
                 loop: LoopDevice, cgroups: list, memcg: MemoryCgroup):
        self.env = env
        self.p = env.params
        self.fs = fs_name
        self.rep = rep
        self.view = view
        self.m = mounted
        self.loop = loop
        self.cgroups = cgroups
        self.memcg = memcg
        self.mnt = mounted.mnt
        self.helpers = env.helpers
        self.data = env.data
        self.logical_written = 0  # bytes the benchmark itself wrote (setup included), for write amp
        self.phase = ""
        self.group_label = ""
        self.recorded: set[str] = set()  # benchmarks that produced at least one number
        # per-point resume (bench/resume.py): the state this run continues from (None: from its start), and the
        # run's totals up to that state, to which this process's part is added
        self.resume_state: dict | None = None
        self.base: dict = {}
        self.st0: dict = {}

    def totals(self) -> dict:
        """The run's whole-run totals so far: what the interrupted part(s) had (`base`) plus this process's part.
        Device writes count from the loop device's attach (`st0`); call with the FS unmounted or at the end."""
        b, st = self.base, self.loop.stat()
        t = {"dev_write_bytes": b.get("dev_write_bytes", 0) + (st["write_sectors"] - self.st0["write_sectors"]) * 512,
             "logical_written": self.logical_written}
        mst = self.memcg.stats() if self.memcg is not None else {}
        if "max_usage_in_bytes" in mst or "cgroup_peak_bytes" in b:
            t["cgroup_peak_bytes"] = max(b.get("cgroup_peak_bytes", 0), mst.get("max_usage_in_bytes", 0))
        if "oom_kill" in mst or "oom_kills" in b:
            t["oom_kills"] = b.get("oom_kills", 0) + mst.get("oom_kill", 0)
        if self.is_amaranth:
            d = self.m.driver
            t["daemon_hwm_kb"] = max(b.get("daemon_hwm_kb", 0), d.hwm_kb)
            t["daemon_cpu_s"] = b.get("daemon_cpu_s", 0.0) + d.daemon_cpu_s
        return t

    @property
    def is_amaranth(self) -> bool:
        return isinstance(self.m.driver, fsmod.Amaranth)

    # -- recording -----------------------------------------------------------------------------
    def record(self, bench: str, phase: str, metric: str, value: float, unit: str = "", x: float | None = None):
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return
        self.env.writer.add(Row(bench, self.fs, phase, self.rep, metric, float(value), unit, "", x, self.view))
        self.recorded.add(bench)

    def save_json(self, name: str, obj) -> None:
        d = self.env.results / "raw" / self.fs
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{name}-r{self.rep}{'-' + self.view if self.view != 'disk' else ''}.json").write_text(
            json.dumps(obj, indent=1))

    # -- steps -----------------------------------------------------------------------------------
    def cold(self, after: str | None = None) -> None:
        """`after`: the phase the unmounted daemon served last (default: the current one)."""
        with PROGRESS.step("cold cache: sync, unmount, drop caches, mount"):
            if self.is_amaranth:
                self.m.driver.sample_daemon()
                self.save_amaranth_stat(f"before-cold-after-{(self.phase if after is None else after) or 'setup'}")
            self.m.cold()

    def save_amaranth_stat(self, what: str) -> None:
        """`amaranth stat --json` of the running daemon into raw/: its counters cover only this daemon's life,
        so it is saved before every unmount (a cold remount starts a new daemon), not only at the end."""
        try:
            self.save_json(f"amaranth-stat-{self.group_label}-{what}", self.m.driver.stat_json(self.mnt))
        except Exception as e:  # noqa: BLE001 - evidence only, never fails the run
            self.m.log.open("a").write(f"amaranth stat --json failed: {e}\n")

    def sync(self) -> float:
        return fsmod.syncfs(self.mnt)

    def untimed(self, cmd, what: str, logical_bytes: int = 0, in_cgroup: bool = False, **kw) -> Result:
        """Work that is not timed: setup runs outside the cgroup; in_cgroup=True for untimed workload
        steps (e.g. the space benchmark's writes), which must live within the memory limit."""
        with PROGRESS.step(what):
            r = run(cmd, timeout=self.p.timeout, cgroups=self.cgroups if in_cgroup else (), **kw)
        self.logical_written += logical_bytes
        return r

    def note_written(self, nbytes: int) -> None:
        self.logical_written += nbytes

    def warm(self, paths: Sequence[Path]) -> None:
        """Read benchmark *sources* on the host disk into the host page cache (outside the cgroup),
        so the timed phase measures the FS under test, not the work dir's disk."""
        for p in paths:
            with PROGRESS.step(f"read the source {p.name} into the host page cache (untimed)"):
                if p.is_dir():
                    run(f"tar -C {p.parent} -cf - {p.name} | cat > /dev/null", timeout=self.p.timeout)
                else:
                    run(f"cat {p} > /dev/null", timeout=self.p.timeout)

    def timed(self, bench: str, phase: str, cmd, *, kind: str = "read", cold: bool = False,
              warm: Sequence[Path] = (), logical_bytes: int = 0, label: str = "", record_seconds: bool = True,
              x: float | None = None, **kw) -> Result:
        """Run one timed phase in the cgroup(s), with the block trace on and device counters read.

        kind='write': after the command, syncfs is run (and timed separately), and the trace and the
        device counters cover it too, so 'seconds_incl_sync', the modeled disk time and the written
        bytes include the flush. Records: seconds, cpu_s, device bytes, write amplification (if
        logical_bytes), block requests, layout score, modeled HDD seconds.
        """
        prev, self.phase = self.phase, phase
        if cold:
            self.cold(prev)
        if warm:
            self.warm(warm)
        amaranth = self.is_amaranth
        tracer = self.env.tracer
        tracer.set_device(self.loop.kdev)  # a run may have a second FS (aging: the fresh copy)
        with PROGRESS.step(f"{bench}: {label or phase}") as info:
            dcpu0 = self.m.driver.daemon_cpu_now() if amaranth else 0.0
            st0 = self.loop.stat()
            tracer.start()
            try:
                res = run(cmd, cgroups=self.cgroups, timeout=self.p.timeout, **kw)
                sync_s = fsmod.syncfs(self.mnt, cgroups=self.cgroups) if kind == "write" else 0.0
            finally:
                tr = tracer.stop(self.p.hdd_seek_ms, self.p.hdd_mb_s)
            st1 = self.loop.stat()
            info["result"] = f"{res.elapsed:.3f}s, {tr.requests:,} requests"
        self.logical_written += logical_bytes
        rec = lambda metric, v, unit: self.record(bench, phase, metric, v, unit, x)  # noqa: E731
        if record_seconds:
            rec("seconds", res.elapsed, "s")
            if kind == "write":
                rec("seconds_incl_sync", res.elapsed + sync_s, "s")
        if kind == "write":
            rec("post_syncfs_s", sync_s, "s")
        rec("cpu_s", res.cpu_user + res.cpu_sys, "s")
        if amaranth:
            rec("daemon_cpu_s", max(0.0, self.m.driver.daemon_cpu_now() - dcpu0), "s")
        rd = (st1["read_sectors"] - st0["read_sectors"]) * 512
        wr = (st1["write_sectors"] - st0["write_sectors"]) * 512
        rec("dev_read_bytes", rd, "B")
        rec("dev_write_bytes", wr, "B")
        rec("dev_flushes", st1["flush_ios"] - st0["flush_ios"], "")
        if logical_bytes:
            rec("write_amp", wr / logical_bytes, "x")
        rec("requests", tr.requests, "")
        rec("read_requests", tr.read_requests, "")
        rec("write_requests", tr.write_requests, "")
        rec("request_bytes", tr.bytes, "B")
        rec("layout_score", tr.layout_score, "")
        rec("hdd_model_s", tr.hdd_model_s, "s")
        if tr.lost_events:
            rec("trace_lost_events", tr.lost_events, "")
        res.extra["sync_s"] = sync_s
        res.extra["trace"] = tr
        return res

    def helper_json(self, res: Result) -> dict:
        try:
            return json.loads(res.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError) as e:
            raise BenchFailure(f"helper output not JSON: {res.stdout[-300:]!r} {res.stderr[-300:]!r}") from e

    def statfs_used(self) -> int:
        st = os.statvfs(self.mnt)
        return (st.f_blocks - st.f_bfree) * st.f_frsize


class Group:
    """One benchmark module run on a fresh FS; `names` = the requested benchmark names it covers."""

    def __init__(self, module, names: list[str]):
        self.module = module
        self.names = names

    @property
    def label(self) -> str:
        return "+".join(self.names)


def run_group(env: Env, group: Group, fs_name: str, rep: int, view: str) -> None:
    from . import resume as resmod

    p = env.params
    w = env.writer
    PROGRESS.context = f"{fs_name}{'@' + str(env.args.hdd_throttle) + 'iops' if view == 'throttle' else ''} | " \
                       f"{group.label} r{rep}/{p.repeat}"
    CMDLOG.context = f"{fs_name} {view} {group.label} r{rep}"
    driver = fsmod.make_driver(fs_name, env.args)
    rundir = env.workdir / f"run-{os.getpid()}"
    mnt = rundir / "mnt"
    log = env.results / "logs" / f"{fs_name}-{group.label}-r{rep}-{view}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    # per-point resume (bench/resume.py): a module with RESUME = "image" keeps its aged image outside the run dir
    # (copied after every point); "points" only keeps the number of the last completed point
    resumable = getattr(group.module, "RESUME", None)
    state = env.resume.get((group.label, fs_name, view, rep)) if resumable else None
    keep_image = resumable == "image" and bool(p.aging_snapshot)
    mounted = loop = memcg = blkcg = None
    ctx = None
    error = ""
    completed = False
    try:
        driver.check()
        group.module.check(env, group.names)
        rundir.mkdir(parents=True, exist_ok=True)
        memcg = MemoryCgroup(p.mem_limit, label=fs_name)
        if keep_image:
            image = resmod.image_dir(env.workdir, env.results, group.label, fs_name, view, rep) / \
                f"{resmod.LIVE_PREFIX}{os.getpid()}.img"
            image.parent.mkdir(parents=True, exist_ok=True)
        else:
            image = rundir / f"{fs_name}.img"
        if state and state.get("image"):
            PROGRESS.log(f"resume: {resmod.describe(state)}")
            with PROGRESS.step(f"copy the kept image {state['image']} to {image.name}, loop device (direct I/O), "
                               f"mount"):
                resmod.restore(state, env.results, image)
                loop = LoopDevice(image, p.image_size, existing=True, keep=True)
        elif state:
            PROGRESS.log(f"resume: {resmod.describe(state)}")
        elif keep_image:
            resmod.remove_stale_images(image.parent, set())
        with PROGRESS.step(f"{'' if loop else 'fresh ' + fmt_size(p.image_size) + ' image, '}loop device (direct I/O), "
                           f"{'' if loop else 'mkfs, '}mount"):
            if loop is None:
                loop = LoopDevice(image, p.image_size, keep=keep_image)
            cgroups = [memcg]
            if view == "throttle":
                blkcg = BlkioCgroup(loop.devno, env.args.hdd_throttle, label=fs_name)
                cgroups.append(blkcg)
            env.tracer.set_device(loop.kdev)
            mounted = fsmod.Mounted(driver, loop, mnt, cgroups, log)
            if state and state.get("image"):
                mnt.mkdir(parents=True, exist_ok=True)
                mounted.mount()
            else:
                mounted.mkfs_and_mount()
        if isinstance(driver, fsmod.Amaranth):
            driver.reset_stats()
        st0 = loop.stat()
        ctx = RunContext(env, fs_name, rep, view, mounted, loop, cgroups, memcg)
        ctx.group_label = group.label
        ctx.st0 = st0
        if state:
            ctx.resume_state = state
            ctx.base = dict(state.get("totals", {}))
            ctx.logical_written = ctx.base.get("logical_written", 0)
            if not state.get("image"):
                ctx.base.pop("dev_write_bytes", None)  # points on fresh file systems: the run's own FS counts
        group.module.run(ctx, group.names)
        if isinstance(driver, fsmod.Amaranth):
            ctx.save_amaranth_stat("end")
        with PROGRESS.step("unmount"):
            mounted.close()
        tot = ctx.totals()
        for name in group.names:
            if name not in ctx.recorded:
                continue
            wr = tot["dev_write_bytes"]
            ctx.record(name, "run", "dev_write_bytes_total", wr, "B")
            if ctx.logical_written:
                ctx.record(name, "run", "logical_write_bytes_total", ctx.logical_written, "B")
                ctx.record(name, "run", "write_amp_total", wr / ctx.logical_written, "x")
        completed = True
    except fsmod.FsUnavailable as e:
        error = str(e)
    except Exception as e:  # noqa: BLE001 - any failure of one run is recorded, the harness goes on
        error = f"{type(e).__name__}: {e}"
        log.open("a").write(traceback.format_exc())
    finally:
        # whatever happened: unmount, detach, remove cgroups (each step guarded)
        if mounted is not None:
            try:
                if isinstance(driver, fsmod.Amaranth) and mounted.mounted:
                    driver.sample_daemon()
                mounted.close()
            except Exception as e:  # noqa: BLE001
                error = error or f"unmount failed: {e}"
        if memcg is not None and error:
            st = memcg.stats()
            if st.get("oom_kill"):
                error += (f" [the memory cgroup ({fmt_size(p.mem_limit)} limit) OOM-killed {st['oom_kill']} "
                          f"process(es) during this run; peak usage {fmt_size(st.get('max_usage_in_bytes', 0))}]")
        if memcg is not None and ctx is not None and any(name in ctx.recorded for name in group.names):
            tot = ctx.totals()
            for name in group.names:
                if name not in ctx.recorded:
                    continue
                if "cgroup_peak_bytes" in tot:
                    ctx.record(name, "run", "cgroup_peak_bytes", tot["cgroup_peak_bytes"], "B")
                if "oom_kills" in tot:
                    ctx.record(name, "run", "oom_kills", tot["oom_kills"], "")
                if isinstance(driver, fsmod.Amaranth):
                    if tot.get("daemon_hwm_kb"):
                        ctx.record(name, "run", "daemon_vmhwm_bytes", tot["daemon_hwm_kb"] * 1024, "B")
                    ctx.record(name, "run", "daemon_cpu_s_total", tot["daemon_cpu_s"], "s")
        for thing in (loop, blkcg, memcg):
            if thing is None:
                continue
            try:
                thing.detach() if isinstance(thing, LoopDevice) else thing.remove()
            except Exception as e:  # noqa: BLE001
                error = error or f"cleanup failed: {e}"
        shutil.rmtree(rundir, ignore_errors=True)
        if resumable:
            if completed and not error:
                resmod.forget(env.results, env.workdir, group.label, fs_name, view, rep)
            elif keep_image:
                # interrupted or failed: keep what the last state names (for --resume), drop the rest
                st = resmod.load(env.results, group.label, fs_name, view, rep)
                idir = resmod.image_dir(env.workdir, env.results, group.label, fs_name, view, rep)
                resmod.remove_stale_images(idir, {Path(st["image"])} if st and st.get("image") else set())
                if st:
                    PROGRESS.log(f"kept for --resume: {resmod.describe(st)}")
        if error:
            phase = ctx.phase if ctx else "setup"
            first = error.strip().splitlines()[0] if error.strip() else error
            PROGRESS.log(f"FAILED in {phase}: {first[:300]}")
            for name in group.names:
                w.add(Row(name, fs_name, phase or "setup", rep, "error", None, "", error.strip()[:2000], None, view))
        PROGRESS.context = ""
        CMDLOG.context = ""
