#!/usr/bin/env bash
# The triton-aot tier of rocm64-torch27 (targets hip:gfx90a and hip:gfx942; no AMD GPU anywhere here) on the
# GPU host's 16 CPU cores, with the env's triton 3.3.1 through `flashkit aot --python`. From the repository
# root, carrying .devcarry/kitwhl (the kit's dependencies as cp312 wheels), .devcarry/rocmaot (made by
# pack_for_gpu_host.sh beside this file) and .work/aot-parts (targets already passed, kept by the kit and
# reused). Triton 3.3.1 links each hsaco with an external ld.lld, and the GPU host has none: ld.lld.py beside
# this file does the same link with the lld built into the host's own triton 3.6. What comes back under
# $OUT: the log, the kept parts, the ledger and the evidence, merged on the build host with `flashkit ledger
# merge`.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-kit .devcarry/kitwhl/*.whl || exit 1
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/lld-in-triton-3.6
printf '#!/bin/sh\nexec %s %s "$@"\n' "$(command -v python3)" "$here/ld.lld.py" > /tmp/lld-in-triton-3.6/ld.lld
chmod +x /tmp/lld-in-triton-3.6/ld.lld
export TRITON_HIP_LLD_PATH=/tmp/lld-in-triton-3.6/ld.lld; "$TRITON_HIP_LLD_PATH" --version || exit 1
# An interpreter whose only triton is the env's: a venv without the host's site-packages (its triton is 3.6).
python3 -m venv --without-pip /tmp/v331 || exit 1
sp=$(/tmp/v331/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
tar -C "$sp" -xJf .devcarry/rocmaot/triton-3.3.1-site.tar.xz || exit 1
/tmp/v331/bin/python -c 'import triton, sys; print("triton", triton.__version__, triton.__file__, sys.version)' || exit 1
touch /tmp/aot_marker; start=$(date +%s)
PYTHONPATH=/tmp/site-kit:$PWD timeout ${AOT_TIMEOUT:-540} python3 -m flashkit.cli.main aot rocm64-torch27 \
  --python /tmp/v331/bin/python --jobs ${AOT_JOBS:-16} > "$OUT/aot.log" 2>&1
echo "aot rc=$? in $(( $(date +%s) - start )) s"; tail -25 "$OUT/aot.log"
ls -la .work/aot-parts/ 2>/dev/null
for f in .work/aot-parts/*.json; do [ -f "$f" ] && xz -9 -c "$f" > "$OUT/part-$(basename "$f").xz"; done
cp verified/rocm64-torch27.jsonl "$OUT/" 2>/dev/null
find verified/evidence -type f -newer /tmp/aot_marker -exec sh -c 'xz -9 -c "$1" > "$OUT/evidence-$(basename "$1").xz"' _ {} \;
ls -la "$OUT"
