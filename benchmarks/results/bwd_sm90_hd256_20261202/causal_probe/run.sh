#!/usr/bin/env bash
# A/B of the causal block order (branch: last query blocks first in the Hopper forward and dQ kernels) against
# main, same run; then ncu of main's hd64 causal backward kernels.
set -u
export PYTHONUNBUFFERED=1
t0=$(date +%s)
(MAX_JOBS=8 FLASH_KERNELS_CUDA_ARCHS=9.0a FLASH_KERNELS_BUILD_CUDA=1 python3 -m pip wheel --no-build-isolation --no-deps ./flash_kernels -w /tmp/wa > /tmp/ba.log 2>&1; echo "A rc=$?") &
(MAX_JOBS=8 FLASH_KERNELS_CUDA_ARCHS=9.0a FLASH_KERNELS_BUILD_CUDA=1 python3 -m pip wheel --no-build-isolation --no-deps ./.kdev-order/flash_kernels -w /tmp/wb > /tmp/bb.log 2>&1; echo "B rc=$?") &
wait; echo "builds $(( $(date +%s) - t0 )) s"
for x in a b; do python3 -m pip install -q --no-deps --no-index --target /tmp/f$x /tmp/w$x/flash_kernels-*.whl || exit 1; done
B="python3 benchmarks/bench_attention.py --head-dims 64,128 --seqlens 4096,16384 --modes fwd,fwd_bwd --causal 1 --backends cuda --no-sdpa --rep-ms 30"
for r in 1 2; do for x in a b; do
  PYTHONPATH=/tmp/f$x timeout 120 $B --out-dir /tmp/o$x$r > /tmp/o$x$r.log 2>&1
  echo "run $r $x: $(grep -h '^|' /tmp/o$x$r/attention_*.md | grep -E '^\| (64|128) ' | cut -d'|' -f2-6 | tr '\n' ';')"
done; done | tee "$OUT/ab.txt"
PYTHONPATH=/tmp/fa timeout 150 ncu --clock-control none -k regex:attn_bwd_.*sm90 --launch-skip 2 --launch-count 2 \
  --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
  python3 .kdev-order/ncu_case.py 64 causal > "$OUT/ncu_hd64_causal.txt" 2>&1; echo "ncu rc=$?"
grep -E "attn_bwd|Duration|Compute \(SM\) Throughput|Issue Slots Busy|Achieved Occupancy|Stall" "$OUT/ncu_hd64_causal.txt" | head -24
