"""The FUSE floor against Amaranth's own work, per system call: runs each operation N times
(C helper ``bench/helpers/opbench.c``, each call timed on its own) on a mounted Amaranth and reads,
before and after, the daemon's request counters, its handler time by opcode (``amaranth stat
--json``: ``fuse.requests_by_opcode``, ``fuse.handler_ns_by_opcode``) and its CPU time (the sum
of ``/proc/PID/task/*/schedstat``). Optionally runs the same calls in a directory of another file
system (``--ref DIR``, e.g. on ext4) for comparison.

    python3 bench/tools/floor.py MOUNTPOINT [--ref DIR] [--n 20000] [--meta-n 2000]
        [--amaranth target/release/amaranth] [--ops nop,getattr,...] [--taskset CPU]

Per operation it prints: µs per call (mean, median, 99th percentile), the slow share (the fraction
of the total time spent in calls over twice the median: on a shared machine a few calls that wait
for a CPU, milliseconds each, often hold most of the time, so the mean can be 2-3x the median;
compare means with means, medians with medians), how often per call the scheduler moved the
caller to another CPU (each move on this VM wakes a halted vCPU), FUSE requests per call, the daemon's handler
time per call (from the request in hand to the reply built), the daemon's CPU per call (all its
threads, kernel time included), and the floor: µs per call minus handler time, i.e. what the call
would cost if the daemon's handlers took no time (kernel VFS + FUSE transport + task switches).
``nop`` (an IOCTL answered ENOTTY at once) measures that floor directly for one round trip.
"""

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
HELPER_SRC = os.path.join(HERE, "..", "helpers", "opbench.c")

OPS = ["nop", "getattr", "statfs", "open", "read", "stat", "readdir", "chmod", "write", "fsync",
       "mkdir", "rmdir", "create", "unlink", "rename"]
# Operations run with the smaller count.
META = {"mkdir", "rmdir", "create", "rename", "unlink", "fsync"}
# Operations that need names made first (untimed, before the counters are read).
PREP = {"rename": "create"}


def build(out):
    subprocess.run(["gcc", "-O2", "-Wall", "-o", out, HELPER_SRC], check=True)
    return out


def stat_json(amaranth, mp):
    out = subprocess.run([amaranth, "stat", "--json", mp], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def cpu_ns(pid):
    total = 0
    for f in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(f) as fh:
                total += int(fh.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def snapshot(amaranth, mp, pid):
    j = stat_json(amaranth, mp)["fuse"]
    return j["requests_by_opcode"], j.get("handler_ns_by_opcode", {}), cpu_ns(pid)


def delta(a, b):
    return {k: v - a.get(k, 0) for k, v in b.items() if v - a.get(k, 0) > 0}


def run_op(helper, d, op, n, taskset):
    cmd = [helper, d, op, str(n)]
    if taskset is not None:
        cmd = ["taskset", "-c", str(taskset)] + cmd
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mountpoint")
    ap.add_argument("--ref", help="a directory on another file system to run the same calls in")
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--meta-n", type=int, default=2000)
    ap.add_argument("--amaranth", default="target/release/amaranth")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--taskset", type=int, help="pin the calling process to this CPU")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON too")
    a = ap.parse_args()
    helper = build(os.path.join("/tmp", f"opbench-{os.getpid()}"))
    ops = a.ops.split(",")
    d = os.path.join(a.mountpoint, "floor")
    os.makedirs(d, exist_ok=True)
    pid = stat_json(a.amaranth, a.mountpoint)["pid"]
    run_op(helper, d, "setup", 0, a.taskset)
    ref = None
    if a.ref:
        ref = os.path.join(a.ref, "floor")
        os.makedirs(ref, exist_ok=True)
        run_op(helper, ref, "setup", 0, a.taskset)
    rows = []
    for op in ops:
        n = a.meta_n if op in META else a.n
        if op in PREP:
            run_op(helper, d, PREP[op], n, a.taskset)
        # The stat query's own requests (a lookup of the mount point) are measured and removed.
        r0, t0, c0 = snapshot(a.amaranth, a.mountpoint, pid)
        r1, t1, c1 = snapshot(a.amaranth, a.mountpoint, pid)
        noise_r, noise_t = delta(r0, r1), delta(t0, t1)
        res = run_op(helper, d, op, n, a.taskset)
        r2, t2, c2 = snapshot(a.amaranth, a.mountpoint, pid)
        reqs = {k: v - noise_r.get(k, 0) for k, v in delta(r1, r2).items()}
        reqs = {k: v for k, v in reqs.items() if v > 0}
        handler = sum(delta(t1, t2).values()) - sum(noise_t.values())
        cpu = (c2 - c1) - (c1 - c0)
        row = {
            "op": op,
            "mean_us": res["mean_ns"] / 1e3,
            "median_us": res["median_ns"] / 1e3,
            "p99_us": res["p99_ns"] / 1e3,
            "slow_share": res.get("slow_share", 0.0),
            "moves": res.get("migrations", -1) / n if res.get("migrations", -1) >= 0 else None,
            "requests": sum(reqs.values()) / n,
            "by_opcode": {k: v / n for k, v in reqs.items()},
            "handler_us": max(handler, 0) / n / 1e3,
            "daemon_cpu_us": max(cpu, 0) / n / 1e3,
        }
        row["floor_us"] = row["mean_us"] - row["handler_us"]
        if ref:
            if op in PREP:
                run_op(helper, ref, PREP[op], n, a.taskset)
            rr = run_op(helper, ref, op, n, a.taskset)
            row["ref_mean_us"] = rr["mean_ns"] / 1e3
            row["ref_median_us"] = rr["median_ns"] / 1e3
            row["ref_slow_share"] = rr.get("slow_share", 0.0)
        rows.append(row)
    shutil.rmtree(d)
    if ref:
        shutil.rmtree(ref)
    os.unlink(helper)
    hdr = ("| op | µs mean / median / p99 | slow share | caller CPU moves | requests | handler µs "
           "| daemon CPU µs | floor µs (mean − handler) |")
    sep = "|---|---|---|---|---|---|---|---|"
    if ref:
        hdr += " reference µs mean / median | reference slow share |"
        sep += "---|---|"
    print(hdr)
    print(sep)
    for r in rows:
        detail = ", ".join(f"{k} {v:.2f}".replace(".00", "") for k, v in sorted(r["by_opcode"].items(), key=lambda kv: -kv[1]))
        moves = "–" if r["moves"] is None else f"{r['moves']:.2f}"
        line = (f"| {r['op']} | {r['mean_us']:.2f} / {r['median_us']:.2f} / {r['p99_us']:.1f} | "
                f"{r['slow_share']:.0%} | {moves} | "
                f"{r['requests']:.2f} ({detail}) | "
                f"{r['handler_us']:.2f} | {r['daemon_cpu_us']:.2f} | {r['floor_us']:.2f} |")
        if ref:
            line += f" {r['ref_mean_us']:.2f} / {r['ref_median_us']:.2f} | {r['ref_slow_share']:.0%} |"
        print(line)
    if a.json:
        print(json.dumps(rows))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
