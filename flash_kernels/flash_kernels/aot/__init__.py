"""Compile every Triton kernel specialisation flash_kernels would launch, for GPUs this host
does not have, with nothing but the installed triton; report what compiled and what it uses.

    python -m flash_kernels.aot --target hip:gfx942 --target hip:gfx90a --target cuda:80 \\
        [--jobs N] [--only SUBSTRING] [--list] [--timings] [--cache-dir DIR] --out report.json

Targets: cuda:80, cuda:90 (PTX + cubin with the ptxas bundled in the triton wheel) and
hip:gfx90a, hip:gfx942 (AMDGCN + hsaco), see targets.py. Exit status: 0 when every
specialisation that was not pruned compiled and fits the target, 1 when any failed, 2 for a
usage error (unknown target, a triton this module was not made to work with, a missing linker).

What is compiled comes from the code the launchers run: the tile configs from triton_tiles
(fwd_space/bwd_space with their pruning reasons, fwd_config, bwd_config, decode_config,
probs_tiles, heads_block, the split-KV limit) for the target given, and DOT_PRECISION from
dot_precision. The constexprs each kernel receives are checked against the kernel's own
parameters, so a kernel that gains a constexpr fails here instead of going uncovered.

Coverage (the report's "coverage" section states it too), chosen so one target is about 440
specialisations, 10-15 minutes with --jobs 2 on two busy cores (the timings are in the report
with --timings). Head dims are grouped by HEAD_DIM_PAD class (16, 32, 64, 128, 256): tiles,
shared memory and registers follow the class, so each class is compiled at its power of two;
the non-power-of-two head dims 12, 24, 40, 72, 96, 160, 192 (masked head-dim lanes; 12, 24, 40
and 72 are not multiples of 16 either, so their strides carry no divisibility hint) are compiled
with every flag at the largest config of their class, for bf16 and fp32.
- tuner: every candidate of fwd_space / bwd_space (pruned ones recorded with the reason) plus
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

Modules: specs (one specialisation, as each launcher makes it), enumeration (the coverage above),
signature (argument types and hints, shared with tools/triton_compile_check.py), worker (compiling,
in a process pool), ptxas and resources (what a compile uses), toolchain (the triton it drives),
report, cli.
"""

from .cli import main, parse_args, run
from .enumeration import coverage, enumerate_specs
from .report import REPORT_VERSION, entry, summarize, write_report
from .resources import HIP_FIELDS, cuda_resources, hip_resources
from .specs import (
    CLASSES,
    DTYPES,
    KERNELS,
    Features,
    Spec,
    append_spec,
    bwd_specs,
    combine_spec,
    delta_spec,
    fwd_spec,
    probs_spec,
    rotary_spec,
)
from .toolchain import TESTED_TRITON, TRITON_RANGE, UsageError, check_backends, check_triton, triton_version
from .worker import compile_all, compile_spec

__all__ = [
    "CLASSES",
    "DTYPES",
    "HIP_FIELDS",
    "KERNELS",
    "REPORT_VERSION",
    "TESTED_TRITON",
    "TRITON_RANGE",
    "Features",
    "Spec",
    "UsageError",
    "append_spec",
    "bwd_specs",
    "check_backends",
    "check_triton",
    "combine_spec",
    "compile_all",
    "compile_spec",
    "coverage",
    "cuda_resources",
    "delta_spec",
    "entry",
    "enumerate_specs",
    "fwd_spec",
    "hip_resources",
    "main",
    "parse_args",
    "probs_spec",
    "rotary_spec",
    "run",
    "summarize",
    "triton_version",
    "write_report",
]
