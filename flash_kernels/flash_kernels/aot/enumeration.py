"""Which specialisations are compiled for a target (the coverage the package docstring states), and the
report's own statement of it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from ..targets import Target
from .specs import (
    ALL_FEATURES,
    CLASSES,
    DTYPES,
    GQA,
    KERNELS,
    PAGED_VARLEN,
    SINGLE_FEATURES,
    SINGLES_HEAD_DIM,
    Features,
    Spec,
    TileConfig,
    append_spec,
    bwd_specs,
    combine_spec,
    delta_spec,
    fwd_spec,
    head_dims,
    probs_spec,
    rotary_spec,
    triton_tiles,
)


def enumerate_specs(target: Target) -> list[Spec]:
    """Every specialisation of the coverage (package docstring) for ``target``, sorted by key."""
    specs = []
    for dtype in DTYPES:
        for hdp in CLASSES:
            tuned, fwd_big, bwd_big = _tuner_specs(target, dtype, hdp)
            specs += tuned
            specs += _feature_specs(target, dtype, hdp, fwd_big, bwd_big)
            specs += _decode_specs(target, dtype, hdp)
            specs += _aux_specs(dtype, hdp, target)
    return _dedupe(specs)


def coverage() -> dict:
    # The wording is part of the report, whose bytes a rerun must reproduce: the tuner's spaces keep the
    # names they had when the recorded reports were made.
    return {
        "dtypes": list(DTYPES),
        "head_dim_classes": {str(c): head_dims(c) for c in CLASSES},
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


def _largest(configs: Iterable[TileConfig], kernels: tuple, hdp: int, dtype: str, target: Target) -> TileConfig:
    """The config with the most shared memory (ties: larger tiles, more warps, more stages)."""

    def size(c):
        est = max(triton_tiles.shared_estimate(k, c, hdp, dtype, target) for k in kernels)
        return (est, c.block_m * c.block_n, c.num_warps, c.num_stages)

    return max(configs, key=size)


def _tuner_specs(target: Target, dtype: str, hdp: int) -> tuple[list[Spec], TileConfig, TileConfig]:
    """Forward and backward tuner candidates + defaults; returns them and the largest configs."""
    fwd_space = triton_tiles.fwd_space(hdp, dtype, target)
    bwd_space = triton_tiles.bwd_space(hdp, dtype, target)
    fwd_default = triton_tiles.fwd_config(hdp, dtype, target)
    bwd_default = triton_tiles.bwd_config(hdp, dtype, target)
    fwd_big = _largest([c for c, why in fwd_space if why is None] + [fwd_default], ("fwd",), hdp, dtype, target)
    bwd_big = _largest([c for c, why in bwd_space if why is None] + [bwd_default], ("dkdv", "dq"), hdp, dtype, target)
    plain = Features()
    specs = [
        fwd_spec(dtype, hdp, plain, fwd_default, target, "default"),
        *bwd_specs(dtype, hdp, plain, bwd_default, target, "default"),
    ]
    every_candidate = dtype != "float16"  # fp16: same tiles and MMA shapes as bf16 (see the package docstring)
    for cfg, why in fwd_space:
        if every_candidate or why is not None or cfg == fwd_big:
            specs.append(fwd_spec(dtype, hdp, plain, cfg, target, "candidate", pruned=why))
    for cfg, why in bwd_space:
        if every_candidate or why is not None or cfg == bwd_big:
            specs += bwd_specs(dtype, hdp, plain, cfg, target, "candidate", pruned=why)
    return specs, fwd_big, bwd_big


def _feature_specs(target: Target, dtype: str, hdp: int, fwd_big: TileConfig, bwd_big: TileConfig) -> list[Spec]:
    specs = []
    for head_dim in head_dims(hdp, dtype):
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
        return triton_tiles.decode_config(rows, hdp, dtype, target)

    big_rows = 128  # over 64 rows: the forward default's row tile
    paged_all = Features(left=True, right=True, softcap=True, alibi=True, page_size=256, group=GQA)
    specs = []
    for head_dim in head_dims(hdp, dtype, extras_for=("bfloat16",)):
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
    for head_dim in head_dims(hdp, dtype, extras_for=("bfloat16",)):
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
