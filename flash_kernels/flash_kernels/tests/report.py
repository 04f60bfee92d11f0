"""pytest plugin loaded by the selftest (``-p flash_kernels.tests.report``): registers the
``gpu`` marker and prints one machine-readable line of counts at the end of the run:

    FLASH_KERNELS_SELFTEST tier=cpu backends=triton passed=N failed=N skipped=N error=N ... exit=N

It imports no torch or triton, so it is safe in the xdist controller process.
"""

from __future__ import annotations

import os

OUTCOMES = ("passed", "failed", "skipped", "error", "xfailed", "xpassed")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a GPU (large shapes or bf16); not in the CPU tier")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    stats = terminalreporter.stats
    counts = {key: len(stats.get(key, [])) for key in OUTCOMES}
    tier = "cpu" if os.environ.get("TRITON_INTERPRET", "0") == "1" else "gpu"
    backends = os.environ.get("FLASH_KERNELS_TEST_BACKENDS", "default")
    fields = " ".join(f"{k}={v}" for k, v in counts.items())
    terminalreporter.write_line(
        f"FLASH_KERNELS_SELFTEST tier={tier} backends={backends} {fields} exit={int(exitstatus)}")
