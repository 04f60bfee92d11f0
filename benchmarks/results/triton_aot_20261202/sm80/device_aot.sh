#!/usr/bin/env bash
# The triton-aot tier of cu130-torch211 (target cuda:80, no A100 here) on the GPU host's 16 cores, with the
# host's own triton (the env's pin, 3.6.0) through `flashkit aot --python`. From the repository root with
# .devcarry/kitwhl/ carried: the kit's dependencies the host lacks, as cp312 wheels. The ledger line and the
# report come back under $OUT and are merged here with `flashkit ledger merge`.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .devcarry/kitwhl/*.whl || exit 1
python3 -c 'import triton; print("triton", triton.__version__)'
touch /tmp/aot_marker; start=$(date +%s)
PYTHONPATH=/tmp/site:$PWD timeout ${AOT_TIMEOUT:-500} python3 -m flashkit.cli.main aot cu130-torch211 \
  --python "$(command -v python3)" --jobs ${AOT_JOBS:-16} > "$OUT/aot.log" 2>&1
echo "aot rc=$? in $(( $(date +%s) - start )) s"; tail -20 "$OUT/aot.log"
cp verified/cu130-torch211.jsonl "$OUT/" 2>/dev/null
find verified/evidence -type f -newer /tmp/aot_marker -exec cp {} "$OUT/" \;
ls "$OUT"
