#!/usr/bin/env bash
# Device call 2 (H200): the committed single-pass kernel (each step issues its own S^T/dP^T; the next
# step's lse/delta load moved after the dS^T fence) with the Triton shared-memory model applied. sm_90a wheel
# built there; smoke test, numerics (all cases, both kernel sets), memcheck + racecheck, forward+backward at
# head dims 64/128 against SDPA's backends, ncu of the head-dim-128 dK/dV kernel.
set -u
export PYTHONUNBUFFERED=1
t0=$(date +%s)
FLASH_KERNELS_LINEINFO=1 MAX_JOBS=16 FLASH_KERNELS_CUDA_ARCHS=9.0a FLASH_KERNELS_BUILD_CUDA=1 \
  python3 -m pip wheel --no-build-isolation --no-deps ./flash_kernels -w /tmp/w > /tmp/build.log 2>&1
echo "build rc=$? $(( $(date +%s) - t0 )) s"; tail -2 /tmp/build.log > "$OUT/build_tail.log"
W=$(ls /tmp/w/flash_kernels-*.whl | head -1)
python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/fk_site "$W" || exit 1
D=benchmarks/results/bwd_sm90_single_pass_20261203
PYTHONPATH=/tmp/fk_site timeout 120 python3 $D/smoke.py > "$OUT/smoke.log" 2>&1; echo "smoke rc=$?"; tail -1 "$OUT/smoke.log"
NUMERICS_TIMEOUT=200 SANITIZE_TIMEOUT=230 bash flash_kernels/tools/device_check.sh "$W" numerics sanitize
grep "^FAIL" "$OUT/numerics.log" | head -8 | cut -c1-300
grep -c "Race\|Hazard" "$OUT/sanitize_racecheck.log"; tail -1 "$OUT/sanitize_racecheck.log"
PYTHONPATH=/tmp/fk_site timeout 200 python3 benchmarks/bench_attention.py --head-dims 64,128 --seqlens 4096,16384 \
  --modes fwd_bwd --backends cuda --rep-ms 50 --out-dir "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s"; rm -f "$OUT"/bench/*.png
grep -A11 "## fwd_bwd" "$OUT"/bench/attention_*.md | cut -d'|' -f2-9
PYTHONPATH=/tmp/fk_site timeout 60 ncu --clock-control none -k regex:attn_bwd_dkdv --launch-skip 1 --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats python3 $D/ncu_case.py > "$OUT/ncu_hd128.txt" 2>&1; echo "ncu rc=$?"
grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput" "$OUT/ncu_hd128.txt" | cut -c1-90 | head -4
echo "total $(( $(date +%s) - t0 )) s"
