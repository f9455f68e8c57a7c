"""Crash test of the IMAP move workload on Amaranth without fsync (issue 12): Dovecot with
mail_fsync=never moves messages between two Maildir folders (UID MOVE, or COPY + STORE \\Deleted +
EXPUNGE, alternately) and the daemon is killed (SIGKILL) at a random point, `imap_crash_cycles`
times. After each kill: fsck is clean, the image mounts, the dotlocks the killed Dovecot left are
removed (Dovecot overrides them only after 2 minutes), every message is in the source or the
destination folder (by Message-ID; a duplicate is the safe direction and is counted), Dovecot
selects both folders without errors, and after its own resync (SELECT rescans the Maildir) its
message count and Message-IDs agree with the files. Amaranth only (kernel file systems have no
daemon to kill); not part of `all` (select it by name)."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from . import Info, Metric, Param
from ._common import need
from .. import fs as fsmod
from ..runner import BenchFailure
from ..util import PROGRESS
from ..util import run as sh

NAMES = ["imapcrash"]
GROUP = "extra"  # see GROUPS in __init__.py
# Seconds between messages: the move spans several of the daemon's 1 s log flushes, so a kill finds
# part of it durable (without any fsync) and part of it lost.
PACE = 0.01
NEEDS = {"mail_user"}
# Parameters (`--set name=value`; `quick`: the value under --quick, where it differs).
PARAMS = {
    "imap_crash_cycles": Param(50, quick=3),
    "imap_crash_msgs": Param(300, quick=40),
}
REPO = Path(__file__).resolve().parents[2]

INFO = {
    "imapcrash": Info(
        "imapcrash", "IMAP move killed at random points (Amaranth, no fsync)",
        "`imap_crash_cycles` cycles: `imap_crash_msgs` messages moved by Dovecot (mail_fsync=never; UID MOVE and "
        "COPY+STORE+EXPUNGE alternately, 10 ms between messages so that a move spans several 1 s log flushes), the "
        "daemon SIGKILLed at a random point (0-20 ms after the client started on a random message, or after the "
        "last); then fsck, remount, the killed Dovecot's dotlocks removed (Dovecot would override them after 2 "
        "min), and the check: no message lost, Dovecot opens both folders, its index agrees with "
        "the files",
        "issue 12's Dovecot crash test (Featherstitch's IMAP workload without fsync)",
        [Metric("crash", "lost_messages", "messages lost (must be 0)", "", False),
         Metric("crash", "problem_cycles", "cycles with a problem (must be 0)", "", False)],
        secondary=[Metric("crash", "cycles", "kills", "", None),
                   Metric("crash", "kills_during_move", "kills while the move was running", "", None),
                   Metric("crash", "duplicates", "messages in both folders after a kill", "", None),
                   Metric("crash", "kills_with_moves_kept", "kills after which some moves had survived", "", None),
                   Metric("crash", "stale_locks", "Dovecot dotlocks left by a kill (removed before the check)",
                          "", None)]),
}


def check(env, names):
    if not Path("/usr/lib/dovecot/imap").exists():
        raise RuntimeError("/usr/lib/dovecot/imap missing: install dovecot-imapd (scripts/install-deps.sh --bench)")
    need(env, "mail_user")


def _kill_daemon(ctx) -> None:
    """SIGKILL the daemon, detach the dead mount, wait until the image is free."""
    drv = ctx.m.driver
    pid = drv.pid
    os.kill(pid, signal.SIGKILL)
    for _ in range(600):
        if not os.path.exists(f"/proc/{pid}"):
            break
        time.sleep(0.05)
    sh(["fusermount3", "-u", "-z", str(ctx.mnt)], check=False)
    if fsmod.is_mounted(ctx.mnt):
        sh(["umount", "-l", str(ctx.mnt)], check=False)
    drv.pid = None
    ctx.m.mounted = False


def _fsck(ctx) -> str:
    """`amaranth fsck` of the device; retried while a dying daemon's thread still holds the image."""
    for _ in range(120):
        r = sh([str(ctx.m.driver.bin), "fsck", ctx.loop.dev], check=False, timeout=600)
        if r.rc != 8:
            break
        time.sleep(0.5)
    # Exit 4 with only benign problems: a file unlinked while open (Dovecot's temporary files),
    # which the next mount removes (docs/GUARANTEES.md).
    benign_only = r.rc == 4 and " 0 corruption" in r.stdout and "OrphanInode" in r.stdout
    if r.rc != 0 and not benign_only:
        raise BenchFailure(f"fsck after the kill exited {r.rc}: {r.stdout[-500:]} {r.stderr[-500:]}")
    return r.stdout


def _clear_locks(root: Path) -> int:
    """Removes the dotlocks the killed Dovecot left (durable like any file). No Dovecot process is
    alive at this point; Dovecot itself would override such a lock only after watching it unchanged
    for 2 minutes (the check would just wait). Returns how many there were."""
    n = 0
    for lock in root.rglob("*.lock"):
        lock.unlink()
        n += 1
    return n


def _cycle(ctx, cycle: int, rng: random.Random, root: Path, conf: Path, uid: int, gid: int, log: Path) -> dict:
    p = ctx.p
    client = [sys.executable, "-m", "bench.workloads.imap_move"]
    src, dst = f"src{cycle}", f"dst{cycle}"
    ids = ctx.mnt.parent / f"imapcrash-ids-{cycle}"
    ids_arg = ["--uid", str(uid), "--gid", str(gid)]
    run_cmd = lambda c, **kw: sh(c, cwd=REPO, timeout=p.timeout, **kw)  # noqa: E731
    run_cmd(client + ["fill", "--dir", str(root), "--box", src, "--msgs", str(p.imap_crash_msgs), "--ids",
                      str(ids), "--seed", str(cycle)] + ids_arg)
    run_cmd(client + ["fill", "--dir", str(root), "--box", dst, "--msgs", "0"] + ids_arg)
    ctx.sync()  # the folders are durable before the moves start
    mode = "move" if cycle % 2 == 0 else "copy"
    mover = subprocess.Popen(client + ["run", "--conf", str(conf), "--log", str(log), "--src", src, "--dst", dst,
                                       "--mode", mode, "--progress", "--pace", str(PACE)] + ids_arg, cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
    # A random point: after the mover has started on message k (0..M; M: after the last one).
    target = rng.randrange(p.imap_crash_msgs + 1)
    for line in mover.stdout:
        if line.startswith("moving ") and int(line.split()[1]) >= target:
            break
    time.sleep(rng.uniform(0, 0.02))
    during = mover.poll() is None
    _kill_daemon(ctx)
    mover.kill()
    mover.wait()
    _fsck(ctx)
    ctx.m.mount()
    stale = _clear_locks(root)
    r = run_cmd(client + ["check", "--conf", str(conf), "--log", str(log), "--dir", str(root), "--boxes",
                          f"{src},{dst}", "--ids", str(ids)] + ids_arg, check=False)
    j = json.loads(r.stdout.strip().splitlines()[-1])
    j.update(cycle=cycle, mode=mode, during=during, target=target, stale_locks=stale)
    return j


def run(ctx, names):
    if not ctx.is_amaranth:
        raise fsmod.FsUnavailable("imapcrash kills the Amaranth daemon: Amaranth only")
    p = ctx.p
    uid, gid = need(ctx.env, "mail_user")
    root = ctx.mnt / "mail"
    for d in ("", "cur", "new", "tmp"):
        (root / d).mkdir(exist_ok=True)
        os.chown(root / d, uid, gid)
    conf = ctx.mnt.parent / "dovecot-imapcrash.conf"
    conf.write_text(f"mail_location = maildir:{root}\nmail_fsync = never\n")
    log = ctx.env.results / "logs" / f"dovecot-imapcrash-r{ctx.rep}.log"
    rng = random.Random(1000 + ctx.rep)
    results = []
    for cycle in range(p.imap_crash_cycles):
        with PROGRESS.step(f"imapcrash cycle {cycle + 1}/{p.imap_crash_cycles}") as info:
            j = _cycle(ctx, cycle, rng, root, conf, uid, gid, log)
            info["result"] = (f"{j['mode']}, killed at message {j['target']}, folders {j['counts']}, lost {j['lost']}, "
                              f"duplicates {j['duplicates']}, problems {len(j['problems'])}")
        results.append(j)
    ctx.save_json("imapcrash", results)
    bad = [j for j in results if j["problems"]]
    ctx.record("imapcrash", "crash", "cycles", len(results), "")
    ctx.record("imapcrash", "crash", "kills_during_move", sum(j["during"] for j in results), "")
    ctx.record("imapcrash", "crash", "lost_messages", sum(j["lost"] for j in results), "")
    ctx.record("imapcrash", "crash", "duplicates", sum(j["duplicates"] for j in results), "")
    ctx.record("imapcrash", "crash", "stale_locks", sum(j["stale_locks"] for j in results), "")
    ctx.record("imapcrash", "crash", "kills_with_moves_kept",
               sum(j["counts"].get(f"dst{j['cycle']}", 0) > 0 for j in results), "")
    ctx.record("imapcrash", "crash", "problem_cycles", len(bad), "")
    if bad:
        raise BenchFailure(f"{len(bad)} of {len(results)} cycles failed the check, first: {bad[0]}")

