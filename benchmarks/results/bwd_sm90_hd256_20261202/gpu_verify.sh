#!/usr/bin/env bash
# The artifact-gpu verdict of cu130-torch211's image-built wheel at the input hash of 15112af (the Hopper
# backward for head dims 136-256), from the repository root with .devcarry/ carried (`flashkit wheelhouse
# cu130-torch211 --policy build,abi,cpu --out /tmp/whp`, then `.ci/pack-gpu-host cu130-torch211
# /tmp/whp/cu130-torch211 .devcarry 3.12`). Usage: gpu_verify.sh <full input hash>. Then the plots of the
# two timing runs of this folder, drawn by bench_attention.plot from their JSON.
set -u
export PYTHONUNBUFFERED=1
G=/tmp/gh; mkdir -p $G
start=$(date +%s)
OUT=$G timeout 450 .ci/gpu-host cu130-torch211 "$1" 2.11 13 .devcarry/wheelhouse/cu130-torch211 .devcarry/extra > $G/gpu-host.txt 2>&1
echo "gpu-host rc=$? in $(( $(date +%s) - start )) s"; tail -c 1500 $G/gpu-host.txt
cp $G/artifact-gpu.json $G/artifact-gpu.junit.xml $G/requirements-check.txt $G/doctor.json $G/gpu-host.txt "$OUT/" 2>/dev/null
R=benchmarks/results/bwd_sm90_hd256_20261202/run2
for d in bf16 fp16; do
  python3 -c "import json, sys; sys.path.insert(0, 'benchmarks'); import bench_attention as b; \
print(b.plot(json.load(open(sys.argv[1])), sys.argv[2]))" $R/$d/attention_*.json "$OUT/attention_$d.png"
done
ls "$OUT"
