"""Launch configuration of the Triton kernels: tile shapes, warps and pipeline depth, the
candidates the one-time tuner times on large problems, and the split-KV count for decode."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import triton

INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") == "1"
IS_HIP = torch.version.hip is not None


@dataclass(frozen=True)
class TileConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int

    def launch_kwargs(self) -> dict:
        return {"BLOCK_M": self.block_m, "BLOCK_N": self.block_n,
                "num_warps": self.num_warps, "num_stages": self.num_stages}


def _head_dim_pad(head_dim: int) -> int:
    return max(16, triton.next_power_of_2(head_dim))


def _fwd_config(head_dim_pad: int, dtype: torch.dtype) -> TileConfig:
    if INTERPRETING:
        # The interpreter's cost is per operation, not per element: few large tiles run fastest.
        return TileConfig(64, 64, 4, 1)
    wide = dtype == torch.float32
    if IS_HIP:
        # MI200/MI300: 64-wide wavefronts and 64 KB LDS favour fewer warps and shallow pipelines.
        if head_dim_pad <= 64:
            return TileConfig(128, 64, 4, 1)
        return TileConfig(128 if head_dim_pad <= 128 and not wide else 64, 32, 4, 1)
    major = torch.cuda.get_device_capability()[0] if torch.cuda.is_available() else 8
    if head_dim_pad <= 64:
        return TileConfig(128, 64 if wide else 128, 4 if wide else 8, 3)
    if head_dim_pad <= 128:
        if wide:
            return TileConfig(64, 32, 4, 2)
        # 128x128 K/V tiles x 3 stages would need ~228 KB of shared memory: over the 227 KB limit.
        return TileConfig(128, 64, 8, 3 if major >= 9 else 2)
    # 256: register file and shared memory bound the tiles.
    return TileConfig(64, 32 if wide else 64, 4 if wide else 8, 2)


def _bwd_config(head_dim_pad: int, dtype: torch.dtype) -> TileConfig:
    if INTERPRETING:
        return TileConfig(64, 64, 4, 1)
    wide = dtype == torch.float32
    if IS_HIP:
        return TileConfig(32 if head_dim_pad > 64 else 64, 64 if head_dim_pad <= 64 else 32, 4, 1)
    if head_dim_pad <= 64:
        return TileConfig(64, 64, 4, 2)
    if head_dim_pad <= 128:
        return TileConfig(32 if wide else 64, 64 if not wide else 32, 4 if wide else 8, 2)
    return TileConfig(32, 32, 4, 1) if wide else TileConfig(64, 32, 8, 1)


def _fwd_candidates(head_dim_pad: int, dtype: torch.dtype) -> list[TileConfig]:
    """Configs the tuner times on large problems, pruned to what fits this head dim."""
    if INTERPRETING or dtype == torch.float32:
        return [_fwd_config(head_dim_pad, dtype)]
    if IS_HIP:
        cands = [TileConfig(bm, bn, w, 1) for bm in (64, 128) for bn in (32, 64) for w in (4, 8)]
    else:
        cands = [TileConfig(128, 64, 8, 3), TileConfig(128, 128, 8, 3), TileConfig(128, 64, 4, 3),
                 TileConfig(64, 64, 4, 3), TileConfig(128, 128, 8, 2), TileConfig(128, 64, 8, 4),
                 TileConfig(64, 128, 4, 3), TileConfig(128, 32, 4, 3)]
    return [c for c in cands if _fits(c, head_dim_pad)]


def _bwd_candidates(head_dim_pad: int, dtype: torch.dtype) -> list[TileConfig]:
    if INTERPRETING or dtype == torch.float32:
        return [_bwd_config(head_dim_pad, dtype)]
    if IS_HIP:
        cands = [TileConfig(bm, bn, 4, 1) for bm in (32, 64) for bn in (32, 64)]
    else:
        cands = [TileConfig(64, 64, 4, 2), TileConfig(64, 64, 8, 2), TileConfig(64, 128, 8, 2),
                 TileConfig(128, 64, 8, 2), TileConfig(32, 128, 4, 2), TileConfig(128, 32, 4, 2),
                 TileConfig(64, 64, 4, 1), TileConfig(64, 128, 8, 1)]
    # Backward holds two fp32 accumulators and recomputes p: at 256 keep tiles small.
    return [c for c in cands if head_dim_pad < 256 or (c.block_m * c.block_n <= 4096
                                                       and c.num_stages == 1)] \
        or [_bwd_config(head_dim_pad, dtype)]


def _fits(cfg: TileConfig, head_dim_pad: int) -> bool:
    """Prune tiles whose fp32 accumulators or K/V stages cannot fit one SM."""
    if head_dim_pad >= 256 and (cfg.block_n > 64 or cfg.num_stages > 2):
        return False
    if head_dim_pad >= 128 and cfg.block_m == 128 and cfg.num_warps < 8:
        return False
    return True


_TUNED: dict[tuple, TileConfig] = {}
AUTOTUNE = os.environ.get("FLASH_KERNELS_AUTOTUNE", "1") != "0"
TUNE_LOG = os.environ.get("FLASH_KERNELS_TUNE_LOG", "0") == "1"
_TUNE_MIN_WORK = 1 << 28  # q-rows x k-rows x heads below which the default config is used


def _choose(kind: str, key: tuple, default: TileConfig, candidates: list[TileConfig], work: int,
            run) -> TileConfig:
    """Pick a tile config: the default for small problems; measured once per key otherwise."""
    if not AUTOTUNE or INTERPRETING or work < _TUNE_MIN_WORK or len(candidates) <= 1:
        return default
    full_key = (kind, *key)
    if full_key not in _TUNED:
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
    return _TUNED[full_key]



def decode_num_splits(batch: int, nheads_k: int, seqlen_q_rows: int, max_seqlen_k: int,
                      block_m: int = 16) -> int:
    """Split the keys until about four programs per SM exist, keeping >= 512 keys per split.

    Decode reads the cache once and is bandwidth-bound: one program per (batch, head) leaves
    most SMs idle or one program deep, too few loads in flight to cover memory latency.
    """
    if INTERPRETING:
        return 2 if max_seqlen_k > 64 else 1
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    programs = batch * nheads_k * max(1, math.ceil(seqlen_q_rows / block_m))
    target = 4 * sms
    if programs >= target:
        return 1
    splits = min(math.ceil(target / programs), max(1, max_seqlen_k // 512), 128)
    return triton.next_power_of_2(splits) if splits > 1 else 1
