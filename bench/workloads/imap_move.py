"""The Featherstitch IMAP experiment on Dovecot (docs/PATCHGROUPS.md; the seed's evaluation, §6):
move every message of one Maildir folder to another over IMAP, one message at a time.

One Dovecot `imap` process in PREAUTH mode over stdio (imaplib.IMAP4_stream), as the unprivileged
benchmark user, with a config of its own (mail_fsync=optimized or never). Modes:
- copy: SELECT src; per message UID COPY to dst and UID STORE +FLAGS (\\Deleted); then EXPUNGE,
  CHECK, CLOSE, LOGOUT (the sequence Featherstitch's expect script sent to UW IMAP);
- move: SELECT src; per message UID MOVE to dst; CLOSE, LOGOUT.

  python3 -m bench.workloads.imap_move fill   --dir MAILROOT --box src --msgs N --uid U --gid G
  python3 -m bench.workloads.imap_move run    --conf C --uid U --gid G --src src --dst dst --mode copy|move
                                              [--preload SO --pg-path DIR] [--final CMD]
  python3 -m bench.workloads.imap_move check  --conf C --uid U --gid G --dir MAILROOT --boxes src,dst --ids FILE

`run` prints JSON: seconds (from SELECT to LOGOUT, plus the --final command: the patchgroup path's
one durable sync), messages moved, NO/BAD replies. `check` opens every folder through Dovecot and
compares with the files: see its docstring.
"""
from __future__ import annotations

import argparse
import imaplib
import json
import os
import random
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

IMAP_BIN = "/usr/lib/dovecot/imap"
MSG_SIZE = 2000  # the seed's messages: about 2 kB each


def imap_command(args) -> str:
    env = ["USER=amabench", "HOME=/nonexistent", "PATH=/usr/bin:/bin"]
    if getattr(args, "preload", None):
        env += [f"LD_PRELOAD={shlex.quote(args.preload)}", f"AMARANTH_PG_PATH={shlex.quote(args.pg_path)}"]
    log = shlex.quote(args.log) if getattr(args, "log", None) else "/dev/null"
    return (f"exec setpriv --reuid={args.uid} --regid={args.gid} --clear-groups env -i {' '.join(env)} "
            f"{IMAP_BIN} -c {shlex.quote(args.conf)} 2>>{log}")


def message(rng: random.Random, n: int) -> tuple[str, bytes]:
    mid = f"<{n}.{rng.getrandbits(48):012x}@amaranth-imapmove>"
    hdr = (f"From: sender{n % 97}@example.org\r\nTo: amabench@example.org\r\nSubject: message {n}\r\n"
           f"Date: Mon, 1 Jan 2024 00:00:00 +0000\r\nMessage-ID: {mid}\r\n\r\n")
    line = "The quick brown fox jumps over the lazy dog; " * 2
    body = ""
    while len(hdr) + len(body) < MSG_SIZE:
        body += line.strip() + "\r\n"
    return mid, (hdr + body).encode()


def cmd_fill(args) -> int:
    """Writes a Maildir folder of N messages directly (untimed setup) and lists their Message-IDs."""
    rng = random.Random(args.seed)
    box = Path(args.dir) / f".{args.box}"
    for d in ("cur", "new", "tmp"):
        (box / d).mkdir(parents=True, exist_ok=True)
    (box / "maildirfolder").touch()
    ids = []
    for n in range(args.msgs):
        mid, data = message(rng, n)
        ids.append(mid)
        (box / "cur" / f"{1700000000 + n}.M{n}P1.imapmove,S={len(data)}:2,S").write_bytes(data)
    for dp, _, fn in os.walk(args.dir):
        os.chown(dp, args.uid, args.gid)
        for f in fn:
            os.chown(os.path.join(dp, f), args.uid, args.gid)
    if args.ids:
        Path(args.ids).write_text("\n".join(ids) + "\n")
    print(json.dumps({"messages": len(ids)}))
    return 0


def _ok(typ, data, what):
    if typ != "OK":
        raise RuntimeError(f"{what}: {typ} {data}")


def cmd_run(args) -> int:
    M = imaplib.IMAP4_stream(imap_command(args))
    t0 = time.monotonic()
    typ, data = M.select(args.src)
    _ok(typ, data, f"SELECT {args.src}")
    typ, data = M.uid("SEARCH", None, "ALL")
    _ok(typ, data, "UID SEARCH")
    uids = data[0].split() if data and data[0] else []
    not_ok = 0
    for i, uid in enumerate(uids):
        if args.progress:
            print(f"moving {i}", flush=True)
        if args.pace:
            time.sleep(args.pace)
        u = uid.decode()
        if args.mode == "move":
            typ, _ = M.uid("MOVE", u, args.dst)
            not_ok += typ != "OK"
        else:
            typ, _ = M.uid("COPY", u, args.dst)
            not_ok += typ != "OK"
            typ, _ = M.uid("STORE", u, "+FLAGS.SILENT", r"(\Deleted)")
            not_ok += typ != "OK"
    if args.mode == "copy":
        typ, data = M.expunge()
        _ok(typ, data, "EXPUNGE")
        M.check()
    M.close()
    M.logout()
    if args.final:
        subprocess.run(args.final, shell=True, check=True)
    t1 = time.monotonic()
    print(json.dumps({"seconds": t1 - t0, "moved": len(uids), "not_ok": not_ok}))
    return 0


_MID = re.compile(rb"^Message-ID:\s*(\S+)", re.I | re.M)


def _file_ids(box: Path) -> list[str]:
    out = []
    for d in ("cur", "new"):
        p = box / d
        if not p.is_dir():
            continue
        for f in p.iterdir():
            m = _MID.search(f.read_bytes()[:4096])
            if m:
                out.append(m.group(1).decode())
    return out


def cmd_check(args) -> int:
    """After a crash: Dovecot selects every folder of --boxes without a NO/BAD; after that resync
    (SELECT rescans the Maildir and finishes what its index says was under way) the folder's
    message count and Message-IDs agree with its files; every message of --ids is in one of the
    folders (by Message-ID; duplicates, the safe direction, are counted). Prints JSON; exit 1 if
    anything is wrong."""
    want = [x for x in Path(args.ids).read_text().split() if x]
    root = Path(args.dir)
    M = imaplib.IMAP4_stream(imap_command(args))
    found: dict[str, int] = {}
    counts: dict[str, int] = {}
    problems = []
    for b in args.boxes.split(","):
        # SELECT first: it is Dovecot's resync of the folder (it may finish an expunge that the
        # crash interrupted, logged in its index before the file was unlinked); the files are
        # compared with what Dovecot then sees.
        typ, data = M.select(b)
        if typ != "OK":
            problems.append(f"SELECT {b}: {typ} {data}")
            continue
        files = _file_ids(root / f".{b}")
        count = int(data[0])
        imap_ids = []
        if count:
            typ, data = M.fetch("1:*", "(BODY.PEEK[HEADER.FIELDS (MESSAGE-ID)])")
            if typ != "OK":
                problems.append(f"FETCH {b}: {typ}")
            for part in data:
                if isinstance(part, tuple):
                    m = _MID.search(part[1])
                    if m:
                        imap_ids.append(m.group(1).decode())
        if count != len(files) or sorted(imap_ids) != sorted(files):
            problems.append(f"{b}: Dovecot sees {count} messages, the folder holds {len(files)} files")
        counts[b] = len(files)
        for i in files:
            found[i] = found.get(i, 0) + 1
        M.close()
    M.logout()
    lost = [i for i in want if i not in found]
    dups = sum(1 for i in want if found.get(i, 0) > 1)
    if lost:
        problems.append(f"{len(lost)} messages lost, e.g. {lost[:3]}")
    print(json.dumps({"messages": len(want), "lost": len(lost), "duplicates": dups, "counts": counts,
                      "problems": problems}))
    return 1 if problems else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fill")
    f.add_argument("--dir", required=True)
    f.add_argument("--box", required=True)
    f.add_argument("--msgs", type=int, required=True)
    f.add_argument("--ids")
    f.add_argument("--seed", type=int, default=42)
    for p in (f,):
        p.add_argument("--uid", type=int, required=True)
        p.add_argument("--gid", type=int, required=True)
    for name in ("run", "check"):
        p = sub.add_parser(name)
        p.add_argument("--conf", required=True)
        p.add_argument("--uid", type=int, required=True)
        p.add_argument("--gid", type=int, required=True)
        p.add_argument("--log")
        if name == "run":
            p.add_argument("--src", required=True)
            p.add_argument("--dst", required=True)
            p.add_argument("--mode", choices=["copy", "move"], required=True)
            p.add_argument("--preload")
            p.add_argument("--pg-path")
            p.add_argument("--final", help="a shell command run after LOGOUT, inside the timing")
            p.add_argument("--progress", action="store_true", help="print a line before each message")
            p.add_argument("--pace", type=float, default=0.0, help="seconds to wait before each message")
        else:
            p.add_argument("--dir", required=True)
            p.add_argument("--boxes", required=True)
            p.add_argument("--ids", required=True)
    args = ap.parse_args(argv)
    return {"fill": cmd_fill, "run": cmd_run, "check": cmd_check}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
