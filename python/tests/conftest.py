"""pytest setup for braid's Python tests. They import braid from the build folder (ctest sets
PYTHONPATH=build/python) or from an installed package. Marker `gpu`: tests that run torchrun on GPUs, run by the
ctest entry python_gpu; python_cpu runs the rest. With BRAID_PYTEST_ALL_SKIPPED_EXIT set (ctest sets 77), a
run where every test skipped exits with that code, which ctest reports as Skipped rather than Passed."""
import os

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs torch and at least 2 CUDA GPUs (runs ranks under torchrun)")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    code = os.environ.get("BRAID_PYTEST_ALL_SKIPPED_EXIT")
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if not code or reporter is None or exitstatus != 0:
        return
    stats = reporter.stats
    if stats.get("skipped") and not stats.get("passed") and not stats.get("failed") and not stats.get("error"):
        session.exitstatus = int(code)
