#!/usr/bin/env bash
# Device call 1 (H200): the single-pass Hopper backward (head dims 64/128). Builds two sm_90a wheels side
# by side: this tree ("new") and the previous commit's flash_kernels/ ("old", unpacked under _old/ by
# `git archive HEAD flash_kernels | tar -x -C _old` before the call); smoke test (long sequences,
# determinism), numerics (all cases, both kernel sets), memcheck + racecheck, forward+backward at head dims
# 64/128 for both builds against SDPA's backends, ncu of the head-dim-128 backward.
set -u
export PYTHONUNBUFFERED=1
t0=$(date +%s)
build() {  # src dir, wheel dir
  FLASH_KERNELS_LINEINFO=1 MAX_JOBS=8 FLASH_KERNELS_CUDA_ARCHS=9.0a FLASH_KERNELS_BUILD_CUDA=1 \
    python3 -m pip wheel --no-build-isolation --no-deps "$1" -w "$2" > "$2.log" 2>&1
}
build ./flash_kernels /tmp/w & build ./_old/flash_kernels /tmp/wold & wait
echo "builds $(( $(date +%s) - t0 )) s"; tail -2 /tmp/w.log > "$OUT/build_tail.log"
W=$(ls /tmp/w/flash_kernels-*.whl | head -1); WOLD=$(ls /tmp/wold/flash_kernels-*.whl | head -1)
python3 -m pip install -q --no-deps --no-index --target /tmp/fk_old "$WOLD" || echo "old install failed"
python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/fk_site "$W" || exit 1
D=benchmarks/results/bwd_sm90_single_pass_20261203
PYTHONPATH=/tmp/fk_site timeout 120 python3 $D/smoke.py > "$OUT/smoke.log" 2>&1; echo "smoke rc=$?"
cat "$OUT/smoke.log" | cut -c1-200
NUMERICS_TIMEOUT=200 SANITIZE_TIMEOUT=150 bash flash_kernels/tools/device_check.sh "$W" numerics sanitize
grep "^FAIL" "$OUT/numerics.log" | head -8 | cut -c1-300
grep -B2 -A12 "Error: Race" "$OUT/sanitize_racecheck.log" | grep -v "^=========         " | head -30
for build in new old; do
  site=/tmp/fk_site; [ $build = old ] && site=/tmp/fk_old
  PYTHONPATH=$site timeout 200 python3 benchmarks/bench_attention.py --head-dims 64,128 --seqlens 4096,16384 \
    --modes fwd_bwd --backends cuda --rep-ms 50 --out-dir "$OUT/bench_$build" > "$OUT/bench_$build.log" 2>&1
  echo "bench $build rc=$? $(( $(date +%s) - t0 )) s"; rm -f "$OUT"/bench_$build/*.png
  grep -A10 "## fwd_bwd" "$OUT"/bench_$build/attention_*.md | cut -d'|' -f2-9
done
PYTHONPATH=/tmp/fk_site timeout 90 ncu --clock-control none -k regex:attn_bwd_dkdv --launch-skip 1 --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats python3 $D/ncu_case.py > "$OUT/ncu_hd128.txt" 2>&1; echo "ncu rc=$?"
grep -E "attn_bwd|Duration|Compute \(SM\) Throughput|Memory Throughput" "$OUT/ncu_hd128.txt" | cut -c1-90 | head -8
echo "total $(( $(date +%s) - t0 )) s"
