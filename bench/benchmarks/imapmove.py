"""Featherstitch's IMAP experiment (SOSP'07 §6; issue 12): Dovecot moves every message of a Maildir
folder to another, one IMAP command at a time, with fsync, without it, and (Amaranth) with
fsync as an ordering point: the mount option `fsync=ordered`, and patchgroups through an
LD_PRELOAD shim (bench/helpers/pgfsync.c) with one durable `amaranth pg sync` at the end."""
from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from . import Info, Metric, Param
from ._common import need
from ..util import PROGRESS
from ..util import run as sh

NAMES = ["imapmove"]
GROUP = "main"  # see GROUPS in __init__.py
NEEDS = {"mail_user"}
# Parameters (`--set name=value`; `quick`: the value under --quick, where it differs).
PARAMS = {
    "imap_msgs": Param(1000, quick=30),
}
IMAP_BIN = Path("/usr/lib/dovecot/imap")
REPO = Path(__file__).resolve().parents[2]

# (configuration, Dovecot's mail_fsync, Amaranth only)
CONFIGS = [("optimized", "optimized", False), ("never", "never", False),
           ("patchgroup", "optimized", True), ("ordered", "optimized", True)]
MODES = ["copy", "move"]


def _metric(phase: str, label: str) -> Metric:
    return Metric(phase, "seconds_incl_sync", label, "s", False)


INFO = {
    "imapmove": Info(
        "imapmove", "IMAP move (Dovecot, Maildir): fsync vs ordering",
        "`imap_msgs` messages of ~2 kB in one Maildir folder, moved to another by one Dovecot `imap` process "
        "(PREAUTH over stdio, as an unprivileged user): `copy` = per message UID COPY + UID STORE \\Deleted, then "
        "EXPUNGE (the sequence Featherstitch sent UW IMAP); `move` = per message UID MOVE. Configurations: "
        "`optimized` (mail_fsync=optimized: 2 fdatasyncs per message), `never` (no fsync: the unsafe lower "
        "bound), Amaranth only: `ordered` (optimized on a mount with -o fsync=ordered) and `patchgroup` "
        "(optimized, each fsync turned into a patchgroup ordering point by an LD_PRELOAD shim, one "
        "`amaranth pg sync` at the end). Seconds from SELECT to LOGOUT (+ the final sync) + syncfs after",
        "Featherstitch SOSP'07 §6 IMAP benchmark (UW IMAP, mbox, 1,000 messages of ~2 kB; moved with COPY+STORE+"
        "EXPUNGE); here Dovecot 2.3 with Maildir, both COPY+STORE+EXPUNGE and UID MOVE",
        [_metric(f"{c}-{m}", f"{c}, {m}") for c, _, a in CONFIGS if not a for m in MODES],
        secondary=[_metric(f"{c}-{m}", f"{c}, {m} (Amaranth only)") for c, _, a in CONFIGS if a
                   for m in MODES]
        + [Metric(f"{c}-{m}", metric, f"{c}, {m}: {what}", unit, False)
           for c, _, _ in CONFIGS for m in MODES
           for metric, what, unit in (("write_requests", "write requests", ""), ("dev_flushes", "device flushes", ""),
                                      ("cpu_s", "client + Dovecot CPU", "s"),
                                      ("daemon_cpu_s", "Amaranth daemon CPU", "s"))]),
}


def check(env, names):
    if not IMAP_BIN.exists():
        raise RuntimeError(f"{IMAP_BIN} missing: install dovecot-imapd (scripts/install-deps.sh --bench)")
    need(env, "mail_user")


def _preload(ctx) -> Path:
    """The LD_PRELOAD shim, compiled once per source version into the work dir."""
    lib = REPO / "clients" / "libamaranth_pg"
    srcs = [REPO / "bench" / "helpers" / "pgfsync.c", lib / "amaranth_pg.c", lib / "amaranth_pg.h"]
    h = hashlib.sha256(b"".join(p.read_bytes() for p in srcs)).hexdigest()[:12]
    out = ctx.env.workdir / "helpers" / f"pgfsync-{h}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        with PROGRESS.step("compile the patchgroup fsync shim"):
            sh(["gcc", "-O2", "-Wall", "-shared", "-fPIC", "-I", str(lib), "-o", str(out) + ".tmp",
                 str(srcs[0]), str(srcs[1]), "-ldl"])
            os.replace(str(out) + ".tmp", out)
    os.chmod(out, 0o755)
    return out


def _remount(ctx, extra: list[str]) -> None:
    ctx.m.driver.extra_mount_args = extra
    ctx.cold()


def run(ctx, names):
    p = ctx.p
    uid, gid = need(ctx.env, "mail_user")
    root = ctx.mnt / "mail"
    for d in ("", "cur", "new", "tmp"):
        (root / d).mkdir(exist_ok=True)
        os.chown(root / d, uid, gid)
    log = ctx.env.results / "logs" / f"dovecot-imapmove-{ctx.fs}-r{ctx.rep}.log"
    client = [sys.executable, "-m", "bench.workloads.imap_move"]
    ids = {"uid": str(uid), "gid": str(gid)}
    for config, mail_fsync, amaranth_only in CONFIGS:
        if amaranth_only and not ctx.is_amaranth:
            continue
        if config == "ordered":
            _remount(ctx, ["-o", "fsync=ordered"])
        conf = ctx.mnt.parent / f"dovecot-{config}.conf"  # the run dir, not the FS under test
        text = f"mail_location = maildir:{root}\nmail_fsync = {mail_fsync}\n"
        if config == "patchgroup":
            # Dovecot executes itself again through doveconf with a cleaned environment: keep the
            # shim and its state (bench/helpers/pgfsync.c).
            text += "import_environment = TZ LD_PRELOAD AMARANTH_PG_PATH AMARANTH_PG_GROUP AMARANTH_PG_TRACE\n"
        conf.write_text(text)
        common = ["--conf", str(conf), "--uid", ids["uid"], "--gid", ids["gid"], "--log", str(log)]
        for mode in MODES:
            phase = f"{config}-{mode}"
            src, dst = f"src-{phase}", f"dst-{phase}"
            ctx.untimed(client + ["fill", "--dir", str(root), "--box", src, "--msgs", str(p.imap_msgs),
                                  "--uid", ids["uid"], "--gid", ids["gid"]],
                        f"{p.imap_msgs} messages into {src} (untimed)", cwd=REPO)
            ctx.untimed(client + ["fill", "--dir", str(root), "--box", dst, "--msgs", "0",
                                  "--uid", ids["uid"], "--gid", ids["gid"]], f"empty {dst}", cwd=REPO)
            ctx.sync()
            extra = []
            if config == "patchgroup":
                extra = ["--preload", str(_preload(ctx)), "--pg-path", str(root)]
            if config in ("patchgroup", "ordered"):
                # fsync orders but does not wait: one durable sync at the end (the harness's syncfs
                # after the phase does not reach a FUSE daemon, and its fsync of the root
                # directory is an ordering point on an fsync=ordered mount).
                extra += ["--final", f"{ctx.m.driver.bin} pg sync -C {root}"]
            r = ctx.timed("imapmove", phase, client + ["run"] + common +
                          ["--src", src, "--dst", dst, "--mode", mode] + extra,
                          kind="write", cwd=REPO, record_seconds=False,
                          label=f"{mode} {p.imap_msgs} messages, {config}")
            j = ctx.helper_json(r)
            if j["moved"] != p.imap_msgs or j["not_ok"]:
                raise RuntimeError(f"{phase}: moved {j['moved']} of {p.imap_msgs}, {j['not_ok']} NO/BAD replies")
            ctx.save_json(f"imapmove-{phase}", j)
            ctx.record("imapmove", phase, "seconds", j["seconds"], "s")
            ctx.record("imapmove", phase, "seconds_incl_sync", j["seconds"] + r.extra["sync_s"], "s")
    if ctx.is_amaranth:
        ctx.m.driver.extra_mount_args = []  # the driver lives for this run only; no remount needed
