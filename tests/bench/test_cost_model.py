#!/usr/bin/env python3
"""bench/cost_model.py reads kTable as the library does, and its model predicts, fits and chooses sanely."""
import os
import re
import subprocess
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import cost_model  # noqa: E402

MiB = 1 << 20


class TableTest(unittest.TestCase):
    def setUp(self):
        self.table = cost_model.parse_table()

    def test_every_row_of_ktable_is_read(self):
        with open(cost_model.TABLE) as f:
            text = f.read()
        bodies = cost_model.table_body(text, "kModelTable") + cost_model.table_body(text, "kTable")
        self.assertEqual(len(self.table), len(re.findall(r"\{Collective::", bodies)))

    def test_shipped_follows_the_first_matching_row(self):
        shipped = cost_model.shipped
        self.assertEqual(shipped(self.table, "allreduce", 64 << 10, 2, False), "ll")
        self.assertEqual(shipped(self.table, "allreduce", 512 * MiB, 2, True), "copyengine")  # 2 ranks, mapped
        self.assertEqual(shipped(self.table, "allreduce", 512 * MiB, 4, True), "twoshot")     # engines: 2 ranks
        self.assertEqual(shipped(self.table, "allreduce", 512 * MiB, 2, False), "twoshot")    # not mapped
        self.assertNotIn("multicast", {shipped(self.table, c, s, w, m) for c in cost_model.COLLECTIVES
                                       for s in cost_model.SIZES for w in (2, 4, 8) for m in (False, True)})

    def test_sizes_parse_as_the_compiler_reads_them(self):
        self.assertEqual(cost_model.cpp_size("size_t(512) << 10"), 512 << 10)
        self.assertEqual(cost_model.cpp_size("SIZE_MAX"), 1 << 62)


class GeneratedRowsTest(unittest.TestCase):
    def test_ktable_holds_the_models_rows_for_the_worlds_never_swept(self):
        machine, table, params, _, _, _ = cost_model.fitted_model(cost_model.ARCHIVE, cost_model.TABLE,
                                                                  "nvidia-h200-x2", 2, "bfloat16")
        with open(cost_model.TABLE) as f:
            text = f.read()
        self.assertEqual(cost_model.table_block(text), cost_model.table_rows(params["graph"], machine, table),
                         "kTable's rows for 5 to 8 ranks are not the model's: run bench/cost_model.py --write-table")

    def test_generated_rows_serve_only_the_worlds_never_swept(self):
        table = cost_model.parse_table()
        model = [row for row in table if row["min_world"] > 1]
        self.assertTrue(model)
        for row in model:
            self.assertGreaterEqual(row["min_world"], 5)
            self.assertLessEqual(row["max_world"], 8)
            self.assertNotEqual(row["collective"], "sendrecv")


class ModelTest(unittest.TestCase):
    machine = cost_model.MACHINES["nvidia-h200"]

    @staticmethod
    def parameters(launch, hop, switch_hop=0.0):
        """launch, hop, eta 1 for every engine, the switch hop."""
        return [launch, hop] + [1.0] * len(cost_model.ENGINES) + [switch_hop]

    def test_time_grows_with_size_and_links_share_egress(self):
        params = self.parameters(2.0, 1.0, switch_hop=0.5)
        small = cost_model.predict_braid(params, self.machine, "allgather", "pipelined", 4, True, MiB)
        large = cost_model.predict_braid(params, self.machine, "allgather", "pipelined", 4, True, 64 * MiB)
        self.assertLess(small, large)
        # 64 MiB by SM stores at 4 ranks: 3/4 of it through 353 GB/s times the egress share; 2 steps, each through
        # the switch
        expected = 2.0 + 2 * (1.0 + 0.5) + 64 * MiB * 0.75 / (353.0 * 344.0 / 369.0) * 1e-3
        self.assertAlmostEqual(large, expected, places=6)

    def test_the_switch_hop_counts_only_beyond_two_ranks(self):
        without = cost_model.predict_braid(self.parameters(2.0, 1.0), self.machine, "allgather", "pipelined", 2, True,
                                           MiB)
        with_hop = cost_model.predict_braid(self.parameters(2.0, 1.0, switch_hop=3.0), self.machine, "allgather",
                                            "pipelined", 2, True, MiB)
        self.assertAlmostEqual(without, with_hop, places=9)

    def test_all_reduce_copy_engines_are_priced_on_two_ranks_only(self):
        params = self.parameters(2.0, 1.0)
        predict = cost_model.predict_braid
        self.assertIsNotNone(predict(params, self.machine, "allreduce", "copyengine", 2, True, MiB))
        self.assertIsNone(predict(params, self.machine, "allreduce", "copyengine", 2, False, MiB))  # pushes: mapped
        self.assertIsNone(predict(params, self.machine, "allreduce", "copyengine", 4, True, MiB))  # pairs: unpriced

    def test_the_switch_hop_is_fitted_on_rows_below_one_mebibyte_only(self):
        params = self.parameters(1.0, 1.0)
        pipelined_everywhere = [{"collective": "allgather", "max_bytes": 1 << 62, "algorithm": "pipelined",
                                 "symmetric": False, "max_world": 8, "fp8": False, "min_world": 1}]
        series = {}
        for size in (64 << 10, 256 << 10, 4 * MiB):
            # the model's time plus 2 us for each of the 2 steps below 1 MiB, and far off above: only the small
            # rows may count
            t = cost_model.predict_braid(params, self.machine, "allgather", "pipelined", 4, True, size)
            series[size] = (t + 2 * 2.0 if size < MiB else 10 * t, "5" * 40)  # no such commit: the table given
        fitted, count = cost_model.fit_switch_hop(params, {("braid", "allgather", "symmetric", "graph"): series},
                                                  pipelined_everywhere, self.machine, 4, "graph")
        self.assertEqual(count, 2)
        self.assertAlmostEqual(fitted[cost_model.SWITCH], 2.0, places=3)
        self.assertEqual(fitted[:cost_model.SWITCH], params[:cost_model.SWITCH])

    def test_minimise_finds_a_known_minimum(self):
        point = cost_model.minimise(lambda p: (p[0] - 3) ** 2 + (p[1] + 1) ** 2, [0.0, 0.0], [1.0, 1.0])
        self.assertAlmostEqual(point[0], 3.0, places=3)
        self.assertAlmostEqual(point[1], -1.0, places=3)

    def test_a_rows_table_is_its_commits_or_todays(self):
        today = cost_model.parse_table()
        self.assertIs(cost_model.table_at("0" * 40, today), today)  # no such commit: today's table
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True)
        if head.returncode == 0:  # a checkout with its history: HEAD's table, read from git
            at_head = cost_model.table_at(head.stdout.strip(), today)
            self.assertIsNot(at_head, today)
            self.assertEqual({row["collective"] for row in at_head}, {row["collective"] for row in today})

    def test_the_report_runs_on_the_archive(self):
        out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "cost_model.py")], capture_output=True,
                             text=True, check=True).stdout
        self.assertIn("checked rows, median error", out)
        self.assertIn("| 8 | allreduce |", out)

    def test_ll_rows_come_first_and_serve_any_buffer(self):
        table = cost_model.parse_table()
        params = self.parameters(1.0, 2.0)
        for world in cost_model.MODEL_WORLDS:
            rows = cost_model.model_rows(params, self.machine, table, world)
            for collective in cost_model.COLLECTIVES:
                mine = [r for r in rows if r[0] == collective]
                self.assertTrue(mine, collective)
                for i, (_, _, algorithm, mapped) in enumerate(mine):
                    if algorithm in ("ll", "ll128"):
                        self.assertEqual(i, 0, collective)
                        self.assertFalse(mapped, collective)
                self.assertIsNone(mine[-1][1], f"{collective}: the last row serves every size")


if __name__ == "__main__":
    unittest.main()
