#!/usr/bin/env bash
# Device call 1 of issue 19 (run from the repository root on the GPU host, .devcarry/ carried):
#  - the artifact-gpu tier of the stable-ABI wheel: .ci/gpu-host installs cu130-torch211's pinned requirements
#    by hash into a fresh venv and runs the wheel's full GPU suite (see device_verify.sh of earlier runs);
#  - the same-run benchmark of that wheel against the version-bound wheel of the previous input hash
#    (benchmarks/bench_abi_modes.py), each unpacked into its own folder.
# Usage: bash benchmarks/results/stable_abi_20261202/device_run1.sh <full input hash>
set -u
export PYTHONUNBUFFERED=1
G=/tmp/gh; mkdir -p $G
OUT=$G timeout 400 .ci/gpu-host cu130-torch211 "$1" 2.11 13 .devcarry/wheelhouse/cu130-torch211 .devcarry/extra > $G/gpu-host.txt 2>&1
echo "gpu-host rc=$?"; tail -c 3000 $G/gpu-host.txt
cp $G/artifact-gpu.json $G/artifact-gpu.junit.xml $G/requirements-check.txt $G/doctor.json $G/gpu-host.txt "$OUT/" 2>/dev/null
python3 -m pip install -q --no-deps --no-index --target /tmp/site_stable $(find .devcarry/wheelhouse/cu130-torch211 -name "*stable*.whl" | head -1)
python3 -m pip install -q --no-deps --no-index --target /tmp/site_version .devcarry/abi/version/*.whl
timeout 150 python3 benchmarks/bench_abi_modes.py --wheel stable=/tmp/site_stable --wheel version=/tmp/site_version \
  --rounds 2 --rep-ms 100 --out-dir "$OUT/abi_modes" > "$OUT/abi_modes.log" 2>&1
echo "abi_modes rc=$?"; cat "$OUT/abi_modes.log" | tail -20
ls "$OUT"
