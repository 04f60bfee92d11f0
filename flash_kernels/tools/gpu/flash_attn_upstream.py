"""Run flash-attention's own upstream test file (tests/test_flash_attn.py) against flash_kernels.

What it does
    1. Copies the shim package ``flash_attn`` (flash_attn_shim/flash_attn beside this file) into a
       temporary folder and puts that folder first on the PYTHONPATH of the pytest it runs, so the
       upstream file's ``from flash_attn import ...`` gets flash_kernels:
         flash_attn/__init__.py             the seven public functions of flash_kernels; the six
                                            non-kvcache ones rescale S_dmask (see below)
         flash_attn/flash_attn_interface.py re-exports, _get_block_size_n, USE_TRITON_ROCM
                                            (no private C++ entry points)
         flash_attn/bert_padding.py         unpad_input / pad_input (differentiable, plain torch)
         flash_attn/layers/rotary.py        apply_rotary_emb (plain torch, float32 math)
    2. Runs pytest on the test file in a subprocess (this interpreter) with a plugin that, at
       collection, samples --cases items with --seed, stratified so that every test function keeps
       at least min(its item count, 10) items and the rest are spread in proportion to each
       function's item count; the other items are deselected. Tests that import one of
       flash_attn's private C++ entry points (test_flash_attn_varlen_paged_kv_num_splits imports
       _flash_attn_varlen_forward, test_flash_attn_generator_arg_must_be_none imports
       flash_attn_gpu) are marked skip with the reason "uses flash_attn's private C++ entry point X,
       which flash_kernels does not have": they are reported as skipped, never as passed.
    3. Prints (and with --json writes) a summary: per test function collected / selected /
       deselected / passed / failed / skipped / error / not-run counts, the totals, pytest's exit
       code, the torch / triton / flash_kernels versions, the GPU, the test file's sha256, the seed.
       The exit code is pytest's, except that it is 0 only when nothing failed, errored or went
       unreported (a run with failures never exits 0).

Why
    flash_kernels is a drop-in for flash_attn's public API; the strongest evidence of that is
    flash_attn's own test file passing unchanged. The full file (commit 0251105a) collects 508,777
    parametrized items on an sm80/sm90 host (about 80 s and 2.5 GB per collecting process), hence
    the reproducible stratified sample; with pytest-xdist every worker collects the full file.

S_dmask scaling
    flash_attn documents S_dmask (return_attn_probs=True) only as "the output of softmax
    (possibly with different scaling)". flash_kernels returns the softmax probabilities P
    (negated where dropout dropped the element, zeros in padding; shape (batch, nheads,
    seqlen_q rounded up to 128, seqlen_k rounded up to 128)). The test helpers
    (normalize_flash_attn_S) instead assume flash_attn's internal scaling: exp(S - m) per key block
    of _get_block_size_n columns, m being a running row maximum, which they undo with the row's
    logsumexp. The shim supplies flash_kernels' scaling with a single key block: its
    _get_block_size_n returns a block wider than any key length, so the helper's split gives one
    block whose m is the row maximum of the scores, and the shim returns
    S_dmask = P / max_j |P| per row (= exp(S - m), since max_j P = exp(m - lse)), computed in
    float32 and cast back to S_dmask's dtype, keeping the sign (dropped entries stay negative) and
    leaving all-zero rows zero.

Command (GPU host; torch, pytest, einops and optionally pytest-xdist installed; flash_kernels
importable, e.g. a wheel unpacked under /tmp/fk):
    PYTHONPATH=/tmp/fk python flash_kernels/tools/gpu/flash_attn_upstream.py \\
        --tests .whl/upstream/test_flash_attn.py --cases 1500 --seed 0 \\
        --junit flash_attn_upstream.xml --json flash_attn_upstream.json -- -n 8

Check without a GPU (collection only; DRY RUN fakes torch.cuda.get_device_capability to return
(9, 0) so the upstream file imports on a CPU host; no test body runs):
    PYTHONPATH=flash_kernels python flash_kernels/tools/gpu/flash_attn_upstream.py \\
        --tests .whl/upstream/test_flash_attn.py --cases 1500 --seed 0 --dry-run

Out of GPU memory: many xdist workers share one GPU, so a case can fail for lack of memory that
another worker held at that moment. After the run, the cases that failed with a clean
torch.OutOfMemoryError (and nothing else: a crashed worker, an AcceleratorError, any other
failure is never retried) run again in one serial pytest (no xdist, none of the arguments after
``--``). The summary gives both counts (first run; after the serial retry) and the exit code
follows the retried outcome; --no-retry-oom turns this off.

Options: --keep-temp keeps the generated folder (shim, plugin, raw outcome records) and prints
its path. --time-limit SECONDS interrupts pytest (SIGINT) after that long, for hosts that limit a
command's time: the JUnit file and the summary still cover what ran, the rest counts as not run.
Arguments after ``--`` go to pytest unchanged (they come after this tool's defaults
``-q --tb=short -rfE``, so they win; a -k / -m filter applies before the sampling).

Standard library only at import (torch is imported by the shim and plugin inside pytest, and by
the --probe-env subprocess); Python 3.9 syntax.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

MIN_PER_FUNCTION = 10
PLUGIN_MODULE = "flashkit_upstream_plugin"
ENV_STATE_DIR = "FLASHKIT_UPSTREAM_STATE_DIR"
ENV_SHIM_DIR = "FLASHKIT_UPSTREAM_SHIM_DIR"
ENV_CASES = "FLASHKIT_UPSTREAM_CASES"
ENV_SEED = "FLASHKIT_UPSTREAM_SEED"
ENV_FAKE_CAPABILITY = "FLASHKIT_UPSTREAM_DRY_RUN_FAKE_CAPABILITY"
DRY_RUN_CAPABILITY = (9, 0)
OUTCOMES_FILE = "outcomes.jsonl"

# What the shim's flash_attn and flash_attn.flash_attn_interface export. A test that imports any other
# name from them (flash_attn's private entry points) is marked skip by the plugin.
SHIM_EXPORTS = frozenset(
    {
        "flash_attn_func",
        "flash_attn_kvpacked_func",
        "flash_attn_qkvpacked_func",
        "flash_attn_varlen_func",
        "flash_attn_varlen_kvpacked_func",
        "flash_attn_varlen_qkvpacked_func",
        "flash_attn_with_kvcache",
        "_get_block_size_n",
        "USE_TRITON_ROCM",
        "SINGLE_KEY_BLOCK",
    }
)
# Known at commit 0251105a; the source scan in private_entry_point() finds these and any new ones.
KNOWN_PRIVATE = {
    "test_flash_attn_varlen_paged_kv_num_splits": "_flash_attn_varlen_forward",
    "test_flash_attn_generator_arg_must_be_none": "flash_attn_gpu",
}
PRIVATE_REASON = "uses flash_attn's private C++ entry point {}, which flash_kernels does not have"

# ---------------------------------------------------------------------------------------------------
# The shim package (written verbatim into the temporary folder)
# ---------------------------------------------------------------------------------------------------






PLUGIN_SOURCE = '''"""pytest plugin of flash_kernels/tools/gpu/flash_attn_upstream.py: its hooks live in that file."""

import importlib.util
import sys

import pytest

_TOOL_PATH = {tool_path!r}
_spec = importlib.util.spec_from_file_location("_flashkit_upstream_tool", _TOOL_PATH)
_tool = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _tool
_spec.loader.exec_module(_tool)

pytest_configure = _tool.plugin_configure
pytest_collection_modifyitems = pytest.hookimpl(trylast=True)(_tool.plugin_collection_modifyitems)
pytest_collectreport = _tool.plugin_collectreport
pytest_runtest_logreport = _tool.plugin_runtest_logreport
'''


SHIM_PACKAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "flash_attn_shim", "flash_attn")


def write_shim(folder: str) -> None:
    """Copies the flash_attn shim package (flash_attn_shim/flash_attn beside this file) and writes the pytest
    plugin module into folder; pytest runs with folder first on its path."""
    shutil.copytree(SHIM_PACKAGE, os.path.join(folder, "flash_attn"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    files = {PLUGIN_MODULE + ".py": PLUGIN_SOURCE.format(tool_path=os.path.abspath(__file__))}
    for rel, text in files.items():
        path = os.path.join(folder, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)


# ---------------------------------------------------------------------------------------------------
# Sampling (pure functions, used by the plugin)
# ---------------------------------------------------------------------------------------------------


def function_name(nodeid: str) -> str:
    """'path/test_x.py::test_f[a-b]' -> 'test_f' (the upstream file has no classes)."""
    return nodeid.split("::")[-1].split("[")[0]


def plan_quotas(counts: dict[str, int], cases: int, floor: int = MIN_PER_FUNCTION) -> dict[str, int]:
    """How many items each function keeps: at least min(count, floor) each, the rest of `cases` spread
    in proportion to the item counts (capped by each function's count). The total exceeds `cases`
    only when the floors alone do."""
    if sum(counts.values()) <= cases:
        return dict(counts)
    quota = {name: min(n, floor) for name, n in counts.items()}
    remaining = cases - sum(quota.values())
    while remaining > 0:  # largest remainder; a function whose share exceeds its room is capped and
        room = {name: counts[name] - quota[name] for name in counts}  # its excess is spread again
        open_names = sorted(name for name in counts if room[name] > 0)
        if not open_names:
            break
        weight = sum(counts[name] for name in open_names)
        exact = {name: remaining * counts[name] / weight for name in open_names}
        capped = [name for name in open_names if exact[name] >= room[name]]
        if capped:
            for name in capped:
                quota[name] += room[name]
                remaining -= room[name]
            continue
        for name in open_names:
            quota[name] += int(exact[name])
        left = remaining - sum(int(exact[name]) for name in open_names)
        order = sorted(open_names, key=lambda name: (int(exact[name]) - exact[name], name))
        for name in order[:left]:  # left < len(open_names); each of these still has room
            quota[name] += 1
        remaining = 0
    return quota


def sample_nodeids(nodeids: list[str], cases: int, seed: int) -> tuple[list[str], dict[str, int], dict[str, int]]:
    """Stratified reproducible sample. Returns (selected nodeids in the given order, collected per
    function, selected per function). Depends only on the set of nodeids, cases and seed."""
    by_function: dict[str, list[str]] = {}
    for nodeid in nodeids:
        by_function.setdefault(function_name(nodeid), []).append(nodeid)
    counts = {name: len(ids) for name, ids in by_function.items()}
    quota = plan_quotas(counts, cases)
    chosen = set()
    for name in sorted(by_function):
        ids = sorted(by_function[name])
        rng = random.Random(f"{seed}:{name}")
        chosen.update(rng.sample(ids, quota[name]))
    selected = [nodeid for nodeid in nodeids if nodeid in chosen]
    return selected, counts, quota


_IMPORT_RE = re.compile(r"from\s+flash_attn(?:\.flash_attn_interface)?\s+import\s+(?:\(([^)]*)\)|([^\n]*))")
_CUDA_MODULE_RE = re.compile(r"\bimport\s+(flash_attn_2_cuda|flash_attn_gpu)\b")


def private_entry_point(name: str, func) -> str | None:
    """The flash_attn private entry point a test function imports, if any (else None)."""
    found = KNOWN_PRIVATE.get(name)
    if found is not None:
        return found
    try:
        import inspect

        source = inspect.getsource(func)
    except (OSError, TypeError):
        return None
    for match in _IMPORT_RE.finditer(source):
        names = match.group(1) if match.group(1) is not None else match.group(2)
        names = " ".join(line.split("#")[0] for line in names.splitlines()).replace("\\", " ")
        for imported in names.split(","):
            imported = imported.strip().split(" as ")[0].strip()
            if imported and imported not in SHIM_EXPORTS:
                return imported
    match = _CUDA_MODULE_RE.search(source)
    return match.group(1) if match else None


# ---------------------------------------------------------------------------------------------------
# The plugin's hooks (run inside pytest; they import pytest / torch lazily)
# ---------------------------------------------------------------------------------------------------

_STATE: dict[str, object] = {"worker": None}


def _state_dir() -> str:
    return os.environ[ENV_STATE_DIR]


def _append_record(record: dict) -> None:
    with open(os.path.join(_state_dir(), OUTCOMES_FILE), "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def plugin_configure(config) -> None:
    import importlib.util

    import pytest

    workerinput = getattr(config, "workerinput", None)
    _STATE["worker"] = workerinput.get("workerid", "worker") if workerinput is not None else None
    shim_dir = os.path.realpath(os.environ[ENV_SHIM_DIR])
    spec = importlib.util.find_spec("flash_attn")
    origin = os.path.realpath(spec.origin) if spec is not None and spec.origin else None
    if origin is None or not origin.startswith(shim_dir + os.sep):
        raise pytest.UsageError(f"flash_attn resolves to {origin}, not to the flash_kernels shim in {shim_dir}: "
                                "the upstream tests would not test flash_kernels")
    fake = os.environ.get(ENV_FAKE_CAPABILITY)
    if fake:
        if not config.option.collectonly:
            raise pytest.UsageError(f"{ENV_FAKE_CAPABILITY} (fake GPU capability) is for --dry-run (collection) only")
        import torch

        capability = tuple(int(part) for part in fake.split(","))

        def fake_get_device_capability(device=None):
            # DRY RUN ONLY: lets the upstream file's import-time capability checks run on a CPU host.
            return capability

        torch.cuda.get_device_capability = fake_get_device_capability


def plugin_collection_modifyitems(session, config, items) -> None:
    import pytest

    cases = int(os.environ[ENV_CASES])
    seed = int(os.environ[ENV_SEED])
    by_nodeid = {item.nodeid: item for item in items}
    selected_ids, counts, quota = sample_nodeids([item.nodeid for item in items], cases, seed)
    chosen = set(selected_ids)
    private: dict[str, str] = {}
    for item in items:
        name = function_name(item.nodeid)
        if name not in private:
            entry = private_entry_point(name, getattr(item, "function", None))
            private[name] = entry or ""
        if item.nodeid in chosen and private[name]:
            item.add_marker(pytest.mark.skip(reason=PRIVATE_REASON.format(private[name])))
    deselected = [item for item in items if item.nodeid not in chosen]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
    items[:] = [by_nodeid[nodeid] for nodeid in selected_ids]
    record = {
        "cases": cases,
        "seed": seed,
        "collected": counts,
        "selected": quota,
        "private": {name: entry for name, entry in private.items() if entry},
        "selected_nodeids": selected_ids,
    }
    worker = _STATE["worker"] or "main"
    path = os.path.join(_state_dir(), f"collection-{worker}.json")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)


def _crash_message(report) -> str:
    longrepr = getattr(report, "longrepr", None)
    crash = getattr(longrepr, "reprcrash", None)
    message = getattr(crash, "message", None)
    if message is None:
        message = str(longrepr) if longrepr is not None else ""
    lines = [line for line in message.splitlines() if line.strip()]
    return (lines[0] if lines else "")[:300]


def plugin_collectreport(report) -> None:
    if _STATE["worker"] is not None or not report.failed:
        return
    _append_record({"nodeid": report.nodeid, "when": "collect", "outcome": "failed",
                    "message": _crash_message(report)})


def plugin_runtest_logreport(report) -> None:
    if _STATE["worker"] is not None:  # with xdist the controller records what the workers report
        return
    record = {"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome}
    if report.skipped and isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
        record["message"] = str(report.longrepr[2])[:300]
    elif report.failed:
        record["message"] = _crash_message(report)
    if hasattr(report, "wasxfail"):
        record["wasxfail"] = True
    _append_record(record)


# ---------------------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------------------


def probe_env() -> dict:
    """Versions and GPU, as seen by a process with pytest's environment (run as --probe-env)."""
    info: dict = {"python": sys.version.split()[0]}
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_cuda"] = torch.version.cuda
        info["torch_hip"] = getattr(torch.version, "hip", None)
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["gpu_capability"] = list(torch.cuda.get_device_capability(0))
        else:
            info["gpu"] = None
    except Exception as exc:
        info["torch"] = f"unavailable: {exc!r}"
    from importlib import metadata

    for dist in ("triton", "pytest", "pytest-xdist", "einops"):
        try:
            info[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            info[dist] = None
    try:
        import flash_kernels

        info["flash_kernels_file"] = flash_kernels.__file__
        version = getattr(flash_kernels, "__version__", None)
        if version is None:
            try:
                version = metadata.version("flash_kernels")
            except metadata.PackageNotFoundError:
                version = "unknown (no distribution metadata; source tree?)"
        info["flash_kernels"] = version
    except Exception as exc:
        info["flash_kernels"] = f"unavailable: {exc!r}"
    try:
        import flash_attn

        info["flash_attn_module"] = flash_attn.__file__
    except Exception as exc:
        info["flash_attn_module"] = f"unavailable: {exc!r}"
    return info


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_outcomes(state_dir: str) -> tuple[dict[str, str], dict[str, str], list[dict]]:
    """Per nodeid one outcome (failed > error > skipped > passed) and its message, plus collection errors."""
    phases: dict[str, dict[str, dict]] = {}
    collect_errors: list[dict] = []
    path = os.path.join(state_dir, OUTCOMES_FILE)
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    continue  # a line cut short by a crash
                if record["when"] == "collect":
                    collect_errors.append(record)
                else:
                    phases.setdefault(record["nodeid"], {})[record["when"]] = record
    outcome: dict[str, str] = {}
    message: dict[str, str] = {}
    for nodeid, by_when in phases.items():
        records = list(by_when.values())
        failed = [r for r in records if r["outcome"] == "failed"]
        # A failure outside setup/teardown (the call, or xdist's report for a crashed worker) is a
        # failure; one in setup or teardown is an error.
        call_failures = [r for r in failed if r["when"] not in ("setup", "teardown")]
        skipped = [r for r in records if r["outcome"] == "skipped"]
        call = by_when.get("call")
        if call_failures:
            result, source = "failed", call_failures[0]
        elif failed:
            result, source = "error", failed[0]
        elif skipped:
            result, source = "skipped", skipped[0]
        elif call is not None and call["outcome"] == "passed":
            result, source = "passed", call
        else:
            result, source = "not_run", {}
        outcome[nodeid] = result
        message[nodeid] = source.get("message", "")
    return outcome, message, collect_errors


def read_collection(state_dir: str) -> dict | None:
    names = sorted(n for n in os.listdir(state_dir) if n.startswith("collection-") and n.endswith(".json"))
    records = []
    for name in names:
        with open(os.path.join(state_dir, name), encoding="utf-8") as f:
            records.append(json.load(f))
    if not records:
        return None
    first = records[0]
    if any(r["selected_nodeids"] != first["selected_nodeids"] for r in records[1:]):
        first["warning"] = "xdist workers selected different items (collection differed between workers)"
    return first


NO_COLLECTION = "no collection record: pytest did not reach the sampling (see its output above)"
COLUMNS = ("collected", "selected", "deselected", "passed", "failed", "skipped", "error", "not_run")


def summarize(collection: dict | None, outcome: dict[str, str], message: dict[str, str],
              collect_errors: list[dict], dry_run: bool) -> dict:
    functions: dict[str, dict[str, int]] = {}
    skip_reasons: dict[str, dict[str, int]] = {}
    selected_ids = collection["selected_nodeids"] if collection else sorted(outcome)
    if collection:
        for name, n in collection["collected"].items():
            row = functions.setdefault(name, dict.fromkeys(COLUMNS, 0))
            row["collected"] = n
            row["selected"] = collection["selected"][name]
            row["deselected"] = n - collection["selected"][name]
    if not dry_run:
        for nodeid in selected_ids:
            name = function_name(nodeid)
            row = functions.setdefault(name, dict.fromkeys(COLUMNS, 0))
            result = outcome.get(nodeid, "not_run")
            row[result] += 1
            if result == "skipped":
                reasons = skip_reasons.setdefault(name, {})
                reasons[message.get(nodeid, "")] = reasons.get(message.get(nodeid, ""), 0) + 1
    totals = {column: sum(row[column] for row in functions.values()) for column in COLUMNS}
    failed_ids = sorted(nodeid for nodeid, result in outcome.items() if result == "failed")
    error_ids = sorted(nodeid for nodeid, result in outcome.items() if result == "error")
    return {
        "functions": dict(sorted(functions.items())),
        "totals": totals,
        "skip_reasons": skip_reasons,
        "private_entry_points": collection.get("private", {}) if collection else {},
        "failed": [{"nodeid": n, "message": message.get(n, "")} for n in failed_ids],
        "errors": [{"nodeid": n, "message": message.get(n, "")} for n in error_ids],
        "collection_errors": collect_errors,
        "collection_warning": collection.get("warning") if collection else NO_COLLECTION,
        "selected_nodeids": selected_ids,
    }


CRASH_MARKS = ("crashed while running", "node down", "Not properly terminated")


def crashed(text: str) -> bool:
    """Whether a failure message is xdist's report of a worker that died (a signal, not an exception)."""
    return any(mark in text for mark in CRASH_MARKS)


def oom_failures(outcome: dict[str, str], message: dict[str, str]) -> list[str]:
    """The failed cases whose exception was a clean torch.OutOfMemoryError: the ones worth a serial retry."""
    return sorted(nodeid for nodeid, result in outcome.items()
                  if result in ("failed", "error") and "OutOfMemoryError" in message.get(nodeid, "")
                  and not crashed(message.get(nodeid, "")))


def merge_retry(outcome: dict[str, str], message: dict[str, str], retried: list[str],
                retry_outcome: dict[str, str], retry_message: dict[str, str]) -> tuple[dict, dict, dict]:
    """Outcomes after the serial retry (a retried case takes its retry's outcome; one the retry did not
    report stays as it was) and the retry's counts."""
    merged, merged_message = dict(outcome), dict(message)
    for nodeid in retried:
        if nodeid in retry_outcome:
            merged[nodeid] = retry_outcome[nodeid]
            merged_message[nodeid] = retry_message.get(nodeid, "")
    counts = {"retried": len(retried),
              "passed": sum(merged[n] == "passed" for n in retried),
              "still_failed": sorted(n for n in retried if merged[n] != "passed"),
              "crashed_in_first_run": sorted(n for n, r in outcome.items()
                                             if r in ("failed", "error") and crashed(message.get(n, "")))}
    return merged, merged_message, counts


def retry_oom_serially(base_cmd: list[str], env: dict, temp: str, test_dir: str, nodeids: list[str],
                       time_limit: float | None) -> tuple[dict[str, str], dict[str, str], int]:
    """Runs the given cases again in one serial pytest (its own state folder); returns their outcomes."""
    state_dir = os.path.join(temp, "state-oom-retry")
    os.makedirs(state_dir, exist_ok=True)
    cmd = base_cmd + ["-q", "--tb=short", "-rfE", "-p", "no:xdist"] + [os.path.join(test_dir, n) for n in nodeids]
    print(f"retrying {len(nodeids)} case(s) that failed with torch.OutOfMemoryError, serially", flush=True)
    rc, _ = run_pytest(cmd, dict(env, **{ENV_STATE_DIR: state_dir}), time_limit)
    outcome, message, _ = read_outcomes(state_dir)
    return outcome, message, rc


def print_summary(report: dict) -> None:
    summary = report["summary"]
    width = max([len("test function")] + [len(name) for name in summary["functions"]])
    header = f"{'test function':<{width}}  " + " ".join(f"{c:>10}" for c in COLUMNS)
    print()
    print("=" * len(header))
    if report["dry_run"]:
        print(f"DRY RUN (collection only): torch.cuda.get_device_capability faked to return {DRY_RUN_CAPABILITY}; "
              "no test ran")
    print(header)
    print("-" * len(header))
    for name, row in summary["functions"].items():
        print(f"{name:<{width}}  " + " ".join(f"{row[c]:>10}" for c in COLUMNS))
    print("-" * len(header))
    print(f"{'TOTAL':<{width}}  " + " ".join(f"{summary['totals'][c]:>10}" for c in COLUMNS))
    for name, entry in summary["private_entry_points"].items():
        print(f"skipped {name}: {PRIVATE_REASON.format(entry)}")
    for name, reasons in summary["skip_reasons"].items():
        if name in summary["private_entry_points"]:
            continue
        for reason, count in sorted(reasons.items(), key=lambda kv: -kv[1]):
            print(f"skip reason {name}: {count} x {reason or '(no reason given)'}")
    for kind in ("failed", "errors"):
        for entry in summary[kind][:50]:
            print(f"{kind.upper()} {entry['nodeid']}: {entry['message']}")
        if len(summary[kind]) > 50:
            print(f"... {len(summary[kind]) - 50} more {kind} (see --json or the JUnit file)")
    for entry in summary["collection_errors"]:
        print(f"COLLECTION ERROR {entry['nodeid']}: {entry['message']}")
    if summary["collection_warning"]:
        print(f"WARNING: {summary['collection_warning']}")
    env = report["environment"]
    print(f"test file: {report['tests']} sha256 {report['tests_sha256']}")
    print(f"cases {report['cases']} seed {report['seed']}; pytest exit code {report['pytest_exit_code']}; "
          f"exit code {report['exit_code']}")
    retry = report.get("oom_retry")
    if retry:
        first = report["first_run_totals"]
        print(f"first run: {first['passed']} passed, {first['failed']} failed, {first['error']} errors; "
              f"{retry['retried']} failed with torch.OutOfMemoryError and ran again serially: {retry['passed']} "
              f"passed, {len(retry['still_failed'])} did not; crashed workers' cases: "
              f"{len(retry['crashed_in_first_run'])} (never retried)")
    if report["interrupted_by_time_limit"]:
        print(f"INTERRUPTED after --time-limit {report['time_limit_s']:g} s: not_run items did not run")
    print("torch {} (cuda {}), triton {}, flash_kernels {} ({}), GPU {}".format(
        env.get("torch"), env.get("torch_cuda"), env.get("triton"), env.get("flash_kernels"),
        env.get("flash_kernels_file"), env.get("gpu")))
    print("=" * len(header))


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    own, extra = split_argv(argv)
    parser = argparse.ArgumentParser(
        description="Run flash-attention's tests/test_flash_attn.py against flash_kernels through a flash_attn "
                    "shim, on a stratified reproducible sample of its items.",
        epilog="Arguments after -- go to pytest (e.g. -- -n 8).")
    parser.add_argument("--tests", help="path of flash-attention's tests/test_flash_attn.py")
    parser.add_argument("--cases", type=int, default=1500, help="items to sample (default 1500)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    parser.add_argument("--junit", help="JUnit XML output (required unless --dry-run)")
    parser.add_argument("--json", help="write the summary as JSON here")
    parser.add_argument("--dry-run", action="store_true",
                        help="collect only (pytest --collect-only -q), faking torch.cuda.get_device_capability "
                             f"-> {DRY_RUN_CAPABILITY} so the file imports on a CPU host; reports the sample")
    parser.add_argument("--keep-temp", action="store_true", help="keep the generated shim/plugin folder")
    parser.add_argument("--time-limit", type=float, default=None,
                        help="seconds after which pytest is interrupted (SIGINT): the JUnit file and the summary "
                             "still cover what ran, the rest counts as not run (exit code non-zero)")
    parser.add_argument("--no-retry-oom", dest="retry_oom", action="store_false",
                        help="do not run the cases that failed with torch.OutOfMemoryError again serially")
    parser.add_argument("--probe-env", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(own)
    if args.probe_env:
        return args, extra
    if not args.tests:
        parser.error("--tests is required")
    if not os.path.isfile(args.tests):
        parser.error(f"--tests {args.tests}: no such file")
    if args.cases < 1:
        parser.error("--cases must be >= 1")
    if not args.junit and not args.dry_run:
        parser.error("--junit is required (unless --dry-run)")
    return args, extra


def run_pytest(cmd: list[str], env: dict, time_limit: float | None) -> tuple[int, bool]:
    """Runs pytest; past time_limit seconds sends it SIGINT (pytest then stops, still writing the JUnit file
    and reporting what ran) and, 120 s later, kills it. Returns (exit code, whether it was interrupted)."""
    proc = subprocess.Popen(cmd, env=env)
    try:
        return proc.wait(timeout=time_limit), False
    except subprocess.TimeoutExpired:
        print(f"\n--time-limit {time_limit:g} s reached: interrupting pytest (SIGINT)", flush=True)
        proc.send_signal(signal.SIGINT)
        try:
            return proc.wait(timeout=120), True
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait(), True


def _environment(env: dict) -> dict:
    probe = subprocess.run([sys.executable, os.path.abspath(__file__), "--probe-env"], env={
        k: v for k, v in env.items() if k != ENV_FAKE_CAPABILITY}, capture_output=True, text=True)
    try:
        return json.loads(probe.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": (probe.stderr or probe.stdout)[-2000:]}


def final_exit_code(pytest_rc: int, summary: dict, collect_errors: list, collection, dry_run: bool,
                    retry: dict | None) -> int:
    """pytest's code, but never 0 while anything failed, errored or did not run; after a serial retry of the
    out-of-memory failures, 0 when the retry left nothing failed and no worker crashed."""
    totals = summary["totals"]
    bad = totals["failed"] + totals["error"] + len(collect_errors) + (0 if dry_run else totals["not_run"])
    if retry is not None and pytest_rc == 1 and bad == 0 and collection is not None:
        return 0  # every failure of the first run was out of memory and passed serially (a crash is a failure)
    if pytest_rc == 0 and (bad > 0 or collection is None):
        return 1
    return pytest_rc


def main(argv: list[str] | None = None) -> int:
    args, extra = parse_args(sys.argv[1:] if argv is None else argv)
    if args.probe_env:
        print(json.dumps(probe_env()))
        return 0
    tests = os.path.abspath(args.tests)
    temp = tempfile.mkdtemp(prefix="flash_attn_upstream_")
    shim_dir = os.path.join(temp, "shim")
    state_dir = os.path.join(temp, "state")
    os.makedirs(state_dir)
    write_shim(shim_dir)
    with open(os.path.join(temp, "pytest.ini"), "w", encoding="utf-8") as f:
        f.write("[pytest]\njunit_suite_name = flash_attn_upstream\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([shim_dir] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # no __pycache__ next to the test file
    env[ENV_STATE_DIR] = state_dir
    env[ENV_SHIM_DIR] = shim_dir
    env[ENV_CASES] = str(args.cases)
    env[ENV_SEED] = str(args.seed)
    env.pop(ENV_FAKE_CAPABILITY, None)
    test_dir = os.path.dirname(tests)
    base = [sys.executable, "-m", "pytest", "-p", PLUGIN_MODULE, "-p", "no:cacheprovider",
            "-c", os.path.join(temp, "pytest.ini"), "--rootdir", test_dir, "--confcutdir", test_dir]
    cmd = [*base[:3], tests, *base[3:]]
    if args.dry_run:
        env[ENV_FAKE_CAPABILITY] = ",".join(str(v) for v in DRY_RUN_CAPABILITY)
        cmd += ["--collect-only", "-q"]
        print(f"DRY RUN: collection only; torch.cuda.get_device_capability is FAKED to return {DRY_RUN_CAPABILITY} "
              "inside pytest so the upstream file imports without a GPU. Nothing is tested.", flush=True)
    else:
        cmd += ["-q", "--tb=short", "-rfE"]
    if args.junit:
        cmd += ["--junit-xml", os.path.abspath(args.junit)]
    cmd += extra
    print("running: " + " ".join(cmd), flush=True)
    retry = None
    try:
        started = time.monotonic()
        pytest_rc, interrupted = run_pytest(cmd, env, args.time_limit)
        collection = read_collection(state_dir)
        outcome, message, collect_errors = read_outcomes(state_dir)
        first_totals = summarize(collection, outcome, message, collect_errors, args.dry_run)["totals"]
        retry_ids = oom_failures(outcome, message) if args.retry_oom and not args.dry_run else []
        if retry_ids and not interrupted:
            left = None if args.time_limit is None else max(1.0, args.time_limit - (time.monotonic() - started))
            retry_outcome, retry_message, _ = retry_oom_serially(base, env, temp, test_dir, retry_ids, left)
            outcome, message, retry = merge_retry(outcome, message, retry_ids, retry_outcome, retry_message)
        environment = _environment(env)
    finally:
        if args.keep_temp:
            print(f"kept {temp}")
        else:
            shutil.rmtree(temp, ignore_errors=True)
    summary = summarize(collection, outcome, message, collect_errors, args.dry_run)
    exit_code = final_exit_code(pytest_rc, summary, collect_errors, collection, args.dry_run, retry)
    report = {
        "tests": tests,
        "tests_sha256": sha256_of(tests),
        "cases": args.cases,
        "seed": args.seed,
        "dry_run": args.dry_run,
        "pytest_command": cmd,
        "pytest_exit_code": pytest_rc,
        "exit_code": exit_code,
        "interrupted_by_time_limit": interrupted,
        "time_limit_s": args.time_limit,
        "environment": environment,
        "summary": summary,
        "first_run_totals": first_totals,
        "oom_retry": retry,
    }
    print_summary(report)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
            f.write("\n")
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
