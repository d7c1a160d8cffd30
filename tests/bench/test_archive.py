#!/usr/bin/env python3
"""bench/archive.py files braid-bench --json runs as archive rows and refuses what is not a default measurement;
bench/performance.py turns rows into the page's tables and goals."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import archive  # noqa: E402
import performance  # noqa: E402

HEAD = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


def collective_run(settings=None, commit=HEAD):
    side = {"algbw_gbs": 100.0, "busbw_gbs": 150.0, "time_us": 10.0, "wrong": 0}
    nccl = dict(side, time_us=20.0, busbw_gbs=75.0)
    config = {"buffers": "cudaMalloc", "graph": 20, "ranks": 2, "commit": commit, "nccl_version": "2.28.9",
              "gpus": ["GPU 0 NVIDIA H100 80GB HBM3 (0000:00:06.0)", "GPU 1 NVIDIA H100 80GB HBM3 (0000:00:07.0)"]}
    if settings is not None:
        config["settings"] = settings
    rows = [{"coll": "allreduce", "size": 8192, "count": 4096, "type": "bfloat16", "redop": "sum", "root": -1,
             "out_of_place": {"braid": side, "nccl": nccl}, "in_place": None}]
    return {"tool": "braid-bench", "config": config, "rows": rows}


class ArchiveTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.archive = os.path.join(self.dir.name, "archive.jsonl")

    def tearDown(self):
        self.dir.cleanup()

    def write(self, run):
        path = os.path.join(self.dir.name, f"run{len(os.listdir(self.dir.name))}.json")
        with open(path, "w") as f:
            json.dump(run, f)
        return path

    def add(self, *paths, extra=()):
        archive.main(["--archive", self.archive, "add", "--gpu", "nvidia-h100-x2", "--date", "2026-01-02", *extra,
                      *paths])
        return archive.load(self.archive)

    def test_a_collective_row_carries_identity_and_both_sides(self):
        rows = self.add(self.write(collective_run()))
        self.assertEqual(len(rows), 1)
        row = rows[0]
        self.assertEqual((row["commit"], row["gpu"], row["world"], row["gpu_name"]),
                         (HEAD, "nvidia-h100-x2", 2, "NVIDIA H100 80GB HBM3"))
        self.assertEqual((row["collective"], row["dtype"], row["bytes"], row["buffers"], row["mode"]),
                         ("allreduce", "bfloat16", 8192, "cudaMalloc", "graph"))
        self.assertEqual((row["braid_us"], row["nccl_us"], row["braid_busbw_gbs"], row["nccl_busbw_gbs"]),
                         (10.0, 20.0, 150.0, 75.0))

    def test_the_same_run_twice_adds_nothing(self):
        path = self.write(collective_run())
        self.add(path)
        self.assertEqual(len(self.add(path)), 1)

    def test_a_run_with_changed_settings_is_refused(self):
        with self.assertRaises(SystemExit) as refused:
            self.add(self.write(collective_run(settings={"BRAID_ALGO": "allreduce=ll"})))
        self.assertIn("BRAID_ALGO", str(refused.exception))
        self.assertEqual(archive.load(self.archive), [])

    def test_a_run_timed_otherwise_is_refused(self):
        for method, named in (({"average": 1}, "average"), ({"blocking": True}, "blocking")):
            run = collective_run()
            run["config"].update(method)
            with self.assertRaises(SystemExit) as refused:
                self.add(self.write(run))
            self.assertIn(named, str(refused.exception))
        self.assertEqual(archive.load(self.archive), [])
        timed = collective_run()
        timed["config"].update(average=3, blocking=False, step_bytes=0)  # what braid-bench writes by default
        self.assertEqual(len(self.add(self.write(timed))), 1)

    def test_exposed_at_first_use_rows_have_a_table_and_command_of_their_own(self):
        exposed = collective_run(settings={"BRAID_EAGER_ZERO_COPY": "1"})
        exposed["config"].update(buffers="vmm", graph=0)
        registered = collective_run(settings={"BRAID_EAGER_ZERO_COPY": "1"})
        registered["config"].update(buffers="registered-vmm", graph=0)
        rows = self.add(self.write(exposed), self.write(registered))
        kinds = {performance.buffers_of(r) for r in rows}
        self.assertEqual(kinds, {"registered, eager zero copy", performance.EXPOSED_AT_FIRST_USE})
        mine = [r for r in rows if performance.buffers_of(r) == performance.EXPOSED_AT_FIRST_USE]
        command = "\n".join(performance.bench_lines(mine, 2))
        self.assertIn("braid-run -n 2 braid-bench", command)
        self.assertNotIn("--register 1", command)

    def test_the_launchers_variables_are_not_settings(self):
        launch = {"BRAID_RANK": "0", "BRAID_WORLD_SIZE": "2", "BRAID_LOCAL_RANK": "0", "BRAID_LOCAL_SIZE": "2",
                  "BRAID_STORE_ADDR": "127.0.0.1:1", "BRAID_JOB_ID": "run-1", "BRAID_JOB_SECRET": "x" * 64}
        self.assertEqual(len(self.add(self.write(collective_run(settings=launch)))), 1)
        with self.assertRaises(SystemExit):
            self.add(self.write(collective_run(settings=dict(launch, BRAID_ALGO="allreduce=ll"))))

    def test_where_a_library_is_found_is_not_a_setting(self):
        where = {"BRAID_NCCL_LIBRARY": "/opt/nccl/lib/libnccl.so.2", "BRAID_CUBLASLT_LIBRARY": "libcublasLt.so.13"}
        self.assertEqual(len(self.add(self.write(collective_run(settings=where)))), 1)

    def test_eager_zero_copy_runs_are_points_of_their_own(self):
        on = collective_run(settings={"BRAID_EAGER_ZERO_COPY": "1"})
        on["config"].update(buffers="registered-vmm", graph=0)
        off = collective_run()
        off["config"].update(buffers="registered-vmm", graph=0)
        rows = self.add(self.write(on), self.write(off))
        self.assertEqual(len(rows), 2)
        switched = [r for r in rows if r.get("eager_zero_copy")]
        self.assertEqual(len(switched), 1)
        self.assertEqual((switched[0]["buffers"], switched[0]["memory"], switched[0]["mode"]),
                         ("registered", "vmm", "eager"))
        self.assertEqual(len({performance.point_key(r) for r in rows}), 2)
        default = collective_run(settings={"BRAID_EAGER_ZERO_COPY": "0"})  # the default, said aloud
        default["config"]["buffers"] = "vmm"
        self.assertEqual(len(self.add(self.write(default))), 3)
        with self.assertRaises(SystemExit):
            self.add(self.write(collective_run(settings={"BRAID_EAGER_ZERO_COPY": "2"})))

    def test_a_run_without_commit_needs_one(self):
        with self.assertRaises(SystemExit) as refused:
            self.add(self.write(collective_run(commit=None)))
        self.assertIn("--commit", str(refused.exception))
        rows = self.add(self.write(collective_run(commit=None)), extra=("--commit", HEAD[:9]))
        self.assertEqual(rows[0]["commit"], HEAD)

    def test_an_unknown_commit_and_a_bad_kind_are_refused(self):
        with self.assertRaises(SystemExit):
            self.add(self.write(collective_run(commit="0" * 40)))
        with self.assertRaises(SystemExit):
            archive.main(["--archive", self.archive, "add", "--gpu", "h100", self.write(collective_run())])


class PerformanceTest(unittest.TestCase):
    def rows(self, braid_us, date="2026-01-02"):
        row = {"kind": "collective", "gpu": "nvidia-h100-x2", "gpu_name": "NVIDIA H100", "world": 2,
               "collective": "allreduce", "dtype": "bfloat16", "op": "sum", "bytes": 8192, "buffers": "cudaMalloc",
               "mode": "graph", "placement": "out-of-place", "commit": HEAD, "date": date, "braid_us": braid_us,
               "nccl_us": 6.0, "braid_busbw_gbs": 2.0, "nccl_busbw_gbs": 1.0, "graph_calls": 20}
        return row

    def test_the_newest_measurement_of_a_point_wins(self):
        current = performance.newest([self.rows(5.0, "2026-01-01"), self.rows(4.0, "2026-01-03"),
                                      self.rows(3.0, "2026-01-02")])
        self.assertEqual([r["braid_us"] for r in current], [4.0])

    def test_goals_report_met_and_missed_with_the_reason(self):
        goal = {"name": "small", "kind": "max", "value": 3.0, "reason": "the floor",
                "select": {"world": 2, "collective": "allreduce", "bytes": 8192}}
        text, notes = performance.page([self.rows(4.0)], [goal])
        self.assertIn("| small | ≤ 3 µs | nvidia-h100-x2 | 4.00 µs | **no** |", text)
        self.assertIn("dev/performance-goals.md", text)
        self.assertIn("- small, nvidia-h100-x2: the floor", notes)
        text, notes = performance.page([self.rows(2.5)], [goal])
        self.assertIn("| 2.50 µs | yes |", text)
        self.assertNotIn("the floor", text + notes)

    def test_a_reason_may_differ_per_machine_kind(self):
        goal = {"name": "small", "kind": "max", "value": 3.0, "per": "buffers",
                "reason": {"cudaMalloc": {"nvidia-h100-x2": "the H100 floor", "other": "the floor"}},
                "select": {"world": 2, "collective": "allreduce", "bytes": 8192}}
        other = dict(self.rows(4.0), gpu="nvidia-h200-x2", gpu_name="NVIDIA H200")
        _, notes = performance.page([self.rows(4.0), other], [goal])
        self.assertIn("- small (cudaMalloc), nvidia-h100-x2: the H100 floor", notes)
        self.assertIn("- small (cudaMalloc), nvidia-h200-x2: the floor", notes)

    def test_the_first_screen_counts_where_braid_is_slower_and_names_the_worst(self):
        faster, slower = self.rows(4.0), dict(self.rows(7.0), bytes=16384)
        text, _ = performance.page([faster, slower], [])
        glance = text[text.index("## At a glance"):text.index("## Goals")]
        row = [line for line in glance.splitlines() if line.startswith("| nvidia-h100-x2")][0]
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        self.assertEqual(cells[3:6], ["2", "1", "1"], row)  # points, braid faster, braid slower
        self.assertIn("16 KiB", cells[7])

    def test_each_table_names_the_braid_bench_command_of_its_rows(self):
        small, large = self.rows(4.0), dict(self.rows(9.0), bytes=32 << 20, graph_calls=2)
        eager = dict(self.rows(5.0), mode="eager", bytes=16384, graph_calls=1, root=-1)
        small["root"] = large["root"] = -1
        text, _ = performance.page([small, large, eager], [])
        self.assertIn("Graph rows 8 KiB to 8 KiB: `braid-bench -t 2 --coll allreduce -d bfloat16 -b 8K -e 8K -f 2 -G 20 "
                      "--inplace 0 --symmetric 0 --compare nccl`", text)
        self.assertIn("Graph rows 32 MiB to 32 MiB: `braid-bench -t 2 --coll allreduce -d bfloat16 -b 32M -e 32M -f 2 -G 2 ",
                      text)
        self.assertIn("Eager rows 16 KiB to 16 KiB: `braid-bench -t 2 --coll allreduce -d bfloat16 -b 16K -e 16K -f 2 -G 0 ",
                      text)

    def add_torch(self, text, **extra):
        """Files a run_torch_check.sh output of `text` into a fresh archive; returns its rows."""
        with tempfile.TemporaryDirectory() as folder:
            output, store = os.path.join(folder, "torch-check.txt"), os.path.join(folder, "archive.jsonl")
            with open(output, "w") as f:
                f.write(text)
            archive.main(["--archive", store, "add-torch", "--gpu", "nvidia-h100-x2", "--date", "2026-01-02",
                          "--commit", HEAD, "--torch", "2.11.0", "--world", "2", output] + extra.get("flags", []))
            return archive.load(store)

    def test_torch_step_times_are_filed_and_shown_beside_nccl(self):
        rows = self.add_torch("--- step times, rank 0, ms per step:\n  section        nccl       shim shim/nccl\n"
                              "  ddp           2.000      2.500     1.250\n  fsdp2        10.000      9.000     0.900\n"
                              "run_torch_check: PASS: both runs right\n")
        self.assertEqual([(r["collective"], r["braid_ms"], r["nccl_ms"]) for r in rows],
                         [("ddp", 2.5, 2.0), ("fsdp2", 9.0, 10.0)])
        text, _ = performance.page(rows, [])
        self.assertIn("| nvidia-h100-x2 | 2 | 2.11.0 | 1024 x 4, batch 64, 20 steps | none | DDP | 2.50 | 2.00 | 1.25 |",
                      text)
        self.assertIn("| nvidia-h100-x2 | 2 | 2.11.0 | 1024 x 4, batch 64, 20 steps | none | FSDP2 | 9.00 | 10.00 | 0.90 |",
                      text)

    def test_a_torch_runs_model_and_settings_make_points_of_their_own(self):
        steps = ("--- step times, rank 0, ms per step:\n  section        nccl       shim shim/nccl\n"
                 "  fsdp2        10.000      9.000     0.900\nrun_torch_check: PASS: both runs right\n")
        model = "  torch_shim_check: training model: width 8192, layers 4, batch 64, timed steps 50\n"
        every = ["--eager-zero-copy", "--allocator-hook", "--expandable-segments"]
        wide = self.add_torch(model + steps, flags=every)
        self.assertEqual([(r["width"], r["layers"], r["batch"], r["steps"], r["eager_zero_copy"], r["allocator_hook"],
                           r["expandable_segments"]) for r in wide], [(8192, 4, 64, 50, True, True, True)])
        plain = self.add_torch(steps)
        self.assertNotIn("width", plain[0])
        self.assertNotIn("allocator_hook", plain[0])
        hook_only = self.add_torch(steps, flags=["--eager-zero-copy", "--allocator-hook"])
        self.assertNotIn("expandable_segments", hook_only[0])
        keys = {performance.point_key(r) for r in wide + plain + hook_only}
        self.assertEqual(len(keys), 3)
        text, _ = performance.page(wide + plain + hook_only, [])
        self.assertIn("| 8192 x 4, batch 64, 50 steps | switch, hook, expandable | FSDP2 | 9.00 | 10.00 | 0.90 |", text)
        self.assertIn("| 1024 x 4, batch 64, 20 steps | none | FSDP2 | 9.00 | 10.00 | 0.90 |", text)
        self.assertIn("| 1024 x 4, batch 64, 20 steps | switch, hook | FSDP2 | 9.00 | 10.00 | 0.90 |", text)

    def test_a_torch_run_that_failed_is_refused(self):
        with self.assertRaises(SystemExit):
            self.add_torch("  ddp           2.000      2.500     1.250\nrun_torch_check: FAILED\n")

    def test_fused_matmul_rows_of_each_mode_are_points_of_their_own(self):
        eager = {"kind": "fused_matmul", "gpu": "nvidia-h200-x2", "gpu_name": "NVIDIA H200", "world": 2,
                 "date": "2026-01-02", "commit": HEAD, "nccl_version": "2.28.9", "torch": "2.11.0",
                 "collective": "matmul_reduce_scatter", "dtype": "bfloat16", "m": 4096, "k": 4096, "n": 4096,
                 "mode": "eager", "braid_us": 200.0, "gemm_us": 180.0, "comm_us": 80.0, "nccl_serial_us": 280.0,
                 "nccl_us": 280.0, "torch_us": 240.0, "torch_error": None, "wrong": 0}
        graph = dict(eager, mode="graph", braid_us=190.0)
        self.assertEqual(len(performance.newest([eager, graph])), 2)
        text, _ = performance.page([eager, graph], [])
        self.assertIn("| matmul_reduce_scatter | 4096 | 4096 | 4096 | eager | 200.0 | 180.0 | 80.0 | 280.0 | 240.0 | 1.40 |",
                      text)
        self.assertIn("| matmul_reduce_scatter | 4096 | 4096 | 4096 | graph | 190.0 | 180.0 | 80.0 | 280.0 | 240.0 | 1.47 |",
                      text)

    def test_the_checked_in_page_is_what_the_archive_gives(self):
        self.assertEqual(performance.main(["--check"]), 0)


if __name__ == "__main__":
    unittest.main()
