#!/usr/bin/env bash
# One device call: requirements + artifact-gpu + doctor (.ci/gpu-host), then the attention benchmark.
set -u
export PYTHONUNBUFFERED=1
H=$1
G=/tmp/gh; mkdir -p $G
OUT_SAVE=$OUT
OUT=$G timeout 420 .ci/gpu-host cu130-torch211 "$H" 2.11 13 .whl/wheelhouse/cu130-torch211 .whl/extra 2>&1 | tee $G/gpu-host.txt
echo "gpu-host rc=${PIPESTATUS[0]}"
python3 -m pip install -q --no-deps --no-index --target /tmp/fk .whl/wheelhouse/cu130-torch211/files/*.whl
PYTHONPATH=/tmp/fk timeout 170 python3 benchmarks/bench_attention.py --head-dims 128 --seqlens 4096,8192,16384 \
  --modes fwd,fwd_bwd --backends triton,cuda --rep-ms 50 --out-dir $G/bench > $G/bench.log 2>&1
echo "bench rc=$?"; tail -30 $G/bench.log
cp $G/artifact-gpu.json $G/requirements-check.txt $G/doctor.json $OUT_SAVE/ 2>/dev/null
cp $G/bench/*.md $OUT_SAVE/ 2>/dev/null
tar -C $G -czf $OUT_SAVE/all.tgz .
ls -la $OUT_SAVE
