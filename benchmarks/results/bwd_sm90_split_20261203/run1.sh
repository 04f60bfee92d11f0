#!/usr/bin/env bash
# Device call 1 (H200): sm_90a wheel built there from this tree; numerics (both kernel sets, --quick),
# compute-sanitizer memcheck + racecheck, forward+backward at head dims 192/256 against the general kernels
# and SDPA (bwd_sm90_hd256_20261202/dev_run.sh), then ncu of the two head-dim-256 backward kernels.
set -u
BENCH_HDS=${BENCH_HDS:-192,256} bash benchmarks/results/bwd_sm90_hd256_20261202/dev_run.sh
PYTHONPATH=/tmp/fk_site timeout 90 ncu --clock-control none -k regex:attn_bwd_.*sm90 --launch-skip 2 --launch-count 2 \
  --section SpeedOfLight --section Occupancy --section WarpStateStats \
  python3 benchmarks/results/bwd_sm90_hd256_20261202/ncu_case.py > "$OUT/ncu_hd256.txt" 2>&1; echo "ncu rc=$?"
grep -E "attn_bwd|Duration|Compute \(SM\) Throughput|Issue Slots Busy" "$OUT/ncu_hd256.txt" | head -12
