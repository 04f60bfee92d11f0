#!/usr/bin/env bash
# Final checks of the cu130-torch211 wheel on the H200 (one or two device calls):
#   verify:  .ci/gpu-host (pinned requirements + artifact-gpu + doctor), numerics vs fp32, sanitizers
#   bench:   benchmarks/bench_attention.py (Hopper kernel, general CUDA kernel, Triton, SDPA)
set -u
export PYTHONUNBUFFERED=1
H=$1; shift
G=/tmp/gh; mkdir -p $G
OUT_SAVE=$OUT
W=$(ls .whl/wheelhouse/cu130-torch211/files/flash_kernels-*.whl | head -1)
python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/fk "$W"
for step in "$@"; do case $step in
  verify)
    OUT=$G timeout 330 .ci/gpu-host cu130-torch211 "$H" 2.11 13 .whl/wheelhouse/cu130-torch211 .whl/extra > $G/gpu-host.txt 2>&1
    echo "gpu-host rc=$?"; tail -4 $G/gpu-host.txt
    OUT=$G/check NUMERICS_TIMEOUT=120 SANITIZE_TIMEOUT=100 bash flash_kernels/tools/device_check.sh "$W" numerics sanitize
    tail -1 $G/check/numerics.log; grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" $G/check/sanitize_*.log
    cp -r $G/check $OUT_SAVE/ ; cp $G/artifact-gpu.json $G/requirements-check.txt $G/doctor.json $G/gpu-host.txt $OUT_SAVE/ 2>/dev/null ;;
  bench)
    PYTHONPATH=/tmp/fk timeout 300 python3 benchmarks/bench_attention.py --head-dims 64,128,256 --seqlens 4096,8192,16384 \
      --modes fwd,fwd_bwd --backends cuda,cuda_general,triton --rep-ms 50 --out-dir $G/bench > $G/bench.log 2>&1
    echo "bench rc=$?"
    PYTHONPATH=/tmp/fk timeout 120 python3 benchmarks/bench_attention.py --head-dims 32,96,160,192 --seqlens 8192 \
      --modes fwd --backends cuda,cuda_general --rep-ms 50 --out-dir $G/bench > $G/bench2.log 2>&1
    echo "bench2 rc=$?"
    cp $G/bench/* $G/bench*.log $OUT_SAVE/ 2>/dev/null ;;
esac; done
tar -C $G -czf $OUT_SAVE/all.tgz .
ls $OUT_SAVE
