#!/usr/bin/env bash
# Device call 3 (H200): the artifact-gpu verdict of cu130-torch211's image-built wheel at the input hash of
# 1efa78c, from the repository root with .devcarry/ carried (`flashkit wheelhouse cu130-torch211 --policy
# build,abi,cpu --out /tmp/whp`, then `.ci/pack-gpu-host cu130-torch211 /tmp/whp/cu130-torch211 .devcarry
# 3.12`). Usage: verify.sh <full input hash>. Then, with that same wheel, the fp16 forward+backward rows of
# head dims 192/256, and the plot of call 2's bf16 table (bench_attention.plot, from its JSON).
set -u
export PYTHONUNBUFFERED=1
G=/tmp/gh; mkdir -p $G
start=$(date +%s)
OUT=$G timeout 420 .ci/gpu-host cu130-torch211 "$1" 2.11 13 .devcarry/wheelhouse/cu130-torch211 .devcarry/extra > $G/gpu-host.txt 2>&1
echo "gpu-host rc=$? in $(( $(date +%s) - start )) s"; tail -c 1200 $G/gpu-host.txt
cp $G/artifact-gpu.json $G/artifact-gpu.junit.xml $G/requirements-check.txt $G/doctor.json $G/gpu-host.txt "$OUT/" 2>/dev/null
python3 -m pip install -q --no-deps --no-index --target /tmp/fk_site .devcarry/wheelhouse/cu130-torch211/files/*.whl
PYTHONPATH=/tmp/fk_site timeout 120 python3 benchmarks/bench_attention.py --head-dims 192,256 --seqlens 4096,16384 \
  --modes fwd_bwd --backends cuda --dtype fp16 --rep-ms 30 --out-dir "$OUT/fp16" > "$OUT/bench_fp16.log" 2>&1
echo "fp16 rc=$?"; grep -A12 "## fwd_bwd" "$OUT"/fp16/attention_*.md | cut -d'|' -f2-9
python3 -c "import json, sys; sys.path.insert(0, 'benchmarks'); import bench_attention as b; \
print(b.plot(json.load(open(sys.argv[1])), sys.argv[2]))" \
  benchmarks/results/bwd_sm90_split_20261203/call2/bench/attention_*.json "$OUT/attention_bf16.png"
ls "$OUT"
