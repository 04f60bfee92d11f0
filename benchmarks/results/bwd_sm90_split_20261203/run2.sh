#!/usr/bin/env bash
# Device call 2 (H200): the committed kernel (split roles, wait-for-all steps) built with -lineinfo so that
# racecheck names source lines; numerics (--quick, both kernel sets), memcheck + racecheck over the
# sanitizer cases, forward+backward at head dims 192/256, ncu of the head-dim-256 kernels.
set -u
export PYTHONUNBUFFERED=1
t0=$(date +%s)
FLASH_KERNELS_LINEINFO=1 MAX_JOBS=16 FLASH_KERNELS_CUDA_ARCHS=9.0a FLASH_KERNELS_BUILD_CUDA=1 \
  python3 -m pip wheel --no-build-isolation --no-deps ./flash_kernels -w /tmp/w > /tmp/build.log 2>&1
echo "build rc=$? $(( $(date +%s) - t0 )) s"; tail -3 /tmp/build.log > "$OUT/build_tail.log"
W=$(ls /tmp/w/flash_kernels-*.whl | head -1)
NUMERICS_TIMEOUT=180 NUMERICS_ARGS=--quick SANITIZE_TIMEOUT=150 \
  bash flash_kernels/tools/device_check.sh "$W" numerics sanitize
grep "^FAIL" "$OUT/numerics.log" | head -8 | cut -c1-300
grep -B2 -A12 "Error: Race" "$OUT/sanitize_racecheck.log" | grep -v "^=========         " | head -40
PYTHONPATH=/tmp/fk_site timeout 200 python3 benchmarks/bench_attention.py --head-dims 192,256 --seqlens 4096,16384 \
  --modes fwd_bwd --backends cuda --rep-ms 50 --out-dir "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "bench rc=$?"; rm -f "$OUT"/bench/*.png
grep -A12 "## fwd_bwd" "$OUT"/bench/attention_*.md | cut -d'|' -f2-9
PYTHONPATH=/tmp/fk_site timeout 90 ncu --clock-control none -k regex:attn_bwd_.*sm90 --launch-skip 2 --launch-count 2 \
  --section SpeedOfLight --section WarpStateStats \
  python3 benchmarks/results/bwd_sm90_hd256_20261202/ncu_case.py > "$OUT/ncu_hd256.txt" 2>&1; echo "ncu rc=$?"
grep -E "attn_bwd|Duration|Compute \(SM\) Throughput" "$OUT/ncu_hd256.txt" | cut -c1-90 | head -8
