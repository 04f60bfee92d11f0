#!/usr/bin/env bash
# Device call 4 (H200): after racecheck stalled on one case in 2 of 5 runs (verify.sh), with the image's
# wheel: that case natively 20,000 times plus 40 s of random small shapes (stress_case.py); then racecheck
# on the case alone, instrumenting only the dK/dV kernel and, separately, everything but it, two runs each.
set -u
export PYTHONUNBUFFERED=1
start=$(date +%s)
python3 -m pip install -q --no-deps --no-index --target /tmp/fk_site .devcarry/wheelhouse/cu130-torch211/files/*.whl
D=benchmarks/results/bwd_sm90_single_pass_20261203
PYTHONPATH=/tmp/fk_site timeout 80 python3 $D/stress_case.py 20000 40 > "$OUT/stress.log" 2>&1
echo "stress rc=$? $(( $(date +%s) - start )) s"; cat "$OUT/stress.log" | tail -3
cat > /tmp/one_case.py <<'PY'
import math, torch
from flash_kernels import _cuda  # noqa: F401
ops = torch.ops.flash_kernels_cuda
g = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn(1, 70, 2, 40, device="cuda", dtype=torch.bfloat16, generator=g)
k, v = (torch.randn(1, 75, 1, 40, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
out, lse = ops.fwd(q, k, v, 40 ** -0.5, True, -1, -1, 0.0)
for _ in range(3):
    ops.bwd(torch.randn_like(q), q, k, v, out, lse, 40 ** -0.5, True, -1, -1, 0.0, False)
torch.cuda.synchronize()
print("done")
PY
for mode in only-dkdv all-but-dkdv all; do
  case $mode in
    only-dkdv) f="--kernel-name regex:attn_bwd_dkdv" ;;
    all-but-dkdv) f="--kernel-name-exclude regex:attn_bwd_dkdv" ;;
    all) f="" ;;
  esac
  for run in 1 2; do
    PYTHONPATH=/tmp/fk_site timeout 20 compute-sanitizer --tool racecheck $f python3 /tmp/one_case.py > /tmp/rc.log 2>&1
    echo "racecheck $mode run $run rc=$? $(tail -1 /tmp/rc.log)"
  done
done | tee "$OUT/racecheck_localize.log"
echo "total $(( $(date +%s) - start )) s"
