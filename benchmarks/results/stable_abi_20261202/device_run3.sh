#!/usr/bin/env bash
# Device call 3 of issue 19, after the allocation change (aoti_torch_empty_strided): for the new stable wheel, the
# artifact-gpu tier (.ci/gpu-host), the same-run benchmark against the version-bound wheel, numerics and
# compute-sanitizer memcheck + racecheck. From the repository root with .devcarry/ carried.
# Usage: bash benchmarks/results/stable_abi_20261202/device_run3.sh <full input hash of cu130-torch211>
set -u
export PYTHONUNBUFFERED=1
G=/tmp/gh; mkdir -p $G
OUT=$G timeout 400 .ci/gpu-host cu130-torch211 "$1" 2.11 13 .devcarry/wheelhouse/cu130-torch211 .devcarry/extra > $G/gpu-host.txt 2>&1
echo "gpu-host rc=$?"; tail -c 1500 $G/gpu-host.txt
cp $G/artifact-gpu.json $G/artifact-gpu.junit.xml $G/requirements-check.txt $G/doctor.json $G/gpu-host.txt "$OUT/" 2>/dev/null
W=$(find .devcarry/wheelhouse/cu130-torch211 -name "*stable*.whl" | head -1); sha256sum "$W"
python3 -m pip install -q --no-deps --no-index --target /tmp/site_stable "$W"
python3 -m pip install -q --no-deps --no-index --target /tmp/site_version .devcarry/abi/version/*.whl
timeout 150 python3 benchmarks/bench_abi_modes.py --wheel stable=/tmp/site_stable --wheel version=/tmp/site_version \
  --rounds 4 --rep-ms 100 --out-dir "$OUT/abi_modes" > "$OUT/abi_modes.log" 2>&1
echo "abi_modes rc=$?"; tail -12 "$OUT/abi_modes.log"
OUT="$OUT/checks" bash flash_kernels/tools/device_check.sh "$W" numerics sanitize
ls "$OUT"
