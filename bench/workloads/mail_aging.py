"""Mail-server aging workload (FAST'17 section 7): Dovecot with Maildir, USERS users x BOXES mailboxes.

  populate: write MSGS messages into every mailbox as Maildir files (the initial state; run as root,
            files chowned to the mail user)
  warm:     one Dovecot `imap` process per user SELECTs every mailbox (builds Dovecot's indexes)
  cycle:    one "day": OPS operations split evenly over the users (one Dovecot `imap` process each, PREAUTH over
            stdio, as the unprivileged mail user, all users at once); each operation is with equal probability
            a delivery (APPEND of a new message to a random mailbox) or a delete (SELECT a random mailbox, UID
            STORE \\Deleted of a random message, EXPUNGE). Messages are random lowercase characters, length
            uniform in 1..MAX bytes. Prints JSON counts.
"""
from __future__ import annotations

import argparse
import imaplib
import json
import multiprocessing as mp
import os
import random
import sys
import time
from pathlib import Path

from .imap_client import imap_command

_LOWER = bytes((ord("a") + b % 26) for b in range(256))


def message(rng: random.Random, max_len: int) -> bytes:
    """A message of random lowercase characters (CRLF every 76), total body length uniform in 1..max_len."""
    n = rng.randint(1, max_len)
    body = rng.randbytes(n).translate(_LOWER)
    lines = [body[i:i + 76] for i in range(0, len(body), 76)]
    return b"Subject: aging\r\n\r\n" + b"\r\n".join(lines) + b"\r\n"


def box_dir(root: Path, user: int, box: int) -> Path:
    return root / f"user{user}" / f".box{box}"


def populate(args) -> dict:
    root = Path(args.root)
    rng = random.Random(args.seed)
    nbytes = 0
    for u in range(args.users):
        for d in ("cur", "new", "tmp"):
            (root / f"user{u}" / d).mkdir(parents=True, exist_ok=True)
        for b in range(args.boxes):
            box = box_dir(root, u, b)
            for d in ("cur", "new", "tmp"):
                (box / d).mkdir(parents=True, exist_ok=True)
            (box / "maildirfolder").touch()
            for j in range(args.msgs):
                msg = message(rng, args.max_msg)
                (box / "cur" / f"{1700000000 + j}.M{j}P{u}x{b}.aging,S={len(msg)}:2,S").write_bytes(msg)
                nbytes += len(msg)
    for dp, dn, fn in os.walk(root):
        os.chown(dp, args.uid, args.gid)
        for f in fn:
            os.chown(os.path.join(dp, f), args.uid, args.gid)
    return {"messages": args.users * args.boxes * args.msgs, "bytes": nbytes}


def _session(args, user: int):
    ns = argparse.Namespace(**vars(args))
    ns.user = f"user{user}"
    return imaplib.IMAP4_stream(imap_command(ns))


def warm(args) -> dict:
    for u in range(args.users):
        M = _session(args, u)
        for b in range(args.boxes):
            typ, data = M.select(f"box{b}")
            if typ != "OK":
                raise RuntimeError(f"user{u} SELECT box{b}: {data}")
        M.logout()
    return {"ok": True}


def _user_ops(args, user: int, ops: int, q) -> None:
    try:
        rng = random.Random(args.seed * 1000 + user)
        M = _session(args, user)
        counts = {"deliver": 0, "delete": 0, "empty": 0, "bytes": 0, "not_ok": 0}
        for _ in range(ops):
            box = f"box{rng.randrange(args.boxes)}"
            if rng.random() < 0.5:
                msg = message(rng, args.max_msg)
                typ, _d = M.append(box, None, None, msg)
                counts["deliver"] += 1
                counts["bytes"] += len(msg)
            else:
                typ, _d = M.select(box)
                if typ == "OK":
                    typ, data = M.uid("SEARCH", None, "ALL")
                    uids = data[0].split() if typ == "OK" and data and data[0] else []
                    if not uids:
                        counts["empty"] += 1
                        continue
                    typ, _d = M.uid("STORE", rng.choice(uids).decode(), "+FLAGS.SILENT", "(\\Deleted)")
                    if typ == "OK":
                        typ, _d = M.expunge()
                counts["delete"] += 1
            if typ != "OK":
                counts["not_ok"] += 1
        M.logout()
        q.put(("ok", counts))
    except Exception as e:  # noqa: BLE001 - reported to the parent
        q.put(("error", f"user{user}: {type(e).__name__}: {e}"))


def cycle(args) -> dict:
    q: mp.Queue = mp.Queue()
    per = [args.ops // args.users + (1 if u < args.ops % args.users else 0) for u in range(args.users)]
    procs = [mp.Process(target=_user_ops, args=(args, u, per[u], q)) for u in range(args.users)]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    results = [q.get(timeout=args.timeout) for _ in procs]
    for p in procs:
        p.join()
    errors = [r[1] for r in results if r[0] == "error"]
    if errors:
        raise RuntimeError("; ".join(errors))
    total: dict = {}
    for _, c in results:
        for k, v in c.items():
            total[k] = total.get(k, 0) + v
    total["seconds"] = time.monotonic() - t0
    return total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m bench.workloads.mail_aging")
    ap.add_argument("mode", choices=["populate", "warm", "cycle"])
    ap.add_argument("--root", help="mail root (populate)")
    ap.add_argument("--conf", default="", help="dovecot config with mail_location = maildir:ROOT/%%u")
    ap.add_argument("--uid", type=int, required=True)
    ap.add_argument("--gid", type=int, required=True)
    ap.add_argument("--users", type=int, default=2)
    ap.add_argument("--boxes", type=int, default=80)
    ap.add_argument("--msgs", type=int, default=1000)
    ap.add_argument("--ops", type=int, default=8000)
    ap.add_argument("--max-msg", type=int, default=32768)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--log", default="")
    args = ap.parse_args(argv)
    out = {"populate": populate, "warm": warm, "cycle": cycle}[args.mode](args)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
