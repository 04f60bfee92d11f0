#!/usr/bin/env bash
# Device call 3 (H200): the artifact-gpu verdict of cu130-torch211's image-built wheel at the input hash of
# the single-pass commit, from the repository root with .devcarry/ carried (`flashkit wheelhouse
# cu130-torch211 --policy build,abi,cpu --out /tmp/whp`, then `.ci/pack-gpu-host cu130-torch211
# /tmp/whp/cu130-torch211 .devcarry 3.12`). Usage: verify.sh <full input hash>. Then, with that same wheel:
# compute-sanitizer racecheck five times over the single-pass cases (racecheck_cases.py), and the fp16
# forward+backward rows of head dims 64/128. Last, what the fixed order costs: a copy of flash_kernels/ with
# the writer's wait for its turn removed (additions in any order: not deterministic), built there (sm_90a),
# timed against the image's wheel, bf16, flash_kernels only, alternating.
set -u
export PYTHONUNBUFFERED=1
G=/tmp/gh; mkdir -p $G
start=$(date +%s)
OUT=$G timeout 400 .ci/gpu-host cu130-torch211 "$1" 2.11 13 .devcarry/wheelhouse/cu130-torch211 .devcarry/extra > $G/gpu-host.txt 2>&1
echo "gpu-host rc=$? in $(( $(date +%s) - start )) s"; tail -c 1200 $G/gpu-host.txt
cp $G/artifact-gpu.json $G/artifact-gpu.junit.xml $G/requirements-check.txt $G/doctor.json $G/gpu-host.txt "$OUT/" 2>/dev/null
python3 -m pip install -q --no-deps --no-index --target /tmp/fk_site .devcarry/wheelhouse/cu130-torch211/files/*.whl
D=benchmarks/results/bwd_sm90_single_pass_20261203
for run in 1 2 3 4 5; do
  PYTHONPATH=/tmp/fk_site timeout 30 compute-sanitizer --tool racecheck --error-exitcode 3 python3 $D/racecheck_cases.py \
    > "$OUT/racecheck_$run.log" 2>&1
  echo "racecheck run $run rc=$? $(grep -c '^ran' "$OUT/racecheck_$run.log") cases; $(tail -1 "$OUT/racecheck_$run.log")"
done
PYTHONPATH=/tmp/fk_site timeout 100 python3 benchmarks/bench_attention.py --head-dims 64,128 --seqlens 4096,16384 \
  --modes fwd_bwd --backends cuda --dtype fp16 --rep-ms 30 --out-dir "$OUT/fp16" > "$OUT/bench_fp16.log" 2>&1
echo "fp16 rc=$? $(( $(date +%s) - start )) s"; grep "fk_cuda\|sdpa_cudnn" "$OUT/bench_fp16.log" | awk '{print $2,$3,$4,$5,$8}' | paste - -

# The cost of the order (a diagnostic build, never shipped).
if [ $(( $(date +%s) - start )) -lt 440 ]; then
  rm -rf /tmp/unordered && mkdir -p /tmp/unordered && cp -r flash_kernels /tmp/unordered/
  sed -i '/wait_counter_equals(counter, dq_add_rank/d' /tmp/unordered/flash_kernels/csrc/bwd_kernel_sm90.cuh
  grep -c wait_counter_equals /tmp/unordered/flash_kernels/csrc/bwd_kernel_sm90.cuh
  MAX_JOBS=16 FLASH_KERNELS_CUDA_ARCHS=9.0a FLASH_KERNELS_BUILD_CUDA=1 python3 -m pip wheel --no-build-isolation \
    --no-deps /tmp/unordered/flash_kernels -w /tmp/wu > /tmp/wu.log 2>&1; echo "unordered build rc=$?"
  python3 -m pip install -q --no-deps --no-index --target /tmp/fk_unordered /tmp/wu/flash_kernels-*.whl
  for run in 1 2; do
    for site in /tmp/fk_site /tmp/fk_unordered; do
      PYTHONPATH=$site timeout 40 python3 benchmarks/bench_attention.py --head-dims 64,128 --seqlens 4096,16384 \
        --modes fwd_bwd --backends cuda --no-sdpa --rep-ms 30 --out-dir /tmp/ub > /tmp/ub.log 2>&1
      echo "$(basename $site) run $run: $(grep fk_cuda /tmp/ub.log | awk '{print $2 "/" $3 "/" $4 "=" $8}' | tr '\n' ' ')"
    done
  done | tee "$OUT/order_cost.log"
fi
echo "total $(( $(date +%s) - start )) s"
