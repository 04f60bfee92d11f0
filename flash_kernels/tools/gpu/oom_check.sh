#!/usr/bin/env bash
# Out-of-memory behaviour on a GPU host, in one call (run from the repository root; about 5-8 minutes on an H100):
#   1. build: the CUDA wheel from this checkout's sources (pip wheel --no-build-isolation, MAX_JOBS=16,
#      FLASH_KERNELS_CUDA_ARCHS=${ARCHS:-9.0a}: the GPU's own code only, to save build time), installed with
#      --target into $FK (default /tmp/fk_oom);
#   2. probe: trials of flash_kernels/tests/oom_probe.py, each in its own process, one after another (each fills
#      the GPU): the issue's three dense shapes (backend auto) with 0/4/64 MB left cold (the GPU filled before any
#      kernel ran), 0 MB warm (every call ran once first), 0 MB cold after flash_kernels.prepare_kernels() (the
#      CUDA path's kernels loaded before the fill, no call made) and 4 MB cold under CUDA_MODULE_LOADING=EAGER
#      (every module loaded at start-up): these tell lazy kernel loading apart; every entry point on cuda
#      (cold, warm, preloaded) and on triton (cold, warm). Per trial: the outcomes under pressure (ok / torch.OutOfMemoryError / other), or the signal and the
#      call it died in (the probe's progress file); the first crashing trial runs again under gdb for a native
#      backtrace when gdb is there;
#   3. suite_cuda: the package's GPU suite on the CUDA backend (-n 8), test_oom and test_concurrency included and
#      listed apart; new_triton: those two on the Triton backend. suite_triton (not in the default set: it
#      does not fit the same call on a fresh machine, whose Triton cache is empty) is the whole suite on Triton.
# Logs under $OUT (default ./oom_logs); a compact summary at the end (also $OUT/summary.txt).
#   usage: flash_kernels/tools/gpu/oom_check.sh [steps...]
#   steps: build probe suite_cuda new_triton (the default, in that order), suite_triton, host_path (the host time
#   per call, benchmarks/bench_host_path.py, to compare with main's wheel on the same machine)
set -u
STEPS=${*:-build probe suite_cuda new_triton}
OUT=${OUT:-oom_logs}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
FK=${FK:-/tmp/fk_oom}
export PYTHONUNBUFFERED=1
SUMMARY="$OUT/summary.txt"; : > "$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
# The whole run stays within BUDGET seconds (default 560: a 600 s call with room to fetch the logs): each
# step's limit is its own or what is left, whichever is less, and a step with under 20 s left is skipped.
DEADLINE=$((SECONDS + ${BUDGET:-560}))
limit() { local left=$((DEADLINE - SECONDS - 5)); echo $(( $1 < left ? $1 : left )); }

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  echo "CUDA_MODULE_LOADING=${CUDA_MODULE_LOADING:-unset}"; command -v gdb || echo "no gdb"; } > "$OUT/host.txt" 2>&1
say "host: $(head -1 "$OUT/host.txt")"

build() {
  rm -rf "$OUT/wheel" "$FK"
  ( cd flash_kernels && FLASH_KERNELS_BUILD_CUDA=1 FLASH_KERNELS_CUDA_ARCHS=${ARCHS:-9.0a} MAX_JOBS=${MAX_JOBS:-16} \
      timeout "$(limit "${BUILD_TIMEOUT:-170}")" python3 -m pip wheel --no-build-isolation --no-deps -w "$OUT/wheel" . ) \
      > "$OUT/build.log" 2>&1
  local rc=$?
  local whl; whl=$(ls "$OUT"/wheel/flash_kernels-*.whl 2>/dev/null | head -1)
  if [ $rc -ne 0 ] || [ -z "$whl" ]; then say "build FAILED rc=$rc (see build.log)"; tail -20 "$OUT/build.log"; return 1; fi
  python3 -m pip install -q --no-deps --no-index --target "$FK" "$whl" >> "$OUT/build.log" 2>&1 || { say "install FAILED"; return 1; }
  say "build ok: $(basename "$whl") ($(grep -o 'torch ABI: [a-z-]*' "$OUT/build.log" | head -1))"
}

# trial NAME ARGS...: one probe process; prints one summary line.
trial() {
  local name=$1; shift
  local progress="$OUT/probe/$name.progress" report="$OUT/probe/$name.json"
  rm -f "$progress" "$report"
  local secs; secs=$(limit "${TRIAL_TIMEOUT:-60}")
  if [ "$secs" -lt 20 ]; then say "  $name: skipped (the run's time budget is spent)"; return; fi
  PYTHONPATH=$FK timeout "$secs" python3 -X faulthandler -m flash_kernels.tests.oom_probe \
      --json "$report" --progress "$progress" "$@" > "$OUT/probe/$name.log" 2>&1
  local rc=$? last; last=$(tail -1 "$progress" 2>/dev/null)
  local verdict
  if [ $rc -eq 124 ]; then
    verdict="TIMEOUT after $secs s during '$last'"
  elif [ $rc -ge 128 ]; then
    verdict="CRASH: signal $((rc - 128)) during '$last'"
    [ -z "${FIRST_CRASH:-}" ] && FIRST_CRASH="$name|$*"
  else
    verdict=$(python3 - "$report" "$rc" <<'EOF'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"NO REPORT rc={sys.argv[2]} ({e})"); sys.exit()
counts = {}
for e in r["entries"].values():
    kind = e["pressure"] if e["pressure"] != "error" else "OTHER"
    counts[kind] = counts.get(kind, 0) + 1
bad = [f"{n}: {e['pressure_detail'] or e['after_free_detail'] or 'results differ'}"[:220]
       for n, e in r["entries"].items() if not e["meets_rules"]]
print(f"free {r['free_mb_after_fill']} MB; under pressure " + " ".join(f"{k}={v}" for k, v in sorted(counts.items()))
      + f"; after free all ok+equal: {all(e['after_free'] == 'ok' and e['after_free_repeat_equal'] for e in r['entries'].values())}"
      + f"; meets rules: {r['meets_rules']}" + "".join(f"\n      {b}" for b in bad))
EOF
)
  fi
  say "  $name: $verdict"
}

probe() {
  mkdir -p "$OUT/probe"
  FIRST_CRASH=
  say "probe (each line one process; pressure outcomes ok / oom (torch.OutOfMemoryError) / OTHER):"
  for mb in 0 4 64; do trial "issue-cold-${mb}MB" --shapes issue --backend auto --free-mb $mb; done
  trial "issue-warm-0MB" --shapes issue --backend auto --free-mb 0 --warm
  trial "issue-cold-0MB-preload" --shapes issue --backend auto --free-mb 0 --preload
  CUDA_MODULE_LOADING=EAGER trial "issue-cold-4MB-EAGER" --shapes issue --backend auto --free-mb 4
  for mb in 0 4; do trial "entries-cuda-cold-${mb}MB" --backend cuda --free-mb $mb; done
  trial "entries-cuda-warm-0MB" --backend cuda --free-mb 0 --warm
  trial "entries-cuda-cold-0MB-preload" --backend cuda --free-mb 0 --preload
  # Triton compiles each kernel at its first call (an empty cache on a fresh machine): more time.
  TRIAL_TIMEOUT=${TRITON_TRIAL_TIMEOUT:-120} trial "entries-triton-cold-4MB" --backend triton --free-mb 4
  TRIAL_TIMEOUT=${TRITON_TRIAL_TIMEOUT:-120} trial "entries-triton-warm-0MB" --backend triton --free-mb 0 --warm
  if [ -n "$FIRST_CRASH" ] && command -v gdb > /dev/null; then
    local name=${FIRST_CRASH%%|*} args=${FIRST_CRASH#*|}
    # shellcheck disable=SC2086  # the trial's arguments, split as they were passed
    PYTHONPATH=$FK timeout "$(limit 90)" gdb -q -batch -ex run -ex bt -ex "info sharedlibrary" --args python3 \
        -m flash_kernels.tests.oom_probe $args > "$OUT/probe/$name.gdb.txt" 2>&1
    say "  gdb backtrace of $name: probe/$name.gdb.txt"; grep -m 12 '^#' "$OUT/probe/$name.gdb.txt" | tee -a "$SUMMARY"
  fi
}

# suite_run NAME BACKEND WORKERS TIMEOUT [pytest args]: the package's GPU suite on one backend; the outcomes of
# test_oom and test_concurrency are listed apart.
suite_run() {
  local name=$1 backend=$2 workers=$3 limit=$4; shift 4
  local log="$OUT/$name.log"
  limit=$(limit "$limit")
  if [ "$limit" -lt 20 ]; then say "$name: skipped (the run's time budget is spent)"; return; fi
  PYTHONPATH=$FK timeout "$limit" python3 -m flash_kernels.selftest --tier gpu --backend "$backend" -q -rA \
      -n "$workers" "$@" > "$log" 2>&1
  say "$name ($backend, -n $workers) rc=$?: $(grep -a 'FLASH_KERNELS_SELFTEST' "$log" | tail -1)"
  grep -a -E '^(PASSED|FAILED|ERROR|SKIPPED).*(test_oom|test_concurrency)' "$log" | cut -c1-200 | sed 's/^/  new: /' \
      | tee -a "$SUMMARY"
  grep -a -E '^(FAILED|ERROR)' "$log" | grep -v -E 'test_oom|test_concurrency' | head -8 | cut -c1-300 | tee -a "$SUMMARY"
}

for step in $STEPS; do
  case $step in
    build) build || break ;;
    probe) probe ;;
    suite_cuda) suite_run suite_cuda cuda 8 "${SUITE_TIMEOUT:-110}" ;;
    new_triton) suite_run new_triton triton 4 "${NEW_TIMEOUT:-120}" -k "test_oom or test_concurrency" ;;
    suite_triton) suite_run suite_triton triton 16 "${TRITON_SUITE_TIMEOUT:-400}" ;;
    host_path) PYTHONPATH=$FK timeout "$(limit "${HOST_PATH_TIMEOUT:-240}")" python3 benchmarks/bench_host_path.py --repeats 5 \
                 --out "$OUT/host_path.json" > "$OUT/host_path.log" 2>&1
               say "host_path rc=$? (host us per call by layer, SDPA in the same run: benchmarks/bench_host_path.py)"
               tail -14 "$OUT/host_path.log" | tee -a "$SUMMARY" ;;
    *) say "unknown step $step (build probe suite_cuda new_triton suite_triton host_path)" ;;
  esac
done
say "elapsed ${SECONDS} s"
echo "===== summary ($SUMMARY)"; cat "$SUMMARY"
