"""Launch configuration of the Triton kernels: tile shapes, warps and pipeline depth, the
candidates the one-time tuner times on large problems, and the split-KV count for decode.

Every choice takes the ``Target`` it is for (targets.py): the running GPU at launch, or a GPU
this host does not have when flash_kernels.aot compiles ahead of time, so both see the same
configs. Candidates whose shared-memory (LDS) estimate exceeds the target's are pruned here,
not discovered by a launch failing. Imports no torch (the AOT compiler needs only triton).
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass, replace
from typing import Optional

import triton

from .targets import Target

INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") == "1"
MAX_SPLITS = 128  # split-KV programs per (batch, head): a power of two the combine kernel reduces
DELTA_BLOCK_M = 64  # rows per program of the backward's delta kernel
COMBINE_BLOCK_M = 16  # rows per program of the split-KV combine kernel
_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
_DTYPE_ALIASES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}


@dataclass(frozen=True)
class TileConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int

    def launch_kwargs(self) -> dict:
        return {"BLOCK_M": self.block_m, "BLOCK_N": self.block_n,
                "num_warps": self.num_warps, "num_stages": self.num_stages}


def pad_head_dim(head_dim: int) -> int:
    return max(16, triton.next_power_of_2(head_dim))


def dtype_name(dtype) -> str:
    """The canonical name (float16, bfloat16, float32) of a torch dtype or of a name like fp16."""
    name = str(dtype).rsplit(".", 1)[-1]
    name = _DTYPE_ALIASES.get(name, name)
    if name not in _DTYPE_BYTES:
        raise ValueError(f"no Triton tile configs for dtype {dtype!r}")
    return name


def _is_fp32(dtype) -> bool:
    return dtype_name(dtype) == "float32"


def dot_precision(dtype, target: Target) -> str:
    # fp32 inputs must not silently drop to tf32 inside tl.dot. AMD's backend takes no tf32
    # (gfx90a rejects it at the first tl.dot); for 16-bit inputs the choice changes nothing.
    return "ieee" if target.is_hip or _is_fp32(dtype) else "tf32"


# ------------------------------------------------------------------------ shared memory
def _async_mma(target: Target, fp32: bool, mma_rows: int) -> bool:
    """Whether Triton runs the kernel's dots on Hopper's wgmma / Blackwell's tcgen05.

    Only 16-bit dots whose MMA has a warpgroup's 64 rows do; fp32 (ieee) dots run on FMAs, and
    narrower tiles and sm_120 (no wgmma) take Ampere's mma.sync path.
    """
    return target.backend == "cuda" and target.cuda_major in (9, 10) and not fp32 and mma_rows >= 64


def _pipeline_buffers(num_stages: int, async_mma: bool) -> int:
    """Copies of each pipelined in-loop load that live in shared memory at once.

    The wgmma / tcgen05 pipeline keeps num_stages copies; Ampere's cp.async pipeline one fewer
    (the stage being consumed sits in registers); AMD's stream pipeliner likewise one fewer.
    """
    return max(1, num_stages) if async_mma else max(1, num_stages - 1)


def shared_estimate(kernel: str, cfg: TileConfig, head_dim_pad: int, dtype, target: Target) -> int:
    """Bytes of shared memory (LDS) a ``kernel`` ("fwd", "dkdv", "dq") launch is expected to use.

    An upper bound for every head dim of the class. With elt the input dtype's size, the tiles
    are m = BLOCK_M x head_dim_pad x elt, n = BLOCK_N x head_dim_pad x elt and s = BLOCK_M x
    BLOCK_N x elt (P or dS, cast to the input dtype for its tl.dot); rows are the MMA's rows
    (BLOCK_N in dK/dV, BLOCK_M otherwise) and copies = _pipeline_buffers(num_stages).

    - resident, loaded before the loop: q (fwd: m); k, v (dkdv: 2n); q, dO (dq: 2m);
    - streamed, loaded in the loop: k, v (fwd, dq: 2n; a one-stage forward holds one at a
      time: n); q, dO and the fp32 lse and delta rows (dkdv: 2m + 8 x BLOCK_M).

    CUDA: resident + copies x streamed + scratch, where scratch is
      - with wgmma / tcgen05 (_async_mma): nothing, except sm_100's backward: 1 KB, and when
        pipelined one more operand tile (dq: n; dkdv: 2m);
      - otherwise P / dS re-laid out through shared memory: s for fp32, and for 16-bit inputs
        when rows < head_dim_pad; for 16-bit dK/dV at least m;
      - in the forward also 4 x BLOCK_M + 4 x BLOCK_N x (copies + 1), at least 1 KB on sm_100.
    AMD: max(m, n, s) with one stage; with more, copies x streamed + max(resident, s).

    Checked against the shared memory the compiler allocated, which flash_kernels.aot records
    beside this estimate, for every fwd, dkdv and dq specialisation of the recorded AOT compiles
    (sm_80 with triton 3.6.0; gfx90a and gfx942 with triton 3.3.1): never below it, and never
    pruning a config that compiled within the limit (tests/test_shared_estimate.py). The sm_90,
    sm_100 and sm_120 terms rest on compiles with triton 3.6.0 outside that record.
    """
    elt = _DTYPE_BYTES[dtype_name(dtype)]
    fp32 = elt == 4
    m_tile = cfg.block_m * head_dim_pad * elt
    n_tile = cfg.block_n * head_dim_pad * elt
    s_tile = cfg.block_m * cfg.block_n * elt
    if kernel == "fwd":
        resident, streamed, mma_rows = m_tile, 2 * n_tile, cfg.block_m
    elif kernel == "dkdv":
        resident, streamed, mma_rows = 2 * n_tile, 2 * m_tile + 2 * 4 * cfg.block_m, cfg.block_n
    elif kernel == "dq":
        resident, streamed, mma_rows = 2 * m_tile, 2 * n_tile, cfg.block_m
    else:
        raise ValueError(f"no shared-memory model for kernel {kernel!r}")
    if target.is_hip:
        # AMD moves the loop-invariant operands to registers before the loop, so their LDS is
        # free again for P's conversion; with one stage no operand stays in LDS at all.
        if cfg.num_stages <= 1:
            return max(m_tile, n_tile, s_tile)
        return _pipeline_buffers(cfg.num_stages, False) * streamed + max(resident, s_tile)
    async_mma = _async_mma(target, fp32, mma_rows)
    copies = _pipeline_buffers(cfg.num_stages, async_mma)
    if kernel == "fwd" and cfg.num_stages <= 1:
        streamed = n_tile  # unpipelined, k's buffer is dead before v's is written
    if async_mma:
        # wgmma takes P / dS from registers and transposed operands straight from shared memory.
        # tcgen05's backward was seen to keep more (1 KB, and pipelined one more operand tile).
        scratch = 0
        if target.cuda_major == 10 and kernel != "fwd":
            scratch = 1024
            if cfg.num_stages > 1:
                scratch += n_tile if kernel == "dq" else 2 * m_tile
    else:
        # FMA dots take P from shared memory. For mma.sync Triton lays all warps along the rows
        # only when the second dot, [rows, head_dim_pad], has at least as many rows as columns;
        # otherwise P / dS moves between layouts through shared memory.
        scratch = s_tile if fp32 or mma_rows < head_dim_pad else 0
        if kernel == "dkdv" and not fp32:
            # q and dO feed one dot as they are and one transposed. Unpipelined (one stage; head
            # dims that are not multiples of 16, whose strides carry no hint) the transposed copy
            # goes through a scratch of up to a q tile, never live with P's.
            scratch = max(scratch, m_tile)
    if kernel == "fwd":
        # Row statistics, and with a paged cache each copy's K/V row offsets (seen: up to 1 KB);
        # tcgen05's forward was seen to keep up to 1 KB beside the tiles.
        vectors = 4 * cfg.block_m + 4 * cfg.block_n * (copies + 1)
        scratch += max(vectors, 1024) if async_mma and target.cuda_major == 10 else vectors
    return resident + copies * streamed + scratch


def _shared_reason(kernels: tuple, cfg: TileConfig, head_dim_pad: int, dtype,
                   target: Target) -> Optional[str]:
    """Why ``cfg`` cannot run on ``target`` for lack of shared memory, or None when it fits."""
    need = max(shared_estimate(k, cfg, head_dim_pad, dtype, target) for k in kernels)
    if need > target.shared_bytes:
        return (f"shared memory: estimate {need} B for {'+'.join(kernels)} exceeds "
                f"{target.name}'s {target.shared_bytes} B")
    return None


def _shrink_to_fit(cfg: TileConfig, kernels: tuple, head_dim_pad: int, dtype,
                   target: Target) -> TileConfig:
    """A default that does not fit the target loses stages, then key, then query rows."""
    while _shared_reason(kernels, cfg, head_dim_pad, dtype, target) is not None:
        if cfg.num_stages > 1:
            cfg = replace(cfg, num_stages=cfg.num_stages - 1)
        elif cfg.block_n > 16:
            cfg = replace(cfg, block_n=cfg.block_n // 2)
        elif cfg.block_m > 16:
            cfg = replace(cfg, block_m=cfg.block_m // 2)
        else:
            break  # 16x16 tiles with one stage: nothing smaller to try
    return cfg


# ------------------------------------------------------------------------ defaults
def fwd_config(head_dim_pad: int, dtype, target: Target) -> TileConfig:
    return _shrink_to_fit(_fwd_preferred(head_dim_pad, dtype, target), ("fwd",), head_dim_pad,
                          dtype, target)


def _fwd_preferred(head_dim_pad: int, dtype, target: Target) -> TileConfig:
    if target.interpreted:
        # The interpreter's cost is per operation, not per element: few large tiles run fastest.
        return TileConfig(64, 64, 4, 1)
    wide = _is_fp32(dtype)
    if target.is_hip:
        # MI200/MI300: 64-wide wavefronts and 64 KB LDS favour fewer warps and shallow pipelines.
        if head_dim_pad <= 64:
            return TileConfig(128, 64, 4, 1)
        return TileConfig(128 if head_dim_pad <= 128 and not wide else 64, 32, 4, 1)
    if head_dim_pad <= 64:
        return TileConfig(128, 64 if wide else 128, 4 if wide else 8, 3)
    if head_dim_pad <= 128:
        if wide:
            return TileConfig(64, 32, 4, 2)
        # 128x128 K/V tiles x 3 stages would need ~228 KB of shared memory: over the 227 KB limit.
        return TileConfig(128, 64, 8, 3 if target.cuda_major >= 9 else 2)
    # 256: register file and shared memory bound the tiles.
    return TileConfig(64, 32 if wide else 64, 4 if wide else 8, 2)


def bwd_config(head_dim_pad: int, dtype, target: Target) -> TileConfig:
    return _shrink_to_fit(_bwd_preferred(head_dim_pad, dtype, target), ("dkdv", "dq"),
                          head_dim_pad, dtype, target)


def _bwd_preferred(head_dim_pad: int, dtype, target: Target) -> TileConfig:
    if target.interpreted:
        return TileConfig(64, 64, 4, 1)
    wide = _is_fp32(dtype)
    if target.is_hip:
        return TileConfig(32 if head_dim_pad > 64 else 64, 64 if head_dim_pad <= 64 else 32, 4, 1)
    if head_dim_pad <= 64:
        return TileConfig(64, 64, 4, 2)
    if head_dim_pad <= 128:
        return TileConfig(32 if wide else 64, 64 if not wide else 32, 4 if wide else 8, 2)
    # Head dim 256: two stages of 32-key tiles, 4 warps (bench_triton_tiles.py on the H100: 0.50-0.56 of
    # cuDNN's fwd+bwd speed, against 0.30-0.35 for the one-stage 64x32 tile with 8 warps).
    return TileConfig(32, 32, 4, 1) if wide else TileConfig(64, 32, 4, 2)


def decode_config(rows: int, head_dim_pad: int, dtype, target: Target) -> TileConfig:
    """Decode (KV cache, split-KV, packed GQA): few query rows, so small row tiles."""
    default = fwd_config(head_dim_pad, dtype, target)
    if target.interpreted:
        return default
    cfg = TileConfig(16 if rows <= 16 else (64 if rows <= 64 else default.block_m),
                     64 if head_dim_pad <= 128 else 32, 4, 2)
    return _shrink_to_fit(cfg, ("fwd",), head_dim_pad, dtype, target)


def probs_tiles(head_dim_pad: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) of the S_dmask kernel (a testing output: no tuning)."""
    return (64, 64) if head_dim_pad <= 128 else (32, 32)


def heads_block(nheads: int, head_dim_pad: int) -> int:
    # One program per token; a head block small enough to keep each tile in registers.
    return max(1, min(triton.next_power_of_2(nheads), max(1, 8192 // head_dim_pad)))


# ------------------------------------------------------------------------ tuner candidates
def fwd_space(head_dim_pad: int, dtype, target: Target) -> list[tuple[TileConfig, Optional[str]]]:
    """Every config the forward tuner considers, each with why it was pruned (None: kept)."""
    if target.interpreted or _is_fp32(dtype):
        return [(fwd_config(head_dim_pad, dtype, target), None)]
    if target.is_hip:
        cands = [TileConfig(bm, bn, w, 1) for bm in (64, 128) for bn in (32, 64) for w in (4, 8)]
    else:
        cands = [TileConfig(128, 64, 8, 3), TileConfig(128, 128, 8, 3), TileConfig(128, 64, 4, 3),
                 TileConfig(64, 64, 4, 3), TileConfig(128, 128, 8, 2), TileConfig(128, 64, 8, 4),
                 TileConfig(64, 128, 4, 3), TileConfig(128, 32, 4, 3)]
    return [(c, _fits_reason(c, head_dim_pad)
             or _shared_reason(("fwd",), c, head_dim_pad, dtype, target)) for c in cands]


def fwd_candidates(head_dim_pad: int, dtype, target: Target) -> list[TileConfig]:
    """Configs the tuner times on large problems, pruned to what fits this head dim and target."""
    return [c for c, why in fwd_space(head_dim_pad, dtype, target) if why is None]


def bwd_space(head_dim_pad: int, dtype, target: Target) -> list[tuple[TileConfig, Optional[str]]]:
    """Every config the backward tuner considers (dK/dV and dQ share the list), with reasons."""
    if target.interpreted or _is_fp32(dtype):
        return [(bwd_config(head_dim_pad, dtype, target), None)]
    if target.is_hip:
        cands = [TileConfig(bm, bn, 4, 1) for bm in (32, 64) for bn in (32, 64)]
    elif head_dim_pad >= 256:
        # The four fastest of 20 tiles timed on the H100 (bench_triton_tiles.py), fastest first.
        cands = [TileConfig(64, 32, 4, 2), TileConfig(128, 32, 8, 2), TileConfig(64, 64, 8, 2),
                 TileConfig(64, 32, 4, 1)]
    else:
        cands = [TileConfig(64, 64, 4, 2), TileConfig(64, 64, 8, 2), TileConfig(64, 128, 8, 2),
                 TileConfig(128, 64, 8, 2), TileConfig(32, 128, 4, 2), TileConfig(128, 32, 4, 2),
                 TileConfig(64, 64, 4, 1), TileConfig(64, 128, 8, 1)]
    space = []
    for c in cands:
        why = None
        # Backward holds two fp32 accumulators and recomputes p: at 256 keep tiles small.
        if head_dim_pad >= 256 and c.block_m * c.block_n > 4096:
            why = "head dim 256: backward keeps tiles of at most 4096 elements"
        space.append((c, why or _shared_reason(("dkdv", "dq"), c, head_dim_pad, dtype, target)))
    if all(why is not None for _, why in space):
        space.append((bwd_config(head_dim_pad, dtype, target), None))
    return space


def bwd_candidates(head_dim_pad: int, dtype, target: Target) -> list[TileConfig]:
    return [c for c, why in bwd_space(head_dim_pad, dtype, target) if why is None]


def _fits_reason(cfg: TileConfig, head_dim_pad: int) -> Optional[str]:
    """Prune tiles whose fp32 accumulators or K/V stages cannot fit one SM."""
    if head_dim_pad >= 256 and (cfg.block_n > 64 or cfg.num_stages > 2):
        return "head dim 256: at most 64 keys per tile and two stages"
    if head_dim_pad >= 128 and cfg.block_m == 128 and cfg.num_warps < 8:
        return "head dim >= 128: 128 query rows need 8 warps for their accumulators"
    return None


_TUNED: dict[tuple, TileConfig] = {}
_TUNE_LOCK = threading.Lock()
AUTOTUNE = os.environ.get("FLASH_KERNELS_AUTOTUNE", "1") != "0"
TUNE_LOG = os.environ.get("FLASH_KERNELS_TUNE_LOG", "0") == "1"
_TUNE_MIN_WORK = 1 << 28  # q-rows x k-rows x heads below which the default config is used


def _choose(kind: str, key: tuple, default: TileConfig, candidates: list[TileConfig], work: int,
            run) -> TileConfig:
    """Pick a tile config: the default for small problems; measured once per key otherwise.

    One tuning at a time, under a lock: threads that ask for a key being tuned wait for its
    answer, so every call of a key runs the same tiles (the same rounding) whatever the timing of
    threads, and no two tunings skew each other's clocks. A tuning that fails (out of GPU memory:
    do_bench's 256 MB cache-flush buffer, or a candidate) raises and is not remembered, so a later
    call tunes again; it does not fall back to the default tiles, which would give that call other
    roundings than the same call gets once tuned.
    """
    if not AUTOTUNE or INTERPRETING or work < _TUNE_MIN_WORK or len(candidates) <= 1:
        return default
    full_key = (kind, *key)
    tuned = _TUNED.get(full_key)
    if tuned is not None:
        return tuned
    with _TUNE_LOCK:
        tuned = _TUNED.get(full_key)
        if tuned is not None:
            return tuned
        best, best_ms = default, float("inf")
        timings = []
        for cfg in candidates:
            try:
                ms = triton.testing.do_bench(lambda cfg=cfg: run(cfg), warmup=5, rep=20)
            except (triton.runtime.errors.OutOfResources, triton.runtime.errors.PTXASError):
                continue
            timings.append((ms, cfg))
            if ms < best_ms:
                best, best_ms = cfg, ms
        _TUNED[full_key] = best
    if TUNE_LOG:
        ranked = ", ".join(f"{c.block_m}x{c.block_n}w{c.num_warps}s{c.num_stages}={ms:.3f}"
                           for ms, c in sorted(timings, key=lambda t: t[0])[:6])
        print(f"flash_kernels tune {full_key}: default "
              f"{default.block_m}x{default.block_n}w{default.num_warps}s{default.num_stages}; "
              f"best {ranked}", flush=True)
    return best


def decode_num_splits(batch: int, nheads_k: int, seqlen_q_rows: int, max_seqlen_k: int,
                      block_m: int = 16) -> int:
    """Split the keys until about four programs per SM exist, keeping >= 512 keys per split.

    Decode reads the cache once and is bandwidth-bound: one program per (batch, head) leaves
    most SMs idle or one program deep, too few loads in flight to cover memory latency.
    """
    if INTERPRETING:
        return 2 if max_seqlen_k > 64 else 1
    import torch

    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    programs = batch * nheads_k * max(1, math.ceil(seqlen_q_rows / block_m))
    target = 4 * sms
    if programs >= target:
        return 1
    splits = min(math.ceil(target / programs), max(1, max_seqlen_k // 512), MAX_SPLITS)
    return triton.next_power_of_2(splits) if splits > 1 else 1
