"""Large-file benchmarks (BetrFS micro/large-file): sequential write, cold sequential read, cold
random 4 KiB reads and cold random 4-byte writes into the same file. One fresh FS per repetition
serves all four."""
from __future__ import annotations

from . import Info, Metric, Param
from ..util import G, M
from ._common import MiB

NAMES = ["seqwrite", "seqread", "randread", "randwrite"]
GROUP = "main"  # see GROUPS in __init__.py
ALIASES = {"largefile": "seqwrite,seqread,randread,randwrite"}
NEEDS: set[str] = set()
# Parameters (`--set name=value`; `quick`: the value under --quick, where it differs).
PARAMS = {
    "large_file": Param(4 * G, quick=384 * M, size=True),
    "seq_write_block": Param(40 * M, size=True),
    "seq_read_block": Param(10 * M, size=True),
    "rand_reads": Param(8192, quick=1024),
    "rand_read_size": Param(4096, size=True),
    "rand_read_threads": Param(16),
    "rand_writes": Param(262_144, quick=8192),
    "rand_write_size": Param(4),
}

INFO = {
    "seqwrite": Info(
        "seqwrite", "Sequential write",
        "one file of `large_file` bytes written with `seq_write_block` pwrite()s of incompressible random data "
        "(taken at rotating offsets from one random pool, so no two blocks are equal), then one fsync; MiB/s "
        "over writes+fsync "
        "(C helper `seqio`, timed inside the helper)",
        "BetrFS run-large-file-write.sh / sequential_write.c (10 GiB file, 40 KiB writes); here 4 GiB = 2x the "
        "memory limit, 40 MiB writes",
        [Metric("write", "mib_per_s", "write + fsync", "MiB/s", True)], ["write"],
        secondary=[Metric("write", "write_s", "writes", "s", False),
                   Metric("write", "fsync_s", "final fsync", "s", False)]),
    "seqread": Info(
        "seqread", "Sequential read (cold)",
        "cold cache, then the whole file read with `seq_read_block` read()s; MiB/s",
        "BetrFS run-large-file-read.sh (dd bs=40960 after a cache clear); here 10 MiB reads",
        [Metric("read", "mib_per_s", "cold read", "MiB/s", True)], ["read"],
        secondary=[Metric("read", "seconds", "cold read", "s", False)]),
    "randread": Info(
        "randread", "Random 4 KiB reads (cold)",
        "cold cache, then `rand_reads` pread()s of `rand_read_size` bytes at block-aligned offsets drawn "
        "uniformly from the file (xorshift64* seeded with `rand_seed`, drawn before the clock starts) after "
        "POSIX_FADV_RANDOM, by one thread (QD1); then cold again, the same offsets shared by "
        "`rand_read_threads` threads (up to that many reads in flight); reads/s and device bytes read per read "
        "(C helper `seqio randread`)",
        "not in the BetrFS scripts; the point-read case of the engine benchmark (docs/benchmarks/engine.md) on "
        "the mount",
        [Metric("randread", "reads_per_s", "cold random reads, QD1", "reads/s", True),
         Metric("randread_mt", "reads_per_s", "cold random reads, threads", "reads/s", True)],
        ["randread", "randread_mt"],
        secondary=[Metric("randread", "dev_bytes_per_read", "device bytes read per read", "B", False),
                   Metric("randread", "read_s", "reads", "s", False),
                   Metric("randread_mt", "dev_bytes_per_read", "device bytes read per read, threads", "B",
                          False)]),
    "randwrite": Info(
        "randwrite", "Random 4-byte writes (cold)",
        "cold cache, then `rand_writes` pwrite()s of `rand_write_size` bytes at offsets "
        "((random()<<32 | random()) % (size-4)), glibc random() seeded with 42, then fsync; seconds "
        "(C helper `randwrite`, offsets precomputed, timed inside the helper)",
        "BetrFS run-large-file-random_write.sh / random_write.c (262,144 4-byte writes into a 10 GiB file, "
        "srand(42)); FAST'18 Table 2",
        [Metric("randwrite", "seconds", "writes + fsync", "s", False)], ["randwrite"],
        secondary=[Metric("randwrite", "write_s", "writes", "s", False),
                   Metric("randwrite", "fsync_s", "final fsync", "s", False),
                   Metric("randwrite", "writes_per_s", "writes/s incl. fsync", "ops/s", True)]),
}


def check(env, names):
    pass


def run(ctx, names):
    p = ctx.p
    f = ctx.mnt / "large.file"
    seqio = str(ctx.helpers["seqio"])
    write_cmd = [seqio, "write", str(f), str(p.large_file), str(p.seq_write_block)]
    if "seqwrite" in names:
        r = ctx.timed("seqwrite", "write", write_cmd, kind="write", logical_bytes=p.large_file,
                      record_seconds=False, label=f"write {p.large_file >> 20} MiB")
        j = ctx.helper_json(r)
        total = j["write_s"] + j["fsync_s"]
        ctx.record("seqwrite", "write", "mib_per_s", j["bytes"] / MiB / total, "MiB/s")
        ctx.record("seqwrite", "write", "seconds", total, "s")
        ctx.record("seqwrite", "write", "write_s", j["write_s"], "s")
        ctx.record("seqwrite", "write", "fsync_s", j["fsync_s"], "s")
    else:
        ctx.untimed(write_cmd, f"write the {p.large_file >> 20} MiB file (untimed)", logical_bytes=p.large_file)
    if "seqread" in names:
        r = ctx.timed("seqread", "read", [seqio, "read", str(f), str(p.seq_read_block)], cold=True,
                      record_seconds=False, label="cold sequential read")
        j = ctx.helper_json(r)
        if j["bytes"] != p.large_file:
            raise RuntimeError(f"read {j['bytes']} bytes, expected {p.large_file}")
        ctx.record("seqread", "read", "mib_per_s", j["bytes"] / MiB / j["read_s"], "MiB/s")
        ctx.record("seqread", "read", "seconds", j["read_s"], "s")
    if "randread" in names:
        r = ctx.timed("randread", "randread",
                      [seqio, "randread", str(f), str(p.rand_reads), str(p.rand_read_size), str(p.rand_seed)],
                      cold=True, record_seconds=False,
                      label=f"cold {p.rand_reads:,} random {p.rand_read_size >> 10} KiB reads")
        j = ctx.helper_json(r)
        if j["file_bytes"] != p.large_file:
            raise RuntimeError(f"file holds {j['file_bytes']} bytes, expected {p.large_file}")
        dev_read = r.extra["trace"].read_bytes
        ctx.record("randread", "randread", "reads_per_s", j["reads"] / j["read_s"], "reads/s")
        ctx.record("randread", "randread", "read_s", j["read_s"], "s")
        ctx.record("randread", "randread", "dev_bytes_per_read", dev_read / j["reads"], "B")
        t = p.rand_read_threads
        r = ctx.timed("randread", "randread_mt",
                      [seqio, "randread", str(f), str(p.rand_reads), str(p.rand_read_size), str(p.rand_seed),
                       str(t)],
                      cold=True, record_seconds=False,
                      label=f"cold {p.rand_reads:,} random {p.rand_read_size >> 10} KiB reads, {t} threads")
        j = ctx.helper_json(r)
        if j["file_bytes"] != p.large_file or j["threads"] != t:
            raise RuntimeError(f"randread with {t} threads: unexpected answer {j}")
        dev_read = r.extra["trace"].read_bytes
        ctx.record("randread", "randread_mt", "reads_per_s", j["reads"] / j["read_s"], "reads/s")
        ctx.record("randread", "randread_mt", "read_s", j["read_s"], "s")
        ctx.record("randread", "randread_mt", "dev_bytes_per_read", dev_read / j["reads"], "B")
    if "randwrite" in names:
        r = ctx.timed("randwrite", "randwrite",
                      [str(ctx.helpers["randwrite"]), str(f), str(p.rand_writes), str(p.rand_write_size),
                       str(p.rand_seed)],
                      kind="write", cold=True, logical_bytes=p.rand_writes * p.rand_write_size,
                      record_seconds=False, label=f"cold {p.rand_writes:,} random {p.rand_write_size}-byte writes")
        j = ctx.helper_json(r)
        ctx.record("randwrite", "randwrite", "seconds", j["total_s"], "s")
        ctx.record("randwrite", "randwrite", "write_s", j["write_s"], "s")
        ctx.record("randwrite", "randwrite", "fsync_s", j["fsync_s"], "s")
        ctx.record("randwrite", "randwrite", "writes_per_s", j["count"] / j["total_s"], "ops/s")
