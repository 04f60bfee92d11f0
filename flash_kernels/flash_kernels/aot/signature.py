"""The signature Triton compiles a kernel for: each argument's type and hints, as a launch specialises it.

A launch makes Triton specialise on the values passed, not only on the constexprs. Compiling ahead of time
(flash_kernels.aot, tools/triton_compile_check.py) has no values, so this states what the launchers pass:
pointers 16-byte aligned, and strides multiples of 16 where the layout is contiguous with a head dim that
is a multiple of 16 (``aligned``); other integers take the generic path. Imports triton only when called.
"""

from __future__ import annotations

TRITON_DTYPE = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
# Pointer arguments by element type; the data pointers take the dtype of the specialisation.
DATA_POINTERS = {
    "Q",
    "K",
    "V",
    "OUT",
    "DO",
    "DK",
    "DV",
    "DQ",
    "PROBS",
    "K_NEW",
    "V_NEW",
    "K_CACHE",
    "V_CACHE",
    "COS",
    "SIN",
}
FP32_POINTERS = {"LSE", "O_PART", "LSE_PART", "DELTA", "ALIBI_SLOPES"}
I32_POINTERS = {"CU_SEQLENS_Q", "CU_SEQLENS_K", "SEQLENS_K", "BATCH_IDX", "LEFTPAD", "BLOCK_TABLE", "CACHE_SEQLENS"}
FLOAT_SCALARS = {"sm_scale", "softcap", "dropout_p", "dropout_scale"}
DUMMY = "*i32"  # what the launchers pass for an absent optional tensor


def arg_type(name: str, dtype: str) -> str:
    """Triton's type of the kernel argument ``name`` for inputs of ``dtype`` (float16, bfloat16, float32)."""
    if name in DATA_POINTERS:
        return "*" + TRITON_DTYPE[dtype]
    if name in FP32_POINTERS:
        return "*fp32"
    if name in I32_POINTERS:
        return "*i32"
    if name == "SEED":
        return "*i64"
    if name.isupper():
        raise ValueError(f"no pointer type known for kernel argument {name}")
    return "fp32" if name in FLOAT_SCALARS else "i32"


def check_constexprs(fn, constexprs: dict) -> None:
    """A kernel that gains or loses a constexpr fails here instead of compiling a variant nobody launches."""
    wanted = {p.name for p in fn.params if p.is_constexpr}
    missing, extra = sorted(wanted - set(constexprs)), sorted(set(constexprs) - wanted)
    if missing or extra:
        raise ValueError(f"{fn.__name__}: constexprs missing {missing}, unknown {extra}")


def ast_source(fn, constexprs: dict, dtype: str, *, aligned: bool = True, pointers: dict | None = None):
    """Triton's ASTSource for ``fn`` (a @triton.jit function) with every constexpr given.

    ``pointers`` overrides an argument's type where a launch passes another (the int32 dummy of an absent
    tensor); ``aligned`` gives the strides the divisibility hint (pointers always have it).
    """
    from triton.compiler import ASTSource

    check_constexprs(fn, constexprs)
    overrides = pointers or {}
    signature, attrs = {}, {}
    for i, param in enumerate(fn.params):
        name = param.name
        if param.is_constexpr:
            signature[name] = "constexpr"
            continue
        signature[name] = overrides.get(name) or arg_type(name, dtype)
        if signature[name].startswith("*") or (aligned and name.startswith("stride_")):
            attrs[(i,)] = [["tt.divisibility", 16]]
    return ASTSource(
        fn=fn, signature=signature, constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()}, attrs=attrs
    )
