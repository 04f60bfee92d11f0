#!/usr/bin/env bash
# Dev iteration: sanitize (memcheck, racecheck with the full report), numerics (both kernel sets), fwd+bwd timing.
set -u
W=$(ls .whl/dev/*.whl | head -1)
OUT=$OUT bash flash_kernels/tools/device_check.sh "$W" sanitize
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" $OUT/sanitize_*.log
export PYTHONPATH=/tmp/fk_site PYTHONUNBUFFERED=1
timeout 200 python3 flash_kernels/tools/cuda_numerics_check.py ${NUM_ARGS:---quick} --json $OUT/numerics.json > $OUT/numerics.log 2>&1
echo "numerics rc=$?"; grep -c "^FAIL" $OUT/numerics.log; grep "^FAIL" $OUT/numerics.log | head -5 | cut -c1-400; tail -1 $OUT/numerics.log
timeout 200 python3 benchmarks/bench_attention.py --head-dims 64,128 --seqlens 4096,16384 --modes fwd,fwd_bwd \
  --backends ${BACKENDS:-cuda,cuda_general,triton} --rep-ms 50 --out-dir $OUT > $OUT/bench.log 2>&1
echo "bench rc=$?"; grep -A12 "## fwd_bwd" $OUT/attention_*.md | cut -d'|' -f2-10
