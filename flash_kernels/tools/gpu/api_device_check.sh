#!/usr/bin/env bash
# One GPU host call's checks of the flash_attn API features on the Triton backend (paged KV cache,
# rotary, cache_leftpad, dropout, the transformers integration), run from flash_kernels/:
#   paged-vs-dense decode timings, the transformers check (errors next to sdpa's), the new test
#   families, then the rest of the suite as a regression check, each under its own time limit.
#   usage: tools/gpu/api_device_check.sh [steps...]   (steps: install bench transformers new old)
# Logs go to $OUT (or ./device_logs); the last lines of each step are echoed.
set -u
STEPS=${*:-install bench transformers new old}
OUT=${OUT:-device_logs}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/fk FLASH_KERNELS_TEST_BACKENDS=triton
SELFTEST="python3 -m flash_kernels.selftest --tier gpu --backend triton -p no:randomly"
NEW="kvcache or paged or dropout"
for step in $STEPS; do
  start=$SECONDS
  case $step in
    install) FLASH_KERNELS_BUILD_CUDA=0 python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/fk . \
               > "$OUT/install.log" 2>&1; echo "install rc=$?"
             { nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
               python3 -c 'import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)'
             } >> "$OUT/install.log" 2>&1; tail -2 "$OUT/install.log" ;;
    bench) timeout "${BENCH_TIMEOUT:-60}" python3 tools/gpu/paged_decode_bench.py --pages 16 64 256 \
             --json "$OUT/paged_decode.json" > "$OUT/paged_decode.log" 2>&1; echo "bench rc=$?"
           cat "$OUT/paged_decode.log" ;;
    transformers) timeout "${TRANSFORMERS_TIMEOUT:-45}" $SELFTEST -q -s -k transformers \
                    > "$OUT/transformers.log" 2>&1; echo "transformers rc=$?"
                  grep -E "TRANSFORMERS_CHECK|FLASH_KERNELS_SELFTEST|^FAILED|Error" "$OUT/transformers.log" | head -40 ;;
    new) timeout "${NEW_TIMEOUT:-70}" $SELFTEST -q -n 16 -k "$NEW" -rfs --junitxml="$OUT/new.xml" \
           > "$OUT/new_families.log" 2>&1; echo "new families rc=$?"
         grep -E "^FAILED|FLASH_KERNELS_SELFTEST" "$OUT/new_families.log" | head -30
         python3 tools/gpu/junit_counts.py "$OUT/new.xml" ;;
    old) timeout "${OLD_TIMEOUT:-60}" $SELFTEST -q -n 16 -k "not ($NEW or transformers)" -rf \
           --junitxml="$OUT/old.xml" > "$OUT/old_families.log" 2>&1; echo "old families rc=$?"
         grep -E "^FAILED|FLASH_KERNELS_SELFTEST" "$OUT/old_families.log" | head -20
         python3 tools/gpu/junit_counts.py "$OUT/old.xml" ;;
  esac
  echo "step $step took $((SECONDS - start)) s"
done
