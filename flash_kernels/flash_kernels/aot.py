"""Compile every Triton kernel specialisation flash_kernels would launch, for GPUs this host
does not have, with nothing but the installed triton; report what compiled and what it uses.

    python -m flash_kernels.aot --target hip:gfx942 --target hip:gfx90a --target cuda:80 \\
        [--jobs N] [--only SUBSTRING] [--list] [--timings] [--cache-dir DIR] --out report.json

Targets: cuda:80, cuda:90 (PTX + cubin with the ptxas bundled in the triton wheel) and
hip:gfx90a, hip:gfx942 (AMDGCN + hsaco), see targets.py. Exit status: 0 when every
specialisation that was not pruned compiled and fits the target, 1 when any failed, 2 for a
usage error (unknown target, a triton this module was not made to work with, a missing linker).

What is compiled comes from the code the launchers run: the tile configs from triton_tiles
(_fwd_space/_bwd_space with their pruning reasons, _fwd_config, _bwd_config, _decode_config,
_probs_tiles, _heads_block, the split-KV limit) for the target given, and DOT_PRECISION from
_dot_precision. The constexprs each kernel receives are checked against the kernel's own
parameters, so a kernel that gains a constexpr fails here instead of going uncovered.

Coverage (the report's "coverage" section states it too), chosen so one target is about 440
specialisations, 10-15 minutes with --jobs 2 on two busy cores (the timings are in the report
with --timings). Head dims are grouped by HEAD_DIM_PAD class (16, 32, 64, 128, 256): tiles,
shared memory and registers follow the class, so each class is compiled at its power of two;
the non-power-of-two head dims 12, 24, 40, 72, 96, 160, 192 (masked head-dim lanes; 12, 24, 40
and 72 are not multiples of 16 either, so their strides carry no divisibility hint) are compiled
with every flag at the largest config of their class, for bf16 and fp32.
- tuner: every candidate of _fwd_space / _bwd_space (pruned ones recorded with the reason) plus
  the defaults, bf16, every class; fp32 has only its default. fp16 shares bf16's element size,
  tiles and MMA shapes, so it gets its defaults and the class's largest-resource config only.
- feature flags (causal, window, softcap, ALiBi, dropout, varlen, GQA) all together at the
  largest-resource config of every class and dtype, for _attn_fwd, _bwd_dkdv and _bwd_dq (the
  most registers and code); each flag alone for bf16 at head dim 128; paged varlen forward at
  every class and dtype.
- _attn_probs (S_dmask) with every flag (plain too for bf16); _bwd_delta (varlen too for bf16).
- decode (_attn_fwd with HAS_SEQLENS_K), bf16 and fp32: packed GQA with split-KV on a dense
  cache; paged (page 16) packed split; a dense cache through cache_batch_idx with leftpad, no
  packing or splits; and for every dtype paged (page 256) with leftpad, softcap, ALiBi, a window
  and 128 splits at the largest decode tile. The decode tile follows the query rows, so these
  cover its three row classes. _combine_splits at 2 and 128 splits; _rotary_q and _append_kv
  (dense with cache_batch_idx, paged with rotary, interleaved or not, up to the largest head block).

Specialisation on values (what a launch decides from the arguments, not the constexprs):
pointers are 16-byte aligned and strides multiples of 16 for head dims that are multiples of 16
(a contiguous layout), unhinted otherwise; other integers take the generic path.

Resources: HIP from the AMDGCN metadata (.vgpr_count, .agpr_count, .sgpr_count, spill counts,
.group_segment_fixed_size = static LDS, .private_segment_fixed_size = scratch) plus Triton's
dynamic LDS (metadata.shared); CUDA from ptxas -v of the compile itself (registers, spill
stores/loads, stack frame) plus metadata.shared. A compiled specialisation whose shared memory
exceeds the target's is reported failed: that launch would fail on the device.

Compiled for a target is not "ran on that GPU": no numerics, no launch, no timing of kernels.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import inspect
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Optional

from . import targets
from .targets import Target

try:  # the tile tables import triton; without it main() says so and exits 2
    from . import triton_tiles
    from .triton_tiles import TileConfig
except ImportError as _e:
    triton_tiles = TileConfig = None
    _TRITON_IMPORT_ERROR = _e

REPORT_VERSION = 1
TESTED_TRITON = ("3.3.1", "3.6.0", "3.9.0")
TRITON_RANGE = ((3, 3), (3, 9))  # major.minor inclusive: ASTSource(fn, signature, constexprs, attrs)
DTYPES = ("bfloat16", "float16", "float32")
TRITON_DTYPE = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
CLASSES = (16, 32, 64, 128, 256)
EXTRA_HEAD_DIMS = (12, 24, 40, 72, 96, 160, 192)
GQA = 4  # query heads per KV head where a specialisation exercises grouped-query attention
SINGLES_HEAD_DIM = 128
ERROR_CHARS = 1500

KERNELS = {
    "_attn_fwd": "triton_forward",
    "_attn_probs": "triton_forward",
    "_combine_splits": "triton_forward",
    "_bwd_delta": "triton_backward",
    "_bwd_dkdv": "triton_backward",
    "_bwd_dq": "triton_backward",
    "_rotary_q": "triton_kvcache",
    "_append_kv": "triton_kvcache",
}
# Pointer arguments by element type; the data pointers take the dtype of the specialisation.
DATA_POINTERS = {
    "Q",
    "K",
    "V",
    "OUT",
    "DO",
    "DK",
    "DV",
    "DQ",
    "PROBS",
    "K_NEW",
    "V_NEW",
    "K_CACHE",
    "V_CACHE",
    "COS",
    "SIN",
}
FP32_POINTERS = {"LSE", "O_PART", "LSE_PART", "DELTA", "ALIBI_SLOPES"}
I32_POINTERS = {"CU_SEQLENS_Q", "CU_SEQLENS_K", "SEQLENS_K", "BATCH_IDX", "LEFTPAD", "BLOCK_TABLE", "CACHE_SEQLENS"}
FLOAT_SCALARS = {"sm_scale", "softcap", "dropout_p", "dropout_scale"}
DUMMY = "*i32"  # what the launchers pass for an absent optional tensor


class UsageError(Exception):
    """Exit 2: the command line or the environment cannot produce a report."""


# ----------------------------------------------------------------------------- specialisations
@dataclass(frozen=True)
class Spec:
    kernel: str
    role: str  # forward | backward | decode
    dtype: str
    head_dim: int
    constexprs: tuple  # sorted (name, value)
    pointers: tuple = ()  # sorted (name, triton type) where a launch passes another type
    num_warps: Optional[int] = None  # None: the backend's default (the launcher passes none)
    num_stages: Optional[int] = None
    sources: tuple = ()  # why it is in the set: candidate, default, features:..., decode:...
    pruned: Optional[str] = None
    shared_estimate: Optional[int] = None

    @property
    def key(self) -> str:
        cx = ",".join(f"{k}={v}" for k, v in self.constexprs if k not in ("HEAD_DIM", "HEAD_DIM_PAD"))
        ptr = "".join(f",{k}:{v}" for k, v in self.pointers)
        return (
            f"{self.kernel}/{TRITON_DTYPE[self.dtype]}/d{self.head_dim}/{cx}{ptr}"
            f"/w{self.num_warps or '-'}s{self.num_stages or '-'}"
        )


@dataclass(frozen=True)
class Features:
    """The attention options a launch turns into constexprs (flash_attn's arguments)."""

    left: bool = False
    right: bool = False
    softcap: bool = False
    alibi: bool = False
    dropout: bool = False
    varlen: bool = False
    page_size: int = 0
    group: int = 1


ALL_FEATURES = Features(left=True, right=True, softcap=True, alibi=True, dropout=True, varlen=True, group=GQA)
SINGLE_FEATURES = {
    "causal": Features(right=True),
    "window": Features(left=True, right=True),
    "softcap": Features(softcap=True),
    "alibi": Features(alibi=True),
    "dropout": Features(dropout=True),
    "varlen": Features(varlen=True),
    "gqa": Features(group=GQA),
}
PAGED_VARLEN = Features(right=True, varlen=True, page_size=16, group=GQA)


def _head_dims(hdp: int, dtype: str = "bfloat16", extras_for=("bfloat16", "float32")) -> list[int]:
    """The class's power of two, and its non-power-of-two head dims for the dtypes in extras_for."""
    extras = [d for d in EXTRA_HEAD_DIMS if triton_tiles._head_dim_pad(d) == hdp] if dtype in extras_for else []
    return [hdp, *extras]


def _common(f: Features, head_dim: int, dtype: str, target: Target) -> dict:
    return dict(
        HAS_LEFT=f.left,
        HAS_RIGHT=f.right,
        SOFTCAP=f.softcap,
        ALIBI=f.alibi,
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=triton_tiles._head_dim_pad(head_dim),
        DOT_PRECISION=triton_tiles._dot_precision(dtype, target),
    )


def _optional_pointers(f: Features, splits: int = 1) -> tuple:
    """Pointer types of the dummies the launchers pass for absent tensors (int32, one element)."""
    ptrs = {}
    if not f.alibi:
        ptrs["ALIBI_SLOPES"] = DUMMY
    if not f.dropout:
        ptrs["SEED"] = DUMMY
    if splits <= 1:
        ptrs["O_PART"] = ptrs["LSE_PART"] = DUMMY
    return tuple(sorted(ptrs.items()))


def _tile_spec(
    kernel: str,
    role: str,
    dtype: str,
    head_dim: int,
    cx: dict,
    cfg: TileConfig,
    target: Target,
    source: str,
    pointers: tuple = (),
    pruned: Optional[str] = None,
    estimate_kernels: tuple = (),
) -> Spec:
    hdp = triton_tiles._head_dim_pad(head_dim)
    cx = dict(cx, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n)
    estimate = None
    if estimate_kernels:
        estimate = max(triton_tiles.shared_estimate(k, cfg, hdp, dtype, target) for k in estimate_kernels)
    return Spec(
        kernel,
        role,
        dtype,
        head_dim,
        tuple(sorted(cx.items())),
        pointers,
        cfg.num_warps,
        cfg.num_stages,
        (source,),
        pruned,
        estimate,
    )


def fwd_spec(dtype, head_dim, f: Features, cfg: TileConfig, target, source, *, pruned=None, decode=None) -> Spec:
    """_attn_fwd as attention_forward launches it; ``decode`` = (pack_gqa, splits, leftpad, batch_idx)."""
    pack, splits, leftpad, batch_idx = decode or (False, 1, False, False)
    cx = dict(
        _common(f, head_dim, dtype, target),
        GROUP=f.group,
        PACK_GQA=pack,
        NUM_SPLITS=splits,
        IS_VARLEN=f.varlen,
        HAS_SEQLENS_K=decode is not None,
        HAS_BATCH_IDX=batch_idx,
        HAS_LEFTPAD=leftpad,
        PAGE_SIZE=f.page_size,
        DROPOUT=f.dropout,
    )
    role = "decode" if decode is not None else "forward"
    return _tile_spec(
        "_attn_fwd", role, dtype, head_dim, cx, cfg, target, source, _optional_pointers(f, splits), pruned, ("fwd",)
    )


def bwd_specs(dtype, head_dim, f: Features, cfg: TileConfig, target, source, *, pruned=None) -> list[Spec]:
    """_bwd_dkdv and _bwd_dq as attention_backward launches them with one tile config."""
    cx = dict(_common(f, head_dim, dtype, target), GROUP=f.group, IS_VARLEN=f.varlen, DROPOUT=f.dropout)
    ptrs = tuple(p for p in _optional_pointers(f) if p[0] in ("ALIBI_SLOPES", "SEED"))
    return [
        _tile_spec(k, "backward", dtype, head_dim, cx, cfg, target, source, ptrs, pruned, ("dkdv", "dq"))
        for k in ("_bwd_dkdv", "_bwd_dq")
    ]


def probs_spec(dtype, head_dim, f: Features, target, source) -> Spec:
    hdp = triton_tiles._head_dim_pad(head_dim)
    block_m, block_n = triton_tiles._probs_tiles(hdp)
    cx = dict(_common(f, head_dim, dtype, target), GROUP=f.group, IS_VARLEN=f.varlen, BLOCK_M=block_m, BLOCK_N=block_n)
    ptrs = (("ALIBI_SLOPES", DUMMY),) if not f.alibi else ()
    return Spec("_attn_probs", "forward", dtype, head_dim, tuple(sorted(cx.items())), ptrs, sources=(source,))


def delta_spec(dtype, head_dim, varlen: bool, source) -> Spec:
    cx = dict(
        IS_VARLEN=varlen,
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=triton_tiles._head_dim_pad(head_dim),
        BLOCK_M=triton_tiles.DELTA_BLOCK_M,
    )
    return Spec("_bwd_delta", "backward", dtype, head_dim, tuple(sorted(cx.items())), sources=(source,))


def combine_spec(dtype, head_dim, splits: int, source) -> Spec:
    cx = dict(
        NUM_SPLITS=splits,
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=triton_tiles._head_dim_pad(head_dim),
        BLOCK_M=triton_tiles.COMBINE_BLOCK_M,
    )
    return Spec("_combine_splits", "decode", dtype, head_dim, tuple(sorted(cx.items())), sources=(source,))


def _max_heads_block(hdp: int) -> int:
    return triton_tiles._heads_block(1 << 16, hdp)  # as many heads as the tile allows


def rotary_spec(dtype, head_dim, *, interleaved, per_row, half_rotary, cos_fp32, nheads, source) -> Spec:
    hdp = triton_tiles._head_dim_pad(head_dim)
    rotary_dim = (head_dim // 4 * 2 if half_rotary else head_dim // 2 * 2) or 2
    cx = dict(
        PER_ROW=per_row,
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=hdp,
        ROTARY_DIM=rotary_dim,
        INTERLEAVED=interleaved,
        BLOCK_H=triton_tiles._heads_block(nheads, hdp),
    )
    ptrs = (("COS", "*fp32"), ("SIN", "*fp32")) if cos_fp32 else ()
    return Spec("_rotary_q", "decode", dtype, head_dim, tuple(sorted(cx.items())), ptrs, sources=(source,))


def append_spec(dtype, head_dim, *, page_size, rotary, interleaved, nheads, source) -> Spec:
    hdp = triton_tiles._head_dim_pad(head_dim)
    cx = dict(
        HAS_BATCH_IDX=page_size == 0,
        PAGE_SIZE=page_size,
        ROTARY=rotary,
        ROTARY_DIM=(head_dim // 2 * 2 or 2) if rotary else 0,
        INTERLEAVED=interleaved,
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=hdp,
        BLOCK_H=triton_tiles._heads_block(nheads, hdp),
    )
    ptrs = () if rotary else (("COS", DUMMY), ("SIN", DUMMY))
    return Spec("_append_kv", "decode", dtype, head_dim, tuple(sorted(cx.items())), ptrs, sources=(source,))


def _largest(configs: Iterable[TileConfig], kernels: tuple, hdp: int, dtype: str, target: Target) -> TileConfig:
    """The config with the most shared memory (ties: larger tiles, more warps, more stages)."""

    def size(c):
        est = max(triton_tiles.shared_estimate(k, c, hdp, dtype, target) for k in kernels)
        return (est, c.block_m * c.block_n, c.num_warps, c.num_stages)

    return max(configs, key=size)


def _tuner_specs(target: Target, dtype: str, hdp: int) -> tuple[list[Spec], TileConfig, TileConfig]:
    """Forward and backward tuner candidates + defaults; returns them and the largest configs."""
    fwd_space = triton_tiles._fwd_space(hdp, dtype, target)
    bwd_space = triton_tiles._bwd_space(hdp, dtype, target)
    fwd_default = triton_tiles._fwd_config(hdp, dtype, target)
    bwd_default = triton_tiles._bwd_config(hdp, dtype, target)
    fwd_big = _largest([c for c, why in fwd_space if why is None] + [fwd_default], ("fwd",), hdp, dtype, target)
    bwd_big = _largest([c for c, why in bwd_space if why is None] + [bwd_default], ("dkdv", "dq"), hdp, dtype, target)
    plain = Features()
    specs = [
        fwd_spec(dtype, hdp, plain, fwd_default, target, "default"),
        *bwd_specs(dtype, hdp, plain, bwd_default, target, "default"),
    ]
    every_candidate = dtype != "float16"  # fp16: same tiles and MMA shapes as bf16 (see the docstring)
    for cfg, why in fwd_space:
        if every_candidate or why is not None or cfg == fwd_big:
            specs.append(fwd_spec(dtype, hdp, plain, cfg, target, "candidate", pruned=why))
    for cfg, why in bwd_space:
        if every_candidate or why is not None or cfg == bwd_big:
            specs += bwd_specs(dtype, hdp, plain, cfg, target, "candidate", pruned=why)
    return specs, fwd_big, bwd_big


def _feature_specs(target: Target, dtype: str, hdp: int, fwd_big: TileConfig, bwd_big: TileConfig) -> list[Spec]:
    specs = []
    for head_dim in _head_dims(hdp, dtype):
        specs.append(fwd_spec(dtype, head_dim, ALL_FEATURES, fwd_big, target, "features:all"))
        specs += bwd_specs(dtype, head_dim, ALL_FEATURES, bwd_big, target, "features:all")
    specs.append(fwd_spec(dtype, hdp, PAGED_VARLEN, fwd_big, target, "features:paged"))
    if dtype == "bfloat16" and hdp == SINGLES_HEAD_DIM:
        for name, f in SINGLE_FEATURES.items():
            specs.append(fwd_spec(dtype, hdp, f, fwd_big, target, f"features:{name}"))
            specs += bwd_specs(dtype, hdp, f, bwd_big, target, f"features:{name}")
    return specs


def _decode_specs(target: Target, dtype: str, hdp: int) -> list[Spec]:
    """The KV-cache forward's shapes: the decode tile follows rows = seqlen_q x (GQA if packed)."""

    def tile(rows):
        return triton_tiles._decode_config(rows, hdp, dtype, target)

    big_rows = 128  # over 64 rows: the forward default's row tile
    paged_all = Features(left=True, right=True, softcap=True, alibi=True, page_size=256, group=GQA)
    specs = []
    for head_dim in _head_dims(hdp, dtype, extras_for=("bfloat16",)):
        specs.append(
            fwd_spec(
                dtype,
                head_dim,
                paged_all,
                tile(big_rows),
                target,
                "decode:paged256-all",
                decode=(True, triton_tiles.MAX_SPLITS, True, False),
            )
        )
    if dtype == "float16":  # bf16's shapes; the largest decode config above is enough
        return specs + _cache_prep_specs(dtype, hdp)
    specs += [
        fwd_spec(
            dtype, hdp, Features(group=GQA), tile(GQA), target, "decode:gqa-split", decode=(True, 4, False, False)
        ),
        fwd_spec(
            dtype,
            hdp,
            Features(right=True, page_size=16, group=GQA),
            tile(16 * GQA),
            target,
            "decode:paged16-split",
            decode=(True, 4, False, False),
        ),
        fwd_spec(dtype, hdp, Features(right=True), tile(1), target, "decode:batch-idx", decode=(False, 1, True, True)),
    ]
    return specs + _cache_prep_specs(dtype, hdp)


def _cache_prep_specs(dtype: str, hdp: int) -> list[Spec]:
    """Split combine, rotary of q and the cache append: small kernels, every dtype and class."""
    specs = [combine_spec(dtype, hdp, splits, "decode:combine") for splits in (2, triton_tiles.MAX_SPLITS)]
    specs += [
        rotary_spec(
            dtype,
            hdp,
            interleaved=True,
            per_row=False,
            half_rotary=False,
            cos_fp32=False,
            nheads=32,
            source="decode:rotary",
        ),
        append_spec(dtype, hdp, page_size=0, rotary=False, interleaved=True, nheads=8, source="decode:append"),
    ]
    # The largest head block, rotary on half the dims: also at the non-power-of-two head dims.
    for head_dim in _head_dims(hdp, dtype, extras_for=("bfloat16",)):
        specs += [
            rotary_spec(
                dtype,
                head_dim,
                interleaved=False,
                per_row=True,
                half_rotary=True,
                cos_fp32=True,
                nheads=1 << 16,
                source="decode:rotary",
            ),
            append_spec(
                dtype, head_dim, page_size=256, rotary=True, interleaved=False, nheads=1 << 16, source="decode:append"
            ),
        ]
    return specs


def _aux_specs(dtype: str, hdp: int, target: Target) -> list[Spec]:
    """S_dmask with every flag (and plain for bf16); the backward's delta (varlen for bf16)."""
    specs = [probs_spec(dtype, hdp, ALL_FEATURES, target, "probs:all"), delta_spec(dtype, hdp, False, "delta")]
    if dtype == "bfloat16":
        specs += [probs_spec(dtype, hdp, Features(), target, "probs"), delta_spec(dtype, hdp, True, "delta:varlen")]
    return specs


def enumerate_specs(target: Target) -> list[Spec]:
    """Every specialisation of the coverage (module docstring) for ``target``, sorted by key."""
    specs = []
    for dtype in DTYPES:
        for hdp in CLASSES:
            tuned, fwd_big, bwd_big = _tuner_specs(target, dtype, hdp)
            specs += tuned
            specs += _feature_specs(target, dtype, hdp, fwd_big, bwd_big)
            specs += _decode_specs(target, dtype, hdp)
            specs += _aux_specs(dtype, hdp, target)
    return _dedupe(specs)


def _dedupe(specs: list[Spec]) -> list[Spec]:
    """One entry per specialisation; every reason it was enumerated kept; compiled beats pruned."""
    merged: dict[str, Spec] = {}
    for s in specs:
        old = merged.get(s.key)
        if old is None:
            merged[s.key] = s
            continue
        pruned = old.pruned if old.pruned and s.pruned else None
        merged[s.key] = dataclasses.replace(old, sources=tuple(sorted(set(old.sources + s.sources))), pruned=pruned)
    return [merged[k] for k in sorted(merged)]


# ----------------------------------------------------------------------------- compiling
def _kernel(name: str):
    import importlib

    return getattr(importlib.import_module(f"{__package__}.{KERNELS[name]}"), name)


def _check_constexprs(fn, constexprs: dict) -> None:
    wanted = {p.name for p in fn.params if p.is_constexpr}
    missing, extra = sorted(wanted - set(constexprs)), sorted(set(constexprs) - wanted)
    if missing or extra:
        raise ValueError(f"{fn.__name__}: constexprs missing {missing}, unknown {extra}")


def ast_source(spec: Spec):
    """Triton's ASTSource for the spec: signature as a launch specialises it (module docstring)."""
    from triton.compiler import ASTSource

    fn = _kernel(spec.kernel)
    constexprs = dict(spec.constexprs)
    _check_constexprs(fn, constexprs)
    aligned = spec.head_dim % 16 == 0
    overrides = dict(spec.pointers)
    signature, attrs = {}, {}
    for i, param in enumerate(fn.params):
        name = param.name
        if param.is_constexpr:
            signature[name] = "constexpr"
            continue
        signature[name] = overrides.get(name) or _arg_type(name, spec.dtype)
        if signature[name].startswith("*") or (aligned and name.startswith("stride_")):
            attrs[(i,)] = [["tt.divisibility", 16]]
    return ASTSource(
        fn=fn, signature=signature, constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()}, attrs=attrs
    )


def _arg_type(name: str, dtype: str) -> str:
    if name in DATA_POINTERS:
        return "*" + TRITON_DTYPE[dtype]
    if name in FP32_POINTERS:
        return "*fp32"
    if name in I32_POINTERS:
        return "*i32"
    if name == "SEED":
        return "*i64"
    if name.isupper():
        raise ValueError(f"no pointer type known for kernel argument {name}")
    return "fp32" if name in FLOAT_SCALARS else "i32"


class _PtxasTap:
    """Stands in for the subprocess module inside triton's NVIDIA backend to keep the log of
    the ptxas -v it runs for the cubin: the registers and spills of the very compile reported."""

    def __init__(self):
        self.logs: list[str] = []

    def __getattr__(self, name):
        return getattr(subprocess, name)

    def run(self, cmd, *args, **kwargs):
        result = subprocess.run(cmd, *args, **kwargs)
        log = kwargs.get("stderr")
        if "-v" in cmd and hasattr(log, "name"):
            with open(log.name) as f:
                self.logs.append(f.read())
        return result


@contextlib.contextmanager
def _ptxas_tap():
    from triton.backends.nvidia import compiler as nv

    tap = _PtxasTap()
    saved = nv.subprocess
    nv.subprocess = tap
    try:
        yield tap
    finally:
        nv.subprocess = saved


def _ptxas_rerun(ptx: str, arch: int) -> str:
    """ptxas -v on the PTX, for a cubin that came from Triton's cache (no log to tap)."""
    from triton.backends.nvidia import compiler as nv

    # triton 3.3 and 3.6+ pick the ptxas per arch (get_ptxas(arch)); 3.4 and 3.5 take no argument.
    takes_arch = bool(inspect.signature(nv.get_ptxas).parameters)
    tool = nv.get_ptxas(arch) if takes_arch else nv.get_ptxas()
    path = tool[0] if isinstance(tool, tuple) else tool.path
    gpu = nv.sm_arch_from_capability(arch)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        done = subprocess.run(
            [path, "-v", f"--gpu-name={gpu}", src, "-o", os.path.join(tmp, "k.cubin")],
            capture_output=True,
            text=True,
            check=True,
        )
    return done.stderr + done.stdout


def cuda_resources(ptxas_log: str, kernel: str, shared: int) -> dict:
    """The entry function's lines of a ptxas -v log (device functions have their own)."""
    start = ptxas_log.find(f"Function properties for {kernel}\n")
    entry_log = ptxas_log[start:] if start >= 0 else ""
    regs = re.search(r"Used (\d+) registers", entry_log)
    frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", entry_log)
    if not regs or not frame:
        raise ValueError(f"no register/spill lines in the ptxas log: {ptxas_log[-300:]!r}")
    return {
        "registers": int(regs.group(1)),
        "stack_frame_bytes": int(frame.group(1)),
        "spill_store_bytes": int(frame.group(2)),
        "spill_load_bytes": int(frame.group(3)),
        "shared_bytes": shared,
    }


HIP_FIELDS = (
    "vgpr_count",
    "agpr_count",
    "sgpr_count",
    "vgpr_spill_count",
    "sgpr_spill_count",
    "group_segment_fixed_size",
    "private_segment_fixed_size",
)


def hip_resources(amdgcn: str, shared: int) -> dict:
    """The kernel's entry of the AMDGPU metadata block, plus Triton's dynamic LDS."""
    start = amdgcn.find(".amdgpu_metadata")
    if start < 0:
        raise ValueError("no .amdgpu_metadata block in the AMDGCN")
    found = dict(re.findall(r"^\s*-?\s*\.(\w+):\s+(\d+)\s*$", amdgcn[start:], flags=re.MULTILINE))
    missing = [f for f in HIP_FIELDS if f not in found and f != "agpr_count"]
    if missing:
        raise ValueError(f"AMDGPU metadata lacks {missing}")
    res = {f: int(found.get(f, 0)) for f in HIP_FIELDS}
    res["shared_bytes"] = shared  # dynamic LDS Triton requests at launch
    res["lds_bytes"] = shared + res["group_segment_fixed_size"]
    return res


def compile_spec(spec: Spec, target: Target) -> dict:
    """Compile one specialisation; its result fields (status, resources or error)."""
    import triton

    options = {k: v for k, v in (("num_warps", spec.num_warps), ("num_stages", spec.num_stages)) if v is not None}
    tap = contextlib.nullcontext(None) if target.is_hip else _ptxas_tap()
    try:
        with tap as log:
            compiled = triton.compile(ast_source(spec), target=target.triton_target(), options=options)
        md = compiled.metadata
        if target.is_hip:
            res = hip_resources(compiled.asm["amdgcn"], md.shared)
            used = res["lds_bytes"]
        else:
            text = log.logs[-1] if log.logs else _ptxas_rerun(compiled.asm["ptx"], target.arch)
            res = cuda_resources(text, spec.kernel, md.shared)
            used = md.shared
    except Exception as e:  # every specialisation gets its verdict; the run goes on
        return {"status": "failed", "error": _error_text(e)}
    out = {"status": "compiled", "num_warps": md.num_warps, "num_stages": md.num_stages, "resources": res}
    if used > target.shared_bytes:
        out.update(
            status="failed",
            error=f"needs {used} B of shared memory (LDS); {target.name} has "
            f"{target.shared_bytes} B: the launch would fail",
        )
    return out


def _error_text(e: BaseException) -> str:
    """The root cause, trimmed to its end (where compilers put the message)."""
    while e.__cause__ is not None:
        e = e.__cause__
    text = f"{type(e).__name__}: {e}".strip()
    return text if len(text) <= ERROR_CHARS else "..." + text[-ERROR_CHARS:]


# ----------------------------------------------------------------------------- environment
def triton_version() -> str:
    if triton_tiles is None:
        raise UsageError(f"triton cannot be imported ({_TRITON_IMPORT_ERROR}); pip install triton")
    import triton

    return triton.__version__


def check_triton(version: str) -> None:
    parts = re.match(r"(\d+)\.(\d+)", version)
    minor = (int(parts.group(1)), int(parts.group(2))) if parts else (0, 0)
    if not TRITON_RANGE[0] <= minor <= TRITON_RANGE[1]:
        lo, hi = (".".join(map(str, v)) for v in TRITON_RANGE)
        raise UsageError(
            f"triton {version} is not supported by flash_kernels.aot: it drives triton.compile through "
            f"ASTSource(fn, signature, constexprs, attrs) with index-tuple keys, the API of triton "
            f"{lo}.x-{hi}.x (tested: {', '.join(TESTED_TRITON)}); older versions take an AttrsDescriptor, "
            f"newer ones are untried"
        )


def check_backends(chosen: list[Target]) -> dict:
    """Each target's backend is in this triton; returns the toolchain facts for the report."""
    from triton.backends import backends

    toolchain = {}
    for t in chosen:
        name = "amd" if t.is_hip else "nvidia"
        if name not in backends:
            raise UsageError(f"the installed triton has no {name} backend, needed for {t.name}")
        if t.is_hip:
            toolchain["hip_linker"] = _hip_linker()
        else:
            toolchain["ptxas"] = _ptxas_version(t.arch)
    return toolchain


def _hip_linker() -> str:
    """Triton before 3.4 links the hsaco with an external ld.lld; later ones link in process."""
    from triton._C.libtriton import amd
    from triton.backends.amd.compiler import HIPBackend

    if hasattr(amd, "link_hsaco"):
        return "built-in"
    with contextlib.suppress(Exception):
        return str(HIPBackend.path_to_rocm_lld())
    # A distribution's LLVM (Debian: apt-get install lld-19); code object v5 needs LLD >= 16.
    for version in range(22, 15, -1):
        path = f"/usr/lib/llvm-{version}/bin/ld.lld"
        if os.path.isfile(path):
            os.environ["TRITON_HIP_LLD_PATH"] = path
            return path
    raise UsageError(
        "this triton links HIP code objects with an external ld.lld and none was found (the PyPI wheel "
        "of triton < 3.4 bundles none; pytorch-triton-rocm does). Install LLVM's lld >= 16 (Debian: "
        "apt-get install lld-19) or set TRITON_HIP_LLD_PATH"
    )


def _ptxas_version(arch: int) -> str:
    from triton.backends.nvidia import compiler as nv

    # triton 3.3 and 3.6+ pick the ptxas per arch (get_ptxas(arch)); 3.4 and 3.5 take no argument.
    takes_arch = bool(inspect.signature(nv.get_ptxas).parameters)
    tool = nv.get_ptxas(arch) if takes_arch else nv.get_ptxas()
    path = tool[0] if isinstance(tool, tuple) else tool.path
    out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
    found = re.search(r"release (\S+), V(\S+)", out)
    return found.group(2) if found else out.strip().splitlines()[-1]


# ----------------------------------------------------------------------------- report
def coverage() -> dict:
    return {
        "dtypes": list(DTYPES),
        "head_dim_classes": {str(c): _head_dims(c) for c in CLASSES},
        "non_power_of_two_head_dims": "bf16 and fp32 (features, all flags); bf16 (decode, rotary, append)",
        "tuner": "every _fwd_space/_bwd_space candidate (bf16; fp32 has its default only) + defaults; "
        "fp16 at its default and the class's largest config",
        "features": "causal+window+softcap+alibi+dropout+varlen+gqa together at the largest config of every "
        f"class, dtype and head dim; each alone for bf16 at head dim {SINGLES_HEAD_DIM}; "
        "paged varlen forward per class",
        "decode": "gqa split (dense cache), paged 16 split, paged 256 + leftpad/softcap/alibi/window with "
        f"{triton_tiles.MAX_SPLITS} splits at the largest decode tile, dense cache_batch_idx; "
        f"_combine_splits at 2 and {triton_tiles.MAX_SPLITS} splits; _rotary_q, _append_kv",
        "kernels": sorted(KERNELS),
        "value_specialisation": "pointers 16-byte aligned; strides multiples of 16 when head_dim % 16 == 0, "
        "unhinted otherwise",
    }


def summarize(target: Target, entries: list[dict]) -> dict:
    """Counts and maxima of one target; spills are those to memory (AMD's SGPR spills go to VGPR
    lanes, counted apart); the shared-memory model is checked against what the compiler reports."""
    counts = {s: sum(e["status"] == s for e in entries) for s in ("compiled", "failed", "pruned")}
    compiled = [e for e in entries if "resources" in e]
    res = [e["resources"] for e in compiled]
    extra = {}
    if target.is_hip:
        shared = [r["lds_bytes"] for r in res]
        regs = {"max_vgprs": max((r["vgpr_count"] for r in res), default=0)}
        spills = sum(r["vgpr_spill_count"] > 0 for r in res)
        extra["with_sgpr_spills"] = sum(r["sgpr_spill_count"] > 0 for r in res)
    else:
        shared = [r["shared_bytes"] for r in res]
        regs = {"max_registers": max((r["registers"] for r in res), default=0)}
        spills = sum(bool(r["spill_store_bytes"] or r["spill_load_bytes"]) for r in res)
    under = [
        e["resources"]["shared_bytes"] - e["shared_estimate"]
        for e in compiled
        if e["shared_estimate"] is not None and e["resources"]["shared_bytes"] > e["shared_estimate"]
    ]
    return {
        **counts,
        **regs,
        **extra,
        "specialisations": len(entries),
        "max_shared_bytes": max(shared, default=0),
        "with_spills": spills,
        "shared_limit_bytes": target.shared_bytes,
        "shared_estimate_below_actual": len(under),
        "shared_estimate_max_shortfall_bytes": max(under, default=0),
    }


def entry(spec: Spec, target: Target, result: dict) -> dict:
    e = {
        "id": spec.key,
        "kernel": spec.kernel,
        "role": spec.role,
        "target": target.name,
        "dtype": spec.dtype,
        "head_dim": spec.head_dim,
        "constexprs": dict(spec.constexprs),
        "pointers": dict(spec.pointers),
        "num_warps": spec.num_warps,
        "num_stages": spec.num_stages,
        "sources": list(spec.sources),
        "shared_estimate": spec.shared_estimate,
    }
    if spec.pruned:
        e.update(status="pruned", reason=spec.pruned)
    else:
        e.update(result)
    return e


def write_report(path: str, report: dict) -> None:
    """Sorted keys, fixed indentation, written whole or not at all (temp file + rename)."""
    text = json.dumps(report, sort_keys=True, indent=1) + "\n"
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".aot-", suffix=".json", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# ----------------------------------------------------------------------------- driver
THROWAWAY_CACHE = "FLASH_KERNELS_AOT_THROWAWAY_CACHE"


def _work(item):
    spec, target = item
    start = time.monotonic()
    if os.environ.get(THROWAWAY_CACHE) == "1":
        # Each specialisation is compiled once: its cache entry is of no further use, and a full
        # run would leave about a gigabyte. A directory per process keeps workers apart.
        base = os.environ["TRITON_CACHE_DIR"]
        own = os.path.join(base, f"worker-{os.getpid()}")
        os.environ["TRITON_CACHE_DIR"] = own
        try:
            result = compile_spec(spec, target)
        finally:
            shutil.rmtree(own, ignore_errors=True)
            os.environ["TRITON_CACHE_DIR"] = base
    else:
        result = compile_spec(spec, target)
    return result, time.monotonic() - start


def compile_all(target: Target, specs: list[Spec], jobs: int, timings: bool) -> list[dict]:
    todo = [s for s in specs if not s.pruned]
    results: dict[str, dict] = {}
    pool = None
    if jobs > 1 and len(todo) > 1:
        # fork: the workers inherit the imported kernels and the environment set up here.
        pool = concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork"))
    try:
        runs = pool.map(_work, [(s, target) for s in todo]) if pool else map(_work, [(s, target) for s in todo])
        for n, (spec, (result, seconds)) in enumerate(zip(todo, runs), 1):
            if timings:
                result = dict(result, seconds=round(seconds, 2))
            results[spec.key] = result
            flag = "ok  " if result["status"] == "compiled" else "FAIL"
            print(f"[{target.name} {n}/{len(todo)}] {flag} {spec.key} ({seconds:.1f}s)", file=sys.stderr, flush=True)
            if result["status"] == "failed":
                print(f"    {result['error'][-400:]}", file=sys.stderr, flush=True)
    finally:
        if pool:
            pool.shutdown()
    return [entry(s, target, results.get(s.key, {})) for s in specs]


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m flash_kernels.aot", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--target", action="append", required=True, help=f"repeatable; one of {', '.join(targets.known_names())}"
    )
    parser.add_argument("--out", help="JSON report path (required unless --list)")
    parser.add_argument("--jobs", type=int, default=1, help="compile processes (default 1)")
    parser.add_argument("--only", help="only specialisations whose id contains this substring")
    parser.add_argument("--list", action="store_true", help="print the specialisations and exit; compile nothing")
    parser.add_argument(
        "--timings",
        action="store_true",
        help="record seconds per specialisation and target (the report is then not reproducible)",
    )
    parser.add_argument("--cache-dir", help="Triton cache to use and keep (default: a fresh one, removed after)")
    args = parser.parse_args(argv)
    if not args.list and not args.out:
        parser.error("--out is required unless --list is given")
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    return args


def run(args) -> int:
    if targets.interpreting():
        raise UsageError(
            "TRITON_INTERPRET=1 makes @triton.jit build interpreter functions, which cannot be "
            "compiled; unset it for flash_kernels.aot"
        )
    try:
        chosen = [targets.parse(t) for t in args.target]
    except ValueError as e:
        raise UsageError(str(e)) from None
    chosen = list(dict.fromkeys(chosen))
    version = triton_version()
    check_triton(version)
    plan = {t: [s for s in enumerate_specs(t) if not args.only or args.only in s.key] for t in chosen}
    if args.list:
        for t, specs in plan.items():
            for s in specs:
                print(f"{t.name} {s.key}" + (f"  [pruned: {s.pruned}]" if s.pruned else ""))
        return 0
    toolchain = check_backends(chosen)
    report = {
        "report_version": REPORT_VERSION,
        "triton": version,
        "toolchain": toolchain,
        "coverage": dict(coverage(), only=args.only),
        "targets": {},
        "specialisations": [],
    }
    with _cache_dir(args.cache_dir):
        for t, specs in plan.items():
            start = time.monotonic()
            entries = compile_all(t, specs, args.jobs, args.timings)
            summary = summarize(t, entries)
            if args.timings:
                summary.update(seconds=round(time.monotonic() - start, 1), jobs=args.jobs)
            print(f"AOT {t.name}: {json.dumps(summary, sort_keys=True)}", file=sys.stderr, flush=True)
            report["targets"][t.name] = summary
            report["specialisations"] += entries
    write_report(args.out, report)
    failed = sum(s["failed"] for s in report["targets"].values())
    print(
        f"FLASH_KERNELS_AOT triton={version} targets={','.join(t.name for t in chosen)} "
        + " ".join(f"{k}={sum(s[k] for s in report['targets'].values())}" for k in ("compiled", "failed", "pruned")),
        flush=True,
    )
    return 1 if failed else 0


@contextlib.contextmanager
def _cache_dir(path: Optional[str]):
    """Compile from scratch into a throw-away Triton cache unless one is named."""
    tmp = None if path else tempfile.mkdtemp(prefix="flash-kernels-aot-cache-")
    saved = {k: os.environ.get(k) for k in ("TRITON_CACHE_DIR", THROWAWAY_CACHE)}
    os.environ["TRITON_CACHE_DIR"] = path or tmp
    os.environ[THROWAWAY_CACHE] = "0" if path else "1"
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except UsageError as e:
        print(f"flash_kernels.aot: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
