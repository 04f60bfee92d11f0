#!/usr/bin/env bash
# Second device call: the forward and forward+backward table in bf16 and fp16 (head dims 64-256, the Hopper
# kernels, and for bf16 the general kernels as the same-run "before" of 192/256), then ncu of the new
# head-dim-256 backward kernels (non-causal, second iteration).
set -u
export PYTHONUNBUFFERED=1
t0=$(date +%s)
MAX_JOBS=16 FLASH_KERNELS_CUDA_ARCHS=9.0a FLASH_KERNELS_BUILD_CUDA=1 \
  python3 -m pip wheel --no-build-isolation --no-deps ./flash_kernels -w /tmp/w > /tmp/build.log 2>&1
echo "build rc=$? $(( $(date +%s) - t0 )) s"
python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/fk_site /tmp/w/flash_kernels-*.whl || exit 1
export PYTHONPATH=/tmp/fk_site
B="python3 benchmarks/bench_attention.py --head-dims 64,128,192,256 --seqlens 4096,16384 --modes fwd,fwd_bwd --rep-ms 25"
timeout 260 $B --backends cuda,cuda_general --dtype bf16 --out-dir "$OUT/bf16" > "$OUT/bench_bf16.log" 2>&1; echo "bf16 rc=$?"
timeout 200 $B --backends cuda --dtype fp16 --out-dir "$OUT/fp16" > "$OUT/bench_fp16.log" 2>&1; echo "fp16 rc=$?"
rm -f "$OUT"/*/*.png
timeout 90 ncu --clock-control none -k regex:attn_bwd_.*sm90 --launch-skip 2 --launch-count 2 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy --section WarpStateStats \
  python3 benchmarks/results/bwd_sm90_hd256_20261202/ncu_case.py > "$OUT/ncu_hd256.txt" 2>&1; echo "ncu rc=$?"
grep -E "attn_bwd|Duration|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|Achieved Occupancy" "$OUT/ncu_hd256.txt" | head -30
for d in bf16 fp16; do grep -A40 "## fwd_bwd" "$OUT"/$d/attention_*.md | cut -d'|' -f2-5,7,10-12 | head -20; done
