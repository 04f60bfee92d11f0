"""The JSON report: one entry per specialisation, a summary per target, written whole or not at all."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile

from ..targets import Target
from .specs import Spec

REPORT_VERSION = 1


def summarize(target: Target, entries: list[dict]) -> dict:
    """Counts and maxima of one target; spills are those to memory (AMD's SGPR spills go to VGPR
    lanes, counted apart); the shared-memory model is checked against what the compiler reports."""
    counts = {s: sum(e["status"] == s for e in entries) for s in ("compiled", "failed", "pruned")}
    compiled = [e for e in entries if "resources" in e]
    res = [e["resources"] for e in compiled]
    extra = {}
    if target.is_hip:
        shared = [r["lds_bytes"] for r in res]
        regs = {"max_vgprs": max((r["vgpr_count"] for r in res), default=0)}
        spills = sum(r["vgpr_spill_count"] > 0 for r in res)
        extra["with_sgpr_spills"] = sum(r["sgpr_spill_count"] > 0 for r in res)
    else:
        shared = [r["shared_bytes"] for r in res]
        regs = {"max_registers": max((r["registers"] for r in res), default=0)}
        spills = sum(bool(r["spill_store_bytes"] or r["spill_load_bytes"]) for r in res)
    under = [
        e["resources"]["shared_bytes"] - e["shared_estimate"]
        for e in compiled
        if e["shared_estimate"] is not None and e["resources"]["shared_bytes"] > e["shared_estimate"]
    ]
    return {
        **counts,
        **regs,
        **extra,
        "specialisations": len(entries),
        "max_shared_bytes": max(shared, default=0),
        "with_spills": spills,
        "shared_limit_bytes": target.shared_bytes,
        "shared_estimate_below_actual": len(under),
        "shared_estimate_max_shortfall_bytes": max(under, default=0),
    }


def entry(spec: Spec, target: Target, result: dict) -> dict:
    e = {
        "id": spec.key,
        "kernel": spec.kernel,
        "role": spec.role,
        "target": target.name,
        "dtype": spec.dtype,
        "head_dim": spec.head_dim,
        "constexprs": dict(spec.constexprs),
        "pointers": dict(spec.pointers),
        "num_warps": spec.num_warps,
        "num_stages": spec.num_stages,
        "sources": list(spec.sources),
        "shared_estimate": spec.shared_estimate,
    }
    if spec.pruned:
        e.update(status="pruned", reason=spec.pruned)
    else:
        e.update(result)
    return e


def write_report(path: str, report: dict) -> None:
    """Sorted keys, fixed indentation, written whole or not at all (temp file + rename)."""
    text = json.dumps(report, sort_keys=True, indent=1) + "\n"
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".aot-", suffix=".json", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
