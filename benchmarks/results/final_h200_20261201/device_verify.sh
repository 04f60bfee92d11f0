#!/usr/bin/env bash
# The artifact-gpu verdict of the image-built cu130-torch211 wheel, in one device call from the repository root
# (.devcarry/ carried: `flashkit wheelhouse cu130-torch211 --policy build,abi,cpu --out /tmp/whp` then
# `.ci/pack-gpu-host cu130-torch211 /tmp/whp/cu130-torch211 .devcarry 3.12`): the pinned requirements installed
# by hash in a fresh venv of the host's Python 3.12, the whole shipped suite with that venv's Python, doctor.
set -u
export PYTHONUNBUFFERED=1
G=/tmp/gh; mkdir -p $G
OUT=$G timeout 430 .ci/gpu-host cu130-torch211 "$1" 2.11 13 .devcarry/wheelhouse/cu130-torch211 .devcarry/extra > $G/gpu-host.txt 2>&1
echo "gpu-host rc=$?"; cat $G/gpu-host.txt | cut -c1-600
cp $G/artifact-gpu.json $G/artifact-gpu.junit.xml $G/requirements-check.txt $G/requirements-install.log $G/doctor.json $G/gpu-host.txt "$OUT/" 2>/dev/null
ls "$OUT"
