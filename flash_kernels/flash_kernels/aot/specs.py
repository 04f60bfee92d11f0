"""One specialisation (kernel, dtype, head dim, constexprs, pointer types, warps, stages) and how each
kernel's launcher turns the attention options into one, with the tile configs triton_tiles chooses."""

from __future__ import annotations

from dataclasses import dataclass

from ..targets import Target
from .signature import DUMMY, TRITON_DTYPE

TRITON_IMPORT_ERROR = None
try:  # the tile tables import triton; without it the command line says so and exits 2
    from .. import triton_tiles
    from ..triton_tiles import TileConfig
except ImportError as _e:
    triton_tiles = TileConfig = None
    TRITON_IMPORT_ERROR = _e

DTYPES = ("bfloat16", "float16", "float32")
CLASSES = (16, 32, 64, 128, 256)
EXTRA_HEAD_DIMS = (12, 24, 40, 72, 96, 160, 192)
GQA = 4  # query heads per KV head where a specialisation exercises grouped-query attention
SINGLES_HEAD_DIM = 128

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


@dataclass(frozen=True)
class Spec:
    kernel: str
    role: str  # forward | backward | decode
    dtype: str
    head_dim: int
    constexprs: tuple  # sorted (name, value)
    pointers: tuple = ()  # sorted (name, triton type) where a launch passes another type
    num_warps: int | None = None  # None: the backend's default (the launcher passes none)
    num_stages: int | None = None
    sources: tuple = ()  # why it is in the set: candidate, default, features:..., decode:...
    pruned: str | None = None
    shared_estimate: int | None = None

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


def head_dims(hdp: int, dtype: str = "bfloat16", extras_for=("bfloat16", "float32")) -> list[int]:
    """The class's power of two, and its non-power-of-two head dims for the dtypes in extras_for."""
    extras = [d for d in EXTRA_HEAD_DIMS if triton_tiles.pad_head_dim(d) == hdp] if dtype in extras_for else []
    return [hdp, *extras]


def _common(f: Features, head_dim: int, dtype: str, target: Target) -> dict:
    return dict(
        HAS_LEFT=f.left,
        HAS_RIGHT=f.right,
        SOFTCAP=f.softcap,
        ALIBI=f.alibi,
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=triton_tiles.pad_head_dim(head_dim),
        DOT_PRECISION=triton_tiles.dot_precision(dtype, target),
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
    pruned: str | None = None,
    estimate_kernels: tuple = (),
) -> Spec:
    hdp = triton_tiles.pad_head_dim(head_dim)
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
    hdp = triton_tiles.pad_head_dim(head_dim)
    block_m, block_n = triton_tiles.probs_tiles(hdp)
    cx = dict(_common(f, head_dim, dtype, target), GROUP=f.group, IS_VARLEN=f.varlen, BLOCK_M=block_m, BLOCK_N=block_n)
    ptrs = (("ALIBI_SLOPES", DUMMY),) if not f.alibi else ()
    return Spec("_attn_probs", "forward", dtype, head_dim, tuple(sorted(cx.items())), ptrs, sources=(source,))


def delta_spec(dtype, head_dim, varlen: bool, source) -> Spec:
    cx = dict(
        IS_VARLEN=varlen,
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=triton_tiles.pad_head_dim(head_dim),
        BLOCK_M=triton_tiles.DELTA_BLOCK_M,
    )
    return Spec("_bwd_delta", "backward", dtype, head_dim, tuple(sorted(cx.items())), sources=(source,))


def combine_spec(dtype, head_dim, splits: int, source) -> Spec:
    cx = dict(
        NUM_SPLITS=splits,
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=triton_tiles.pad_head_dim(head_dim),
        BLOCK_M=triton_tiles.COMBINE_BLOCK_M,
    )
    return Spec("_combine_splits", "decode", dtype, head_dim, tuple(sorted(cx.items())), sources=(source,))


def rotary_spec(dtype, head_dim, *, interleaved, per_row, half_rotary, cos_fp32, nheads, source) -> Spec:
    hdp = triton_tiles.pad_head_dim(head_dim)
    rotary_dim = (head_dim // 4 * 2 if half_rotary else head_dim // 2 * 2) or 2
    cx = dict(
        PER_ROW=per_row,
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=hdp,
        ROTARY_DIM=rotary_dim,
        INTERLEAVED=interleaved,
        BLOCK_H=triton_tiles.heads_block(nheads, hdp),
    )
    ptrs = (("COS", "*fp32"), ("SIN", "*fp32")) if cos_fp32 else ()
    return Spec("_rotary_q", "decode", dtype, head_dim, tuple(sorted(cx.items())), ptrs, sources=(source,))


def append_spec(dtype, head_dim, *, page_size, rotary, interleaved, nheads, source) -> Spec:
    hdp = triton_tiles.pad_head_dim(head_dim)
    cx = dict(
        HAS_BATCH_IDX=page_size == 0,
        PAGE_SIZE=page_size,
        ROTARY=rotary,
        ROTARY_DIM=(head_dim // 2 * 2 or 2) if rotary else 0,
        INTERLEAVED=interleaved,
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=hdp,
        BLOCK_H=triton_tiles.heads_block(nheads, hdp),
    )
    ptrs = () if rotary else (("COS", DUMMY), ("SIN", DUMMY))
    return Spec("_append_kv", "decode", dtype, head_dim, tuple(sorted(cx.items())), ptrs, sources=(source,))
