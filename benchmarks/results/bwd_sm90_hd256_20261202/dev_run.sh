#!/usr/bin/env bash
# One device call (H200): build an sm_90a-only wheel there, numerics against float32 (both kernel sets,
# --quick), compute-sanitizer memcheck + racecheck over the sanitizer cases, then forward+backward timing
# of the Hopper and general backward against SDPA (cuDNN, flash) in the same run.
set -u
export PYTHONUNBUFFERED=1
t0=$(date +%s)
MAX_JOBS=16 FLASH_KERNELS_CUDA_ARCHS=9.0a FLASH_KERNELS_BUILD_CUDA=1 \
  python3 -m pip wheel --no-build-isolation --no-deps ./flash_kernels -w /tmp/w > /tmp/build.log 2>&1
echo "build rc=$? $(( $(date +%s) - t0 )) s"; tail -3 /tmp/build.log > "$OUT/build_tail.log"
W=$(ls /tmp/w/flash_kernels-*.whl | head -1)
NUMERICS_TIMEOUT=${NUMERICS_TIMEOUT:-180} NUMERICS_ARGS=${NUMERICS_ARGS:---quick} SANITIZE_TIMEOUT=${SANITIZE_TIMEOUT:-120} \
  bash flash_kernels/tools/device_check.sh "$W" numerics sanitize
grep "^FAIL" "$OUT/numerics.log" | head -8 | cut -c1-300
PYTHONPATH=/tmp/fk_site timeout ${BENCH_TIMEOUT:-240} python3 benchmarks/bench_attention.py --head-dims ${BENCH_HDS:-128,192,256} \
  --seqlens 4096,16384 --modes fwd_bwd --backends cuda,cuda_general --rep-ms 50 --out-dir "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "bench rc=$?"; rm -f "$OUT"/bench/*.png
grep -A16 "## fwd_bwd" "$OUT"/bench/attention_*.md | cut -d'|' -f2-12
