"""A small reproduction of the mail aging cycle (bench/workloads/mail_aging.py) on Amaranth and kernel file
systems in one run, with Amaranth's FUSE requests by opcode and the daemon's CPU time per cycle.

    python3 bench/tools/mailcycle.py [--fs amaranth,ext4] [--amaranth target/release/amaranth]
        [--amaranth-before OTHER_BINARY (file system "amaranth-before")] [--users 2]
        [--boxes 10] [--msgs 200] [--ops 1000] [--rounds 2] [--dir /var/tmp/mailcycle] [--strace] [--cache-size N]

Each file system gets a fresh image on a loop device (direct I/O, as the bench does), the mail store is written
and indexed by Dovecot (untimed), then `--rounds` cycles of `--ops` operations run, alternating between the file
systems (fs1 cycle 1, fs2 cycle 1, fs1 cycle 2, ...) so that the machine's load falls on both alike. Prints one
JSON line per cycle and a summary table: seconds per cycle, ratio to the first file system, and for Amaranth the
requests per operation by opcode and the daemon's CPU seconds. `--strace` counts the system calls of one cycle
(per file system, the last round) with `strace -c -f`.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw).stdout


def amaranth_counts(binary, mnt):
    """Requests by opcode, and handler nanoseconds by opcode (as "ns:OPCODE"), and the device's flushes."""
    j = json.loads(sh([binary, "stat", "--json", str(mnt)]))
    out = dict(j["fuse"]["requests_by_opcode"])
    out.update({f"ns:{k}": v for k, v in j["fuse"].get("handler_ns_by_opcode", {}).items()})
    out["device_flushes"] = j.get("device", {}).get("flushes", 0)
    return out


def daemon_cpu(pid):
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


class Mounted:
    def __init__(self, fs, root, args):
        self.fs, self.args = fs, args
        self.img = root / f"{fs}.img"
        self.mnt = root / f"mnt-{fs}"
        self.mnt.mkdir(parents=True, exist_ok=True)
        self.img.unlink(missing_ok=True)
        with open(self.img, "wb") as f:
            f.truncate(args.image_gib << 30)
        self.loop = sh(["losetup", "--find", "--show", "--direct-io=on", str(self.img)]).strip()
        self.pid = None
        self.bin = args.amaranth_before if fs == "amaranth-before" else args.amaranth
        if fs.startswith("amaranth"):
            sh([self.bin, "mkfs", self.loop])
            pidf = root / f"{fs}.pid"
            sh([self.bin, "mount", self.loop, str(self.mnt), "--pid-file", str(pidf),
                "--log-file", str(root / f"{fs}.daemon.log")] +
               (["--cache-size", args.cache_size] if args.cache_size else []))
            self.pid = int(pidf.read_text().strip())
        else:
            sh([f"mkfs.{fs}", "-q" if fs != "btrfs" else "-f", self.loop])
            sh(["mount", "-t", fs, self.loop, str(self.mnt)])

    def close(self):
        for _ in range(50):
            r = subprocess.run(["umount", str(self.mnt)], capture_output=True)
            if r.returncode == 0:
                break
            time.sleep(0.2)
        if self.pid:
            for _ in range(300):
                if not Path(f"/proc/{self.pid}").exists():
                    break
                time.sleep(0.1)
        subprocess.run(["losetup", "-d", self.loop], check=False)
        self.img.unlink(missing_ok=True)


def tool(args, m, mode, *extra):
    conf = m.mnt.parent / f"dovecot-{m.fs}.conf"
    conf.write_text(f"mail_location = maildir:{m.mnt}/mail/%u\n")
    uid, gid = args.uid_gid
    return [sys.executable, "-m", "bench.workloads.mail_aging", mode, "--root", str(m.mnt / "mail"),
            "--conf", str(conf), "--uid", str(uid), "--gid", str(gid), "--users", str(args.users),
            "--boxes", str(args.boxes), "--msgs", str(args.msgs), "--max-msg", str(args.max_msg),
            "--log", str(m.mnt.parent / f"dovecot-{m.fs}.log")] + list(extra)


def drop_caches():
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fs", default="amaranth,ext4")
    ap.add_argument("--amaranth", default=str(HERE / "target/release/amaranth"))
    ap.add_argument("--amaranth-before", default="", help="a second binary, run as file system amaranth-before")
    ap.add_argument("--users", type=int, default=2)
    ap.add_argument("--boxes", type=int, default=10)
    ap.add_argument("--msgs", type=int, default=200)
    ap.add_argument("--ops", type=int, default=1000)
    ap.add_argument("--max-msg", type=int, default=32768)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--image-gib", type=int, default=4)
    ap.add_argument("--dir", default="/var/tmp/mailcycle")
    ap.add_argument("--strace", action="store_true")
    ap.add_argument("--cache-size", default="", help="Amaranth --cache-size")
    ap.add_argument("--label", default="")
    ap.add_argument("--maildir-ops", type=int, default=0,
                    help="also run bench/tools/maildir_ops.py (2 clients, this many deliveries and deletes each) "
                         "on every file system in every round (--ops 0: only that)")
    args = ap.parse_args()
    import pwd
    pw = pwd.getpwnam("amabench")
    args.uid_gid = (pw.pw_uid, pw.pw_gid)
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    mounts = []
    results = []
    try:
        for fs in args.fs.split(","):
            m = Mounted(fs, root, args)
            mounts.append(m)
            if args.ops:
                sh(tool(args, m, "populate", "--seed", "1"), cwd=HERE)
                sh(tool(args, m, "warm"), cwd=HERE)
        drop_caches()
        for r in range(args.rounds):
            for m in mounts:
                if args.maildir_ops:
                    cmd = [sys.executable, str(HERE / "bench/tools/maildir_ops.py"), str(m.mnt), "--n",
                           str(args.maildir_ops), "--clients", "2"] + (["--amaranth", m.bin] if m.pid else [])
                    j = json.loads(sh(cmd).strip().splitlines()[-1])
                    print(json.dumps({"fs": m.fs, "round": r + 1, "maildir_ops": j}), flush=True)
                    results.append({"fs": m.fs, "round": r + 1, "maildir_ops": j})
                if not args.ops:
                    continue
                cmd = tool(args, m, "cycle", "--ops", str(args.ops), "--seed", str(100 + r))
                st = None
                if args.strace and r == args.rounds - 1:
                    st = m.mnt.parent / f"strace-{m.fs}.txt"
                    cmd = ["strace", "-c", "-f", "-o", str(st)] + cmd
                c0 = amaranth_counts(m.bin, m.mnt) if m.pid else {}
                cpu0 = daemon_cpu(m.pid) if m.pid else 0.0
                t0 = time.monotonic()
                out = json.loads(sh(cmd, cwd=HERE).strip().splitlines()[-1])
                os.sync()
                secs = time.monotonic() - t0
                res = {"fs": m.fs, "round": r + 1, "seconds_incl_sync": round(secs, 3),
                       "cycle_seconds": round(out["seconds"], 3), "deliver": out["deliver"],
                       "delete": out["delete"], "not_ok": out["not_ok"]}
                if m.pid:
                    c1 = amaranth_counts(m.bin, m.mnt)
                    res["daemon_cpu_s"] = round(daemon_cpu(m.pid) - cpu0, 3)
                    d = {k: v - c0.get(k, 0) for k, v in c1.items() if v - c0.get(k, 0) > 0}
                    ns = {k[3:]: v for k, v in d.items() if k.startswith("ns:")}
                    res["device_flushes"] = d.pop("device_flushes", 0)
                    req = {k: v for k, v in d.items() if not k.startswith("ns:")}
                    res["requests"] = sum(req.values())
                    res["requests_per_op"] = {k: round(v / args.ops, 2)
                                              for k, v in sorted(req.items(), key=lambda kv: -kv[1])}
                    res["handler_s"] = round(sum(ns.values()) / 1e9, 3)
                    res["handler_us_per_request"] = {k: round(ns.get(k, 0) / v / 1e3, 1)
                                                     for k, v in sorted(req.items(), key=lambda kv: -ns.get(kv[0], 0))}
                if st:
                    res["strace"] = str(st)
                print(json.dumps(res), flush=True)
                results.append(res)
    finally:
        for m in mounts:
            m.close()
    first = args.fs.split(",")[0]
    if args.maildir_ops:
        for ph in ("deliver", "delete (flag change + expunge)"):
            print(f"\n| {ph} round | " + " | ".join(f"{f} us/op" for f in args.fs.split(",")) + " |")
            for r in range(args.rounds):
                row = {x["fs"]: x["maildir_ops"][ph]["us_per_op"] for x in results
                       if x["round"] == r + 1 and "maildir_ops" in x}
                print(f"| {r + 1} | " + " | ".join(f"{row[f]:.0f}" for f in args.fs.split(",")) + " |")
    if not args.ops:
        return
    print(f"\n| {args.label} round | " + " | ".join(f"{f} s" for f in args.fs.split(",")) + " | ratios |")
    for r in range(args.rounds):
        row = {x["fs"]: x["seconds_incl_sync"] for x in results if x["round"] == r + 1 and "seconds_incl_sync" in x}
        ratios = ", ".join(f"{f}/{first} {row[f] / row[first]:.2f}" for f in row if f != first)
        print(f"| {r + 1} | " + " | ".join(f"{row[f]:.2f}" for f in args.fs.split(",")) + f" | {ratios} |")


if __name__ == "__main__":
    main()
