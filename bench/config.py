"""Benchmark parameters: full defaults (about an hour for all four file systems on the 2-core/24 GiB
machine) and the --quick preset (a few minutes, tiny sizes, every code path)."""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from .util import parse_size

G, M, K = 1 << 30, 1 << 20, 1 << 10


@dataclass
class Params:
    # environment
    image_size: int = 16 * G  # every FS gets a sparse image file of this size on a loop device
    mem_limit: int = 2 * G  # cgroup v1 memory limit for the workload (and the Amaranth daemon)
    amaranth_cache_size: int = 0  # 0 = half of mem_limit
    repeat: int = 3
    timeout: int = 3600  # per command, seconds
    hdd_seek_ms: float = 8.0
    hdd_mb_s: float = 150.0
    trace_buffer_kb: int = 16384  # per CPU, tracing instance
    fio_size: int = 2 * G
    fio_runtime: int = 8
    # seqwrite / seqread / randwrite
    large_file: int = 4 * G
    seq_write_block: int = 40 * M
    seq_read_block: int = 10 * M
    rand_writes: int = 262_144
    rand_write_size: int = 4
    rand_seed: int = 42
    # tokubench
    toku_files: int = 500_000
    toku_threads: int = 4
    toku_fanout: int = 128
    toku_iosize: int = 200
    toku_sample: int = 10_000
    # rename-by-size
    rename_min: int = 4 * K
    rename_max: int = 64 * M
    rename_step: int = 2  # multiply the size by this
    rename_count: int = 100
    # dirrename
    dirrename_count: int = 100
    # the Linux tree: tree_subset '' = the whole linux-source-6.1, else comma-separated subdirectories;
    # tree_exclude: subdirectories left out. Default: without drivers/, i.e. 47k files / ~0.45 GB, the
    # size of the papers' Linux 3.11.10 tree (~45k files), and half the time of the whole 6.1 tree
    tree_subset: str = ""
    tree_exclude: str = "drivers"
    # dirclone
    clone_dirs: int = 8
    clone_files: int = 8
    clone_file_size: int = 4 * M
    clone_copies: int = 8
    # git
    git_stages: int = 8
    # mailserver
    mail_boxes: int = 10
    mail_msgs: int = 1000
    mail_clients: int = 4
    mail_ops: int = 2000  # per client
    # imapmove (Featherstitch's IMAP experiment) and imapcrash
    imap_msgs: int = 1000
    imap_crash_cycles: int = 50
    imap_crash_msgs: int = 300
    # nanobench
    nano_iters: int = 100_000
    nano_meta_iters: int = 10_000
    # space
    space_files: int = 8
    space_file_size: int = 512 * M
    space_settle_max: int = 90
    space_settle_interval: int = 3
    space_settle_samples: int = 3  # this many equal readings in a row = settled
    space_settle_min_amaranth: int = 65  # Amaranth checkpoints every 60 s: wait at least one period
    # aging (FAST'17), shared: after each cold remount wait until the device was idle this long (at most max)
    aging_quiesce_s: float = 5.0
    aging_quiesce_max_s: float = 90.0
    # aging-git: history = successive releases of a PyPI package (one commit each), see bench/gitsource.py
    aging_git_package: str = "awscli"
    aging_git_from: str = "1.10.0"  # the first awscli release with a wheel
    aging_git_pulls: int = 1000
    aging_git_every: int = 100
    aging_git_gc: int = 0  # 1 = git's automatic gc on (as git's default)
    # aging-mail
    aging_mail_users: int = 2
    aging_mail_boxes: int = 80  # per user
    aging_mail_msgs: int = 1000  # per mailbox, initially
    aging_mail_ops: int = 8000  # per cycle
    aging_mail_cycles: int = 100
    aging_mail_max_msg: int = 32 * K
    # aging-intrafile
    aging_intra_files: int = 10
    aging_intra_size: int = 400 * K
    aging_intra_chunk: int = 4 * K
    aging_intra_step: int = 10  # round-robin chunks added per round
    # aging-interfile (the Linux tree: tree_subset / tree_exclude)
    aging_inter_step: int = 10  # percent of the files in random order added per round
    aging_inter_file_size: int = 4 * K

    def cache_size(self) -> int:
        """Amaranth's --cache-size: by default half the memory limit. The daemon shares the memory group
        with the workload and the page cache of its own FUSE files; a cache as large as the whole limit
        gets the daemon OOM-killed once it fills (seen with 256 MiB and 2 GiB limits)."""
        return self.amaranth_cache_size or self.mem_limit // 2


QUICK = dict(
    image_size=3 * G,
    mem_limit=256 * M,
    repeat=1,
    timeout=600,
    fio_size=256 * M,
    fio_runtime=2,
    large_file=384 * M,
    rand_writes=8192,
    toku_files=20_000,
    toku_sample=2_000,
    rename_max=1 * M,
    rename_step=4,
    rename_count=20,
    dirrename_count=10,
    tree_subset="kernel,lib",
    tree_exclude="",
    clone_dirs=2,
    clone_files=2,
    clone_file_size=1 * M,
    clone_copies=3,
    git_stages=3,
    mail_boxes=2,
    mail_msgs=40,
    mail_clients=2,
    mail_ops=60,
    imap_msgs=30,
    imap_crash_cycles=3,
    imap_crash_msgs=40,
    nano_iters=5_000,
    nano_meta_iters=500,
    space_files=4,
    space_file_size=16 * M,
    space_settle_max=6,
    space_settle_interval=1,
    space_settle_samples=2,
    space_settle_min_amaranth=0,
    aging_quiesce_s=1.0,
    aging_quiesce_max_s=10.0,
    aging_git_pulls=6,
    aging_git_every=3,
    aging_mail_boxes=3,
    aging_mail_msgs=40,
    aging_mail_ops=200,
    aging_mail_cycles=2,
    aging_intra_step=50,
    aging_inter_step=50,
)

SIZE_FIELDS = {"image_size", "mem_limit", "amaranth_cache_size", "fio_size", "large_file", "seq_write_block",
               "seq_read_block", "rename_min", "rename_max", "clone_file_size", "space_file_size",
               "aging_mail_max_msg", "aging_intra_size", "aging_intra_chunk", "aging_inter_file_size"}


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
