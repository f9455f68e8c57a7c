"""What one Maildir delivery and one delete cost on a mounted file system: a delivery as Dovecot's LDA does it
(create `tmp/NAME` exclusively, write the message, fsync, close, rename to `new/NAME`), a delete as an expunge
does it (unlink `cur/NAME`, after a flag change renamed `new/NAME` to `cur/NAME:2,S`). Prints JSON per phase:
microseconds per operation and, on an Amaranth mount, FUSE requests per operation by opcode, the daemon's handler
microseconds per request by opcode, and device flushes per operation.

    python3 bench/tools/maildir_ops.py MOUNTPOINT [--n 500] [--size 4096] [--amaranth target/release/amaranth]
        [--clients 1]

With `--clients 2` two processes deliver (and delete) at once into two mailboxes of their own.
"""

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import time
from pathlib import Path


def stat(amaranth, mnt):
    if not amaranth:
        return None
    try:
        j = json.loads(subprocess.run([amaranth, "stat", "--json", str(mnt)], check=True, capture_output=True,
                                      text=True).stdout)
    except (subprocess.CalledProcessError, FileNotFoundError):
        return None
    out = {k: v for k, v in j["fuse"]["requests_by_opcode"].items()}
    out.update({f"ns:{k}": v for k, v in j["fuse"].get("handler_ns_by_opcode", {}).items()})
    out["flushes"] = j.get("device", {}).get("flushes", 0)
    return out


def msg_name(box: Path, i: int) -> str:
    return f"{1700000000 + i}.M{i}.{box.name},S=4096"


def deliver(box: Path, n: int, size: int):
    body = os.urandom(size)
    for i in range(n):
        name = msg_name(box, i)
        fd = os.open(box / "tmp" / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, body)
        os.fsync(fd)
        os.close(fd)
        os.rename(box / "tmp" / name, box / "new" / name)


def delete(box: Path, n: int):
    for i in range(n):
        name = msg_name(box, i)
        os.rename(box / "new" / name, box / "cur" / (name + ":2,S"))
        os.unlink(box / "cur" / (name + ":2,S"))


def phase(args, boxes, fn):
    before = stat(args.amaranth, args.mount)
    t0 = time.monotonic()
    procs = [mp.Process(target=fn, args=(b,)) for b in boxes]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        assert p.exitcode == 0
    secs = time.monotonic() - t0
    after = stat(args.amaranth, args.mount)
    ops = args.n * len(boxes)
    res = {"us_per_op": round(secs / ops * 1e6, 1)}
    if before and after:
        d = {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0) > 0}
        ns = {k[3:]: v for k, v in d.items() if k.startswith("ns:")}
        res["device_flushes_per_op"] = round(d.pop("flushes", 0) / ops, 2)
        req = {k: v for k, v in d.items() if not k.startswith("ns:")}
        res["requests_per_op"] = {k: round(v / ops, 2) for k, v in sorted(req.items(), key=lambda kv: -kv[1])}
        res["handler_us_per_request"] = {k: round(ns.get(k, 0) / v / 1e3, 1) for k, v in req.items()}
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mount")
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--amaranth", default="")
    args = ap.parse_args()
    boxes = []
    for c in range(args.clients):
        box = Path(args.mount) / f"maildir-ops-{c}-{os.getpid()}"
        for d in ("tmp", "new", "cur"):
            (box / d).mkdir(parents=True)
        boxes.append(box)
    out = {"deliver": phase(args, boxes, lambda b: deliver(b, args.n, args.size)),
           "delete (flag change + expunge)": phase(args, boxes, lambda b: delete(b, args.n))}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
