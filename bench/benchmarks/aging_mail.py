"""Mail-server aging (FAST'17 section 7): Dovecot/Maildir deliveries and deletes in cycles; after every
cycle a cold grep of the mail store on the aged FS and on a fresh copy of it."""
from __future__ import annotations

import sys
from pathlib import Path

from . import Info, Metric, Param
from ..util import K
from ._common import need
from .mailserver import IMAP_BIN, USER
from ..aging import Eta, aged_and_unaged, point_log
from ..resume import Points

NAMES = ["aging-mail"]
GROUP = "aging"  # see GROUPS in __init__.py
RESUME = "image"  # --resume continues after the last completed cycle, on a copy of the aged image (bench/resume.py)
NEEDS = {"mail_user"}
# Parameters (`--set name=value`; `quick`: the value under --quick, where it differs).
PARAMS = {
    "aging_mail_users": Param(2),
    "aging_mail_boxes": Param(80, quick=3),  # per user
    "aging_mail_msgs": Param(1000, quick=40),  # per mailbox, initially
    "aging_mail_ops": Param(8000, quick=200),  # per cycle
    "aging_mail_cycles": Param(100, quick=2),
    "aging_mail_max_msg": Param(32 * K, size=True),
}
HERE = Path(__file__).resolve().parents[2]

INFO = {
    "aging-mail": Info(
        "aging-mail", "Aging: mail server (Dovecot Maildir, cold grep, aged vs. fresh copy)",
        "`aging_mail_users` users × `aging_mail_boxes` Maildir mailboxes × `aging_mail_msgs` messages written "
        "into the FS and indexed by Dovecot (untimed); then `aging_mail_cycles` cycles of `aging_mail_ops` "
        "operations through Dovecot `imap` processes (PREAUTH over stdio, one per user, all users at once): half "
        "deliveries (APPEND of random lowercase characters, 1 to `aging_mail_max_msg` bytes, uniform), half "
        "deletes (STORE \\Deleted + EXPUNGE of a random message of a random mailbox) [cycle, timed, +syncfs]. "
        "At 0 and after every cycle: cold, quiet, `grep -r` of the mail store for a random string [aged]; "
        "`cp -a` onto a fresh FS of the same kind, cold, quiet, same grep [unaged]",
        "FAST'17 mail-server workload (Dovecot Maildir, 2 users × 80 mailboxes × 1,000 messages, cycles of 8,000 "
        "operations, 100 cycles, grep after every cycle, aged vs. fresh copy)",
        [Metric("aged", "s_per_gib", "grep cost, aged", "s/GiB", False),
         Metric("unaged", "s_per_gib", "grep cost, fresh copy", "s/GiB", False)],
        ["aged", "unaged"], ["aging"],
        secondary=[Metric("cycle", "seconds_incl_sync", "cycle time (+syncfs)", "s", False)]),
}


def check(env, names):
    if not IMAP_BIN.exists():
        raise RuntimeError(f"{IMAP_BIN} missing: install dovecot-imapd (scripts/install-deps.sh --bench)")
    need(env, "mail_user")


def run(ctx, names):
    p = ctx.p
    bench = "aging-mail"
    uid, gid = need(ctx.env, "mail_user")
    root = ctx.mnt / "mail"
    conf = ctx.mnt.parent / "dovecot-aging.conf"  # the run dir, not the FS under test
    conf.write_text(f"# minimal config for the aging benchmark's PREAUTH imap processes\n"
                    f"mail_location = maildir:{root}/%u\n")
    log = ctx.env.results / "logs" / f"dovecot-aging-{ctx.fs}-r{ctx.rep}-{ctx.view}.log"
    common = ["--uid", str(uid), "--gid", str(gid), "--users", str(p.aging_mail_users), "--boxes",
              str(p.aging_mail_boxes), "--msgs", str(p.aging_mail_msgs), "--max-msg", str(p.aging_mail_max_msg),
              "--conf", str(conf), "--log", str(log), "--timeout", str(p.timeout)]
    tool = [sys.executable, "-m", "bench.workloads.mail_aging"]
    cycles = p.aging_mail_cycles
    points = Points(ctx, bench, list(range(cycles + 1)), ["the setup"] + [f"cycle {c}" for c in range(1, cycles + 1)],
                    image=True)
    eta = Eta(cycles + 1, points.start)
    if points.start == 0:
        r = ctx.untimed(tool + ["populate", "--root", str(root), "--seed", str(p.rand_seed + ctx.rep)] + common,
                        f"write {p.aging_mail_users} x {p.aging_mail_boxes} mailboxes x {p.aging_mail_msgs} messages "
                        f"(untimed)", cwd=HERE)
        ctx.note_written(ctx.helper_json(r)["bytes"])
        ctx.untimed(tool + ["warm"] + common, "Dovecot indexes every mailbox (untimed)", cwd=HERE)
        ctx.sync()
        aged, unaged = aged_and_unaged(ctx, bench, root, 0)
        point_log(bench, 0, aged, unaged, eta, 1)
        points.done(0, {"files": aged["files"], "bytes": aged["bytes"]})
    elif not root.is_dir():
        raise RuntimeError(f"resumed on an image without the mail store {root}")
    for c in range(max(1, points.start), cycles + 1):
        r = ctx.timed(bench, "cycle", tool + ["cycle", "--ops", str(p.aging_mail_ops), "--seed",
                                              str(p.rand_seed * 100_000 + ctx.rep * 1000 + c)] + common,
                      kind="write", x=c, cwd=HERE, label=f"cycle {c}: {p.aging_mail_ops} operations")
        j = ctx.helper_json(r)
        ctx.note_written(j["bytes"])
        ctx.record(bench, "cycle", "not_ok_replies", j["not_ok"], "", x=c)
        if j["not_ok"] > p.aging_mail_ops // 100:
            raise RuntimeError(f"cycle {c}: {j['not_ok']} IMAP commands failed (see {log})")
        aged, unaged = aged_and_unaged(ctx, bench, root, c)
        point_log(bench, c, aged, unaged, eta, c + 1)
        points.done(c, {"files": aged["files"], "bytes": aged["bytes"]})
