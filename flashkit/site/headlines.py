"""One line that says what a benchmark result found, computed from the result file itself.

Each kind of file the benchmarks write has its own headline: the attention rows give flash_kernels' speed over
cuDNN's (and FlashAttention-2's) at the longest sequence of each head dim, the decode summary the API's speed
over cuDNN's per call, a GPU-host result its test counts, and so on. The kind is told by what the file holds,
not by its name. The numbers are only ever ratios within one file, so within one run on one GPU.
"""

from __future__ import annotations

import lzma
import re
from pathlib import Path

from flashkit.core import safeio
from flashkit.core.errors import SpecError

MAX_DATA_BYTES = 4 * safeio.MIB  # the largest result kept is 30 KiB (xz) or 120 KiB
MAX_UNPACKED_BYTES = 32 * safeio.MIB
# A row as bench_attention.py prints it: "fwd_bwd  hd64   s4096   causal=0 fk_cuda   6.056 ms   317.7 TFLOP/s"
ATTENTION_LINE = re.compile(
    r"^(?P<mode>fwd|fwd_bwd|decode)\s+hd(?P<head_dim>\d+)\s+s(?P<seqlen>\d+)\s+causal=(?P<causal>[01])\s+"
    r"(?P<impl>\S+)\s+[\d.]+ ms\s+(?P<tflops>[\d.]+) TFLOP/s$",
    re.MULTILINE,
)
# The implementation a headline speaks for, in order of preference (the backend users get on the GPU measured),
# and its name in words.
OURS = {"fk_cuda": "flash_kernels (CUDA)", "fk_triton": "flash_kernels (Triton)"}


def read(path: Path, root: Path) -> dict | str:
    """A result file: JSON (``.json``, or ``.json.xz`` as the large ones are kept) or a run's text log."""
    shown = safeio.describe(path, root)
    data = safeio.read_bytes(path, what="benchmark result", error=SpecError, max_bytes=MAX_DATA_BYTES, root=root)
    if path.name.endswith(".xz"):
        unpack = lzma.LZMADecompressor()
        try:
            data = unpack.decompress(data, max_length=MAX_UNPACKED_BYTES)
        except lzma.LZMAError as exc:
            raise SpecError(f"{shown}: not an xz file ({exc})") from None
        if not unpack.eof and unpack.needs_input:  # the stream stops before its end marker
            raise SpecError(f"{shown}: the xz stream is cut short (a truncated file)")
        if not unpack.eof:
            raise SpecError(f"{shown}: unpacks to more than {MAX_UNPACKED_BYTES // safeio.MIB} MiB")
    if path.name.endswith((".json", ".json.xz")):
        value = safeio.parse_json(data, shown=shown, what="benchmark result", error=SpecError)
        if not isinstance(value, dict):
            raise SpecError(f"{shown}: a benchmark result is a JSON object, not {type(value).__name__}")
        return value
    return safeio.decode_utf8(data, shown=shown, what="benchmark log", error=SpecError)


def headline(data: dict | str, mode: str | None = None) -> str:
    """What the result found, in one line; ``mode`` picks the attention rows' mode (fwd, fwd_bwd)."""
    if isinstance(data, str):
        rows = [dict(m.groupdict(), causal=m["causal"] == "1") for m in ATTENTION_LINE.finditer(data)]
        if not rows:
            raise ValueError("no attention rows as bench_attention.py prints them")
        return attention(rows, mode)
    for key, make in (
        ("tests_sha256", lambda: upstream_tests(data)),
        ("attention", lambda: attention(data["attention"], mode)),
        ("tier", lambda: gpu_run(data)),
        ("summary", lambda: decode(data["summary"])),
        ("ratios", lambda: generate(data["ratios"])),
        ("wheels", lambda: abi_modes(data["rows"])),
        ("calls", lambda: host_path(data["rows"])),
        ("rows", lambda: triton_tiles(data["rows"])),
    ):
        if key in data:
            return make()
    raise ValueError("not a result file of a benchmark in benchmarks/")


def _num(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(f"{value!r} is not a number")
    return float(value)


def _span(values: list[float], fmt: str = "{:.2f}") -> str:
    low, high = fmt.format(min(values)), fmt.format(max(values))
    return low if low == high else f"{low}-{high}"


def attention(rows: list[dict], mode: str | None) -> str:
    modes = {r["mode"] for r in rows}
    mode = mode if mode in modes else ("fwd_bwd" if "fwd_bwd" in modes else "fwd")
    rows = [r for r in rows if r["mode"] == mode]
    ours = next(i for i in (*OURS, *sorted({r["impl"] for r in rows})) if any(r["impl"] == i for r in rows))
    seqlen = max(int(r["seqlen"]) for r in rows)
    parts = []
    for hd in sorted({int(r["head_dim"]) for r in rows}):
        cells = []
        for causal in (False, True):
            speed = {r["impl"]: _num(r["tflops"]) for r in rows if (int(r["head_dim"]), int(r["seqlen"]),
                     bool(r["causal"])) == (hd, seqlen, causal)}  # fmt: skip
            if ours in speed and "sdpa_cudnn" in speed:
                fa2 = f" ({speed[ours] / speed['sdpa_flash']:.2f})" if "sdpa_flash" in speed else ""
                cells.append(f"{'causal ' if causal else ''}{speed[ours] / speed['sdpa_cudnn']:.2f}{fa2}")
        if cells:
            parts.append(f"head dim {hd} {', '.join(cells)}")
    if not parts:
        raise ValueError("no row of flash_kernels beside cuDNN's at the same shape")
    fa2 = " (over FlashAttention-2)" if "(" in " ".join(parts) else ""
    who = OURS.get(ours, ours)
    return f"{mode.replace('_', '+')} at seqlen {seqlen}, {who} speed over cuDNN's{fa2}: {'; '.join(parts)}"


def decode(summary: list[dict]) -> str:
    key = "api_vs_cudnn_call" if all("api_vs_cudnn_call" in s for s in summary) else "speedup_vs_sdpa_cudnn_call"
    ratios = [_num(s[key]) for s in summary]
    who = "the API (flash_attn_with_kvcache)" if key.startswith("api") else "the CUDA KV-cache kernel"
    return f"{who}, one call, speed over cuDNN's: {_span(ratios)} at {len(ratios)} shapes"


def gpu_run(data: dict) -> str:
    counts = data["counts"]
    gpu = data.get("host", {}).get("gpu") or "the GPU host"
    return (
        f"{data['tier']} {data['verdict']} on {gpu}: {int(counts['passed'])} passed, {int(counts['failed'])} "
        f"failed, {int(counts['skipped'])} skipped ({data['env']}, wheel {str(data['judged']['wheel_sha256'])[:12]})"
    )


def upstream_tests(data: dict) -> str:
    summary = data["summary"]
    totals = summary["totals"]
    failed = int(totals["failed"])
    text = (
        f"flash-attention's test_flash_attn.py, {int(totals['selected'])} sampled items: {int(totals['passed'])} "
        f"passed, {failed} failed, {int(totals['skipped'])} skipped"
    )
    # Workers sharing one card run out of memory between them: say how many failures were that, and nothing else.
    failures = summary.get("failed")
    if failed and isinstance(failures, list):
        oom = sum(1 for f in failures if str(f.get("message", "")).startswith("torch.OutOfMemoryError"))
        text += f" ({oom} of them torch.OutOfMemoryError)"
    not_run = int(totals.get("not_run", 0))
    return text + (f", {not_run} not run" if not_run else "")


def generate(ratios: dict) -> str:
    return (
        f"generate {_num(ratios['generate_sdpa_over_fk']):.2f}x the speed of sdpa, "
        f"training step {_num(ratios['train_sdpa_over_fk']):.2f}x"
    )


def abi_modes(rows: list[dict]) -> str:
    ratios = [_num(r["ratio_device_us"]) for r in rows]
    return f"device time, stable-ABI wheel over version-bound: {_span(ratios)} at {len(ratios)} cases"


def host_path(rows: list[dict]) -> str:
    by_layer: dict[str, list[float]] = {}
    for r in rows:
        by_layer.setdefault(str(r["layer"]), []).append(_num(r["us"]))
    shown = [(name, by_layer[layer]) for layer, name in (("api", "the API"), ("sdpa_cudnn", "SDPA cuDNN"))]
    return (
        ", ".join(f"{n} {_span(us, '{:.0f}')} µs" for n, us in shown if us)
        + f" per call at {len({str(r.get('shape')) for r in rows})} shapes"
    )


def triton_tiles(rows: list[dict]) -> str:
    best: dict[tuple, float] = {}
    default: dict[tuple, float] = {}
    for r in rows:
        shape = (r["seqlen"], r["causal"])
        if r["config"] == "default":
            default[shape] = _num(r["vs_cudnn"])
        else:
            best[shape] = max(best.get(shape, 0.0), _num(r["vs_cudnn"]))
    return (
        f"fwd+bwd speed over cuDNN's: best forced tile {_span(list(best.values()))}, the tile the path "
        f"picked then {_span(list(default.values()))} ({len(best)} shapes)"
    )
