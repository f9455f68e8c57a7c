"""Block-device side: image files on loop devices (direct I/O), device counters, block tracing with
the hard-disk model, and fio device limits."""
from __future__ import annotations

import errno
import json
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import cleanup
from .util import CommandError, PROGRESS, read_file, run, write_file

TRACEFS = Path("/sys/kernel/tracing")
TRACE_PREFIX = "amaranth_bench"


# ---------------------------------------------------------------------------------------------
# loop devices


class LoopDevice:
    """A sparse image file of `size` bytes attached with `losetup --direct-io=on`. `existing`: attach the image
    file as it is (an aged image kept for --resume). `keep`: the image is not removed on detach or cleanup (its
    owner, bench/resume.py, removes it)."""

    def __init__(self, image: Path, size: int, existing: bool = False, keep: bool = False):
        self.image = image
        if existing:
            if not image.is_file():
                raise RuntimeError(f"image {image} missing")
        else:
            if image.exists():
                image.unlink()
            image.parent.mkdir(parents=True, exist_ok=True)
            with open(image, "wb") as f:
                f.truncate(size)
        self._img_tok = None if keep else cleanup.register(f"remove image {image}",
                                                            lambda: image.unlink(missing_ok=True))
        self.keep = keep
        self.dev = run(["losetup", "--find", "--show", "--direct-io=on", str(image)]).stdout.strip()
        self._tok = cleanup.register(f"detach {self.dev}", self.detach)
        self.name = os.path.basename(self.dev)
        self.devno = read_file(f"/sys/block/{self.name}/dev").strip()  # "7:N"
        major, minor = (int(x) for x in self.devno.split(":"))
        self.kdev = (major << 20) | minor  # dev_t as the block tracepoints record it
        dio = read_file(f"/sys/block/{self.name}/loop/dio", "0").strip()
        if dio != "1":
            raise RuntimeError(f"{self.dev}: direct I/O was not enabled (loop/dio={dio})")

    def stat(self) -> dict[str, int]:
        """/sys/block/loopN/stat: I/O counts and 512-byte sectors read/written since attach."""
        f = [int(x) for x in read_file(f"/sys/block/{self.name}/stat").split()]
        return {"read_ios": f[0], "read_sectors": f[2], "write_ios": f[4], "write_sectors": f[6],
                "flush_ios": f[15] if len(f) > 15 else 0}

    def allocated_bytes(self) -> int:
        return os.stat(self.image).st_blocks * 512

    def detach(self) -> None:
        if self.dev:
            for attempt in range(20):
                try:
                    run(["losetup", "-d", self.dev])
                    break
                except CommandError:
                    if attempt == 19:
                        raise
                    time.sleep(0.25)
            # losetup -d is asynchronous-ish (autoclear); wait until the device is really free
            for _ in range(40):
                if not read_file(f"/sys/block/{self.name}/loop/backing_file", "").strip():
                    break
                time.sleep(0.05)
            self.dev = ""
        cleanup.release(self._tok)
        if not self.keep:
            self.image.unlink(missing_ok=True)
            cleanup.release(self._img_tok)


def leftover_loops(workdir: Path, skip=lambda back_file: False) -> list[str]:
    """Loop devices whose backing file is inside `workdir` (from a crashed run), for `--cleanup`;
    not those whose backing file `skip` accepts."""
    out = []
    try:
        res = run(["losetup", "-a", "-O", "NAME,BACK-FILE", "-n", "-l"], log=False, check=False)
    except CommandError:
        return out
    wd = str(workdir.resolve())
    for line in res.stdout.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2 and parts[1].strip().startswith(wd) and not skip(parts[1].strip()):
            out.append(parts[0])
    return out


# ---------------------------------------------------------------------------------------------
# block tracing and the hard-disk model


@dataclass
class TraceResult:
    requests: int = 0
    read_requests: int = 0
    write_requests: int = 0
    bytes: int = 0
    read_bytes: int = 0
    write_bytes: int = 0
    contiguous: int = 0
    lost_events: int = 0
    hdd_model_s: float = 0.0
    reqs: list = field(default_factory=list, repr=False)  # [(rwbs, sector, sectors)] in issue order

    @property
    def layout_score(self) -> float:
        return self.contiguous / self.requests if self.requests else float("nan")


_LINE = re.compile(r"block_rq_issue: (\d+),(\d+) (\S+) (\d+) \((.*?)\) (\d+) \+ (\d+)")


def analyze_requests(reqs: list[tuple[str, int, int]], seek_ms: float, mb_per_s: float) -> TraceResult:
    """reqs = [(rwbs, sector, nr_sectors)] in issue order (requests with data only).

    Dynamic layout score (FAST'17 aging paper): fraction of requests whose first sector is the
    sector right after the previous request's last one. Modeled hard-disk time: one seek of
    `seek_ms` for every request that does not continue the previous one (the first one included)
    plus all bytes at `mb_per_s` (10^6 bytes/s).
    """
    r = TraceResult()
    prev_end = None
    for rwbs, sector, nsec in reqs:
        nbytes = nsec * 512
        r.requests += 1
        r.bytes += nbytes
        if "W" in rwbs:
            r.write_requests += 1
            r.write_bytes += nbytes
        else:
            r.read_requests += 1
            r.read_bytes += nbytes
        if prev_end is not None and sector == prev_end:
            r.contiguous += 1
        prev_end = sector + nsec
    seeks = r.requests - r.contiguous
    r.hdd_model_s = seeks * seek_ms / 1000.0 + r.bytes / (mb_per_s * 1e6)
    return r


def parse_trace(text: str, kdev_major: int, kdev_minor: int) -> list[tuple[str, int, int]]:
    out = []
    for m in _LINE.finditer(text):
        if int(m.group(1)) != kdev_major or int(m.group(2)) != kdev_minor:
            continue
        nsec = int(m.group(7))
        if nsec == 0:  # flushes and other data-less requests
            continue
        rwbs = m.group(3)
        if "D" in rwbs:  # discards move no data
            continue
        out.append((rwbs, int(m.group(6)), nsec))
    return out


class Tracer:
    """block_rq_issue events of one device, recorded in a private tracefs instance."""

    def __init__(self, buffer_kb: int = 16384):
        self.inst = TRACEFS / "instances" / f"{TRACE_PREFIX}_{os.getpid()}"
        self.event = self.inst / "events/block/block_rq_issue"
        self._buffer_kb = buffer_kb
        self._ensure_instance()
        self._tok = cleanup.register(f"remove tracing instance {self.inst}", self.close)
        self._thread: threading.Thread | None = None
        self._chunks: list[bytes] = []
        self._stop = threading.Event()
        self._dev = None

    def _ensure_instance(self) -> None:
        """Mount tracefs if it is not mounted and (re)create this run's instance if it is missing. tracefs is
        shared by everyone on the machine: it is never unmounted here, and a harness run whose tracefs was
        unmounted by someone else (which removes every instance) gets its instance back at the next phase."""
        if not (TRACEFS / "events").exists():
            TRACEFS.mkdir(parents=True, exist_ok=True)
            run(["mount", "-t", "tracefs", "nodev", str(TRACEFS)])
        if self.inst.exists():
            return
        self.inst.mkdir()
        write_file(self.inst / "tracing_on", "0")
        write_file(self.inst / "buffer_size_kb", str(self._buffer_kb))
        if not self.event.exists():
            raise RuntimeError("tracepoint block/block_rq_issue not available")
        fmt = read_file(self.event / "format")
        if not re.search(r"field:dev_t dev;", fmt):
            raise RuntimeError("block_rq_issue has no dev field")

    def set_device(self, kdev: int) -> None:
        self._ensure_instance()
        write_file(self.event / "enable", "0")
        write_file(self.event / "filter", f"dev == {kdev}")
        write_file(self.event / "enable", "1")
        self._dev = (kdev >> 20, kdev & ((1 << 20) - 1))

    def _overruns(self) -> int:
        total = 0
        for st in (self.inst / "per_cpu").glob("cpu*/stats"):
            for line in read_file(st, "").splitlines():
                if line.startswith("overrun:") or line.startswith("dropped events:"):
                    total += int(line.split(":")[1])
        return total

    def _reader(self, fd: int) -> None:
        while True:
            try:
                b = os.read(fd, 1 << 20)
                if b:
                    self._chunks.append(b)
                    continue
            except BlockingIOError:
                pass
            except OSError as e:
                if e.errno != errno.EAGAIN:
                    raise
            if self._stop.is_set():
                return
            time.sleep(0.05)

    def start(self) -> None:
        assert self._dev is not None, "set_device first"
        write_file(self.inst / "trace", "")  # clear buffers
        self._ov0 = self._overruns()
        self._chunks = []
        self._stop.clear()
        self._fd = os.open(self.inst / "trace_pipe", os.O_RDONLY | os.O_NONBLOCK)
        self._thread = threading.Thread(target=self._reader, args=(self._fd,), daemon=True)
        write_file(self.inst / "tracing_on", "1")
        self._thread.start()

    def stop(self, seek_ms: float, mb_per_s: float) -> TraceResult:
        write_file(self.inst / "tracing_on", "0")
        self._stop.set()
        if self._thread:
            self._thread.join()
            self._thread = None
        # drain what is left
        while True:
            try:
                b = os.read(self._fd, 1 << 20)
            except BlockingIOError:
                break
            if not b:
                break
            self._chunks.append(b)
        os.close(self._fd)
        text = b"".join(self._chunks).decode(errors="replace")
        self._chunks = []
        reqs = parse_trace(text, *self._dev)
        res = analyze_requests(reqs, seek_ms, mb_per_s)
        res.lost_events = self._overruns() - self._ov0
        res.reqs = reqs
        return res

    def close(self) -> None:
        if self._thread:
            self._stop.set()
            self._thread.join()
            self._thread = None
            try:
                os.close(self._fd)
            except OSError:
                pass
        if self.inst.exists():
            try:
                write_file(self.inst / "tracing_on", "0")
                write_file(self.event / "enable", "0")
                write_file(self.event / "filter", "0")
            except OSError:
                pass
            for _ in range(20):
                try:
                    self.inst.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
        cleanup.release(self._tok)


def leftover_trace_instances() -> list[Path]:
    d = TRACEFS / "instances"
    return sorted(d.glob(f"{TRACE_PREFIX}_*")) if d.exists() else []


# ---------------------------------------------------------------------------------------------
# fio device limits


@dataclass
class DeviceLimits:
    seq_write_mb_s: float = float("nan")
    seq_read_mb_s: float = float("nan")
    rand_read_iops: float = float("nan")
    rand_read_lat_us: float = float("nan")
    config: str = ""
    error: str = ""
    raw: dict = field(default_factory=dict)


def measure_fio(workdir: Path, size: int, runtime: int) -> DeviceLimits:
    """Sequential 1 MiB write and read bandwidth (libaio, QD 16) and 4 KiB random read IOPS at QD1
    (psync), direct I/O, on an image file in the work dir. The file is removed afterwards."""
    f = workdir / "fio-test.img"
    lim = DeviceLimits()
    common = ["fio", "--output-format=json", f"--filename={f}", f"--size={size}", "--direct=1",
              f"--runtime={runtime}", "--time_based", "--group_reporting"]
    jobs = [
        ("seqwrite", ["--name=seqwrite", "--rw=write", "--bs=1M", "--ioengine=libaio", "--iodepth=16"]),
        ("seqread", ["--name=seqread", "--rw=read", "--bs=1M", "--ioengine=libaio", "--iodepth=16"]),
        ("randread", ["--name=randread", "--rw=randread", "--bs=4k", "--ioengine=psync", "--iodepth=1"]),
    ]
    lim.config = (f"fio {size >> 20} MiB file in the work dir, direct=1, {runtime}s each: seq write/read bs=1M "
                  f"libaio iodepth=16; random read bs=4k psync QD1")
    tok = cleanup.register(f"remove {f}", lambda: f.unlink(missing_ok=True))
    try:
        # lay the file out first so the write test measures overwrites of allocated blocks
        for name, args in jobs:
            with PROGRESS.step(f"fio {name}") as info:
                out = run(common + args, timeout=runtime * 10 + 120).stdout
                j = json.loads(out[out.index("{"):])
                lim.raw[name] = j["jobs"][0]
                job = j["jobs"][0]
                if name == "seqwrite":
                    lim.seq_write_mb_s = job["write"]["bw_bytes"] / 1e6
                    info["result"] = f"{lim.seq_write_mb_s:.0f} MB/s"
                elif name == "seqread":
                    lim.seq_read_mb_s = job["read"]["bw_bytes"] / 1e6
                    info["result"] = f"{lim.seq_read_mb_s:.0f} MB/s"
                else:
                    lim.rand_read_iops = job["read"]["iops"]
                    lim.rand_read_lat_us = job["read"]["clat_ns"]["mean"] / 1000
                    info["result"] = f"{lim.rand_read_iops:.0f} IOPS"
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        lim.error = str(e)
    finally:
        cleanup.release(tok, run=True)
    return lim
