#!/usr/bin/env bash
# Compile csrc/ops.cpp as the stable-ABI build does (no GPU, no torch install: headers only) and classify
# the object's undefined symbols. Fails if any is a libtorch/c10/ATen C++ symbol.
#
#   tools/gpu/stable_abi_check.sh TORCH_INCLUDE [CUDA_INCLUDE] [TARGET_HEX]
#     TORCH_INCLUDE  torch/include of the torch to compile against, e.g. from an unzipped wheel:
#                    unzip torch-2.11.0-*.whl 'torch/include/*' -d /tmp/t  ->  /tmp/t/torch/include
#     CUDA_INCLUDE   default /usr/local/cuda/include (cuda_runtime_api.h, cuda_fp16.h, cuda_bf16.h)
#     TARGET_HEX     TORCH_TARGET_VERSION, default 0x020a000000000000 (torch 2.10)
# One g++ process, no parallelism. Run from flash_kernels/. Writes to $OUT_DIR (default a temp dir).
set -euo pipefail
torch_inc=${1:?usage: tools/gpu/stable_abi_check.sh TORCH_INCLUDE [CUDA_INCLUDE] [TARGET_HEX]}
cuda_inc=${2:-/usr/local/cuda/include}
target=${3:-0x020a000000000000}
out=${OUT_DIR:-$(mktemp -d)}
mkdir -p "$out"
obj="$out/ops_stable.o"

cmd=(g++ -std=c++17 -O3 -fPIC -c -DFLASH_KERNELS_STABLE_ABI=1 "-DTORCH_TARGET_VERSION=$target"
     -DFLASH_KERNELS_SM90A=1 -D_GLIBCXX_USE_CXX11_ABI=1 -I"$torch_inc" -I"$cuda_inc" -Icsrc csrc/ops.cpp -o "$obj")
echo "+ ${cmd[*]}"
"${cmd[@]}"

nm -C -u "$obj" | awk '{ $1=""; sub(/^ /, ""); print }' > "$out/undefined.txt"
torch_cxx=$(grep -E '^(c10|at|torch|caffe2)::|[ <(,](c10|at|torch|caffe2)::' "$out/undefined.txt" || true)
shim=$(grep -cE '^(aoti_torch_|torch_)' "$out/undefined.txt" || true)
cuda=$(grep -cE '^cuda' "$out/undefined.txt" || true)
ours=$(grep -cE 'flash_kernels::' "$out/undefined.txt" || true)
total=$(wc -l < "$out/undefined.txt")
echo "undefined symbols in $obj: $total"
echo "  torch C shim (aoti_torch_*, torch_*): $shim"
echo "  CUDA runtime: $cuda"
echo "  flash_kernels launchers (defined by the .cu objects): $ours"
echo "  libstdc++/libc/other: $((total - shim - cuda - ours))"
if [ -n "$torch_cxx" ]; then
  echo "FAIL: libtorch/c10/ATen C++ symbols:"
  echo "$torch_cxx"
  exit 1
fi
echo "OK: no libtorch/c10/ATen C++ symbol"
echo "shim symbols used:"
grep -E '^(aoti_torch_|torch_)' "$out/undefined.txt" | sort | tr '\n' ' '
echo
