#!/usr/bin/env bash
# Device call 2 of issue 19: numerics against float32 and compute-sanitizer memcheck + racecheck of the
# stable-ABI wheel (flash_kernels/tools/device_check.sh), from the repository root with .devcarry/ carried.
set -u
W=$(find .devcarry/wheelhouse/cu130-torch211 -name "*stable*.whl" | head -1)
sha256sum "$W"
OUT="$OUT/checks" bash flash_kernels/tools/device_check.sh "$W" numerics sanitize
