"""Benchmark parameters: the shared ones (environment, seed, the Linux tree, aging quiesce times) here, each
benchmark's own in its module's PARAMS; full defaults (about an hour for all four file systems on the
2-core/24 GiB machine) and the --quick preset (a few minutes, tiny sizes, every code path)."""
from __future__ import annotations

from dataclasses import fields, make_dataclass, replace

from . import benchmarks
from .benchmarks import Param
from .util import G, M, K, parse_size

# The parameters that belong to no one benchmark (each benchmark's own are in its module's PARAMS).
SHARED: dict[str, Param] = {
    # environment
    "image_size": Param(16 * G, quick=3 * G, size=True),  # every FS gets a sparse image file of this size on a loop device
    "mem_limit": Param(2 * G, quick=256 * M, size=True),  # cgroup v1 memory limit for the workload (and the Amaranth daemon)
    "amaranth_cache_size": Param(0, size=True),  # 0 = half of mem_limit
    "amaranth_compression": Param(""),  # `amaranth mkfs --compression`: none, lz4, zstd; '' = mkfs's default
    "amaranth_mount_options": Param(""),  # `amaranth mount -o` (e.g. out_of_line_min=16k); '' = none
    "repeat": Param(3, quick=1),
    "timeout": Param(3600, quick=600),  # per command, seconds
    "hdd_seek_ms": Param(8.0),
    "hdd_mb_s": Param(150.0),
    "trace_buffer_kb": Param(16384),  # per CPU, tracing instance
    "fio_size": Param(2 * G, quick=256 * M, size=True),
    "fio_runtime": Param(8, quick=2),
    # the seed of every benchmark's random choices
    "rand_seed": Param(42),
    # the Linux tree: tree_subset '' = the whole linux-source-6.1, else comma-separated subdirectories;
    # tree_exclude: subdirectories left out. Default: without drivers/, i.e. 47k files / ~0.45 GB, the
    # size of the papers' Linux 3.11.10 tree (~45k files), and half the time of the whole 6.1 tree
    "tree_subset": Param("", quick="kernel,lib"),
    "tree_exclude": Param("drivers", quick=""),
    # aging (FAST'17), shared: after each cold remount wait until the device was idle this long (at most max)
    "aging_quiesce_s": Param(5.0, quick=1.0),
    "aging_quiesce_max_s": Param(90.0, quick=10.0),
    # aging-git / aging-mail: after every point, unmount the aged FS, copy its image (sparse) beside the work dir's
    # images and mount it again, so that --resume continues after the last completed point (bench/resume.py);
    # 0 = no copies: an interrupted run starts over
    "aging_snapshot": Param(1),
}

_ALL_PARAMS: dict[str, Param] = dict(SHARED)
for _k, _p in benchmarks.PARAMS.items():
    assert _k not in _ALL_PARAMS, f"parameter {_k!r} is both shared and a benchmark's"
    _ALL_PARAMS[_k] = _p


def _cache_size(self) -> int:
    """Amaranth's --cache-size: by default half the memory limit. The daemon shares the memory group
    with the workload and the page cache of its own FUSE files; a cache as large as the whole limit
    gets the daemon OOM-killed once it fills (seen with 256 MiB and 2 GiB limits)."""
    return self.amaranth_cache_size or self.mem_limit // 2


# Every parameter, a field with its full default.
Params = make_dataclass(
    "Params",
    [(k, type(p.default), p.default) for k, p in _ALL_PARAMS.items()],
    namespace={"cache_size": _cache_size, "__module__": __name__},
)

# The --quick preset: the parameters whose value differs under it.
QUICK = {k: p.quick for k, p in _ALL_PARAMS.items() if p.quick is not None}

SIZE_FIELDS = {k for k, p in _ALL_PARAMS.items() if p.size}


def set_param(p: Params, key: str, value: str) -> Params:
    names = {f.name: f for f in fields(Params)}
    if key not in names:
        raise ValueError(f"unknown parameter {key!r}; known: {', '.join(sorted(names))}")
    typ = names[key].type
    if key in SIZE_FIELDS:
        v = parse_size(value)
    elif typ in ("int", int):
        v = int(value.replace("_", ""))
    elif typ in ("float", float):
        v = float(value)
    else:
        v = value
    return replace(p, **{key: v})


def make_params(quick: bool) -> Params:
    p = Params()
    if quick:
        p = replace(p, **QUICK)
    return p


def describe(p: Params) -> list[tuple[str, str]]:
    from .util import fmt_size

    out = []
    for f in fields(Params):
        v = getattr(p, f.name)
        out.append((f.name, fmt_size(v) if f.name in SIZE_FIELDS and v else str(v)))
    return out
