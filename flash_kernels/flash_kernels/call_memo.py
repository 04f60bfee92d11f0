"""Host checks once per call signature.

A decode loop calls the same function thousands of times with tensors that differ only in their
data. The checks and the backend choice depend on what a tensor looks like (type, shape, strides,
dtype, device, 16-byte alignment) and on the options, never on its values, so their result (the
"plan": scale, window, backend, ...) is kept per signature and a repeated call goes straight to
the kernels. Validation stays exactly as strict: a call whose signature was never seen runs every
check, and a call that failed a check is not remembered.

A call is not keyed (it is checked every time) when a tensor is a subclass (its type may carry
behaviour the checks must see) or an option is not a plain bool/int/float/str/None (a tensor or a
numpy scalar as an option, a list as a window): its value could change without its identity.
"""

from __future__ import annotations

import os
from typing import Callable, Optional, TypeVar

import torch

Plan = TypeVar("Plan")

# Enough for every layer shape and batch size a serving process sees. Past it the memo starts
# over: simpler than evicting one entry, and safe when threads share it (no iteration).
LIMIT = 4096
_plans: dict = {}

_PLAIN = (bool, int, float, str, type(None))


def _tensor_part(t) -> Optional[tuple]:
    if t is None:
        return ()
    if type(t) is not torch.Tensor:
        return None
    # The CUDA path takes only 16-byte aligned operands: alignment decides the backend too.
    return (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0)


def _option_part(value) -> bool:
    if type(value) in _PLAIN:
        return True
    return type(value) is tuple and all(type(v) in _PLAIN for v in value)


def signature(entry: str, tensors: tuple, options: tuple) -> Optional[tuple]:
    """The key of one call, or None when the call must be checked every time."""
    parts = [entry, os.environ.get("FLASH_KERNELS_BACKEND"), os.environ.get("TRITON_INTERPRET")]
    for t in tensors:
        part = _tensor_part(t)
        if part is None:
            return None
        parts.append(part)
    for value in options:
        if not _option_part(value):
            return None
    parts.append(options)
    return tuple(parts)


def plan_for(key: Optional[tuple], build: Callable[[], Plan]) -> Plan:
    """``build()``'s plan for this signature, built (every check run) only the first time."""
    if key is None:
        return build()
    plan = _plans.get(key)
    if plan is None:
        plan = build()  # a failed check raises here, before anything is remembered
        if len(_plans) >= LIMIT:
            _plans.clear()
        _plans[key] = plan
    return plan


def clear() -> None:
    """Forget every plan (tests; or after swapping the CUDA extension in a running process)."""
    _plans.clear()
