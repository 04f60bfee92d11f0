#!/usr/bin/env bash
# Dev iteration on the GPU host: install the carried wheel, probe the sm90 forward, numerics, bench.
set -u
W=$(ls .whl/dev/*.whl | head -1)
python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/fk_site "$W" || exit 1
export PYTHONPATH=/tmp/fk_site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
timeout 120 python3 .whl/sm90_probe.py 2>&1 | tee $OUT/probe.log | tail -25
for s in ${STEPS:-numerics bench}; do case $s in
 numerics) for ov in 0 1; do FLASH_KERNELS_SM90_OVERLAP=$ov timeout 240 python3 flash_kernels/tools/cuda_numerics_check.py ${NUM_ARGS:---quick} --json $OUT/numerics$ov.json > $OUT/numerics$ov.log 2>&1; echo "numerics overlap=$ov rc=$?"; grep -c FAIL $OUT/numerics$ov.log; tail -1 $OUT/numerics$ov.log; done;;
 bench) timeout 200 python3 flash_kernels/tools/cuda_bench.py --skip-triton ${BENCH_ARGS:-} --json $OUT/bench.json > $OUT/bench.log 2>&1; echo "bench rc=$?"
   python3 - <<'P'
import json,os
for r in json.load(open(os.environ["OUT"]+"/bench.json"))["rows"]:
    print(r["seqlen"], "causal" if r["causal"] else "full", "hd", r["head_dim"], "sm90 %.0f sm80 %.0f flash %.0f cudnn %.0f | vs flash %.3f | fwd_bwd vs flash %.3f" % (r["cuda_fwd"], r.get("cuda_sm80_fwd", 0), r.get("sdpa_flash_fwd", 0), r.get("sdpa_cudnn_fwd", 0), r.get("cuda_fwd_vs_sdpa_flash", 0), r.get("cuda_fwd_bwd_vs_sdpa_flash", 0)))
P
 ;;
esac; done
