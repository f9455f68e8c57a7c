"""Dovecot IMAP mail server with Maildir storage on the FS under test."""
from __future__ import annotations

import os
import random
import sys
from pathlib import Path

from . import Info, Metric, Param
from ._common import need
from ..util import PROGRESS

NAMES = ["mailserver"]
GROUP = "main"  # see GROUPS in __init__.py
ALIASES = {"imap": "mailserver"}
NEEDS = {"mail_user"}
# Parameters (`--set name=value`; `quick`: the value under --quick, where it differs).
PARAMS = {
    "mail_boxes": Param(10, quick=2),
    "mail_msgs": Param(1000, quick=40),
    "mail_clients": Param(4, quick=2),
    "mail_ops": Param(2000, quick=60),  # per client
}
USER = "amabench"
IMAP_BIN = Path("/usr/lib/dovecot/imap")

INFO = {
    "mailserver": Info(
        "mailserver", "IMAP mail server (Dovecot, Maildir)",
        "`mail_boxes` mailboxes x `mail_msgs` messages (~4 KiB median, written directly as Maildir files, then "
        "indexed by one untimed Dovecot pass), cold remount, then `mail_clients` client processes, each "
        "driving its own Dovecot `imap` process (PREAUTH over stdio, as an unprivileged user) with `mail_ops` "
        "operations: 50% reads (UID FETCH body), 50% writes (APPEND / STORE \\Deleted + EXPUNGE / flag change, "
        "1/3 each), switching mailbox every 10 operations; operations/s (+syncfs after)",
        "BetrFS macro/mailserver/imap-punish.py (Dovecot, 10 mailboxes x 2,500 messages, 8 processes x "
        "10,000 ops, 50% writes); here 4 clients, 10 x 1,000 messages",
        [Metric("imap", "ops_per_s", "IMAP operations/s", "ops/s", True)],
        ["imap"],
        secondary=[Metric("imap", "seconds", "time for all operations", "s", False),
                   Metric("imap", "seconds_incl_sync", "... + syncfs", "s", False),
                   Metric("imap", "not_ok_replies", "NO/BAD replies (races between clients)", "", None)]),
}


def check(env, names):
    if not IMAP_BIN.exists():
        raise RuntimeError(f"{IMAP_BIN} missing: install dovecot-imapd (scripts/install-deps.sh --bench)")
    need(env, "mail_user")


def run(ctx, names):
    p = ctx.p
    uid, gid = need(ctx.env, "mail_user")
    root = ctx.mnt / "mail"
    rng = random.Random(42)
    from ..workloads.imap_client import make_message

    written = 0
    with PROGRESS.step(f"create {p.mail_boxes} Maildir mailboxes x {p.mail_msgs} messages (untimed)"):
        for d in ("cur", "new", "tmp"):
            (root / d).mkdir(parents=True)
        for b in range(p.mail_boxes):
            box = root / f".box{b}"
            for d in ("cur", "new", "tmp"):
                (box / d).mkdir(parents=True)
            (box / "maildirfolder").touch()
            for j in range(p.mail_msgs):
                msg = make_message(rng, j)
                name = f"{1700000000 + j}.M{j}P{b}.amaranth-bench,S={len(msg)}:2,S"
                (box / "cur" / name).write_bytes(msg)
                written += len(msg)
        for dp, dn, fn in os.walk(root):
            os.chown(dp, uid, gid)
            for f in fn:
                os.chown(os.path.join(dp, f), uid, gid)
    ctx.note_written(written)
    conf = ctx.mnt.parent / "dovecot.conf"  # the run dir, not the FS under test
    conf.write_text(f"# minimal config for the benchmark's PREAUTH imap processes\nmail_location = maildir:{root}\n")
    log = ctx.env.results / "logs" / f"dovecot-{ctx.fs}-r{ctx.rep}.log"
    common = [sys.executable, "-m", "bench.workloads.imap_client", "--conf", str(conf), "--uid", str(uid), "--gid",
              str(gid), "--user", USER, "--boxes", str(p.mail_boxes), "--log", str(log)]
    here = Path(__file__).resolve().parents[2]
    ctx.untimed([common[0], common[1], common[2], "warm"] + common[3:], "Dovecot indexes every mailbox (untimed)",
                cwd=here)
    ctx.sync()
    r = ctx.timed("mailserver", "imap",
                  [common[0], common[1], common[2], "run"] + common[3:] +
                  ["--clients", str(p.mail_clients), "--ops", str(p.mail_ops), "--seed", "42"],
                  kind="write", cold=True, cwd=here, record_seconds=False,
                  label=f"{p.mail_clients} clients x {p.mail_ops} IMAP operations")
    j = ctx.helper_json(r)
    ctx.save_json("mailserver", j)
    ctx.record("mailserver", "imap", "ops_per_s", j["ops_per_s"], "ops/s")
    ctx.record("mailserver", "imap", "seconds", j["seconds"], "s")
    ctx.record("mailserver", "imap", "seconds_incl_sync", j["seconds"] + r.extra["sync_s"], "s")
    ctx.record("mailserver", "imap", "not_ok_replies", j["counts"].get("not_ok", 0), "")
