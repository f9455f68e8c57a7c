"""FUSE requests per system call on a mounted Amaranth: runs each operation N times and divides
the daemon's request counters (``amaranth stat --json``, ``fuse.requests_by_opcode``) by N.

    python3 bench/tools/reqcount.py MOUNTPOINT [--n 1000] [--amaranth target/release/amaranth]
        [--workload untar:TARBALL] [--workload git:REPO] [--workload rsync:DIR]

The nanobench operations run as nanobench does them (warm cache, a 1 MiB file written and read
once first). Workloads count the requests of the whole command divided by the files it creates.
Prints a Markdown table: operation, requests per call, and the opcodes behind them.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys


def counts(amaranth, mp):
    out = subprocess.run([amaranth, "stat", "--json", mp], check=True, capture_output=True, text=True).stdout
    return json.loads(out)["fuse"]["requests_by_opcode"]


def measure(amaranth, mp, n, fn):
    """Runs ``fn`` and returns the requests it caused per ``n``, by opcode."""
    before = counts(amaranth, mp)
    fn()
    after = counts(amaranth, mp)
    # The stat query itself may reach the mount (a lookup of the mount point); it is not ours.
    base = counts(amaranth, mp)
    noise = {k: base.get(k, 0) - after.get(k, 0) for k in base}
    diff = {}
    for k, v in after.items():
        d = v - before.get(k, 0) - noise.get(k, 0)
        if d > 0:
            diff[k] = d / n
    return diff


def nanobench_ops(d, n):
    f = os.path.join(d, "nano.file")
    data = os.urandom(1 << 20)
    fd = os.open(f, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.pwrite(fd, data, 0)
    os.fsync(fd)
    os.pread(fd, 1 << 20, 0)
    block = data[:4096]
    held = {}

    def open_only():
        for _ in range(n):
            held.setdefault("fds", []).append(os.open(f, os.O_RDONLY))

    def close_only():
        for x in held.pop("fds"):
            os.close(x)

    def names(prefix):
        return [os.path.join(d, f"{prefix}.{i}") for i in range(n)]

    def create():
        for p in names("c"):
            os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))

    ops = [
        ("open (O_RDONLY)", open_only),
        ("close", close_only),
        ("read 4 KiB (cached)", lambda: [os.pread(fd, 4096, (i % 256) * 4096) for i in range(n)]),
        ("stat", lambda: [os.stat(f) for _ in range(n)]),
        ("chmod", lambda: [os.chmod(f, 0o600 if i % 2 else 0o644) for i in range(n)]),
        ("write 4 KiB", lambda: [os.pwrite(fd, block, (i % 256) * 4096) for i in range(n)]),
        ("mkdir", lambda: [os.mkdir(p) for p in names("d")]),
        ("rmdir", lambda: [os.rmdir(p) for p in names("d")]),
        ("create (open O_CREAT+close)", create),
        ("unlink", lambda: [os.unlink(p) for p in names("c")]),
        ("rename", lambda: [os.rename(p, p + ".r") for p in names("d0")]),
    ]
    return ops, fd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mountpoint")
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--amaranth", default="target/release/amaranth")
    ap.add_argument("--workload", action="append", default=[])
    a = ap.parse_args()
    d = os.path.join(a.mountpoint, "reqcount")
    os.makedirs(d, exist_ok=True)
    ops, fd = nanobench_ops(d, a.n)
    rows = []
    for name, fn in ops:
        if name == "rename":
            for i in range(a.n):
                os.mkdir(os.path.join(d, f"d0.{i}"))
        rows.append((name, measure(a.amaranth, a.mountpoint, a.n, fn)))
    os.close(fd)
    for w in a.workload:
        kind, src = w.split(":", 1)
        dst = os.path.join(a.mountpoint, f"wl-{kind}")
        cmd = {
            "untar": ["tar", "-xf", src, "-C", dst],
            "git": ["git", "clone", "-q", "--no-hardlinks", src, os.path.join(dst, "repo")],
            "rsync": ["rsync", "-a", src.rstrip("/") + "/", dst + "/"],
        }[kind]
        os.makedirs(dst, exist_ok=True)
        before = counts(a.amaranth, a.mountpoint)
        subprocess.run(cmd, check=True)
        after = counts(a.amaranth, a.mountpoint)
        files = sum(len(fs) + len(ds) for _, ds, fs in os.walk(dst))
        diff = {k: (v - before.get(k, 0)) / files for k, v in after.items() if v - before.get(k, 0) > 0}
        rows.append((f"{kind} (per file or directory, {files})", diff))
        shutil.rmtree(dst)
    shutil.rmtree(d)
    print("| operation | requests per call | by opcode |")
    print("|---|---|---|")
    for name, diff in rows:
        total = sum(diff.values())
        detail = ", ".join(f"{k} {v:.2f}".replace(".00", "") for k, v in sorted(diff.items(), key=lambda kv: -kv[1]))
        print(f"| {name} | {total:.2f} | {detail} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
