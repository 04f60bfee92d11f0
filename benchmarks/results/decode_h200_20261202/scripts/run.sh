#!/bin/bash
# One device call: build the branch's wheel and the base commit's (A/B in one run), KV-cache numerics,
# decode dense/paged A/B (new, old, new, old), compute-sanitizer memcheck + racecheck, ncu of the d64 shape.
set -u
cd "$(dirname "$0")"
export PYTHONUNBUFFERED=1
L=$OUT/run.log
log() { echo "[$(date +%T)] $*" | tee -a $L; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv >> $L 2>&1
log build start
for t in new old; do
  ( cd $t && MAX_JOBS=8 FLASH_KERNELS_CUDA_ARCHS=9.0a FLASH_KERNELS_BUILD_CUDA=1 \
      python3 -m pip wheel --no-build-isolation --no-deps ./flash_kernels -w /tmp/w_$t > /tmp/build_$t.log 2>&1
    echo "build $t rc=$?" >> $L
    python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/site_$t /tmp/w_$t/flash_kernels-*.whl >> $L 2>&1 ) &
done
wait
log build done; tail -3 /tmp/build_new.log >> $L
ls /tmp/site_new/flash_kernels/_C*.so /tmp/site_old/flash_kernels/_C*.so >> $L 2>&1 || { tail -40 /tmp/build_new.log /tmp/build_old.log >> $L; exit 1; }
PYTHONPATH=/tmp/site_new timeout 100 python3 new/flash_kernels/tools/cuda_numerics_check.py --kvcache-only > $OUT/kvcache_numerics.log 2>&1
log "kvcache numerics rc=$? $(tail -1 $OUT/kvcache_numerics.log)"
SH="64,2048,32,4,64;32,4096,32,8,128;1,32768,32,8,128"
for r in new1 old1 new2 old2; do
  t=${r%?}
  PYTHONPATH=/tmp/site_$t timeout 60 python3 new/benchmarks/bench_decode.py --rep-ms 50 --cuda-only --shapes "$SH" --out-dir /tmp/dec/$r > /tmp/dec_$r.log 2>&1
  log "decode $r rc=$?"; grep "^(" /tmp/dec_$r.log >> $L
done
mkdir -p /tmp/dec; cp /tmp/dec_*.log /tmp/dec/ 2>/dev/null; tar czf $OUT/decode_runs.tgz -C /tmp dec
for tool in memcheck racecheck; do
  FLASH_KERNELS_SANITIZE_KVCACHE_ONLY=1 PYTHONPATH=/tmp/site_new timeout 70 compute-sanitizer --tool $tool --error-exitcode 3 python3 new/flash_kernels/tools/cuda_sanitize_cases.py > $OUT/sanitize_kvcache_$tool.log 2>&1
  log "sanitize $tool rc=$? $(tail -1 $OUT/sanitize_kvcache_$tool.log)"
done
PYTHONPATH=/tmp/site_new timeout 80 ncu --clock-control none -k regex:attn_kvcache --launch-skip 4 --launch-count 4 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section LaunchStats python3 ncu_d64.py > $OUT/ncu_d64.txt 2>&1
log "ncu rc=$?"
