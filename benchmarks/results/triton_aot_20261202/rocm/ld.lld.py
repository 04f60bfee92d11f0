#!/usr/bin/env python3
"""An ld.lld for triton 3.3.1's HIP backend on a host that has no LLVM linker: the same link (`-flavor gnu
-shared IN -o OUT`) done by the lld that triton >= 3.4 carries inside libtriton (`amd.link_hsaco`). Run by an
interpreter that has such a triton (device_aot.sh writes the shell wrapper that names it). Any other command
line is refused."""
import sys

args = sys.argv[1:]
if args == ["--version"]:
    import triton

    print(f"LLD built into triton {triton.__version__} (triton._C.libtriton.amd.link_hsaco)")
    sys.exit(0)
if len(args) != 6 or args[:3] != ["-flavor", "gnu", "-shared"] or args[4] != "-o":
    sys.exit(f"ld.lld.py: unsupported command line {args!r}")
from triton._C.libtriton import amd

amd.link_hsaco(args[3], args[5])
