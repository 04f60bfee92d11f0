"""Target-aware tile selection: CUDA choices frozen as they were before targets existed, shared
memory pruning, the interpreter's tiles. Pure Python: no GPU, no kernel launch."""

from __future__ import annotations

import pytest

from flash_kernels import targets, triton_tiles
from flash_kernels.triton_tiles import TileConfig

# ---------------------------------------------------------------------------------------------
# What the launchers chose on sm_80 / sm_90 before selection took a Target, recorded from that
# code with the capability patched in. The H200 verdicts were measured with these choices: a
# change here is a change of the CUDA runtime behaviour and must be deliberate.
# ---------------------------------------------------------------------------------------------
ALL_FWD = [(128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 4, 3), (64, 64, 4, 3), (128, 128, 8, 2),
           (128, 64, 8, 4), (64, 128, 4, 3), (128, 32, 4, 3)]
FWD_128 = [(128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3), (128, 128, 8, 2), (128, 64, 8, 4),
           (64, 128, 4, 3)]
ALL_BWD = [(64, 64, 4, 2), (64, 64, 8, 2), (64, 128, 8, 2), (128, 64, 8, 2), (32, 128, 4, 2),
           (128, 32, 4, 2), (64, 64, 4, 1), (64, 128, 8, 1)]
DECODE_64 = [(16, 64, 4, 2), (64, 64, 4, 2), (128, 64, 4, 2)]  # rows <= 16, <= 64, > 64
DECODE_64_FP32_128 = [(16, 64, 4, 2), (64, 64, 4, 2), (64, 64, 4, 2)]
DECODE_32 = [(16, 32, 4, 2), (64, 32, 4, 2), (64, 32, 4, 2)]

# (head_dim_pad, 16-bit?) -> (fwd default, bwd default, decode tiles, fwd candidates, bwd candidates)
SM80 = {
    (16, True): ((128, 128, 8, 3), (64, 64, 4, 2), DECODE_64, ALL_FWD, ALL_BWD),
    (32, True): ((128, 128, 8, 3), (64, 64, 4, 2), DECODE_64, ALL_FWD, ALL_BWD),
    (64, True): ((128, 128, 8, 3), (64, 64, 4, 2), DECODE_64, ALL_FWD, ALL_BWD),
    (128, True): ((128, 64, 8, 2), (64, 64, 8, 2), DECODE_64, FWD_128, ALL_BWD),
    (256, True): ((64, 64, 8, 2), (64, 32, 4, 2), DECODE_32, [], [(64, 32, 4, 2), (64, 64, 8, 2), (64, 32, 4, 1)]),
    (16, False): ((128, 64, 4, 3), (64, 64, 4, 2), DECODE_64, [(128, 64, 4, 3)], [(64, 64, 4, 2)]),
    (32, False): ((128, 64, 4, 3), (64, 64, 4, 2), DECODE_64, [(128, 64, 4, 3)], [(64, 64, 4, 2)]),
    (64, False): ((128, 64, 4, 3), (64, 64, 4, 2), DECODE_64, [(128, 64, 4, 3)], [(64, 64, 4, 2)]),
    (128, False): ((64, 32, 4, 2), (32, 32, 4, 2), DECODE_64_FP32_128, [(64, 32, 4, 2)], [(32, 32, 4, 2)]),
    (256, False): ((64, 32, 4, 2), (32, 32, 4, 1), DECODE_32, [(64, 32, 4, 2)], [(32, 32, 4, 1)]),
}
# Hopper differs in two places: three stages for the 16-bit head-dim-128 forward.
SM90 = dict(SM80)
SM90[(128, True)] = ((128, 64, 8, 3), *SM80[(128, True)][1:])
# and at head dim 256 its shared memory holds the two-stage 128x32 backward tile too.
SM90[(256, True)] = (*SM80[(256, True)][:4], [(64, 32, 4, 2), (128, 32, 8, 2), (64, 64, 8, 2), (64, 32, 4, 1)])
FROZEN = {80: SM80, 90: SM90}
DTYPES = {"float16": True, "bfloat16": True, "float32": False}


def _t(cfg: TileConfig) -> tuple:
    return (cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages)


@pytest.mark.parametrize("cc", [80, 90])
@pytest.mark.parametrize("head_dim_pad", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_cuda_choices_are_frozen(cc, head_dim_pad, dtype):
    import torch

    target = targets.parse(f"cuda:{cc}")
    fwd, bwd, decode, fwd_cands, bwd_cands = FROZEN[cc][(head_dim_pad, DTYPES[dtype])]
    # Both spellings of the dtype: torch's (the launchers) and the name (the AOT compiler).
    for dt in (getattr(torch, dtype), dtype):
        assert _t(triton_tiles.fwd_config(head_dim_pad, dt, target)) == fwd
        assert _t(triton_tiles.bwd_config(head_dim_pad, dt, target)) == bwd
        assert [_t(c) for c in triton_tiles.fwd_candidates(head_dim_pad, dt, target)] == fwd_cands
        assert [_t(c) for c in triton_tiles.bwd_candidates(head_dim_pad, dt, target)] == bwd_cands
        for rows, want in zip((1, 64, 128), decode):
            assert _t(triton_tiles.decode_config(rows, head_dim_pad, dt, target)) == want
        assert triton_tiles.dot_precision(dt, target) == ("tf32" if DTYPES[dtype] else "ieee")


@pytest.mark.parametrize("head_dim_pad", [16, 64, 256])
def test_interpreter_tiles_unchanged(head_dim_pad):
    """Under TRITON_INTERPRET=1 the tiles are few and large, whatever the dtype."""
    it = targets.INTERPRETER
    for dt in ("float16", "float32"):
        assert _t(triton_tiles.fwd_config(head_dim_pad, dt, it)) == (64, 64, 4, 1)
        assert _t(triton_tiles.bwd_config(head_dim_pad, dt, it)) == (64, 64, 4, 1)
        assert _t(triton_tiles.decode_config(1, head_dim_pad, dt, it)) == (64, 64, 4, 1)
        assert [_t(c) for c in triton_tiles.fwd_candidates(head_dim_pad, dt, it)] == [(64, 64, 4, 1)]
    assert triton_tiles.dot_precision("float16", it) == "tf32"


def test_parse_targets():
    t = targets.parse("hip:gfx942")
    assert (t.backend, t.arch, t.warp_size, t.shared_bytes) == ("hip", "gfx942", 64, 65536)
    t = targets.parse("cuda:80")
    assert (t.backend, t.arch, t.warp_size, t.shared_bytes, t.cuda_major) == ("cuda", 80, 32, 166912, 8)
    assert targets.parse("cuda:90").shared_bytes == 232448
    for bad in ("cuda:75", "hip:gfx1234", "gfx942", "rocm:gfx942", ""):
        with pytest.raises(ValueError, match="unknown target"):
            targets.parse(bad)


@pytest.mark.parametrize("arch", ["gfx90a", "gfx942"])
def test_hip_prunes_what_exceeds_lds(arch):
    target = targets.parse(f"hip:{arch}")
    big = TileConfig(128, 128, 8, 2)  # two stages of 128x256 bf16 K and V tiles: far over 64 KB
    assert triton_tiles.shared_estimate("fwd", big, 256, "bfloat16", target) > 65536
    reason = triton_tiles._shared_reason(("fwd",), big, 256, "bfloat16", target)
    assert reason is not None and "65536" in reason and arch in reason
    # Every config the selection hands out fits the target.
    for hdp in (16, 32, 64, 128, 256):
        for dt in DTYPES:
            for cfg in triton_tiles.fwd_candidates(hdp, dt, target):
                assert triton_tiles._shared_reason(("fwd",), cfg, hdp, dt, target) is None
            for cfg in triton_tiles.bwd_candidates(hdp, dt, target):
                assert triton_tiles._shared_reason(("dkdv", "dq"), cfg, hdp, dt, target) is None
            for kernels, cfg in ((("fwd",), triton_tiles.fwd_config(hdp, dt, target)),
                                 (("fwd",), triton_tiles.decode_config(128, hdp, dt, target)),
                                 (("dkdv", "dq"), triton_tiles.bwd_config(hdp, dt, target))):
                assert triton_tiles._shared_reason(kernels, cfg, hdp, dt, target) is None, (hdp, dt, cfg)
            assert triton_tiles.dot_precision(dt, target) == "ieee"


def test_hip_fp32_decode_drops_a_stage():
    """fp32 decode at head dim 128 with two stages needs 64 KB of K/V alone on AMD: the
    selection drops to one stage instead of letting the launch fail."""
    target = targets.parse("hip:gfx942")
    assert _t(triton_tiles.decode_config(1, 128, "float32", target)) == (16, 64, 4, 1)
    assert _t(triton_tiles.decode_config(1, 128, "bfloat16", target)) == (16, 64, 4, 2)


def test_candidate_pruned_with_reason_on_a_small_target():
    """A candidate over the target's budget leaves the tuner's list, with the reason kept."""
    small = targets.Target("cuda", 80, 32, 100 * 1024)
    space = triton_tiles.fwd_space(128, "bfloat16", small)
    pruned = {_t(c): why for c, why in space if why and why.startswith("shared memory")}
    assert (128, 128, 8, 3) in pruned and "102400" in pruned[(128, 128, 8, 3)]
    assert all(_t(c) not in pruned for c in triton_tiles.fwd_candidates(128, "bfloat16", small))
