#!/bin/bash
# Second call: dense vs paged A/B repeated (new, old alternating, 4 each, rep 100 ms) at d64 and a d128
# control, and executed instructions per kernel (ncu metrics) of both builds at the d64 shape.
set -u
cd "$(dirname "$0")"
export PYTHONUNBUFFERED=1
L=$OUT/run2.log
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
log build done
ls /tmp/site_new/flash_kernels/_C*.so /tmp/site_old/flash_kernels/_C*.so >> $L 2>&1 || { tail -40 /tmp/build_new.log /tmp/build_old.log >> $L; exit 1; }
SH="64,2048,32,4,64;32,4096,32,8,128"
for r in new1 old1 new2 old2 new3 old3 new4 old4; do
  t=${r%?}
  PYTHONPATH=/tmp/site_$t timeout 40 python3 new/benchmarks/bench_decode.py --rep-ms 100 --cuda-only --shapes "$SH" --out-dir /tmp/dec/$r > /tmp/dec_$r.log 2>&1
  log "decode $r rc=$?"; grep "^(" /tmp/dec_$r.log >> $L
done
cp /tmp/dec_*.log /tmp/dec/; tar czf $OUT/decode_runs2.tgz -C /tmp dec
for t in new old; do
  PYTHONPATH=/tmp/site_$t timeout 40 ncu --clock-control none -k regex:attn_kvcache --launch-skip 4 --launch-count 4 --metrics gpu__time_duration.sum,smsp__inst_executed.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed python3 ncu_d64.py > $OUT/ncu_inst_$t.txt 2>&1
  log "ncu $t rc=$?"; grep -E "attn_kvcache|inst_executed|duration|dram__" $OUT/ncu_inst_$t.txt >> $L
done
