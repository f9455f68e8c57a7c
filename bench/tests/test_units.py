"""Unit tests of the pure parts of the harness: `python3 -m unittest discover -s bench/tests -t .`"""
import math
import tempfile
import unittest
from pathlib import Path

from bench import benchmarks
from bench.config import make_params, set_param
from bench.device import analyze_requests, parse_trace
from bench.results import ResultWriter, Row, load
from bench.stats import fmt_num, mean_ci, t975
from bench.util import parse_size


class Stats(unittest.TestCase):
    def test_t_quantiles(self):
        self.assertAlmostEqual(t975(1), 12.706)
        self.assertAlmostEqual(t975(2), 4.303)
        self.assertAlmostEqual(t975(100), 1.984, places=2)

    def test_mean_ci(self):
        m, h, n = mean_ci([1.0, 2.0, 3.0])
        self.assertEqual((m, n), (2.0, 3))
        self.assertAlmostEqual(h, 4.303 * 1.0 / math.sqrt(3), places=6)
        m, h, n = mean_ci([5.0])
        self.assertEqual((m, n), (5.0, 1))
        self.assertTrue(math.isnan(h))
        self.assertEqual(mean_ci([])[2], 0)

    def test_fmt(self):
        self.assertEqual(fmt_num(62.0), "62")
        self.assertEqual(fmt_num(0.01234), "0.0123")
        self.assertEqual(fmt_num(123456.7), "123,457")


class Trace(unittest.TestCase):
    SAMPLE = (
        "  grep-1 [000] ..... 1.0: block_rq_issue: 7,3 R 4096 () 100 + 8 be,0,4 [grep]\n"
        "  grep-1 [000] ..... 1.1: block_rq_issue: 7,3 RA 8192 () 108 + 16 be,0,4 [grep]\n"
        "  kw-2   [001] ..... 1.2: block_rq_issue: 7,3 FWS 0 () 0 + 0 be,0,4 [kworker]\n"
        "  grep-1 [000] ..... 1.3: block_rq_issue: 7,4 R 4096 () 124 + 8 be,0,4 [grep]\n"
        "  kw-2   [001] ..... 1.4: block_rq_issue: 7,3 W 4096 () 5000 + 8 be,0,4 [kworker]\n"
        "  kw-2   [001] ..... 1.5: block_rq_issue: 7,3 WS 4096 () 5008 + 8 be,0,4 [kworker]\n"
    )

    def test_parse_filters_device_and_empty_requests(self):
        reqs = parse_trace(self.SAMPLE, 7, 3)
        self.assertEqual(reqs, [("R", 100, 8), ("RA", 108, 16), ("W", 5000, 8), ("WS", 5008, 8)])

    def test_layout_score_and_model(self):
        r = analyze_requests(parse_trace(self.SAMPLE, 7, 3), seek_ms=8.0, mb_per_s=150.0)
        self.assertEqual(r.requests, 4)
        self.assertEqual(r.contiguous, 2)  # 108 follows 100+8, 5008 follows 5000+8
        self.assertAlmostEqual(r.layout_score, 0.5)
        self.assertEqual((r.read_requests, r.write_requests), (2, 2))
        self.assertEqual(r.bytes, (8 + 16 + 8 + 8) * 512)
        self.assertAlmostEqual(r.hdd_model_s, 2 * 0.008 + r.bytes / 150e6)


class Config(unittest.TestCase):
    def test_sizes_and_params(self):
        self.assertEqual(parse_size("2G"), 2 << 30)
        self.assertEqual(parse_size("512MiB"), 512 << 20)
        self.assertEqual(parse_size("4096"), 4096)
        p = set_param(make_params(False), "large_file", "8G")
        self.assertEqual(p.large_file, 8 << 30)
        self.assertEqual(set_param(p, "toku_files", "1_000").toku_files, 1000)
        with self.assertRaises(ValueError):
            set_param(p, "no_such_thing", "1")
        self.assertEqual(make_params(True).repeat, 1)

    def test_benchmark_names(self):
        self.assertEqual(benchmarks.expand("randwrite,seqwrite"), ["seqwrite", "randwrite"])
        self.assertEqual(benchmarks.expand("largefile"), ["seqwrite", "seqread", "randread", "randwrite"])
        aging = benchmarks.expand("aging")
        self.assertEqual(aging, ["aging-git", "aging-mail", "aging-intrafile", "aging-interfile"])
        extra = [n for m in benchmarks.EXTRA_MODULES for n in m.NAMES]  # crash tests: only when asked for
        self.assertEqual(len(benchmarks.expand("all")) + len(aging) + len(extra), len(benchmarks.ORDER))
        self.assertFalse(set(aging) & set(benchmarks.expand("all")))  # hours long: only when asked for
        with self.assertRaises(ValueError):
            benchmarks.expand("nope")
        groups = benchmarks.groups(["seqread", "tokubench"])
        self.assertEqual([g[1] for g in groups], [["seqread"], ["tokubench"]])


class Csv(unittest.TestCase):
    def test_roundtrip(self):
        with tempfile.TemporaryDirectory() as d:
            w = ResultWriter(Path(d) / "r.csv")
            w.add(Row("seqwrite", "ext4", "write", 1, "mib_per_s", 612.5, "MiB/s"))
            w.add(Row("seqwrite", "amaranth", "setup", 1, "error", None, "", "binary, \"missing\"\nline 2"))
            w.add(Row("rename", "xfs", "rename", 2, "renames_per_s", 300.0, "renames/s", x=4096.0))
            rows = load(Path(d) / "r.csv")
            self.assertEqual(rows, w.rows)

    def test_resume_keeps_completed_runs_only(self):
        from bench.cli import completed_runs

        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "r.csv"
            w = ResultWriter(path)
            done = [Row("aging-git", "ext4", "aged", 1, "seconds", 1.0, "s", x=0.0),
                    Row("aging-git", "ext4", "run", 1, "dev_write_bytes_total", 5.0, "B")]
            for r in done:
                w.add(r)
            w.add(Row("aging-git", "xfs", "aged", 1, "seconds", 2.0, "s", x=0.0))  # interrupted: no 'run' rows
            w.add(Row("aging-git", "btrfs", "run", 1, "dev_write_bytes_total", 5.0, "B"))
            w.add(Row("aging-git", "btrfs", "aged", 1, "error", None, "", "boom"))  # failed
            runs = completed_runs(path)
            self.assertEqual(runs, {("aging-git", "ext4", "disk", 1)})
            w2 = ResultWriter(path, keep=lambda r: (r.benchmark, r.fs, r.view, r.repetition) in runs)
            self.assertEqual(load(path), done)
            self.assertEqual(w2.rows, done)


if __name__ == "__main__":
    unittest.main()


class ImapMove(unittest.TestCase):
    def test_registered_and_the_crash_test_kept_out_of_all(self):
        self.assertIn("imapmove", benchmarks.expand("all"))
        self.assertNotIn("imapcrash", benchmarks.expand("all"))
        self.assertEqual(benchmarks.expand("imapcrash"), ["imapcrash"])
        self.assertEqual(make_params(True).imap_msgs, 30)
        self.assertEqual(set_param(make_params(False), "imap_msgs", "5").imap_msgs, 5)

    def test_messages_are_about_2_kb_with_unique_ids(self):
        import random

        from bench.workloads.imap_move import message

        rng = random.Random(1)
        msgs = [message(rng, n) for n in range(50)]
        self.assertEqual(len({mid for mid, _ in msgs}), 50)
        for mid, data in msgs:
            self.assertTrue(1900 <= len(data) <= 2200, len(data))
            self.assertIn(mid.encode(), data)


class IdlePoll(unittest.TestCase):
    """The machine setting of `--idle-poll-us`, against a file standing in for the haltpoll parameter."""

    def test_set_returns_the_previous_value_and_describe_shows_it(self):
        from bench import machine

        with tempfile.TemporaryDirectory() as d:
            f = Path(d) / "guest_halt_poll_ns"
            f.write_text("0\n")
            saved = machine.HALT_POLL
            machine.HALT_POLL = f
            try:
                self.assertEqual(machine.set_halt_poll(200000), 0)
                self.assertEqual(f.read_text().strip(), "200000")
                self.assertIn("guest_halt_poll_ns 200000", machine.cpu_idle())
                self.assertEqual(machine.set_halt_poll(0), 200000)
                with self.assertRaises(ValueError):
                    machine.set_halt_poll(-1)
                self.assertEqual(f.read_text().strip(), "0", "a refused value changed the setting")
                f.unlink()
                with self.assertRaises(RuntimeError):
                    machine.set_halt_poll(1000)
                self.assertNotIn("guest_halt_poll_ns", machine.cpu_idle())
            finally:
                machine.HALT_POLL = saved
