"""Per-point resume of the aging runs (bench/resume.py).

The unit tests run everywhere. `ResumeEndToEnd` runs the harness itself (root, loop devices, mkfs.ext4, Dovecot):
it is skipped unless BENCH_E2E=1 (bench/smoke.sh sets it, so `make test` runs it): the quick aging-mail on ext4
uninterrupted, then the same run killed with SIGKILL in the middle of a point, resumed, stopped with SIGTERM in
the middle of a later point, resumed again; every point must be in the CSV exactly once, with the file counts of
the uninterrupted run, and nothing may be left behind.
"""
import collections
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path
from types import SimpleNamespace

from bench import resume
from bench.aging import Eta, needle, point_rng
from bench.results import ResultWriter, Row, load

REPO = Path(__file__).resolve().parents[2]


def _state(**kw):
    st = {"version": resume.VERSION, "benchmark": "aging-mail", "fs": "ext4", "view": "disk", "rep": 1,
          "point": 3, "x": 3.0, "x_first": 0.0, "points_total": 21, "next": "cycle 4", "identity": {},
          "params": {"rand_seed": 42, "aging_mail_ops": 8000}, "image": None, "kind": "none"}
    st.update(kw)
    return st


class Rows(unittest.TestCase):
    def test_keeps_points_up_to_the_state(self):
        st = _state()
        row = lambda phase, x, err="": Row("aging-mail", "ext4", phase, 1, "m", 1.0, "", err, x)  # noqa: E731
        self.assertTrue(resume.keeps_row(st, row("aged", 0.0)))
        self.assertTrue(resume.keeps_row(st, row("cycle", 3.0)))
        self.assertTrue(resume.keeps_row(st, row("unaged", 3.0)))
        self.assertFalse(resume.keeps_row(st, row("cycle", 4.0)))  # the half-done point: redone
        self.assertFalse(resume.keeps_row(st, row("run", None)))  # whole-run totals: recorded at the end
        self.assertFalse(resume.keeps_row(st, row("cycle", None, "RuntimeError: x")))
        self.assertFalse(resume.keeps_row(None, row("aged", 0.0)))

    def test_writer_keeps_rows_and_replaces_the_file_whole(self):
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "results.csv"
            w = ResultWriter(path)
            for x in range(4):
                w.add(Row("aging-mail", "ext4", "aged", 1, "seconds", float(x), "s", "", float(x)))
            w2 = ResultWriter(path, keep=lambda r: r.x <= 1)
            self.assertEqual([r.x for r in load(path)], [0.0, 1.0])
            w2.add(Row("aging-mail", "ext4", "aged", 1, "seconds", 2.0, "s", "", 2.0))
            self.assertEqual([r.x for r in load(path)], [0.0, 1.0, 2.0])
            self.assertEqual(sorted(os.listdir(d)), ["results.csv"])  # no temp file left

    def test_describe(self):
        self.assertEqual(resume.describe(_state(image="/w/aged-3.img")),
                         "aging-mail on ext4: points 0–3 kept (4 of 21), continuing at cycle 4 from /w/aged-3.img")
        self.assertEqual(resume.describe(_state(point=0, x=0.0, next="cycle 1")),
                         "aging-mail on ext4: point 0 kept (1 of 21), continuing at cycle 1")


class Seeds(unittest.TestCase):
    def test_a_points_randomness_depends_on_the_point_alone(self):
        ctx = SimpleNamespace(p=SimpleNamespace(rand_seed=42), rep=1)
        a = [needle(ctx, "aging-mail", "aged", x) for x in range(5)]
        self.assertEqual(a, [needle(ctx, "aging-mail", "aged", x) for x in range(5)])  # same in a new run
        self.assertEqual(needle(ctx, "aging-mail", "aged", 3), a[3])  # and when started at point 3
        self.assertEqual(len(set(a)), 5)
        self.assertNotEqual(needle(ctx, "aging-mail", "unaged", 3), a[3])
        self.assertNotEqual(needle(SimpleNamespace(p=ctx.p, rep=2), "aging-mail", "aged", 3), a[3])
        self.assertEqual(point_rng(ctx, "b", "data", 10).randbytes(16), point_rng(ctx, "b", "data", 10).randbytes(16))

    def test_eta_counts_this_process_only(self):
        e = Eta(10, before=4)
        self.assertIn("resumed after 4", e.line(4))
        self.assertNotIn("left", e.line(4))


def _sparse(path: Path, chunks: dict[int, bytes], size: int = 64 << 20) -> None:
    with open(path, "wb") as f:
        f.truncate(size)
        for off, data in chunks.items():
            f.seek(off)
            f.write(data)


class Images(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.d = Path(self.tmp.name)
        self.results = self.d / "results"
        self.workdir = self.d / "work"
        self.idir = resume.image_dir(self.workdir, self.results, "aging-mail", "ext4", "disk", 1)
        self.idir.mkdir(parents=True)

    def tearDown(self):
        self.tmp.cleanup()

    def test_copy_is_sparse_and_equal(self):
        src, dst = self.idir / "a.img", self.idir / "b.img"
        _sparse(src, {0: b"x" * 4096, 40 << 20: os.urandom(1 << 20)})
        resume.copy_image(src, dst)
        self.assertEqual(src.read_bytes(), dst.read_bytes())
        self.assertLess(os.stat(dst).st_blocks * 512, 8 << 20)  # the holes stayed holes
        self.assertFalse(dst.with_name("b.img.tmp").exists())

    def test_restore_from_a_snapshot(self):
        snap = self.idir / "aged-3.img"
        _sparse(snap, {4096: b"state after point 3"})
        dead_live = self.idir / f"{resume.LIVE_PREFIX}999999999.img"  # a killed harness's live image
        _sparse(dead_live, {4096: b"half of point 4"})
        st = _state(image=str(snap), kind="snapshot")
        live = self.idir / f"{resume.LIVE_PREFIX}{os.getpid()}.img"
        resume.restore(st, self.results, live)
        self.assertEqual(live.read_bytes(), snap.read_bytes())
        self.assertFalse(dead_live.exists())
        self.assertEqual(sorted(p.name for p in self.idir.iterdir()), sorted([snap.name, live.name]))

    def test_restore_from_a_live_state_makes_its_copy_first(self):
        # killed while the live image (unmounted, in the state after point 3) was being copied
        old_live = self.idir / f"{resume.LIVE_PREFIX}999999999.img"
        _sparse(old_live, {8192: b"state after point 3"})
        (self.idir / "aged-3.img.tmp").write_bytes(b"half a copy")
        (self.idir / "aged-2.img").write_bytes(b"point 2: older")
        st = _state(image=str(old_live), kind="live")
        live = self.idir / f"{resume.LIVE_PREFIX}{os.getpid()}.img"
        resume.restore(st, self.results, live)
        saved = json.loads(resume.state_path(self.results, "aging-mail", "ext4", "disk", 1).read_text())
        self.assertEqual((saved["kind"], saved["image"]), ("snapshot", str(self.idir / "aged-3.img")))
        self.assertEqual(live.read_bytes(), (self.idir / "aged-3.img").read_bytes())
        self.assertEqual(live.read_bytes()[8192:8211], b"state after point 3")
        self.assertEqual(sorted(p.name for p in self.idir.iterdir()), sorted(["aged-3.img", live.name]))

    def test_prepare_drops_what_cannot_be_continued(self):
        params = {"rand_seed": 42, "aging_mail_ops": 8000}
        args = SimpleNamespace(amaranth_bin=self.d / "amaranth", amaranth_base_bin=None)
        args.amaranth_bin.write_bytes(b"build 1")
        snap = self.idir / "aged-3.img"
        _sparse(snap, {0: b"x"})
        good = _state(image=str(snap), kind="snapshot")
        other = dict(good, fs="amaranth", identity=resume.fs_identity("amaranth", args), image=None)
        for st in (good, other):
            resume.write_json_atomic(resume.state_path(self.results, st["benchmark"], st["fs"], "disk", 1), st)
        got = resume.prepare(self.results, self.workdir, params, args, set(), True)
        self.assertEqual(set(got), {("aging-mail", "ext4", "disk", 1), ("aging-mail", "amaranth", "disk", 1)})
        args.amaranth_bin.write_bytes(b"build 2")  # another binary: that run starts over
        got = resume.prepare(self.results, self.workdir, params, args, set(), True)
        self.assertEqual(set(got), {("aging-mail", "ext4", "disk", 1)})
        got = resume.prepare(self.results, self.workdir, dict(params, aging_mail_ops=100), args, set(), True)
        self.assertEqual(got, {})  # other parameters: every run starts over
        self.assertFalse((self.results / "resume").exists())
        self.assertFalse(self.idir.exists())


def _rows(csv_path: Path) -> list[dict]:
    with open(csv_path, newline="") as f:
        return list(csv.DictReader(f))


@unittest.skipUnless(os.environ.get("BENCH_E2E") == "1" and os.geteuid() == 0 and shutil.which("mkfs.ext4")
                     and Path("/usr/lib/dovecot/imap").exists(),
                     "end-to-end: needs root, mkfs.ext4 and Dovecot, and BENCH_E2E=1 (bench/smoke.sh sets it)")
class ResumeEndToEnd(unittest.TestCase):
    CYCLES = 3
    FS = os.environ.get("BENCH_E2E_FS", "ext4")

    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="amaranth-bench-resume-test.", dir="/var/tmp"))
        self.tmp.chmod(0o755)  # Dovecot runs as the mail user, in the mount under the work dir
        self.workdir = Path(os.environ.get("BENCH_E2E_WORKDIR") or self.tmp / "work")
        self.procs: list[subprocess.Popen] = []
        # the harness runs in sessions of its own (so that the test can kill all it started): if the test itself
        # is stopped (bench/smoke.sh's timeout), stop them and undo their mounts first
        self.old_term = signal.signal(signal.SIGTERM, self.on_term)

    def on_term(self, signum, frame):  # noqa: ARG002
        self.stop_all()
        raise SystemExit(128 + signum)

    def stop_all(self):
        signal.signal(signal.SIGTERM, self.old_term)
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        subprocess.run([sys.executable, "-m", "bench", "--cleanup", "--workdir", str(self.workdir)], cwd=REPO,
                       capture_output=True)

    def tearDown(self):
        self.stop_all()
        left = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
        if os.environ.get("BENCH_E2E_KEEP") == "1":
            print(f"kept: {self.tmp}", file=sys.stderr)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)
        self.assertNotIn(str(self.tmp), left, "a loop device of the test is still attached")

    def start(self, *args: str, log: str) -> subprocess.Popen:
        with open(self.tmp / log, "w") as f:
            p = subprocess.Popen([sys.executable, "-m", "bench", *args], cwd=REPO, start_new_session=True,
                                 stdout=f, stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p

    def run_args(self, out: str) -> list[str]:
        # BENCH_E2E_FS=amaranth BENCH_E2E_AMARANTH_BIN=PATH: the same test on Amaranth
        extra = ["--amaranth-bin", os.environ["BENCH_E2E_AMARANTH_BIN"]] if "BENCH_E2E_AMARANTH_BIN" in os.environ else []
        return ["--quick", "--bench", "aging-mail", "--fs", self.FS, "--no-fio", "--workdir", str(self.workdir),
                "--out", str(self.tmp / out), "--set", f"aging_mail_cycles={self.CYCLES}"] + extra

    def finish(self, p: subprocess.Popen, log: str, out: str) -> None:
        rc = p.wait(timeout=900)
        self.assertEqual(rc, 0, f"harness exit {rc}:\n" + (self.tmp / log).read_text()[-3000:])
        errors = [r["error"] for r in _rows(self.tmp / out / "results.csv") if r["error"]]
        self.assertEqual(errors, [], (self.tmp / log).read_text()[-3000:])

    def wait_for_row(self, p: subprocess.Popen, csv_path: Path, phase: str, x: int, timeout: float = 600) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if csv_path.exists() and any(r["phase"] == phase and r["x"] and float(r["x"]) == x
                                         for r in _rows(csv_path)):
                return
            self.assertIsNone(p.poll(), "the harness ended before the point to interrupt")
            time.sleep(0.2)
        self.fail(f"no {phase} row at x={x} after {timeout} s")

    def state(self, out: str) -> dict:
        return json.loads((self.tmp / out / "resume" / f"aging-mail-{self.FS}-disk-r1.json").read_text())

    def test_killed_and_stopped_run_resumes_to_the_uninterrupted_result(self):
        # the reference: uninterrupted
        ref = self.start(*self.run_args("ref"), log="ref.log")
        self.finish(ref, "ref.log", "ref")
        # killed with SIGKILL (the harness and everything it started, as when a session ends) once cycle 2 is
        # measured: point 2 is half done, the state is the one after point 1
        out = self.tmp / "cut"
        p = self.start(*self.run_args("cut"), log="cut-1.log")
        self.wait_for_row(p, out / "results.csv", "cycle", 2)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        st = self.state("cut")
        self.assertEqual((st["point"], st["x"], st["kind"]), (1, 1.0, "snapshot"))
        self.assertTrue(Path(st["image"]).exists())
        self.assertTrue(any(r["x"] and float(r["x"]) == 2 for r in _rows(out / "results.csv")))
        # resumed, then stopped with SIGTERM in the middle of point 3 (the harness cleans up, keeps the state)
        p = self.start("--resume", str(out), log="cut-2.log")
        self.wait_for_row(p, out / "results.csv", "cycle", 3)
        os.killpg(p.pid, signal.SIGTERM)
        self.assertEqual(p.wait(timeout=300), 130)
        log2 = (self.tmp / "cut-2.log").read_text()
        self.assertIn(f"aging-mail on {self.FS}: points 0–1 kept (2 of 4), continuing at cycle 2 from "
                      f"{st['image']}", log2)
        st = self.state("cut")
        self.assertEqual((st["point"], st["kind"]), (2, "snapshot"))
        live = [f for f in Path(st["image"]).parent.iterdir() if f.name.startswith(resume.LIVE_PREFIX)]
        self.assertEqual(live, [], "SIGTERM: the live image is removed, the copy of point 2 kept")
        # resumed to the end
        p = self.start("--resume", str(out), log="cut-3.log")
        self.finish(p, "cut-3.log", "cut")
        self.assertIn("points 0–2 kept (3 of 4), continuing at cycle 3", (self.tmp / "cut-3.log").read_text())

        ref_rows, rows = _rows(self.tmp / "ref" / "results.csv"), _rows(out / "results.csv")
        fx = lambda r: float(r["x"]) if r["x"] else None  # noqa: E731  (kept rows are written back as 1.0, new as 1)
        key = lambda r: (r["phase"], r["metric"], fx(r))  # noqa: E731
        count = collections.Counter(key(r) for r in rows)
        self.assertEqual({k: n for k, n in count.items() if n != 1}, {}, "a measurement recorded twice")
        self.assertEqual(set(count), {key(r) for r in ref_rows}, "not the measurements of the uninterrupted run")
        xs = sorted({float(r["x"]) for r in rows if r["x"]})
        self.assertEqual(xs, [float(c) for c in range(self.CYCLES + 1)])
        # the same mail store at every point: file counts as the uninterrupted run's
        counts = lambda rs: {(r["phase"], fx(r)): float(r["value"]) for r in rs  # noqa: E731
                             if r["metric"] == "files" and r["phase"] in ("aged", "unaged")}
        self.assertEqual(counts(rows), counts(ref_rows))
        self.assertEqual(len(counts(rows)), 2 * (self.CYCLES + 1))
        # the resumed run's work is counted in its totals: within a factor of the uninterrupted run's writes
        tot = lambda rs: next(float(r["value"]) for r in rs if r["metric"] == "dev_write_bytes_total")  # noqa: E731
        self.assertGreater(tot(rows), 0.5 * tot(ref_rows))
        # nothing left: no state, no image
        self.assertFalse((out / "resume").exists())
        self.assertFalse(resume.images_root(self.workdir, out).exists())
        meta = json.loads((out / "run.json").read_text())
        self.assertEqual((meta["status"], len(meta["resumed"])), ("complete", 2))


if __name__ == "__main__":
    unittest.main()
