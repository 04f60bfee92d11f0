#!/usr/bin/env bash
# doctor on the GPU host, in the environment the pinned requirements make (see .ci/gpu-host).
set -u
V=$(mktemp -d)/v; python3 -m venv $V
site=$($V/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' > $site/zz-host-site.pth
(cd .whl/wheelhouse/cu130-torch211 && $V/bin/python -m pip install -q --no-index --find-links files --find-links ../../extra --require-hashes -r requirements.txt) || echo "requirements install failed"
$V/bin/python -m pip install -q --no-index --find-links .whl/extra pyelftools abi3info
PYTHONPATH=$PWD $V/bin/python -m flashkit.cli doctor > $OUT/doctor_h200.txt 2>&1; echo "doctor rc=$?"
PYTHONPATH=$PWD $V/bin/python -m flashkit.cli doctor --json > $OUT/doctor_h200.json 2>$OUT/doctor_h200.err; echo "doctor --json rc=$?"
head -60 $OUT/doctor_h200.txt
