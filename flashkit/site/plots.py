"""The performance section: the latest same-run benchmarks of ``benchmarks/results`` as bar charts.

Two charts, each from one benchmark file, so every bar in a chart was measured in the same run on the same
GPU: attention (TFLOP/s of flash_kernels, cuDNN and FlashAttention-2 as PyTorch ships it, by shape) from the
newest ``attention_*.json``, and decode (the share of the GPU's measured copy bandwidth each kernel reaches)
from the newest ``decode.json``. Each chart keeps the command that produced it and the commit that recorded
it. The bars are drawn as SVG by the page's template; here is only their geometry, from the numbers.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import re
from pathlib import Path

from flashkit.core import procs, safeio
from flashkit.core.errors import SpecError, ToolError

RESULTS = "benchmarks/results"
MAX_RESULT_BYTES = 4 * safeio.MIB  # the largest result kept is 30 KiB
# What each implementation is, in the words a reader knows.
IMPLS = {
    "fk_cuda": "flash_kernels CUDA",
    "fk_triton": "flash_kernels Triton",
    "api": "flash_kernels (flash_attn_with_kvcache)",
    "cuda": "flash_kernels CUDA",
    "cuda_paged16": "flash_kernels CUDA, paged (16)",
    "cuda_paged64": "flash_kernels CUDA, paged (64)",
    "cuda_paged256": "flash_kernels CUDA, paged (256)",
    "triton": "flash_kernels Triton",
    "sdpa_cudnn": "cuDNN (torch SDPA)",
    "sdpa_flash": "FlashAttention-2 (torch SDPA)",
    "sdpa_efficient": "memory-efficient (torch SDPA)",
}


@dataclasses.dataclass(frozen=True)
class Bar:
    label: str
    value: float
    shown: str  # the value as printed beside the bar
    share: float  # of the chart's largest value, 0..1 (the bar's length)
    ours: bool  # a flash_kernels implementation (drawn in the accent colour)


@dataclasses.dataclass(frozen=True)
class Group:
    label: str
    bars: tuple[Bar, ...]


@dataclasses.dataclass(frozen=True)
class Chart:
    slug: str
    title: str
    unit: str
    source: str  # repo-relative path of the result file
    command: str
    commit: str
    device: str
    torch: str
    groups: tuple[Group, ...]


def _commit(root: Path, rel: str) -> tuple[int, str]:
    """When and in which commit the file was last recorded (0, "not in git" outside a git checkout)."""
    try:
        res = procs.run(
            ["git", "-C", str(root), "log", "-1", "--format=%ct %H", "--", rel],
            timeout=30,
            capture_output=True,
            text=True,
        )
    except ToolError:  # no git, or it hangs: the chart says so rather than the page failing
        return 0, "not in git"
    parts = res.stdout.split()
    return (int(parts[0]), parts[1]) if res.returncode == 0 and len(parts) == 2 else (0, "not in git")


def _result_files(root: Path, pattern: str) -> list[Path]:
    """The files under ``benchmarks/results`` whose name matches ``pattern``. Symlinked folders are not
    followed (a link to ``..`` would list the tree for ever); what each file is, is checked when it is read."""
    return [
        Path(folder, name)
        for folder, _dirs, names in os.walk(root / RESULTS)
        for name in sorted(names)
        if fnmatch.fnmatchcase(name, pattern)
    ]


def _newest(root: Path, pattern: str) -> tuple[Path, str, str] | None:
    """The result file matching ``pattern`` recorded last (by commit time, then path), its path and commit."""
    found = []
    for p in _result_files(root, pattern):
        rel = p.relative_to(root).as_posix()
        when, commit = _commit(root, rel)
        found.append((when, rel, commit))
    if not found:
        return None
    _when, rel, commit = max(found)
    return root / rel, rel, commit


def _measure(value: object, name: str) -> float:
    """A measured value as a bar can show it: a finite number, not below zero."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
        raise ValueError(f"{name} {str(value)[:40]!r} is not a measurement (a finite number, 0 or more)")
    return float(value)


def _groups(cases: dict[str, list[tuple[str, float]]], fmt: str) -> tuple[Group, ...]:
    top = max((v for bars in cases.values() for _, v in bars), default=0.0) or 1.0
    return tuple(
        Group(
            label,
            tuple(
                Bar(IMPLS.get(i, i), v, fmt.format(v), v / top, i.startswith(("fk_", "cuda", "triton", "api")))
                for i, v in bars
            ),
        )
        for label, bars in cases.items()
    )


def attention_chart(data: dict, source: str, commit: str) -> Chart:
    cases: dict[str, list[tuple[str, float]]] = {}
    for r in data.get("attention", []):
        label = (
            f"{r['mode'].replace('_', '+')}, head dim {r['head_dim']}, seqlen {r['seqlen']}, batch {r['batch']}, "
            f"{r['nheads']} heads{', causal' if r.get('causal') else ''}"
        )
        cases.setdefault(label, []).append((str(r["impl"]), _measure(r["tflops"], "tflops")))
    title = f"Attention, {data.get('dtype', '')}: TFLOP/s (higher is better)"
    return _chart(data, "attention", title, "TFLOP/s", source, commit, _groups(cases, "{:.0f}"))


def decode_chart(data: dict, source: str, commit: str) -> Chart:
    cases: dict[str, list[tuple[str, float]]] = {}
    for r in data.get("rows", []):
        # cuda_s<N> rows are a forced split-count sweep (a tuning aid), not a backend a user picks
        if r.get("share_of_copy_call") is None or re.fullmatch(r"cuda_s\d+", str(r.get("impl"))):
            continue
        label = f"batch {r['batch']}, KV cache {r['cache_len']}, {r['heads_q']}/{r['heads_kv']} heads, head dim {r['head_dim']}"
        cases.setdefault(label, []).append((str(r["impl"]), 100.0 * _measure(r["share_of_copy_call"], "share")))
    copy = data.get("copy_TBps")
    bandwidth = f" ({_measure(copy, 'copy_TBps'):.2f} TB/s)" if copy else ""
    title = f"Decode, one call each: share of the measured copy bandwidth{bandwidth} (higher is better)"
    return _chart(data, "decode", title, "%", source, commit, _groups(cases, "{:.0f}%"))


def _chart(data: dict, slug: str, title: str, unit: str, source: str, commit: str, groups) -> Chart:
    """A chart with the run's own facts (command, device, torch) as its result file states them."""
    return Chart(
        slug, title, unit, source, str(data.get("command", "")), commit, str(data.get("device", "")),
        str(data.get("torch", "")), groups,
    )  # fmt: skip


def charts(root: Path) -> tuple[tuple[Chart, ...], tuple[str, ...]]:
    """The charts whose result files are present (none in a checkout without benchmark results), and a line
    for each result file that could not be read: the page says so instead of leaving the chart out quietly."""
    out, problems = [], []
    for pattern, make in (("attention_*.json", attention_chart), ("decode.json", decode_chart)):
        found = _newest(root, pattern)
        if found is None:
            continue
        path, rel, commit = found
        try:
            data = safeio.read_json(
                path, what="benchmark result", error=SpecError, max_bytes=MAX_RESULT_BYTES, root=root
            )
        except SpecError as exc:  # not a regular file in the checkout, too large, not UTF-8 or not strict JSON
            problems.append(str(exc).splitlines()[0])
            continue
        try:
            if not isinstance(data, dict):
                raise TypeError(f"a JSON object, not {type(data).__name__}")
            chart = make(data, rel, commit)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            problems.append(f"{rel}: not a benchmark result this page can read ({type(exc).__name__}: {exc})")
            continue
        if chart.groups:
            out.append(chart)
    return tuple(out), tuple(problems)
