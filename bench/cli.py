"""Command line: `python3 -m bench [--bench a,b] [--fs amaranth,ext4,xfs,btrfs] [--quick] [--check] ...`."""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from . import benchmarks, cleanup, datasets
from . import resume as resume_points
from .config import describe as describe_params, make_params, set_param
from .device import Tracer, leftover_loops, leftover_trace_instances, measure_fio
from .results import ResultWriter
from .runner import Env, Group, run_group
from .util import CMDLOG, PROGRESS, fmt_secs, parse_size, run

REPO = Path(__file__).resolve().parent.parent
ALL_FS = ["amaranth", "ext4", "xfs", "btrfs"]
# Also accepted by --fs: a second Amaranth build (`--amaranth-base-bin`), run beside the first for a
# before/after comparison in one run.
BASE_FS = "amaranth-base"
KNOWN_FS = ALL_FS + [BASE_FS]


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="python3 -m bench",
        description="Side-by-side benchmarks of Amaranth, ext4, XFS and Btrfs on loop devices (run as root).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Benchmarks: " + ", ".join(benchmarks.ORDER) + "\nAliases: " +
               ", ".join(f"{k}={v}" for k, v in benchmarks.ALIASES.items() if k != "all") +
               "\nEvery parameter (see --list) can be changed with --set KEY=VALUE.")
    ap.add_argument("--bench", default="all", help="comma-separated benchmarks (default: all)")
    ap.add_argument("--fs", default=",".join(ALL_FS), help="comma-separated file systems (default: %(default)s)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, 1 repetition: a few minutes in total")
    ap.add_argument("--check", action="store_true",
                    help="after the run, verify the report is complete and well formed; exit 1 if not")
    ap.add_argument("--repeat", type=int, help="repetitions of every measurement (default 3, quick 1)")
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp/amaranth-bench"),
                    help="images, caches and helpers go here (default: %(default)s)")
    ap.add_argument("--out", type=Path, help="results directory (default: bench/results/<timestamp>)")
    ap.add_argument("--mem-limit", help="cgroup memory limit for workload + daemon (default 2G, quick 256M)")
    ap.add_argument("--image-size", help="image file size per FS (default 16G, quick 3G)")
    ap.add_argument("--amaranth-bin", type=Path, default=REPO / "target/release/amaranth",
                    help="amaranth binary (default: %(default)s)")
    ap.add_argument("--amaranth-base-bin", type=Path, default=None,
                    help=f"a second Amaranth binary (e.g. main's), run as file system {BASE_FS!r} beside the first")
    ap.add_argument("--amaranth-commit", metavar="COMMIT",
                    help="git commit the --amaranth-bin was built from, for the report (default: the repository's "
                         "HEAD if the binary is its target/release/amaranth, else unknown)")
    ap.add_argument("--amaranth-cache-size", help="Amaranth --cache-size (default: half the memory limit)")
    ap.add_argument("--hdd-throttle", type=int, metavar="IOPS",
                    help="also run everything under a cgroup v1 blkio throttle of IOPS on the loop device")
    ap.add_argument("--hdd-seek-ms", type=float, help="modeled hard disk: seek time per discontiguous request (8)")
    ap.add_argument("--hdd-mb-s", type=float, help="modeled hard disk: transfer rate in MB/s (150)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="set any parameter")
    ap.add_argument("--idle-poll-us", type=float, metavar="US",
                    help="machine setting for the whole run, every file system alike: let an idle vCPU poll this "
                         "long before it halts (the haltpoll cpuidle driver's guest_halt_poll_ns); the previous "
                         "value is restored at the end. Default: leave the machine as it is")
    ap.add_argument("--no-fio", action="store_true", help="skip the fio device-limit measurement")
    ap.add_argument("--list", action="store_true", help="list benchmarks and parameters, then exit")
    ap.add_argument("--cleanup", action="store_true",
                    help="remove leftovers of an interrupted/crashed run (mounts and loop devices in the work dir, "
                         "amaranth-bench cgroups, tracing instances), then exit")
    ap.add_argument("--resume", type=Path, metavar="RESULTS_DIR",
                    help="continue an interrupted run in RESULTS_DIR with its original options: runs (benchmark x "
                         "FS x view x repetition) that completed are kept, an aging run continues after its last "
                         "completed point (on a copy of its aged image), the others are run again")
    ap.add_argument("--report-only", type=Path, metavar="RESULTS_DIR",
                    help="regenerate report.md and figures from an existing results directory")
    return ap.parse_args(argv)


def build_params(args):
    p = make_params(args.quick)
    for key, opt in [("repeat", args.repeat), ("mem_limit", args.mem_limit), ("image_size", args.image_size),
                     ("amaranth_cache_size", args.amaranth_cache_size), ("hdd_seek_ms", args.hdd_seek_ms),
                     ("hdd_mb_s", args.hdd_mb_s)]:
        if opt is not None:
            p = set_param(p, key, str(opt))
    for kv in args.set:
        if "=" not in kv:
            raise SystemExit(f"--set expects KEY=VALUE, got {kv!r}")
        k, v = kv.split("=", 1)
        p = set_param(p, k.strip(), v.strip())
    if p.repeat < 1:
        raise SystemExit("--repeat must be >= 1")
    return p


def do_cleanup(workdir: Path) -> int:
    from .cgroup import leftovers
    from .fs import is_mounted

    n = 0
    wd = workdir.resolve()
    for line in open("/proc/self/mountinfo").read().splitlines():
        mp = line.split()[4]
        if mp.startswith(str(wd) + "/") and not cleanup.owned_by_live_run(mp):
            print(f"unmounting {mp}")
            fstype = line.partition(" - ")[2].split()[0]
            if fstype.startswith("fuse"):
                run(["fusermount3", "-u", "-z", mp], check=False)
            if is_mounted(Path(mp)):
                run(["umount", mp], check=False)
            if is_mounted(Path(mp)):
                run(["umount", "-l", mp], check=False)
            n += 1
    for dev in leftover_loops(wd, skip=cleanup.owned_by_live_run):
        print(f"detaching {dev}")
        run(["losetup", "-d", dev], check=False)
        n += 1
    # the run directories of dead harness runs (images of a fresh copy, mount points), once nothing is mounted
    # in them and no loop device uses a file in them
    mounts = [line.split()[4] for line in open("/proc/self/mountinfo").read().splitlines()]
    for d in sorted(wd.glob("run-*")):
        if not d.is_dir() or cleanup.owned_by_live_run(d.name):
            continue
        if any(m == str(d) or m.startswith(str(d) + "/") for m in mounts) or leftover_loops(d):
            print(f"keeping {d}: still mounted or attached")
            continue
        print(f"removing {d}")
        shutil.rmtree(d, ignore_errors=True)
        n += 1
    stale = [c for c in leftovers() if not cleanup.owned_by_live_run(c.name)]
    for cg in sorted(stale, key=lambda p: -len(p.parts)):
        print(f"removing cgroup {cg} (members: {open(cg / 'cgroup.procs').read().split()})")
        try:
            cg.rmdir()
        except OSError as e:
            print(f"  could not remove: {e}")
        n += 1
    for inst in (i for i in leftover_trace_instances() if not cleanup.owned_by_live_run(i.name)):
        print(f"removing tracing instance {inst}")
        try:
            (inst / "tracing_on").write_text("0")
            inst.rmdir()
        except OSError as e:
            print(f"  could not remove: {e}")
        n += 1
    print(f"{n} leftover(s) handled")
    return 0


def completed_runs(csv_path: Path) -> set[tuple]:
    """(benchmark, fs, view, repetition) of the runs in a results CSV that finished without a failure (a run
    records its whole-run rows, phase 'run', only after its last phase)."""
    from .results import load

    if not csv_path.exists():
        return set()
    rows = load(csv_path)
    key = lambda r: (r.benchmark, r.fs, r.view, r.repetition)  # noqa: E731
    failed = {key(r) for r in rows if r.error}
    return {key(r) for r in rows if r.phase == "run" and r.metric == "dev_write_bytes_total"} - failed


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    resume = args.resume.resolve() if args.resume else None
    before: dict = {}
    if resume:
        # the original options, so the resumed part measures exactly what the first part did
        before = json.loads((resume / "run.json").read_text())
        argv = shlex.split(before["invocation"])[3:]  # drop "python3 -m bench"
        args = parse_args(argv)
        args.out, args.resume = resume, resume
    if args.list:
        print("Benchmarks:")
        for n in benchmarks.ORDER:
            print(f"  {n:12s} {benchmarks.INFO[n].title}")
        print("\nParameters (full defaults; --quick changes some; --set KEY=VALUE):")
        for k, v in describe_params(make_params(args.quick)):
            print(f"  {k:24s} {v}")
        return 0
    if args.report_only:
        from .report import write_report
        from .check import check_results

        meta = json.loads((args.report_only / "run.json").read_text())
        write_report(args.report_only, meta)
        if args.check:
            return 1 if check_results(args.report_only, meta) else 0
        return 0
    if os.geteuid() != 0:
        print("the benchmark harness needs root (loop devices, mounts, cgroups, drop_caches, tracefs)",
              file=sys.stderr)
        return 2
    if args.cleanup:
        return do_cleanup(args.workdir)

    params = build_params(args)
    names = benchmarks.expand(args.bench)
    fs_list = [f.strip() for f in args.fs.split(",") if f.strip()]
    for f in fs_list:
        if f not in KNOWN_FS:
            print(f"unknown file system {f!r}; known: {', '.join(KNOWN_FS)}", file=sys.stderr)
            return 2
        if f == BASE_FS and not args.amaranth_base_bin:
            print(f"--fs {BASE_FS} needs --amaranth-base-bin", file=sys.stderr)
            return 2
    params = replace(params, amaranth_cache_size=params.cache_size())  # the value used, in run.json too
    args.amaranth_cache_size = params.amaranth_cache_size
    if params.amaranth_compression not in ("", "none", "lz4", "zstd"):
        print(f"amaranth_compression={params.amaranth_compression!r}: choose none, lz4 or zstd", file=sys.stderr)
        return 2
    args.amaranth_compression = params.amaranth_compression
    args.amaranth_mount_options = params.amaranth_mount_options
    args.workdir = args.workdir.resolve()
    out = (args.out or REPO / "bench" / "results" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    args.workdir.mkdir(parents=True, exist_ok=True)
    views = ["disk"] + (["throttle"] if args.hdd_throttle else [])

    cleanup.install()
    CMDLOG.open(out / "commands.log")
    if args.idle_poll_us is not None:
        from . import machine as _machine

        try:
            before_ns = _machine.set_halt_poll(round(args.idle_poll_us * 1000))
        except (OSError, RuntimeError, ValueError) as e:
            print(f"--idle-poll-us: {e}", file=sys.stderr)
            return 2
        cleanup.register(f"restore guest_halt_poll_ns {before_ns}", lambda: _machine.set_halt_poll(before_ns))
        PROGRESS.log(f"idle vCPUs poll {args.idle_poll_us:g} us before they halt (was {before_ns / 1000:g} us; "
                     "restored at the end)")
    invocation = "python3 -m bench " + shlex.join(sys.argv[1:] if argv is None else argv)
    from . import machine

    meta = {
        "invocation": invocation,
        "cwd": os.getcwd(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "benchmarks": names,
        "fs": fs_list,
        "views": views,
        "hdd_throttle": args.hdd_throttle,
        "quick": args.quick,
        "params": asdict(params),
        "params_text": describe_params(params),
        "workdir": str(args.workdir),
        "amaranth_bin": str(args.amaranth_bin),
        "machine": machine.describe(args.workdir, REPO),
        "amaranth_build": machine.amaranth_build(Path(args.amaranth_bin), REPO, args.amaranth_commit)
        if "amaranth" in fs_list else "",
        "status": "running",
    }
    meta_path = out / "run.json"

    def save_meta():
        meta_path.write_text(json.dumps(meta, indent=1, default=str))

    save_meta()
    PROGRESS.log(f"results -> {out}")
    PROGRESS.log(f"benchmarks: {', '.join(names)}; file systems: {', '.join(fs_list)}; repeat {params.repeat}; "
                 f"memory limit {params.mem_limit >> 20} MiB; image {params.image_size >> 30} GiB")
    done: set = set()
    if resume:
        # a killed run leaves mounts, loop devices and cgroups: remove those of harness runs no longer alive (as
        # --cleanup does) before their images are used again
        do_cleanup(args.workdir)
        done = completed_runs(out / "results.csv")
        meta["started"] = before.get("started")
        meta["resumed"] = before.get("resumed", []) + [time.strftime("%Y-%m-%d %H:%M:%S %Z")]
    # per-point resume of the aging runs (bench/resume.py): the state after each one's last completed point
    params_dict = json.loads(json.dumps(asdict(params), default=str))
    states = resume_points.prepare(out, args.workdir, params_dict, args, done, bool(resume))
    if resume:
        PROGRESS.log(f"resuming {out}: {len(done)} completed run(s) kept, {len(states)} aging run(s) continue from "
                     f"their last completed point, the rest is run again")
        for st in states.values():
            PROGRESS.log(f"    {resume_points.describe(st)}")
    key = lambda r: (r.benchmark, r.fs, r.view, r.repetition)  # noqa: E731
    writer = ResultWriter(out / "results.csv", keep=lambda r: key(r) in done or resume_points.keeps_row(
        states.get(key(r)), r))
    rc = 0
    tracer = None
    try:
        helpers = datasets.build_helpers(args.workdir)
        if not args.no_fio:
            lim = measure_fio(args.workdir, params.fio_size, params.fio_runtime)
            meta["fio"] = {k: v for k, v in asdict(lim).items() if k != "raw"}
            (out / "raw").mkdir(exist_ok=True)
            (out / "raw" / "fio.json").write_text(json.dumps(lim.raw, indent=1))
            save_meta()
        data: dict = {}
        needs = set().union(*(m.NEEDS for m, _ in benchmarks.groups(names)))
        cache = args.workdir / "cache"
        cache.mkdir(exist_ok=True)
        if "tree" in needs or "git" in needs:
            try:
                data["tree"] = datasets.linux_tree(cache, params.tree_subset, params.tree_exclude)
                meta["tree"] = data["tree"].description
            except Exception as e:  # noqa: BLE001 - the benchmarks that need it fail with this error
                data["tree"] = e
                PROGRESS.log(f"Linux tree unavailable: {e}")
        if "tree_tmpfs" in needs and not isinstance(data.get("tree"), BaseException):
            try:
                data["tree_tmpfs"] = datasets.tmpfs_copy(args.workdir, data["tree"])
            except Exception as e:  # noqa: BLE001 - rsync then reads the work dir copy, warmed each time
                data["tree_tmpfs"] = e
                PROGRESS.log(f"tmpfs copy of the tree failed ({e}); rsync will read the work dir copy")
        if "git" in needs:
            try:
                if isinstance(data["tree"], BaseException):
                    raise data["tree"]
                data["git"] = datasets.git_repo(cache, data["tree"], params.git_stages)
                meta["git"] = data["git"].description
            except Exception as e:  # noqa: BLE001
                data["git"] = e
                PROGRESS.log(f"git repository unavailable: {e}")
        if "git_history" in needs:
            try:
                from .gitsource import build_history

                data["git_history"] = build_history(cache, params.aging_git_package, params.aging_git_from,
                                                    params.aging_git_pulls + 1)
                meta["git_history"] = data["git_history"].description
            except Exception as e:  # noqa: BLE001 - aging-git fails with this error
                data["git_history"] = e
                PROGRESS.log(f"git history unavailable: {e}")
        if "mail_user" in needs:
            try:
                data["mail_user"] = datasets.ensure_user("amabench")
            except Exception as e:  # noqa: BLE001
                data["mail_user"] = e
        save_meta()
        try:
            tracer = Tracer(params.trace_buffer_kb)
        except Exception as e:  # noqa: BLE001
            meta["trace_error"] = str(e)
            PROGRESS.log(f"block tracing unavailable: {e}")
            raise
        env = Env(params, args.workdir, out, writer, tracer, helpers, data, args, states, params_dict)
        groups = benchmarks.groups(names)
        total = len(groups) * params.repeat * len(views) * len(fs_list)
        k = 0
        for module, gnames in groups:
            for rep in range(1, params.repeat + 1):
                for view in views:
                    for fs_name in fs_list:
                        k += 1
                        PROGRESS.log(f"=== run {k}/{total}: {'+'.join(gnames)} on {fs_name}"
                                     f"{' (blkio throttle)' if view == 'throttle' else ''}, repetition {rep}")
                        if all((n, fs_name, view, rep) in done for n in gnames):
                            PROGRESS.log("    completed in the interrupted run: kept")
                            continue
                        run_group(env, Group(module, gnames), fs_name, rep, view)
        meta["status"] = "complete"
    except cleanup.Interrupted as e:
        meta["status"] = f"interrupted ({e})"
        PROGRESS.log(f"interrupted: {e}; cleaning up")
        rc = 130
    except Exception as e:  # noqa: BLE001
        import traceback

        meta["status"] = f"failed: {type(e).__name__}: {e}"
        PROGRESS.log(f"harness failed: {e}")
        traceback.print_exc()
        rc = 1
    finally:
        if tracer is not None:
            tracer.close()
        cleanup.run_all()
        meta["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        meta["elapsed"] = fmt_secs(PROGRESS.elapsed())
        save_meta()
    from .report import write_report

    try:
        with PROGRESS.step("write report.md and figures"):
            write_report(out, meta)
    except Exception as e:  # noqa: BLE001
        import traceback

        traceback.print_exc()
        PROGRESS.log(f"report failed: {e}")
        rc = rc or 1
    PROGRESS.log(f"report: {out / 'report.md'}")
    if args.check:
        from .check import check_results

        problems = check_results(out, meta)
        if problems:
            rc = rc or 1
    return rc
