#!/usr/bin/env bash
# One GPU host call's checks of a built CUDA wheel (run from the repository root on the GPU host):
#   numerics vs float32, compute-sanitizer memcheck + racecheck, the timing table, the shipped suite
#   against the CUDA backend. Logs go to $OUT (or ./device_logs). Each step has its own time limit so
#   one slow step cannot take the others' time.
#   usage: flash_kernels/tools/gpu/device_check.sh WHEEL [steps...]
#   steps: numerics sanitize bench suite (the default set), and kvcache (numerics of the KV-cache kernel and
#   paged forward only), sanitize_kvcache (memcheck + racecheck of those only), decode (benchmarks/bench_decode.py)
set -u
WHEEL=$1; shift
STEPS=${*:-numerics sanitize bench suite}
OUT=${OUT:-device_logs}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/fk_site "$WHEEL" || exit 1
SO=$(ls /tmp/fk_site/flash_kernels/_C*.so)
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c 'import torch; print(torch.__version__)';
  cuobjdump --list-elf "$SO" | sed 's/.*\.\(sm_[0-9]*\)\..*/\1/' | sort | uniq -c; cuobjdump --list-ptx "$SO" | sed 's/.*\.\(sm_[0-9]*\)\..*/ptx \1/' | sort | uniq -c; } > "$OUT/wheel_info.txt" 2>&1
T=flash_kernels/tools/gpu
for step in $STEPS; do
  case $step in
    numerics) PYTHONPATH=/tmp/fk_site timeout ${NUMERICS_TIMEOUT:-150} python3 $T/cuda_numerics_check.py ${NUMERICS_ARGS:-} > "$OUT/numerics.log" 2>&1; echo "numerics rc=$?"; tail -1 "$OUT/numerics.log" ;;
    sanitize) for tool in memcheck racecheck; do
                PYTHONPATH=/tmp/fk_site timeout ${SANITIZE_TIMEOUT:-120} compute-sanitizer --tool $tool --error-exitcode 3 python3 $T/cuda_sanitize_cases.py > "$OUT/sanitize_$tool.log" 2>&1; echo "sanitize $tool rc=$?"; done ;;
    bench) PYTHONPATH=/tmp/fk_site timeout 100 python3 $T/cuda_bench.py ${BENCH_ARGS:-} --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1; echo "bench rc=$?" ;;
    kvcache) PYTHONPATH=/tmp/fk_site timeout ${NUMERICS_TIMEOUT:-150} python3 $T/cuda_numerics_check.py --kvcache-only --json "$OUT/kvcache_numerics.json" > "$OUT/kvcache_numerics.log" 2>&1; echo "kvcache numerics rc=$?"; tail -1 "$OUT/kvcache_numerics.log" ;;
    sanitize_kvcache) for tool in memcheck racecheck; do
                FLASH_KERNELS_SANITIZE_KVCACHE_ONLY=1 PYTHONPATH=/tmp/fk_site timeout ${SANITIZE_TIMEOUT:-120} compute-sanitizer --tool $tool --error-exitcode 3 python3 $T/cuda_sanitize_cases.py > "$OUT/sanitize_kvcache_$tool.log" 2>&1; echo "sanitize_kvcache $tool rc=$?"; tail -2 "$OUT/sanitize_kvcache_$tool.log"; done ;;
    decode) PYTHONPATH=/tmp/fk_site timeout ${DECODE_TIMEOUT:-150} python3 benchmarks/bench_decode.py ${DECODE_ARGS:-} --out-dir "$OUT/decode" > "$OUT/decode.log" 2>&1; echo "decode rc=$?" ;;
    suite) PYTHONPATH=/tmp/fk_site timeout ${SUITE_TIMEOUT:-90} python3 -m flash_kernels.selftest --tier gpu --backend cuda -q -n 8 > "$OUT/suite.log" 2>&1; echo "suite rc=$?"; tail -3 "$OUT/suite.log" ;;
  esac
done
