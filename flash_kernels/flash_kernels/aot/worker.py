"""Compiling the specialisations: one per call in a worker, a pool of them per target, each with its
verdict (compiled with its resources, or failed with the compiler's message)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import importlib
import multiprocessing
import os
import shutil
import sys
import tempfile
import time

from ..targets import Target
from .ptxas import ptxas_rerun, ptxas_tap
from .report import entry
from .resources import cuda_resources, hip_resources
from .signature import ast_source
from .specs import KERNELS, Spec

ERROR_CHARS = 1500
THROWAWAY_CACHE = "FLASH_KERNELS_AOT_THROWAWAY_CACHE"


def spec_source(spec: Spec):
    """Triton's ASTSource for the spec: signature as a launch specialises it (signature.py)."""
    fn = getattr(importlib.import_module(f"..{KERNELS[spec.kernel]}", __package__), spec.kernel)
    return ast_source(
        fn, dict(spec.constexprs), spec.dtype, aligned=spec.head_dim % 16 == 0, pointers=dict(spec.pointers)
    )


def compile_spec(spec: Spec, target: Target) -> dict:
    """Compile one specialisation; its result fields (status, resources or error)."""
    import triton

    options = {k: v for k, v in (("num_warps", spec.num_warps), ("num_stages", spec.num_stages)) if v is not None}
    tap = contextlib.nullcontext(None) if target.is_hip else ptxas_tap()
    try:
        with tap as log:
            compiled = triton.compile(spec_source(spec), target=target.triton_target(), options=options)
        md = compiled.metadata
        if target.is_hip:
            res = hip_resources(compiled.asm["amdgcn"], md.shared)
            used = res["lds_bytes"]
        else:
            text = log.logs[-1] if log.logs else ptxas_rerun(compiled.asm["ptx"], target.arch)
            res = cuda_resources(text, spec.kernel, md.shared)
            used = md.shared
    except Exception as e:  # every specialisation gets its verdict; the run goes on
        return {"status": "failed", "error": _error_text(e)}
    out = {"status": "compiled", "num_warps": md.num_warps, "num_stages": md.num_stages, "resources": res}
    if used > target.shared_bytes:
        out.update(
            status="failed",
            error=f"needs {used} B of shared memory (LDS); {target.name} has "
            f"{target.shared_bytes} B: the launch would fail",
        )
    return out


def _error_text(e: BaseException) -> str:
    """The root cause, trimmed to its end (where compilers put the message)."""
    while e.__cause__ is not None:
        e = e.__cause__
    text = f"{type(e).__name__}: {e}".strip()
    return text if len(text) <= ERROR_CHARS else "..." + text[-ERROR_CHARS:]


def _work(item):
    spec, target = item
    start = time.monotonic()
    if os.environ.get(THROWAWAY_CACHE) == "1":
        # Each specialisation is compiled once: its cache entry is of no further use, and a full
        # run would leave about a gigabyte. A directory per process keeps workers apart.
        base = os.environ["TRITON_CACHE_DIR"]
        own = os.path.join(base, f"worker-{os.getpid()}")
        os.environ["TRITON_CACHE_DIR"] = own
        try:
            result = compile_spec(spec, target)
        finally:
            shutil.rmtree(own, ignore_errors=True)
            os.environ["TRITON_CACHE_DIR"] = base
    else:
        result = compile_spec(spec, target)
    return result, time.monotonic() - start


def compile_all(target: Target, specs: list[Spec], jobs: int, timings: bool) -> list[dict]:
    todo = [s for s in specs if not s.pruned]
    results: dict[str, dict] = {}
    pool = None
    if jobs > 1 and len(todo) > 1:
        # fork: the workers inherit the imported kernels and the environment set up here.
        pool = concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork"))
    try:
        runs = pool.map(_work, [(s, target) for s in todo]) if pool else map(_work, [(s, target) for s in todo])
        for n, (spec, (result, seconds)) in enumerate(zip(todo, runs), 1):
            if timings:
                result = dict(result, seconds=round(seconds, 2))
            results[spec.key] = result
            flag = "ok  " if result["status"] == "compiled" else "FAIL"
            print(f"[{target.name} {n}/{len(todo)}] {flag} {spec.key} ({seconds:.1f}s)", file=sys.stderr, flush=True)
            if result["status"] == "failed":
                print(f"    {result['error'][-400:]}", file=sys.stderr, flush=True)
    finally:
        if pool:
            pool.shutdown()
    return [entry(s, target, results.get(s.key, {})) for s in specs]


@contextlib.contextmanager
def cache_dir(path: str | None):
    """Compile from scratch into a throw-away Triton cache unless one is named."""
    tmp = None if path else tempfile.mkdtemp(prefix="flash-kernels-aot-cache-")
    saved = {k: os.environ.get(k) for k in ("TRITON_CACHE_DIR", THROWAWAY_CACHE)}
    os.environ["TRITON_CACHE_DIR"] = path or tmp
    os.environ[THROWAWAY_CACHE] = "0" if path else "1"
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
