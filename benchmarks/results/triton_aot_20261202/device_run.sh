#!/usr/bin/env bash
# The one device call of this session: the artifact-gpu tier of cu130-torch211's wheel at its new input hash
# (the Triton tile selection now takes a Target; CUDA's choices are meant to be unchanged, and this run is
# what shows the kernels still pass on the H200). From the repository root with .devcarry/ carried
# (.ci/pack-gpu-host output). Usage: bash benchmarks/results/triton_aot_20261202/device_run.sh <full input hash>
set -u
export PYTHONUNBUFFERED=1
G=/tmp/gh; mkdir -p $G
start=$(date +%s)
OUT=$G timeout 430 .ci/gpu-host cu130-torch211 "$1" 2.11 13 .devcarry/wheelhouse/cu130-torch211 .devcarry/extra > $G/gpu-host.txt 2>&1
echo "gpu-host rc=$? in $(( $(date +%s) - start )) s"; tail -c 1500 $G/gpu-host.txt
cp $G/artifact-gpu.json $G/artifact-gpu.junit.xml $G/requirements-check.txt $G/doctor.json $G/gpu-host.txt "$OUT/" 2>/dev/null
ls "$OUT"
