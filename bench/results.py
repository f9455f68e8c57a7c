"""The CSV of every individual measurement (and every failure)."""
from __future__ import annotations

import csv
import math
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

FIELDS = ["benchmark", "fs", "phase", "repetition", "metric", "value", "unit", "error", "x", "view"]


@dataclass
class Row:
    benchmark: str
    fs: str
    phase: str
    repetition: int
    metric: str
    value: float | None
    unit: str = ""
    error: str = ""
    x: float | None = None  # position on a curve (files created, file size, clone number)
    view: str = "disk"  # "disk" = this machine's disk; "throttle" = under the blkio IOPS throttle

    @property
    def failed(self) -> bool:
        return bool(self.error)


def _fmt(v):
    if v is None:
        return ""
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return repr(v)
    return str(v)


class ResultWriter:
    """Appends rows to results.csv as they are produced (so an interrupted run keeps its data)."""

    def __init__(self, path: Path, keep=None):
        """keep: when given, the rows of an existing CSV that it accepts are kept (a resumed run)."""
        self.path = path
        self.rows: list[Row] = [r for r in load(path) if keep(r)] if keep and path.exists() else []
        # the kept rows are written to a new file that replaces the old one at once: a kill meanwhile loses nothing
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w", newline="") as f:
            wr = csv.writer(f)
            wr.writerow(FIELDS)
            for r in self.rows:
                d = asdict(r)
                wr.writerow([_fmt(d[k]) for k in FIELDS])
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def add(self, row: Row) -> None:
        self.rows.append(row)
        with open(self.path, "a", newline="") as f:
            d = asdict(row)
            csv.writer(f).writerow([_fmt(d[k]) for k in FIELDS])


def load(path: Path) -> list[Row]:
    rows = []
    with open(path, newline="") as f:
        r = csv.DictReader(f)
        if r.fieldnames != FIELDS:
            raise ValueError(f"{path}: unexpected header {r.fieldnames}")
        for d in r:
            rows.append(
                Row(
                    benchmark=d["benchmark"],
                    fs=d["fs"],
                    phase=d["phase"],
                    repetition=int(d["repetition"]),
                    metric=d["metric"],
                    value=float(d["value"]) if d["value"] not in ("",) else None,
                    unit=d["unit"],
                    error=d["error"],
                    x=float(d["x"]) if d["x"] else None,
                    view=d["view"],
                )
            )
    return rows


assert [f.name for f in fields(Row)] == FIELDS
