"""What a compiled specialisation uses, from the compiler's own output: registers or VGPRs, spills,
shared memory or LDS."""

from __future__ import annotations

import re

HIP_FIELDS = (
    "vgpr_count",
    "agpr_count",
    "sgpr_count",
    "vgpr_spill_count",
    "sgpr_spill_count",
    "group_segment_fixed_size",
    "private_segment_fixed_size",
)


def cuda_resources(ptxas_log: str, kernel: str, shared: int) -> dict:
    """The entry function's lines of a ptxas -v log (device functions have their own)."""
    start = ptxas_log.find(f"Function properties for {kernel}\n")
    entry_log = ptxas_log[start:] if start >= 0 else ""
    regs = re.search(r"Used (\d+) registers", entry_log)
    frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", entry_log)
    if not regs or not frame:
        raise ValueError(f"no register/spill lines in the ptxas log: {ptxas_log[-300:]!r}")
    return {
        "registers": int(regs.group(1)),
        "stack_frame_bytes": int(frame.group(1)),
        "spill_store_bytes": int(frame.group(2)),
        "spill_load_bytes": int(frame.group(3)),
        "shared_bytes": shared,
    }


def hip_resources(amdgcn: str, shared: int) -> dict:
    """The kernel's entry of the AMDGPU metadata block, plus Triton's dynamic LDS."""
    start = amdgcn.find(".amdgpu_metadata")
    if start < 0:
        raise ValueError("no .amdgpu_metadata block in the AMDGCN")
    found = dict(re.findall(r"^\s*-?\s*\.(\w+):\s+(\d+)\s*$", amdgcn[start:], flags=re.MULTILINE))
    missing = [f for f in HIP_FIELDS if f not in found and f != "agpr_count"]
    if missing:
        raise ValueError(f"AMDGPU metadata lacks {missing}")
    res = {f: int(found.get(f, 0)) for f in HIP_FIELDS}
    res["shared_bytes"] = shared  # dynamic LDS Triton requests at launch
    res["lds_bytes"] = shared + res["group_segment_fixed_size"]
    return res
