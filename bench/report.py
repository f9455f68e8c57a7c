"""report.md with tables and PNG figures (matplotlib, Agg), from results.csv and run.json."""
from __future__ import annotations

import math
import re
from collections import defaultdict
from pathlib import Path

from . import benchmarks, report_aging
from .results import Row, load
from .stats import fmt_mean_ci, fmt_num, mean_ci, ratio
from .util import fmt_size

FS_COLORS = {"amaranth": "#c0392b", "amaranth-base": "#e59866", "ext4": "#2c3e50", "xfs": "#2980b9",
             "btrfs": "#27ae60"}
BASELINE = "ext4"


class Data:
    """Index over the CSV rows."""

    def __init__(self, rows: list[Row]):
        self.rows = rows
        self.vals: dict[tuple, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
        self.errors: dict[tuple, list[Row]] = defaultdict(list)
        self.xs: dict[tuple, set] = defaultdict(set)
        for r in rows:
            if r.error:
                self.errors[(r.benchmark, r.fs, r.view)].append(r)
                continue
            if r.value is None:
                continue
            key = (r.benchmark, r.fs, r.view, r.phase, r.metric, r.x)
            self.vals[key][r.repetition].append(r.value)
            if r.x is not None:
                self.xs[(r.benchmark, r.phase, r.metric)].add(r.x)

    def per_rep(self, bench, fs, view, phase, metric, x=None, combine="mean") -> list[float]:
        """One value per repetition. With x=None but x-indexed rows, combine over all x per repetition."""
        xs = sorted(self.xs.get((bench, phase, metric), ()))
        if x is None and xs:
            reps: dict[int, list[float]] = defaultdict(list)
            for xv in xs:
                for rep, vs in self.vals.get((bench, fs, view, phase, metric, xv), {}).items():
                    reps[rep] += vs
            return [sum(v) / len(v) if combine == "mean" else sum(v) for v in reps.values() if v]
        d = self.vals.get((bench, fs, view, phase, metric, x), {})
        return [sum(v) / len(v) for v in d.values() if v]

    def has_numbers(self, bench, fs, view) -> bool:
        return any(k[0] == bench and k[1] == fs and k[2] == view for k in self.vals)

    def xs_of(self, bench, phase, metric) -> list[float]:
        return sorted(self.xs.get((bench, phase, metric), ()))


def _esc(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def _fmt_x(bench: str, x: float) -> str:
    if bench == "rename":
        return fmt_size(x)
    if bench == "dirclone":
        return f"copy {int(x)}"
    return fmt_num(x)


def _fs_label(fs: str, view: str, meta) -> str:
    return fs if view == "disk" else f"{fs} @{meta.get('hdd_throttle')} IOPS"


def _status(data: Data, bench, fs, view) -> str:
    nums, errs = data.has_numbers(bench, fs, view), bool(data.errors.get((bench, fs, view)))
    return "ok" if nums and not errs else "partial" if nums else "failed" if errs else "missing"


# ------------------------------------------------------------------------------------------------
# figures


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def fig_bars(data: Data, meta, bench: str, path: Path) -> bool:
    info = benchmarks.INFO[bench]
    metrics = info.primary
    if not metrics:
        return False
    plt = _plt()
    n = len(metrics)
    cols = min(n, 4)
    rowsn = math.ceil(n / cols)
    fig, axes = plt.subplots(rowsn, cols, figsize=(3.4 * cols, 3.2 * rowsn), squeeze=False)
    fs_list, views = meta["fs"], meta["views"]
    width = 0.8 / len(views)
    for i, m in enumerate(metrics):
        ax = axes[i // cols][i % cols]
        for vi, view in enumerate(views):
            for fi, fs in enumerate(fs_list):
                vals = data.per_rep(bench, fs, view, m.phase, m.metric)
                mean, ci, nn = mean_ci(vals)
                xpos = fi + (vi - (len(views) - 1) / 2) * width
                if nn == 0:
                    ax.text(xpos, 0, "failed" if _status(data, bench, fs, view) != "missing" else "n/a",
                            rotation=90, ha="center", va="bottom", fontsize=8, color="#c0392b")
                    continue
                ax.bar(xpos, mean, width * 0.9, yerr=None if math.isnan(ci) else ci, capsize=3,
                       color=FS_COLORS.get(fs, "#7f8c8d"), alpha=1.0 if view == "disk" else 0.55,
                       hatch=None if view == "disk" else "//", edgecolor="black", linewidth=0.5)
        ax.set_xticks(range(len(fs_list)))
        ax.set_xticklabels(fs_list, fontsize=8)
        ax.set_title(f"{m.label}", fontsize=9)
        ax.set_ylabel(f"{m.unit} ({'higher' if m.higher_better else 'lower'} is better)", fontsize=8)
        ax.tick_params(axis="y", labelsize=8)
        ax.grid(axis="y", alpha=0.3)
    for j in range(n, rowsn * cols):
        axes[j // cols][j % cols].axis("off")
    title = info.title + (" (hatched: under the blkio throttle)" if len(views) > 1 else "")
    fig.suptitle(title + " — mean, 95% CI", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def fig_hdd(data: Data, meta, bench: str, path: Path) -> bool:
    info = benchmarks.INFO[bench]
    phases = [ph for ph in info.read_phases
              if any(data.per_rep(bench, fs, "disk", ph, "hdd_model_s") for fs in meta["fs"])]
    if not phases:
        return False
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    fs_list = meta["fs"]
    width = 0.8 / len(fs_list)
    for k, (metric, label, combine) in enumerate([("hdd_model_s", "modeled hard-disk time (s)", "sum"),
                                                  ("layout_score", "dynamic layout score", "mean")]):
        ax = axes[k]
        for fi, fs in enumerate(fs_list):
            for pi, ph in enumerate(phases):
                vals = data.per_rep(bench, fs, "disk", ph, metric, combine=combine)
                mean, ci, nn = mean_ci(vals)
                if nn == 0:
                    continue
                ax.bar(pi + (fi - (len(fs_list) - 1) / 2) * width, mean, width * 0.9,
                       yerr=None if math.isnan(ci) else ci, capsize=2, color=FS_COLORS.get(fs, "#7f8c8d"),
                       label=fs if pi == 0 else None, edgecolor="black", linewidth=0.5)
        ax.set_xticks(range(len(phases)))
        ax.set_xticklabels(phases, fontsize=8)
        ax.set_title(label, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        if k == 1:
            ax.set_ylim(0, 1.05)
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize=7)
    fig.suptitle(f"{info.title}: hard-disk view of the read phases "
                 f"({meta['params']['hdd_seek_ms']} ms seek per discontiguous request + bytes at "
                 f"{meta['params']['hdd_mb_s']} MB/s)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _curve(ax, data, meta, bench, phase, metric, scale=1.0, errorbars=True):
    drawn = False
    for fs in meta["fs"]:
        xs = data.xs_of(bench, phase, metric)
        px, py, pe = [], [], []
        for x in xs:
            mean, ci, nn = mean_ci(data.per_rep(bench, fs, "disk", phase, metric, x=x))
            if nn:
                px.append(x)
                py.append(mean * scale)
                pe.append(0 if math.isnan(ci) else ci * scale)
        if px:
            drawn = True
            if errorbars:
                ax.errorbar(px, py, yerr=pe, marker="o", ms=3, capsize=2, label=fs, color=FS_COLORS.get(fs))
            else:
                ax.plot(px, py, marker=".", label=fs, color=FS_COLORS.get(fs))
    ax.grid(alpha=0.3)
    return drawn


def fig_tokubench(data, meta, path) -> bool:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ok = _curve(ax, data, meta, "tokubench", "create", "cum_files_per_s", errorbars=False)
    ax.set_xlabel("files created")
    ax.set_ylabel("cumulative files/s")
    ax.set_title("TokuBench: cumulative throughput (mean of repetitions)", fontsize=10)
    ax.set_ylim(bottom=0)
    if ok:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return ok


def fig_rename(data, meta, path) -> bool:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ok = _curve(ax, data, meta, "rename", "rename", "renames_per_s")
    ax.set_xscale("log", base=2)
    xs = data.xs_of("rename", "rename", "renames_per_s")
    if xs:
        ax.set_xticks(xs)
        ax.set_xticklabels([fmt_size(x).replace(".0", "") for x in xs], rotation=45, fontsize=7)
    ax.set_xlabel("file size (log scale)")
    ax.set_ylabel("renames/s (rename + fsync dir)")
    ax.set_ylim(bottom=0)
    ax.set_title("Rename throughput by file size (mean, 95% CI)", fontsize=10)
    if ok:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return ok


def fig_clone(data, meta, path) -> bool:
    plt = _plt()
    fig, axes = plt.subplots(2, 2, figsize=(9, 6))
    specs = [("copy", "seconds_incl_sync", "copy time incl. sync (s)", 1.0),
             ("write", "seconds", "16-byte write to every file + sync (s)", 1.0),
             ("grep", "seconds", "cold grep -r of the FS (s)", 1.0),
             ("space", "added_bytes", "space added by the copy (KiB, log scale)", 1 / 1024)]
    ok = False
    for ax, (ph, metric, label, scale) in zip(axes.flat, specs):
        ok |= _curve(ax, data, meta, "dirclone", ph, metric, scale)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("copy number")
        if metric == "added_bytes":
            if ax.has_data():
                ax.set_yscale("symlog", linthresh=64)
        else:
            ax.set_ylim(bottom=0)
    if ok:
        axes[0][0].legend(fontsize=8)
    fig.suptitle("Directory clone: per-copy latency and space (mean, 95% CI)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return ok


# ------------------------------------------------------------------------------------------------
# tables


def _ratio_txt(r: float) -> str:
    """×r with two decimals, or two significant digits below 0.01 (×0.0016, not ×0.00)."""
    return f"×{r:.2f}" if r >= 0.01 else f"×{r:.2g}"


def _cell(data: Data, meta, bench, fs, view, phase, metric, x=None, higher_better=True, base_vals=None,
          scale: float = 1.0) -> str:
    vals = [v * scale for v in data.per_rep(bench, fs, view, phase, metric, x=x)]
    st = _status(data, bench, fs, view)
    if not vals:
        return "**FAILED**" if st in ("failed", "partial") else "–"
    s = fmt_mean_ci(vals)
    if base_vals and fs != BASELINE:
        r = ratio(mean_ci(vals)[0], mean_ci(base_vals)[0])
        if not math.isnan(r):
            s += f" ({_ratio_txt(r)})"
    if st == "partial":
        s += " ⚠"
    return s


def primary_table(data: Data, meta, bench: str) -> list[str]:
    info = benchmarks.INFO[bench]
    cols = [(fs, view) for view in meta["views"] for fs in meta["fs"]]
    out = ["| metric | " + " | ".join(_fs_label(fs, v, meta) for fs, v in cols) + " |",
           "|---|" + "---|" * len(cols)]
    for m in info.primary + info.secondary:
        xs = data.xs_of(bench, m.phase, m.metric)
        if m in info.secondary and not any(data.per_rep(bench, fs, v, m.phase, m.metric) for fs, v in cols):
            continue
        for x in (xs or [None]):
            hint = "" if m.higher_better is None else f"{'higher' if m.higher_better else 'lower'} is better"
            paren = ", ".join(t for t in (m.unit, hint) if t)
            label = f"{m.label}{' @ ' + _fmt_x(bench, x) if x is not None else ''}{' (' + paren + ')' if paren else ''}"
            if m in info.secondary:
                label = f"*{label}*"
            cells = []
            for fs, view in cols:
                base = [v * m.scale for v in data.per_rep(bench, BASELINE, view, m.phase, m.metric, x=x)]
                cells.append(_cell(data, meta, bench, fs, view, m.phase, m.metric, x, m.higher_better, base,
                                   m.scale))
            out.append(f"| {_esc(label)} | " + " | ".join(cells) + " |")
    return out


def hdd_table(data: Data, meta, bench: str) -> list[str]:
    info = benchmarks.INFO[bench]
    out = []
    for ph in info.read_phases:
        if not any(data.per_rep(bench, fs, v, ph, "requests") for fs in meta["fs"] for v in meta["views"]):
            continue
        npts = len(data.xs_of(bench, ph, "requests"))
        note = f" (summed over the {npts} points of the series)" if npts else ""
        out.append(f"*Phase `{ph}`{note}:*")
        out.append("")
        out.append("| FS | measured (s) | requests | MiB read | MiB written | layout score | modeled HDD (s) | "
                   "modeled vs ext4 |")
        out.append("|---|---|---|---|---|---|---|---|")
        for view in meta["views"]:
            base = data.per_rep(bench, BASELINE, view, ph, "hdd_model_s", combine="sum")
            for fs in meta["fs"]:
                req = data.per_rep(bench, fs, view, ph, "requests", combine="sum")
                if not req:
                    out.append(f"| {_fs_label(fs, view, meta)} | **FAILED** | | | | | | |"
                               if _status(data, bench, fs, view) != "ok" else f"| {fs} | – | | | | | | |")
                    continue
                secs = data.per_rep(bench, fs, view, ph, "seconds", combine="sum")
                mib = [v / (1 << 20) for v in data.per_rep(bench, fs, view, ph, "dev_read_bytes", combine="sum")]
                wmib = [v / (1 << 20) for v in data.per_rep(bench, fs, view, ph, "dev_write_bytes", combine="sum")]
                lay = data.per_rep(bench, fs, view, ph, "layout_score")
                hdd = data.per_rep(bench, fs, view, ph, "hdd_model_s", combine="sum")
                r = ratio(mean_ci(hdd)[0], mean_ci(base)[0]) if base else float("nan")
                out.append(f"| {_fs_label(fs, view, meta)} | {fmt_mean_ci(secs)} | {fmt_mean_ci(req)} | "
                           f"{fmt_mean_ci(mib)} | {fmt_mean_ci(wmib)} | {fmt_mean_ci(lay)} | {fmt_mean_ci(hdd)} | "
                           f"{'×%.2f' % r if not math.isnan(r) else '–'} |")
        out.append("")
    return out


def resources_table(data: Data, meta, bench: str) -> list[str]:
    out = ["| FS | device bytes written | bytes the benchmark wrote | written per byte (whole run) | "
           "cgroup peak memory | OOM kills | daemon VmHWM | daemon CPU (s) |",
           "|---|---|---|---|---|---|---|---|"]
    any_row = False
    for view in meta["views"]:
        for fs in meta["fs"]:
            g = lambda m: data.per_rep(bench, fs, view, "run", m)  # noqa: E731
            dev, log, wa = g("dev_write_bytes_total"), g("logical_write_bytes_total"), g("write_amp_total")
            peak, oom, hwm, cpu = g("cgroup_peak_bytes"), g("oom_kills"), g("daemon_vmhwm_bytes"), \
                g("daemon_cpu_s_total")
            if not (dev or peak):
                continue
            any_row = True
            mib = lambda v: fmt_mean_ci([x / (1 << 20) for x in v]) + " MiB" if v and any(v) else "–"  # noqa: E731
            out.append(f"| {_fs_label(fs, view, meta)} | {mib(dev)} | {mib(log)} | "
                       f"{fmt_mean_ci(wa) if wa else '–'} | {mib(peak)} | {fmt_mean_ci(oom) if oom else '–'} | "
                       f"{mib(hwm) if hwm else '–'} | {fmt_mean_ci(cpu) if cpu else '–'} |")
    return out if any_row else []


def phase_wa_table(data: Data, meta, bench: str) -> list[str]:
    """Per write phase: device bytes written (after the phase's syncfs) per byte written."""
    phases = sorted({k[3] for k in data.vals if k[0] == bench and k[4] == "write_amp"})
    if not phases:
        return []
    out = ["| phase | " + " | ".join(meta["fs"]) + " |", "|---|" + "---|" * len(meta["fs"])]
    for ph in phases:
        cells = [fmt_mean_ci(data.per_rep(bench, fs, "disk", ph, "write_amp")) for fs in meta["fs"]]
        out.append(f"| {ph} | " + " | ".join(cells) + " |")
    return out


def summary_table(data: Data, meta) -> list[str]:
    cols = [(fs, view) for view in meta["views"] for fs in meta["fs"]]
    out = ["| benchmark | metric | " + " | ".join(_fs_label(fs, v, meta) for fs, v in cols) + " |",
           "|---|---|" + "---|" * len(cols)]
    for bench in meta["benchmarks"]:
        info = benchmarks.INFO[bench]
        m = info.primary[0]
        cells = []
        for fs, view in cols:
            base = data.per_rep(bench, BASELINE, view, m.phase, m.metric)
            cells.append(_cell(data, meta, bench, fs, view, m.phase, m.metric, None, m.higher_better, base))
        unit = f"{m.unit}, {'higher' if m.higher_better else 'lower'} is better"
        mean_note = " (mean over all points of the series)" if data.xs_of(bench, m.phase, m.metric) else ""
        out.append(f"| [{bench}](#{bench}) | {_esc(m.label)}{mean_note} ({unit}) | " + " | ".join(cells) + " |")
    return out


def hdd_overview(data: Data, meta) -> list[str]:
    """One row per traced phase of every benchmark: modeled hard-disk time (ratio to ext4), layout score and
    request count per FS, from the 'disk' view."""
    fss = meta["fs"]
    out = ["| benchmark: phase | " + " | ".join(fss) + " |", "|---|" + "---|" * len(fss)]
    for bench in meta["benchmarks"]:
        for ph in benchmarks.INFO[bench].read_phases:
            get = lambda fs, m, c="mean": mean_ci(data.per_rep(bench, fs, "disk", ph, m, combine=c))[0]  # noqa: E731
            base = get(BASELINE, "hdd_model_s", "sum")
            cells = []
            for fs in fss:
                hdd = get(fs, "hdd_model_s", "sum")
                if math.isnan(hdd):
                    cells.append("**FAILED**" if _status(data, bench, fs, "disk") != "ok" else "–")
                    continue
                r = ratio(hdd, base)
                cells.append(f"{fmt_num(hdd)} s{'' if fs == BASELINE or math.isnan(r) else f' ({_ratio_txt(r)})'}, "
                             f"{fmt_num(get(fs, 'layout_score'), 2)}, {get(fs, 'requests', 'sum'):,.0f} req")
            out.append(f"| [{bench}](#{bench}): {ph} | " + " | ".join(cells) + " |")
    return out


def resources_overview(data: Data, meta) -> list[str]:
    """Per benchmark: device bytes written per byte the benchmark wrote (whole run) for every FS, and the
    Amaranth daemon's peak resident memory (VmHWM) and CPU time beside the memory cgroup's peak."""
    fss = meta["fs"]
    ama = "amaranth" in fss
    out = ["| benchmark | " + " | ".join(f"{fs} written/byte" for fs in fss)
           + (" | Amaranth daemon VmHWM | Amaranth cgroup peak | Amaranth daemon CPU (s) |" if ama else " |"),
           "|---|" + "---|" * (len(fss) + (3 if ama else 0))]
    for bench in meta["benchmarks"]:
        get = lambda fs, m: data.per_rep(bench, fs, "disk", "run", m)  # noqa: E731
        cells = [fmt_mean_ci(get(fs, "write_amp_total")) if get(fs, "write_amp_total") else "–" for fs in fss]
        if ama:
            mib = lambda v: f"{fmt_mean_ci([x / (1 << 20) for x in v])} MiB" if v else "–"  # noqa: E731
            cpu = get("amaranth", "daemon_cpu_s_total")
            cells += [mib(get("amaranth", "daemon_vmhwm_bytes")), mib(get("amaranth", "cgroup_peak_bytes")),
                      fmt_mean_ci(cpu) if cpu else "–"]
        out.append(f"| [{bench}](#{bench}) | " + " | ".join(cells) + " |")
    return out


# ------------------------------------------------------------------------------------------------


def write_report(out: Path, meta: dict) -> Path:
    rows = load(out / "results.csv")
    data = Data(rows)
    figdir = out / "figures"
    figdir.mkdir(exist_ok=True)
    p = meta["params"]
    L: list[str] = []
    L.append("# Amaranth benchmark report")
    L.append("")
    L.append(f"- **Date:** started {meta.get('started')}, finished {meta.get('finished', '?')} "
             f"(elapsed {meta.get('elapsed', '?')})")
    L.append(f"- **Status:** {meta.get('status')}")
    L.append(f"- **Command:** `{meta['invocation']}` (in `{meta.get('cwd')}`)")
    L.append(f"- **File systems:** {', '.join(meta['fs'])}; **benchmarks:** {', '.join(meta['benchmarks'])}")
    L.append(f"- **Raw data:** `results.csv` (every run: benchmark, fs, phase, repetition, metric, value, unit, "
             f"error, x, view), `commands.log` (every command), `raw/` (helper outputs, fio, Amaranth stats), "
             f"`logs/`")
    L.append("")
    L.append("## Machine")
    L.append("")
    L.append("| | |")
    L.append("|---|---|")
    for k, v in meta.get("machine", {}).items():
        L.append(f"| {k} | {_esc(str(v))} |")
    if meta.get("amaranth_build"):
        L.append(f"| Amaranth measured | {_esc(meta['amaranth_build'])} |")
    L.append("")
    L.append("### Device limits (fio, measured in this run)")
    L.append("")
    fio = meta.get("fio")
    if fio and not fio.get("error"):
        L.append("| sequential write 1 MiB | sequential read 1 MiB | random read 4 KiB QD1 |")
        L.append("|---|---|---|")
        L.append(f"| {fio['seq_write_mb_s']:,.0f} MB/s | {fio['seq_read_mb_s']:,.0f} MB/s | "
                 f"{fio['rand_read_iops']:,.0f} IOPS ({fio['rand_read_lat_us']:.0f} µs) |")
        L.append("")
        L.append(f"({fio['config']})")
    elif fio:
        L.append(f"fio **failed**: {_esc(fio['error'])}")
    else:
        L.append("not measured (`--no-fio` or the run stopped before)")
    L.append("")
    L.append("## Method")
    L.append("")
    L.append(
        f"- Every benchmark runs on a **freshly made file system** (mkfs with default options; ext4 with "
        f"`lazy_itable_init=0,lazy_journal_init=0`) on a new sparse **{fmt_size(p['image_size'])} image file** in "
        f"`{meta['workdir']}`, attached with `losetup --direct-io=on` (no double caching in the host). "
        f"Benchmarks served by one module (seqwrite/seqread/randwrite) share one fresh FS per repetition.")
    L.append(
        f"- **Small machine:** the workload processes (and the Amaranth daemon, started by `amaranth mount` "
        f"inside the group) run in a cgroup v1 memory group limited to **{fmt_size(p['mem_limit'])}**; page cache "
        f"is charged to it. Amaranth gets `--cache-size {p['amaranth_cache_size'] or p['mem_limit'] // 2}` "
        f"({fmt_size(p['amaranth_cache_size'] or p['mem_limit'] // 2)}, its engine cache; the group's limit also "
        f"holds the daemon's other memory and its files' page cache). Setup steps (copying inputs in) run "
        f"outside the group.")
    L.append(
        "- **Cold cache** before every timed read phase (and where marked cold): `sync`, unmount, "
        "`echo 3 > /proc/sys/vm/drop_caches`, mount again (for Amaranth: `amaranth umount` + `amaranth mount`, "
        "i.e. a new daemon). Inputs that live on the work dir's disk (the Linux tar/tree, the git repository) "
        "are then read into the host page cache *outside* the cgroup, so the timed phase does not measure the "
        "host disk.")
    L.append(
        "- **Write phases** are followed by `syncfs` (`sync -f`), timed separately (`seconds_incl_sync`); "
        "device counters and block traces of a write phase include that flush. The kernel does not pass "
        "syncfs on to a FUSE daemon, so on Amaranth the mount's root directory is also fsync()ed (`sync DIR`), "
        "which makes the daemon sync its log.")
    L.append(
        f"- **Hard-disk view:** every timed phase is traced with the `block:block_rq_issue` tracepoint (private "
        f"tracefs instance, filtered on the loop device). Per phase: requests, bytes, the *dynamic layout score* "
        f"(fraction of requests that start at the sector where the previous request ended; FAST'17 aging paper) "
        f"and a **modeled hard-disk time** = {p['hdd_seek_ms']} ms × (requests not continuing the previous one) "
        f"+ bytes / {p['hdd_mb_s']} MB/s."
        + (f" Additionally every benchmark ran under a cgroup v1 **blkio throttle of {meta['hdd_throttle']} IOPS** "
           f"(read and write) on the loop device (columns marked @IOPS)." if meta.get("hdd_throttle") else ""))
    L.append(
        f"- **Statistics:** {p['repeat']} repetition(s), interleaved across file systems; mean ± half-width of "
        f"the 95% confidence interval (Student t; no interval with 1 repetition). (×r) = ratio of the means to "
        f"ext4 in this run (for 'lower is better' metrics, <1 is better). ⚠ = some repetitions failed.")
    L.append(
        "- **Written per byte:** bytes the loop device wrote (`/sys/block/loopN/stat`, from after mkfs to after "
        "the final unmount) divided by the bytes the benchmark wrote (setup included).")
    if meta.get("trace_error"):
        L.append(f"- **Block tracing was unavailable:** {meta['trace_error']}")
    L.append("")
    L.append("## Summary")
    L.append("")
    L += summary_table(data, meta)
    L.append("")
    L.append("### Hard-disk view, all benchmarks")
    L.append("")
    L.append(f"Per traced phase: modeled hard-disk time ({p['hdd_seek_ms']:g} ms per request that does not continue "
             f"the previous one + bytes at {p['hdd_mb_s']:g} MB/s; ratio to ext4), dynamic layout score, block "
             f"requests (means over the repetitions; series summed over their points).")
    L.append("")
    L += hdd_overview(data, meta)
    L.append("")
    L.append("### Bytes written per byte and Amaranth's memory, all benchmarks")
    L.append("")
    L.append("Device bytes written (loop device, after mkfs to after the final unmount) per byte the benchmark "
             "wrote, setup included; for Amaranth the daemon's peak resident memory (highest VmHWM over its "
             "daemons in the run), the memory cgroup's peak (daemon + workload + page cache) and the daemon's CPU "
             "time.")
    L.append("")
    L += resources_overview(data, meta)
    L.append("")
    failures = [r for r in rows if r.error]
    if failures:
        L.append("### Failures")
        L.append("")
        L.append("| benchmark | FS | view | repetition | phase | error |")
        L.append("|---|---|---|---|---|---|")
        for r in failures:
            L.append(f"| {r.benchmark} | {r.fs} | {r.view} | {r.repetition} | {r.phase} | "
                     f"{_esc(r.error[:500])} |")
        L.append("")
    missing = [(b, fs, v) for b in meta["benchmarks"] for fs in meta["fs"] for v in meta["views"]
               if _status(data, b, fs, v) == "missing"]
    if missing:
        L.append("Not run (the run was stopped before): " +
                 ", ".join(f"{b} on {_fs_label(fs, v, meta)}" for b, fs, v in missing))
        L.append("")
    figures: dict[str, list[str]] = {}
    for bench in meta["benchmarks"]:
        info = benchmarks.INFO[bench]
        figs = []
        f = figdir / f"{bench}.png"
        if fig_bars(data, meta, bench, f):
            figs.append(f.name)
        for curve in info.curves:
            f = figdir / f"{bench}-{curve}.png"
            fn = {"tokubench": fig_tokubench, "rename": fig_rename, "clone": fig_clone,
                  "aging": lambda d, m, path, b=bench: report_aging.figure(d, m, b, path)}[curve]
            if fn(data, meta, f):
                figs.append(f.name)
        f = figdir / f"{bench}-hdd.png"
        if fig_hdd(data, meta, bench, f):
            figs.append(f.name)
        figures[bench] = figs
        L.append(f'<a id="{bench}"></a>')
        L.append(f"## {bench}: {info.title}")
        L.append("")
        L.append(f"**What is measured:** {info.what}.")
        L.append("")
        L.append(f"**Papers:** {info.paper}.")
        L.append("")
        status = {fs_v: _status(data, bench, *fs_v) for fs_v in
                  [(fs, v) for v in meta["views"] for fs in meta["fs"]]}
        L.append("**Status:** " + ", ".join(f"{_fs_label(fs, v, meta)} {s}" for (fs, v), s in status.items()))
        L.append("")
        L += primary_table(data, meta, bench) if "aging" not in info.curves else report_aging.table(data, meta, bench)
        L.append("")
        for name in figs:
            L.append(f"![{bench} {name}](figures/{name})")
            L.append("")
        hdd = hdd_table(data, meta, bench)
        if hdd:
            L.append("**Hard-disk view** (block requests issued to the loop device during the timed phase; a write "
                     "phase includes its syncfs; *measured* is the time on this machine):")
            L.append("")
            L += hdd
        wa = phase_wa_table(data, meta, bench)
        if wa:
            L.append("**Device bytes written per byte written, per write phase** (after its syncfs):")
            L.append("")
            L += wa
            L.append("")
        res = resources_table(data, meta, bench)
        if res:
            L.append("**Whole run:**")
            L.append("")
            L += res
            L.append("")
        errs = [r for fs in meta["fs"] for v in meta["views"] for r in data.errors.get((bench, fs, v), [])]
        for r in errs:
            L.append(f"- **FAILED** on {_fs_label(r.fs, r.view, meta)}, repetition {r.repetition}, phase "
                     f"`{r.phase}`: `{_esc(r.error[:800])}`")
        if errs:
            L.append("")
    L.append("## Inputs")
    L.append("")
    L.append(f"- Linux tree: {meta.get('tree', 'not used')}")
    L.append(f"- git repository: {meta.get('git', 'not used')}")
    if meta.get("git_history"):
        L.append(f"- git history of the aging experiment: {meta['git_history']}")
    L.append(f"- Amaranth binary: `{meta.get('amaranth_bin')}`"
             + (f" ({meta['amaranth_build']})" if meta.get("amaranth_build") else ""))
    L.append("")
    L.append("## Parameters")
    L.append("")
    L.append("| parameter | value |")
    L.append("|---|---|")
    for k, v in meta.get("params_text", []):
        L.append(f"| `{k}` | {v} |")
    L.append("")
    L.append("## Commands")
    L.append("")
    L.append(f"Invocation: `{meta['invocation']}`. Every command, with its cgroup, is in `commands.log`; the "
             f"commands of the first repetition of each benchmark on each file system:")
    L.append("")
    L.append("<details><summary>commands</summary>")
    L.append("")
    L.append("```")
    L += _first_rep_commands(out / "commands.log")
    L.append("```")
    L.append("")
    L.append("</details>")
    L.append("")
    (out / "report.md").write_text("\n".join(L) + "\n")
    return out / "report.md"


def _first_rep_commands(log: Path, limit: int = 3000) -> list[str]:
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        m = re.match(r"\S+ \[(.*?)\] (.*)", line)
        if not m:
            continue
        ctx, cmd = m.groups()
        if ctx and not ctx.endswith(" r1"):
            continue
        out.append(f"[{ctx or 'setup'}] {cmd}")
        if len(out) >= limit:
            out.append("... (truncated; see commands.log)")
            break
    return out
