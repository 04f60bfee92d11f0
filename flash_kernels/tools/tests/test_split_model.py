"""The KV-cache kernel's split-count model (csrc/split_model.h), compiled with the host's C++ compiler.

The model is host code whose only inputs are a few numbers a GPU reports, so its choices can be checked here
without one. The expected counts are the best forced counts measured on the H100 (serving_path_20261205) and
what the H200's bandwidth calls for (decode_h200_20261201); a model change that moves them must say why.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parents[2] / "csrc"
CXX = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")

# (memory clock kHz, bus width bits, SMs) as cudaDeviceGetAttribute reports them.
H100 = (2619000, 5120, 132)
H200 = (3201000, 6144, 132)
# Decode blocks per SM (occupancy) of the decode tile: two at head dims 64/128, one at 256.
D128 = dict(tile_bytes=2 * 64 * 128 * 2, per_sm=2)
D64 = dict(tile_bytes=2 * 128 * 64 * 2, per_sm=2)

PROGRAM = r"""
#include <cstdio>
#include <cstdlib>
#include "split_model.h"
int main(int argc, char** argv) {
  // units key_blocks tile_bytes per_sm sms khz bits requested, one case per line on stdin
  long long units; int kb, tile, per_sm, sms, khz, bits, requested;
  while (std::scanf("%lld %d %d %d %d %d %d %d", &units, &kb, &tile, &per_sm, &sms, &khz, &bits, &requested) == 8) {
    const double bw = flash_kernels::read_bytes_per_us(khz, bits, sms);
    std::printf("%d %.0f\n", flash_kernels::plan_splits(units, kb, tile, per_sm, sms, bw, requested), bw);
  }
  return 0;
}
"""


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    if CXX is None:
        pytest.skip("no C++ compiler on PATH (Debian: g++)")
    d = tmp_path_factory.mktemp("split_model")
    (d / "main.cpp").write_text(PROGRAM)
    exe = d / "split_model"
    subprocess.run([CXX, "-std=c++17", "-O1", f"-I{CSRC}", str(d / "main.cpp"), "-o", str(exe)], check=True)

    def plan(gpu, *, batch, keys, heads_kv, tile_bytes, per_sm, block_n=64, requested=0):
        khz, bits, sms = gpu
        units = batch * heads_kv  # one packed 16-row strip per (sequence, kv head) at one new token
        line = f"{units} {-(-keys // block_n)} {tile_bytes} {per_sm} {sms} {khz} {bits} {requested}\n"
        out = subprocess.run([str(exe)], input=line, capture_output=True, text=True, check=True).stdout.split()
        return int(out[0]), float(out[1])

    return plan


def test_the_bandwidth_comes_from_the_memory_clock_and_bus(model):
    _, h100 = model(H100, batch=1, keys=4096, heads_kv=8, **D128)
    _, h200 = model(H200, batch=1, keys=4096, heads_kv=8, **D128)
    assert h100 == pytest.approx(0.88 * 3.352e6, rel=1e-3)  # 2 x 2619 MHz x 640 bytes = 3.35 TB/s peak
    assert h200 == pytest.approx(0.88 * 4.917e6, rel=1e-3)
    _, unknown = model((0, 0, 132), batch=1, keys=4096, heads_kv=8, **D128)
    assert unknown == pytest.approx(4.4e6)


@pytest.mark.parametrize(
    "batch, keys, heads_kv, tile, want",
    [
        (1, 32768, 8, D128, 16),  # auto took 32 before: 53.4 us against 50.6 at 16 (graph replay)
        (1, 131072, 8, D128, 16),  # 191.0 against 177.3
        (8, 8192, 8, D128, 2),
        (32, 4096, 8, D128, 1),
        (16, 16384, 16, D128, 1),
        (64, 2048, 4, dict(D64, block_n=128), 1),
    ],
)
def test_the_h100_gets_the_count_measured_fastest(model, batch, keys, heads_kv, tile, want):
    tile = dict(tile)
    block_n = tile.pop("block_n", 64)
    assert model(H100, batch=batch, keys=keys, heads_kv=heads_kv, block_n=block_n, **tile)[0] == want


def test_the_h200_fills_two_blocks_per_sm_at_batch_one(model):
    # Its bandwidth needs more than one 23 GB/s block per SM: between 128 and 264 blocks (8 kv heads).
    for keys in (32768, 131072):
        splits, _ = model(H200, batch=1, keys=keys, heads_kv=8, **D128)
        assert 16 < splits <= 33, (keys, splits)


def test_a_requested_count_is_honoured_up_to_one_key_block_per_split(model):
    assert model(H100, batch=1, keys=32768, heads_kv=8, requested=7, **D128)[0] == 7
    assert model(H100, batch=1, keys=256, heads_kv=8, requested=64, **D128)[0] == 4
    assert model(H100, batch=1, keys=64 * 1000, heads_kv=1, requested=1000, **D128)[0] == 128
