"""Unit tests of the aging experiments' pure parts: `python3 -m unittest discover -s bench/tests -t .`"""
import os
import random
import tempfile
import unittest
import zipfile
from pathlib import Path
from types import SimpleNamespace

from bench.aging import seek_profile, tree_size, wait_quiet
from bench.benchmarks.aging_interfile import creation_order, write_tree
from bench.benchmarks.aging_intrafile import rounds, write_files
from bench.gitsource import apply_release, select_versions
from bench.report import Data
from bench.report_aging import table, targets
from bench.results import Row
from bench.workloads.mail_aging import message


class Traces(unittest.TestCase):
    def test_seek_profile(self):
        reqs = [("R", 100, 8), ("R", 108, 8), ("R", 50, 16), ("R", 2000, 8), ("R", 2008, 256)]
        p = seek_profile(reqs)
        self.assertEqual(p["jumps"], 2)  # 116 -> 50 (back 66 sectors), 66 -> 2000 (forward 1934)
        self.assertEqual(p["backward_jumps"], 1)
        self.assertEqual(p["median_jump_bytes"], 1934 * 512)
        self.assertEqual(p["median_request_bytes"], 8 * 512)
        self.assertEqual(seek_profile([])["jumps"], 0)


class Interfile(unittest.TestCase):
    def test_creation_order(self):
        files = [f"d{i // 10}/f{i}" for i in range(100)]
        files.sort()
        perm = list(files)
        random.Random(1).shuffle(perm)
        self.assertEqual(creation_order(files, perm, 0), files)
        self.assertEqual(creation_order(files, perm, 100), perm)
        half = creation_order(files, perm, 50)
        self.assertEqual(sorted(half), files)  # a permutation: every file once
        moved = set(perm[:50])
        for i, f in enumerate(files):
            if f not in moved:
                self.assertEqual(half[i], f)  # the others keep their sorted place
        self.assertEqual([f for f in half if f in moved], perm[:50])  # the moved ones in permutation order

    def test_write_tree(self):
        with tempfile.TemporaryDirectory() as d:
            n = write_tree(Path(d) / "t", ["a/b/c", "a/d", "e"], 4096, random.Random(3))
            self.assertEqual(n, 3 * 4096)
            self.assertEqual(tree_size(Path(d) / "t"), (3, 3 * 4096))


class Intrafile(unittest.TestCase):
    def test_rounds(self):
        self.assertEqual(rounds(400 << 10, 4 << 10, 10), list(range(0, 101, 10)))
        self.assertEqual(rounds(400 << 10, 4 << 10, 30), [0, 30, 60, 90, 100])
        self.assertEqual(rounds(400 << 10, 4 << 10, 100), [0, 100])

    def test_write_files(self):
        with tempfile.TemporaryDirectory() as d:
            for k in (0, 3, 10):
                n = write_files(Path(d) / f"k{k}", 4, 40 << 10, 4 << 10, k, random.Random(k))
                self.assertEqual(n, 4 * (40 << 10))
                self.assertEqual(tree_size(Path(d) / f"k{k}"), (4, 4 * (40 << 10)))


class GitSource(unittest.TestCase):
    def test_select_versions(self):
        avail = ["1.10.2", "1.9.0", "1.10.10", "1.10.1", "2.0.0rc1", "1.10.3.dev1", "1.11.0"]
        self.assertEqual(select_versions(avail, "1.10.0", 10), ["1.10.1", "1.10.2", "1.10.10", "1.11.0"])
        self.assertEqual(select_versions(avail, "1.10.2", 2), ["1.10.2", "1.10.10"])

    def test_apply_release(self):
        with tempfile.TemporaryDirectory() as d:
            d = Path(d)
            work = d / "work"
            (work / ".git").mkdir(parents=True)
            (work / ".git" / "HEAD").write_text("keep")

            def wheel(name, files):
                w = d / name
                with zipfile.ZipFile(w, "w") as z:
                    for k, v in files.items():
                        z.writestr(k, v)
                return w

            self.assertEqual(apply_release(work, wheel("a.whl", {"p/a.py": "1", "p/b.py": "2", "q/c": "3"})),
                             (3, 0, 0))
            self.assertEqual(apply_release(work, wheel("b.whl", {"p/a.py": "1", "p/b.py": "22", "r/d": "4"})),
                             (1, 1, 1))
            self.assertEqual(sorted(str(p.relative_to(work)) for p in work.rglob("*") if p.is_file()),
                             [".git/HEAD", "p/a.py", "p/b.py", "r/d"])
            self.assertFalse((work / "q").exists())  # emptied directories go too
            self.assertEqual((work / "p/b.py").read_text(), "22")


class Mail(unittest.TestCase):
    def test_message(self):
        rng = random.Random(5)
        for _ in range(200):
            m = message(rng, 300)
            head, body = m.split(b"\r\n\r\n", 1)
            raw = body.replace(b"\r\n", b"")
            self.assertTrue(1 <= len(raw) <= 300)
            self.assertTrue(raw.isalpha() and raw.islower(), raw[:40])


class Quiet(unittest.TestCase):
    def test_waits_for_idle_device(self):
        seq = iter([{"r": 1}, {"r": 2}, {"r": 3}] + [{"r": 3}] * 1000)
        ctx = SimpleNamespace(loop=SimpleNamespace(stat=lambda: next(seq)))
        waited = wait_quiet(ctx, 0.4, 10)
        self.assertGreaterEqual(waited, 1.0)  # two changes seen, then 0.4 s of quiet
        self.assertLess(waited, 5)
        self.assertEqual(wait_quiet(ctx, 0, 10), 0.0)

    def test_gives_up_at_max(self):
        n = iter(range(10**6))
        ctx = SimpleNamespace(loop=SimpleNamespace(stat=lambda: {"r": next(n)}))
        self.assertLess(wait_quiet(ctx, 5, 1.0), 2.0)


def _rows(fs, x, aged_s, unaged_s, layout, reqs, hdd):
    out = []
    for ph, secs in (("aged", aged_s), ("unaged", unaged_s)):
        for metric, v in (("seconds", secs), ("s_per_gib", secs * 10), ("layout_score", layout),
                          ("read_requests", reqs), ("hdd_s_per_gib", hdd if ph == "aged" else hdd * 0.9),
                          ("request_bytes", 1 << 20), ("files", 10), ("data_bytes", 1 << 26)):
            out.append(Row("aging-git", fs, ph, 1, metric, float(v), "", "", float(x), "disk"))
    return out


class Report(unittest.TestCase):
    META = {"fs": ["amaranth", "ext4", "xfs", "btrfs"], "views": ["disk"], "hdd_throttle": None}

    def test_targets_met(self):
        rows = []
        for x in (0, 100):
            rows += _rows("amaranth", x, 1.0, 0.95, 0.95, 100, 1.0)
            for fs in ("ext4", "xfs", "btrfs"):
                rows += _rows(fs, x, 3.0, 1.5, 0.5, 1000, 5.0)
        text = "\n".join(targets(Data(rows), self.META, "aging-git"))
        self.assertEqual(text.count("**met**"), 4, text)

    def test_points_without_requests_are_left_out(self):
        rows = _rows("amaranth", 0, 1.0, 1.0, 0.95, 100, 1.0) + _rows("btrfs", 0, 1.0, 1.0, 0.5, 100, 5.0)
        rows += [r for r in _rows("amaranth", 50, 1.0, 1.0, 0.5, 0, 0.0)]  # a background write: layout 0.5
        rows += _rows("btrfs", 50, 1.0, 1.0, 0.5, 100, 5.0)
        text = "\n".join(targets(Data(rows), self.META, "aging-git"))
        self.assertIn("at 1 of 2 points (x = 50;", text)
        self.assertIn("layout score ≥ 0.9 at every point: **met** (lowest 0.95, at x = 0)", text)
        self.assertIn("read requests ≤ 1/5 of Btrfs's for the same grep: **missed** (highest ratio 1.00, at x = 0)",
                      text)

    def test_hdd_target_counts_the_remount_when_recorded(self):
        rows = _rows("amaranth", 0, 1.0, 1.0, 0.95, 0, 0.0) + _rows("ext4", 0, 1.0, 1.0, 0.5, 100, 5.0)
        mk = lambda fs, ph, v: Row("aging-git", fs, ph, 1, "hdd_s_per_gib_incl_mount", v, "", "", 0.0, "disk")  # noqa
        rows += [mk("amaranth", "aged", 6.0), mk("ext4", "unaged", 5.5)]
        text = "\n".join(targets(Data(rows), self.META, "aging-git"))
        self.assertIn("modeled hard disk (grep + the remount before it), aged Amaranth faster than every kernel FS "
                      "unaged: **missed** (Amaranth / best kernel FS highest 1.09", text)

    def test_targets_missed_and_table(self):
        rows = []
        for x in (0, 100):
            rows += _rows("amaranth", x, 2.0 if x else 1.0, 1.0, 0.5 if x else 0.95, 900, 9.0)
            for fs in ("ext4", "xfs", "btrfs"):
                rows += _rows(fs, x, 3.0, 1.5, 0.5, 1000, 5.0)
        rows.append(Row("aging-git", "xfs", "aged", 1, "error", None, "", "boom", None, "disk"))
        data = Data(rows)
        text = "\n".join(targets(data, self.META, "aging-git"))
        self.assertEqual(text.count("**missed**"), 5, text)
        self.assertIn("highest 2.00, at x = 100", text)
        self.assertIn("the same ratio on the modeled hard disk (grep requests only): **missed** (highest 1.11", text)
        t = "\n".join(table(data, self.META, "aging-git"))
        self.assertIn("| amaranth | 100 | 20 / 10 | 2 |", t)
        self.assertIn("stopped after", t)  # xfs has numbers and a failure: partial


if __name__ == "__main__":
    unittest.main()
