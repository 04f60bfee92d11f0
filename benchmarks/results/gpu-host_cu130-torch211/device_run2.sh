#!/usr/bin/env bash
# One device call: requirements + artifact-gpu + doctor (.ci/gpu-host).
set -u
export PYTHONUNBUFFERED=1
G=/tmp/gh; mkdir -p $G
OUT_SAVE=$OUT
OUT=$G timeout 500 .ci/gpu-host cu130-torch211 "$1" 2.11 13 .whl/wheelhouse/cu130-torch211 .whl/extra 2>&1 | tee $G/gpu-host.txt
echo "gpu-host rc=${PIPESTATUS[0]}"
cp $G/artifact-gpu.json $G/requirements-check.txt $G/doctor.json $OUT_SAVE/ 2>/dev/null
tar -C $G -czf $OUT_SAVE/all.tgz .
