"""Where uv is found: on PATH, else the binary the ``uv`` PyPI package (a dependency of flashkit) ships."""

from __future__ import annotations

import shutil

from flashkit.core.errors import ToolError


def uv_binary() -> str:
    found = shutil.which("uv")
    if found:
        return found
    try:
        from uv import find_uv_bin  # the `uv` PyPI package ships the binary beside this helper
    except ImportError:
        find_uv_bin = None
    if find_uv_bin is not None:
        try:
            return find_uv_bin()
        except FileNotFoundError:
            pass
    raise ToolError("uv is not installed: `pip install uv` (it is a dependency of flashkit)")
