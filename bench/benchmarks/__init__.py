"""The benchmarks. Each module has NAMES (the benchmark names it serves; names of one module share
one fresh file system per repetition), GROUP (see GROUPS), optionally ALIASES (name -> comma-separated
benchmark names), INFO (report metadata per name), NEEDS (prepared inputs), check(env, names) and
run(ctx, names), optionally PARAMS (its parameters: name -> Param), and is listed once in REGISTRY.
bench/config.py makes every module's PARAMS fields of Params (and of the --quick preset)."""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field


@dataclass
class Metric:
    phase: str
    metric: str
    label: str
    unit: str
    higher_better: bool | None  # None: informational, no direction
    scale: float = 1.0  # multiply stored values by this for display (e.g. bytes -> MiB)


@dataclass(frozen=True)
class Param:
    """A benchmark parameter: its full default, its value under --quick (None: the same), and whether
    it is a size in bytes (`--set` then takes 4k, 2G, ...). Its type is its default's (int, float, str)."""
    default: int | float | str
    quick: int | float | str | None = None
    size: bool = False


@dataclass
class Info:
    name: str
    title: str
    what: str  # what is measured, exactly
    paper: str  # which paper benchmark it follows and how it is scaled
    primary: list[Metric]
    read_phases: list[str] = field(default_factory=list)  # phases shown in the hard-disk view
    curves: list[str] = field(default_factory=list)  # special figures: "tokubench", "rename", "clone"
    secondary: list[Metric] = field(default_factory=list)  # more rows for the table (not charted)


# The registry: every benchmark module, in canonical order (the order of runs and reports). Adding a benchmark
# is one module file (NAMES, GROUP, optional ALIASES and PARAMS, INFO, NEEDS, check, run) and one entry here.
REGISTRY = ["largefile", "tokubench", "rename", "dirrename", "linuxtree", "dirclone", "git", "tar", "rsync",
            "mailserver", "imapmove", "nanobench", "space",
            "aging_git", "aging_mail", "aging_intrafile", "aging_interfile",
            "imapcrash"]

# What a module's GROUP means:
GROUPS = {
    "main": "part of `all`",
    # the FAST'17 aging experiments (hours at full size)
    "aging": "selected by name or `aging`, not part of `all`",
    # crash tests with a benchmark's workload (imapcrash: Amaranth only)
    "extra": "selected by name only, not part of `all`",
}

_ALL = [importlib.import_module(f".{name}", __name__) for name in REGISTRY]
for _m in _ALL:
    assert _m.GROUP in GROUPS, f"{_m.__name__}: unknown GROUP {_m.GROUP!r}"
# Every module's parameters, in registry order (bench/config.py makes them fields of Params).
PARAMS: dict[str, Param] = {}
for _m in _ALL:
    for _k, _p in getattr(_m, "PARAMS", {}).items():
        assert _k not in PARAMS, f"{_m.__name__}: parameter {_k!r} defined twice"
        assert isinstance(_p.default, (int, float, str)), f"{_m.__name__}: {_k!r} has no plain default"
        PARAMS[_k] = _p
MODULES = [m for m in _ALL if m.GROUP == "main"]
AGING_MODULES = [m for m in _ALL if m.GROUP == "aging"]
EXTRA_MODULES = [m for m in _ALL if m.GROUP == "extra"]
# canonical order: the main benchmarks, then the aging experiments, then the extra ones
_ORDERED = MODULES + AGING_MODULES + EXTRA_MODULES
ORDER: list[str] = [n for m in _ORDERED for n in m.NAMES]
BY_NAME = {n: m for m in _ORDERED for n in m.NAMES}
INFO: dict[str, Info] = {n: m.INFO[n] for m in _ORDERED for n in m.NAMES}
ALIASES = {"all": ",".join(n for m in MODULES for n in m.NAMES),
           "aging": ",".join(n for m in AGING_MODULES for n in m.NAMES)}
for _m in _ORDERED:
    for _k, _v in getattr(_m, "ALIASES", {}).items():
        assert _k not in ALIASES, f"{_m.__name__}: alias {_k!r} defined twice"
        ALIASES[_k] = _v


def expand(spec: str) -> list[str]:
    """'a,b,c' (aliases allowed) -> benchmark names in canonical order, validated."""
    out = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        for n in ALIASES.get(part, part).split(","):
            if n not in BY_NAME:
                raise ValueError(f"unknown benchmark {n!r}; known: {', '.join(ORDER)}")
            if n not in out:
                out.append(n)
    return [n for n in ORDER if n in out]


def groups(names: list[str]):
    """[(module, [names])] in canonical order: one fresh FS per module per repetition."""
    out = []
    for m in _ORDERED:
        sel = [n for n in m.NAMES if n in names]
        if sel:
            out.append((m, sel))
    return out
