#!/usr/bin/env bash
# Pack the env's triton (3.3.1, cp312) for `flashkit aot rocm64-torch27 --python` on the GPU host, which has
# no network and takes at most 64 MiB per call. Run on the build host from the repository root.
#  - triton: the PyPI wheel, unpacked; libtriton.so's symbol and debug sections stripped (strip
#    --strip-unneeded: 323 MB -> 127 MB, code unchanged) and the CUDA backend's binaries left out (ptxas,
#    cupti, headers: unused for HIP targets). RECORD is rewritten to the files as carried, so the record's
#    triton_record_sha256 names exactly this tree, not the wheel's.
# Triton < 3.4 links each hsaco with an external ld.lld. Debian's lld 19 with the libraries it loads packs to
# 44 MB, too much beside triton; device_aot.sh links with the lld inside the GPU host's triton 3.6 instead
# (ld.lld.py). Compared on 37 specialisations here, both linkers give the same report.
set -euo pipefail
dest=${1:-.devcarry/rocmaot}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 -d "$tmp" triton==3.3.1
whl=$(ls "$tmp"/triton-3.3.1-*.whl); sha256sum "$whl"
mkdir "$tmp/site"; (cd "$tmp/site" && unzip -q "$whl")
t=$tmp/site/triton
strip --strip-unneeded "$t/_C/libtriton.so"
rm -rf "$t/backends/nvidia/bin" "$t/backends/nvidia/lib/cupti" "$t/backends/nvidia/include"
python3 - "$tmp/site" <<'PY'
import base64, hashlib, pathlib, sys
site = pathlib.Path(sys.argv[1])
rec = next(site.glob("triton-*.dist-info")) / "RECORD"
rows = []
for line in rec.read_text().splitlines():
    name = line.rsplit(",", 2)[0]
    p = site / name
    if name.endswith("RECORD"):
        rows.append(f"{name},,")
    elif p.is_file():
        digest = base64.urlsafe_b64encode(hashlib.sha256(p.read_bytes()).digest()).rstrip(b"=").decode()
        rows.append(f"{name},sha256={digest},{p.stat().st_size}")
rec.write_text("\n".join(rows) + "\n")
print(len(rows), "files in RECORD")
PY
mkdir -p "$dest"; rm -f "$dest"/*.tar.xz
tar -C "$tmp/site" -cf - . | xz -9 -T2 > "$dest/triton-3.3.1-site.tar.xz"
ls -la "$dest"
