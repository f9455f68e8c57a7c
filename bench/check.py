"""--check: the report is complete and well formed (not what the numbers are)."""
from __future__ import annotations

import math
import re
from pathlib import Path

from . import benchmarks
from .results import load


def check_results(out: Path, meta: dict) -> list[str]:
    problems: list[str] = []
    csv_path = out / "results.csv"
    try:
        rows = load(csv_path)
    except Exception as e:  # noqa: BLE001
        problems.append(f"results.csv does not parse: {e}")
        rows = []
    for r in rows:
        if not r.error and (r.value is None or math.isinf(r.value)):
            problems.append(f"row without a finite value and without an error: {r}")
        if r.error and r.metric != "error":
            problems.append(f"error row with metric {r.metric!r}: {r}")
    for bench in meta["benchmarks"]:
        for fs in meta["fs"]:
            for view in meta["views"]:
                sel = [r for r in rows if r.benchmark == bench and r.fs == fs and r.view == view]
                nums = [r for r in sel if not r.error]
                errs = [r for r in sel if r.error]
                if not nums and not errs:
                    problems.append(f"{bench} on {fs} ({view}): neither numbers nor a failure recorded")
                    continue
                if errs:
                    continue
                info = benchmarks.INFO[bench]
                reps = sorted({r.repetition for r in nums})
                if reps != list(range(1, meta["params"]["repeat"] + 1)):
                    problems.append(f"{bench} on {fs}: repetitions {reps}, expected 1..{meta['params']['repeat']}")
                for m in info.primary:
                    if not any(r.phase == m.phase and r.metric == m.metric for r in nums):
                        problems.append(f"{bench} on {fs}: primary metric {m.phase}/{m.metric} missing")
    rep = out / "report.md"
    if not rep.exists():
        problems.append("report.md missing")
    else:
        text = rep.read_text()
        for section in ("## Machine", "### Device limits", "## Method", "## Summary", "## Parameters",
                        "## Commands", "**Date:**"):
            if section not in text:
                problems.append(f"report.md: section {section!r} missing")
        for bench in meta["benchmarks"]:
            m = re.search(rf"^## {re.escape(bench)}: .*?(?=^## |\Z)", text, re.S | re.M)
            if not m:
                problems.append(f"report.md: no section for {bench}")
                continue
            body = m.group(0)
            for fs in meta["fs"]:
                if fs not in body:
                    problems.append(f"report.md: {bench} section does not mention {fs}")
                failed = any(r.error for r in rows if r.benchmark == bench and r.fs == fs)
                if failed and "FAILED" not in body:
                    problems.append(f"report.md: {bench} on {fs} failed but the section shows no failure")
            if not re.search(r"!\[[^\]]*\]\(figures/[^)]+\.png\)", body):
                problems.append(f"report.md: {bench} has no figure")
        for link in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
            f = out / link
            if not f.exists():
                problems.append(f"figure {link} missing")
            elif f.stat().st_size < 1000 or f.read_bytes()[:8] != b"\x89PNG\r\n\x1a\n":
                problems.append(f"figure {link} is not a valid PNG")
    if meta.get("fio") is None and "--no-fio" not in meta.get("invocation", ""):
        problems.append("device limits (fio) not recorded")
    elif meta.get("fio", {}).get("error"):
        problems.append(f"fio failed: {meta['fio']['error']}")
    if not str(meta.get("status", "")).startswith("complete"):
        problems.append(f"run status is {meta.get('status')!r}")
    n_err = sum(1 for r in rows if r.error)
    print(f"check: {len(rows)} CSV rows, {n_err} failure rows, "
          f"{len(meta['benchmarks'])} benchmarks x {len(meta['fs'])} file systems x {len(meta['views'])} view(s)")
    if problems:
        print("check FAILED:")
        for p in problems:
            print(f"  - {p}")
    else:
        print("check passed: every benchmark x file system has numbers or an explicit failure; CSV, report and "
              "figures are well formed")
    return problems
