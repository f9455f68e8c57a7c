"""The daemon's memory above its cache, and the CPU its allocator costs (docs/DESIGN.md, the daemon's
memory bound). Needs root, /dev/fuse and the cgroup v1 memory controller.

    python3 bench/tools/daemon_memory.py memory BIN [--cache 256M] [--files 120000]
    python3 bench/tools/daemon_memory.py cpu BIN[:VAR=VALUE;...] ... [--rounds 3]

``memory``: mkfs, mount with ``--cache-size CACHE`` inside a new memory cgroup without a limit that
holds only the daemon, create FILES files of 1-16 KiB (1000 per directory) and read them back; print
one JSON line: the cgroup's peak (``memory.max_usage_in_bytes``), the daemon's VmHWM, the engine's
accounted cache peak (nodes) and the inode table (``amaranth stat --json``), the inodes known.

``cpu``: for each round, for each binary in turn (each with its own environment variables, e.g.
``target/release/amaranth:MALLOC_MMAP_THRESHOLD_=1048576``): 30,000 creates of 1-16 KiB files
through a mount with a 256 MiB cache, then sync; print one JSON line with the creates' seconds and
the daemon's CPU seconds (user + system, all threads) up to the end of the sync.

Everything goes under --workdir (default /var/tmp/amaranth-daemon-memory) and is removed after.
"""

import argparse
import json
import os
import random
import shutil
import subprocess
import time

MIB = 1 << 20
CGROUP_ROOT = "/sys/fs/cgroup/memory"


class Mounted:
    """A fresh image mounted from ``base``; unmounted and removed on exit."""

    def __init__(self, binary, env, base, cache, cgroup=None):
        self.bin, self.base = binary, base
        shutil.rmtree(base, ignore_errors=True)
        os.makedirs(f"{base}/mnt")
        os.makedirs(f"{base}/run")
        self.env = dict(os.environ, AMARANTH_RUN_DIR=f"{base}/run", **env)
        self.mp = f"{base}/mnt"
        img = f"{base}/fs.img"
        self.run("mkfs", img, "--size", "8G")
        join = None
        if cgroup:
            def join():
                with open(f"{cgroup}/cgroup.procs", "w") as f:
                    f.write(str(os.getpid()))
        subprocess.run([binary, "mount", img, self.mp, "--cache-size", cache, "--pid-file",
                        f"{base}/pid", "--log-file", f"{base}/log"], check=True, env=self.env,
                       capture_output=True, preexec_fn=join)
        with open(f"{base}/pid") as f:
            self.pid = int(f.read())

    def run(self, *args):
        return subprocess.run([self.bin, *args], check=True, env=self.env, capture_output=True).stdout

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        subprocess.run([self.bin, "umount", self.mp], env=self.env, capture_output=True)
        shutil.rmtree(self.base, ignore_errors=True)

    def cpu_seconds(self):
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def vmhwm(self):
        with open(f"/proc/{self.pid}/status") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM"))


def path(mp, i):
    return f"{mp}/d{i // 1000:03}/f{i:06}"


def content(i):
    r = random.Random(i)
    return r.randbytes(1024 + r.randrange(15 * 1024 + 1))


def create(mp, n):
    for i in range(n):
        if i % 1000 == 0:
            os.mkdir(os.path.dirname(path(mp, i)))
        with open(path(mp, i), "wb") as f:
            f.write(content(i))


def memory(a):
    cg = f"{CGROUP_ROOT}/amaranth-daemon-memory-{os.getpid()}"
    os.mkdir(cg)
    try:
        with Mounted(a.binary, {}, f"{a.workdir}/memory", a.cache, cg) as m:
            t = time.time()
            create(m.mp, a.files)
            created = time.time() - t
            t = time.time()
            for i in range(a.files):
                with open(path(m.mp, i), "rb") as f:
                    assert f.read() == content(i), path(m.mp, i)
            read = time.time() - t
            st = json.loads(m.run("stat", m.mp, "--json"))
            with open(f"{cg}/memory.max_usage_in_bytes") as f:
                peak = int(f.read())
            print(json.dumps(dict(
                binary=a.binary, cache=a.cache, files=a.files, create_s=round(created, 1),
                read_s=round(read, 1), cgroup_peak_mib=round(peak / MIB, 1),
                vmhwm_mib=round(m.vmhwm() / MIB, 1), cache_peak_mib=round(st["cache_peak_bytes"] / MIB, 1),
                table_mib=round(st["fs"]["table_bytes"] / MIB, 1), inodes=st["fs"]["cached_inodes"])),
                flush=True)
    finally:
        time.sleep(0.5)
        with open(f"{cg}/cgroup.procs") as f:
            left = f.read().split()
        for pid in left:
            with open(f"{CGROUP_ROOT}/cgroup.procs", "w") as f:
                f.write(pid)
        os.rmdir(cg)


def cpu(a):
    for r in range(a.rounds):
        for spec in a.binaries:
            binary, _, extra = spec.partition(":")
            env = dict(kv.split("=", 1) for kv in extra.split(";") if kv)
            with Mounted(binary, env, f"{a.workdir}/cpu", "256M") as m:
                t = time.time()
                create(m.mp, 30_000)
                created = time.time() - t
                os.sync()
                print(json.dumps(dict(binary=spec, round=r, create_s=round(created, 2),
                                      daemon_cpu_s=round(m.cpu_seconds(), 2))), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workdir", default="/var/tmp/amaranth-daemon-memory")
    sub = p.add_subparsers(dest="what", required=True)
    m = sub.add_parser("memory")
    m.add_argument("binary")
    m.add_argument("--cache", default="256M")
    m.add_argument("--files", type=int, default=120_000)
    c = sub.add_parser("cpu")
    c.add_argument("binaries", nargs="+")
    c.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    memory(a) if a.what == "memory" else cpu(a)


if __name__ == "__main__":
    main()
