"""Run the shipped kernel test suite: ``python -m flash_kernels.selftest [options] [pytest args]``.

  --tier cpu   Triton's interpreter on the CPU (TRITON_INTERPRET=1, set here before triton is
               imported), small fp16/fp32 shapes: tests marked ``gpu`` are deselected.
  --tier gpu   every test on the GPU (the default).
  --tier all   cpu, then gpu, each in its own process (a JUnit path gets .cpu/.gpu inserted).
  --backend    triton | cuda | auto, or a comma list (default: triton on cpu, triton,cuda on gpu).

Other arguments go to pytest unchanged (e.g. ``-n 8``, ``-x``, ``-k varlen``, ``--junitxml=r.xml``).
Exit status is pytest's (for ``all``, the first non-zero one), or 6 when the gpu tier cannot
run because no GPU is visible (a tier that did not run is not a pass). Each run prints one line
``FLASH_KERNELS_SELFTEST tier=... passed=N failed=N skipped=N ...`` for machines to read.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

TIERS = ("cpu", "gpu", "all")
EXIT_NO_GPU = 6


def _with_suffix(args: list[str], tier: str) -> list[str]:
    """Give each tier of an ``all`` run its own JUnit file."""
    out = []
    for i, arg in enumerate(args):
        if arg.startswith("--junitxml=") or arg.startswith("--junit-xml="):
            flag, path = arg.split("=", 1)
            root, ext = os.path.splitext(path)
            arg = f"{flag}={root}.{tier}{ext or '.xml'}"
        elif i > 0 and args[i - 1] in ("--junitxml", "--junit-xml"):
            root, ext = os.path.splitext(arg)
            arg = f"{root}.{tier}{ext or '.xml'}"
        out.append(arg)
    return out


def run_tier(tier: str, backend: str | None, pytest_args: list[str]) -> int:
    env = dict(os.environ)
    cmd = [sys.executable, "-m", "pytest", "--pyargs", "flash_kernels.tests",
           "-p", "no:cacheprovider", "-p", "flash_kernels.tests.report", "-ra"]
    if tier == "cpu":
        env["TRITON_INTERPRET"] = "1"
        cmd += ["-m", "not gpu"]
    else:
        env.pop("TRITON_INTERPRET", None)
        import torch  # only here: the cpu tier's process must import triton after the env is set

        if not torch.cuda.is_available():
            print(f"flash_kernels.selftest: tier=gpu not run: torch {torch.__version__} sees no "
                  "CUDA/ROCm GPU (use --tier cpu on a machine without one)", flush=True)
            print(f"FLASH_KERNELS_SELFTEST tier=gpu not_run=no-gpu exit={EXIT_NO_GPU}", flush=True)
            return EXIT_NO_GPU
    if backend:
        env["FLASH_KERNELS_TEST_BACKENDS"] = backend
    print(f"flash_kernels.selftest: tier={tier} backend={backend or 'default'}: "
          f"{' '.join(cmd + pytest_args)}", flush=True)
    return subprocess.call(cmd + pytest_args, env=env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flash_kernels.selftest", description=__doc__.split("\n\n")[0],
        epilog="Unrecognised arguments are passed to pytest.")
    parser.add_argument("--tier", choices=TIERS, default="gpu")
    parser.add_argument("--backend", default=None,
                        help="triton, cuda, auto, or a comma list of them")
    args, pytest_args = parser.parse_known_args(argv)
    if args.tier != "all":
        return run_tier(args.tier, args.backend, pytest_args)
    codes = [run_tier(t, args.backend, _with_suffix(pytest_args, t)) for t in ("cpu", "gpu")]
    return next((c for c in codes if c != 0), 0)


if __name__ == "__main__":
    sys.exit(main())
