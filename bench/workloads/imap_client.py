"""IMAP load generator for the mailserver benchmark (BetrFS macro/mailserver/imap-punish.py style).

Each client is a separate process that talks to its own Dovecot `imap` process in PREAUTH mode
over stdio (imaplib.IMAP4_stream), running as the unprivileged benchmark user. All clients connect
and select a mailbox first, then start together at a barrier. Each does OPS operations: 50% reads
(UID FETCH of a random message's full body) and 50% writes, the writes split evenly between APPEND
of a new message, delete (STORE \\Deleted + EXPUNGE) and a flag change (STORE +/-\\Flagged). A
client works on one random mailbox for 10 operations at a time, then SELECTs another (the SELECT is
part of the timed work). Prints JSON: operations, errors, and the time from the common start to the
last client's end.

  python3 -m bench.workloads.imap_client run  --conf C --uid U --gid G --boxes B --clients N --ops K --seed S
  python3 -m bench.workloads.imap_client warm --conf C --uid U --gid G --boxes B
"""
from __future__ import annotations

import argparse
import base64
import imaplib
import json
import multiprocessing as mp
import random
import re
import shlex
import sys
import time
from collections import Counter

IMAP_BIN = "/usr/lib/dovecot/imap"


def imap_command(args) -> str:
    log = shlex.quote(args.log) if args.log else "/dev/null"
    return (f"exec setpriv --reuid={args.uid} --regid={args.gid} --clear-groups "
            f"env -i USER={args.user} HOME=/nonexistent PATH=/usr/bin:/bin "
            f"{IMAP_BIN} -c {shlex.quote(args.conf)} 2>>{log}")


def make_message(rng: random.Random, n: int) -> bytes:
    size = int(min(65536, max(600, rng.lognormvariate(8.3, 0.8))))
    body_raw = rng.randbytes(size * 3 // 4)
    b64 = base64.b64encode(body_raw).decode()
    lines = [b64[i:i + 76] for i in range(0, len(b64), 76)]
    hdr = (f"From: sender{rng.randrange(1000)}@example.org\r\nTo: amabench@example.org\r\n"
           f"Subject: benchmark message {n} {rng.getrandbits(32):08x}\r\n"
           f"Date: Mon, 1 Jan 2024 00:00:00 +0000\r\nMessage-ID: <{rng.getrandbits(64):016x}@amaranth-bench>\r\n"
           f"MIME-Version: 1.0\r\nContent-Type: text/plain\r\n\r\n")
    return (hdr + "\r\n".join(lines) + "\r\n").encode()


def _uids(M) -> list[bytes]:
    typ, data = M.uid("SEARCH", None, "ALL")
    return data[0].split() if typ == "OK" and data and data[0] else []


def _select(M, box: str) -> list[bytes]:
    typ, data = M.select(box)
    if typ != "OK":
        raise RuntimeError(f"SELECT {box}: {data}")
    return _uids(M)


_APPENDUID = re.compile(rb"APPENDUID \d+ (\d+)")


def worker(idx: int, args, barrier, q) -> None:
    try:
        rng = random.Random(args.seed * 1000 + idx)
        M = imaplib.IMAP4_stream(imap_command(args))
        box = f"box{rng.randrange(args.boxes)}"
        uids = _select(M, box)
        counts: Counter = Counter()
        barrier.wait(timeout=600)
        t0 = time.monotonic()
        for i in range(args.ops):
            if i and i % 10 == 0:
                box = f"box{rng.randrange(args.boxes)}"
                uids = _select(M, box)
                counts["select"] += 1
            typ = "OK"
            if rng.random() < 0.5:
                if uids:
                    typ, _ = M.uid("FETCH", rng.choice(uids).decode(), "(BODY.PEEK[])")
                counts["fetch"] += 1
            else:
                kind = rng.randrange(3)
                if kind == 0 or not uids:
                    typ, data = M.append(box, None, None, make_message(rng, i))
                    m = _APPENDUID.search(data[0] or b"") if data else None
                    if m:
                        uids.append(m.group(1))
                    counts["append"] += 1
                elif kind == 1:
                    uid = uids.pop(rng.randrange(len(uids)))
                    typ, _ = M.uid("STORE", uid.decode(), "+FLAGS.SILENT", r"(\Deleted)")
                    if typ == "OK":
                        typ, _ = M.expunge()
                    counts["delete"] += 1
                else:
                    op = "+FLAGS.SILENT" if rng.random() < 0.5 else "-FLAGS.SILENT"
                    typ, _ = M.uid("STORE", rng.choice(uids).decode(), op, r"(\Flagged)")
                    counts["flag"] += 1
            if typ != "OK":
                counts["not_ok"] += 1
        t1 = time.monotonic()
        M.logout()
        q.put({"client": idx, "t0": t0, "t1": t1, "ops": args.ops, "counts": dict(counts)})
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        try:
            barrier.abort()
        except Exception:  # noqa: BLE001
            pass
        q.put({"client": idx, "error": f"{type(e).__name__}: {e}"})


def cmd_run(args) -> int:
    barrier = mp.Barrier(args.clients)
    q: mp.Queue = mp.Queue()
    procs = [mp.Process(target=worker, args=(i, args, barrier, q)) for i in range(args.clients)]
    for p in procs:
        p.start()
    results = [q.get() for _ in procs]
    for p in procs:
        p.join()
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        print(json.dumps({"error": errors}))
        print("; ".join(errors), file=sys.stderr)
        return 1
    t0 = min(r["t0"] for r in results)
    t1 = max(r["t1"] for r in results)
    total = sum(r["ops"] for r in results)
    counts: Counter = Counter()
    for r in results:
        counts.update(r["counts"])
    print(json.dumps({"clients": args.clients, "ops": total, "seconds": t1 - t0, "ops_per_s": total / (t1 - t0),
                      "counts": dict(counts)}))
    return 0


def cmd_warm(args) -> int:
    """SELECT every mailbox once and read all flags, so Dovecot builds its index files (setup)."""
    M = imaplib.IMAP4_stream(imap_command(args))
    n = 0
    for b in range(args.boxes):
        typ, data = M.select(f"box{b}")
        if typ != "OK":
            raise RuntimeError(f"SELECT box{b}: {data}")
        n += int(data[0])
        M.fetch("1:*", "(FLAGS)")
    M.logout()
    print(json.dumps({"messages": n}))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["run", "warm"])
    ap.add_argument("--conf", required=True)
    ap.add_argument("--uid", type=int, required=True)
    ap.add_argument("--gid", type=int, required=True)
    ap.add_argument("--user", default="amabench")
    ap.add_argument("--boxes", type=int, required=True)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--ops", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--log", default="")
    args = ap.parse_args()
    return cmd_run(args) if args.mode == "run" else cmd_warm(args)


if __name__ == "__main__":
    sys.exit(main())
