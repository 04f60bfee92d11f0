#!/usr/bin/env bash
# Final checks of the image-built cu130-torch211 wheel on the H200, in one device call, from the repository
# root (.devcarry/ carried, made by `flashkit wheelhouse cu130-torch211 --policy build,abi,cpu --out /tmp/whp` and
# `.ci/pack-gpu-host cu130-torch211 /tmp/whp/cu130-torch211 .devcarry 3.12`: the wheelhouse and the pinned cp312
# wheels the host lacks):
#   1. .ci/gpu-host: the pinned requirements installed by hash in a fresh venv, the artifact-gpu tier (the whole
#      shipped suite: every family on both backends, the transformers checks) and doctor;
#   2. CUDA numerics (--quick) with both kernel sets, the KV-cache and paged cases included;
#   3. paged vs dense decode in one run (CUDA kernel, Triton).
set -u
export PYTHONUNBUFFERED=1
H=$1
G=/tmp/gh; mkdir -p $G
SAVE=$OUT
WH=.devcarry/wheelhouse/cu130-torch211
W=$(ls $WH/files/flash_kernels-*.whl | head -1)
OUT=$G timeout 430 .ci/gpu-host cu130-torch211 "$H" 2.11 13 $WH .devcarry/extra > $G/gpu-host.txt 2>&1
echo "gpu-host rc=$?"; tail -5 $G/gpu-host.txt
cp $G/artifact-gpu.json $G/artifact-gpu.junit.xml $G/requirements-check.txt $G/doctor.json $G/gpu-host.txt $SAVE/ 2>/dev/null
python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/fk "$W"
OUT=$G/check NUMERICS_TIMEOUT=100 NUMERICS_ARGS=--quick bash flash_kernels/tools/device_check.sh "$W" numerics > $G/numerics.txt 2>&1
echo "numerics rc=$?"; tail -2 $G/check/numerics.log 2>/dev/null
PYTHONPATH=/tmp/fk timeout 70 python3 flash_kernels/tools/paged_decode_bench.py --pages 16 64 256 > $G/paged_decode.txt 2>&1
echo "paged bench rc=$?"; tail -12 $G/paged_decode.txt
cp $G/numerics.txt $G/check/numerics.log $G/paged_decode.txt $SAVE/ 2>/dev/null
tar -C $G -czf $SAVE/all.tgz .
ls $SAVE
