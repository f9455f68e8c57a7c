"""The benchmarks. Each module has NAMES (the benchmark names it serves; names of one module share
one fresh file system per repetition), INFO (report metadata per name), NEEDS (prepared inputs),
check(env, names) and run(ctx, names)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Metric:
    phase: str
    metric: str
    label: str
    unit: str
    higher_better: bool | None  # None: informational, no direction
    scale: float = 1.0  # multiply stored values by this for display (e.g. bytes -> MiB)


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


from . import (aging_git, aging_interfile, aging_intrafile, aging_mail, dirclone, dirrename, git,  # noqa: E402
               imapcrash, imapmove, largefile, linuxtree, mailserver, nanobench, rename, rsync, space, tar,
               tokubench)

MODULES = [largefile, tokubench, rename, dirrename, linuxtree, dirclone, git, tar, rsync, mailserver, imapmove,
           nanobench, space]
# the FAST'17 aging experiments (hours at full size): selected by name or `aging`, not part of `all`
AGING_MODULES = [aging_git, aging_mail, aging_intrafile, aging_interfile]
# crash tests with a benchmark's workload (imapcrash: Amaranth only): selected by name, not part of `all`
EXTRA_MODULES = [imapcrash]
ORDER: list[str] = [n for m in MODULES + AGING_MODULES + EXTRA_MODULES for n in m.NAMES]
BY_NAME = {n: m for m in MODULES + AGING_MODULES + EXTRA_MODULES for n in m.NAMES}
INFO: dict[str, Info] = {n: m.INFO[n] for m in MODULES + AGING_MODULES + EXTRA_MODULES for n in m.NAMES}
ALIASES = {"rename-by-size": "rename", "grep": "linuxtree", "largefile": "seqwrite,seqread,randwrite",
           "all": ",".join(n for m in MODULES for n in m.NAMES), "imap": "mailserver", "clone": "dirclone",
           "nano": "nanobench", "aging": ",".join(n for m in AGING_MODULES for n in m.NAMES),
           "aging-micro": "aging-intrafile,aging-interfile"}


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
    for m in MODULES + AGING_MODULES + EXTRA_MODULES:
        sel = [n for n in m.NAMES if n in names]
        if sel:
            out.append((m, sel))
    return out
