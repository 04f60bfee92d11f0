"""flash_attn_upstream.py's serial retry of out-of-memory failures: which cases it retries, how their
outcomes merge, and the exit code that follows (the pure parts; the pytest runs need a GPU)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "gpu" / "flash_attn_upstream.py"
_spec = importlib.util.spec_from_file_location("flash_attn_upstream", TOOL)
upstream = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(upstream)

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
CRASH = "worker 'gw3' crashed while running 'test_flash_attn.py::test_b[1]'"


def _first_run():
    outcome = {"t::a[0]": "passed", "t::a[1]": "failed", "t::b[1]": "failed", "t::c[0]": "failed", "t::d[0]": "error"}
    message = {"t::a[1]": OOM, "t::b[1]": CRASH, "t::c[0]": "AssertionError: max diff 0.5",
               "t::d[0]": "torch.AcceleratorError: CUDA error: out of memory"}
    return outcome, message


def test_only_clean_out_of_memory_failures_are_retried():
    outcome, message = _first_run()
    assert upstream.oom_failures(outcome, message) == ["t::a[1]"]  # not the crash, the assert, the AcceleratorError


def test_retry_outcome_replaces_the_first_and_crashes_are_counted():
    outcome, message = _first_run()
    merged, _, counts = upstream.merge_retry(outcome, message, ["t::a[1]"], {"t::a[1]": "passed"}, {})
    assert merged["t::a[1]"] == "passed" and merged["t::b[1]"] == "failed"
    assert counts == {"retried": 1, "passed": 1, "still_failed": [], "crashed_in_first_run": ["t::b[1]"]}
    merged, _, counts = upstream.merge_retry(outcome, message, ["t::a[1]"], {}, {})  # the retry never reported it
    assert merged["t::a[1]"] == "failed" and counts["still_failed"] == ["t::a[1]"]


def _summary(failed=0, error=0, not_run=0):
    return {"totals": {"failed": failed, "error": error, "not_run": not_run}}


def test_exit_code_follows_the_retry():
    retry = {"retried": 1}
    assert upstream.final_exit_code(1, _summary(), [], {}, False, retry) == 0  # all out-of-memory, passed serially
    assert upstream.final_exit_code(1, _summary(failed=1), [], {}, False, retry) == 1  # a crash or a real failure
    assert upstream.final_exit_code(1, _summary(), [], {}, False, None) == 1  # no retry: pytest's code stands
    assert upstream.final_exit_code(0, _summary(not_run=2), [], {}, False, None) == 1
    assert upstream.final_exit_code(0, _summary(), [], None, False, None) == 1  # no collection record
