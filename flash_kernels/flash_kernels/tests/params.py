"""Case marking and the forced-backend skip shared by the numerics test modules."""

from __future__ import annotations

import pytest

from flash_kernels.errors import BackendUnavailableError

GPU = pytest.mark.gpu


def maybe_gpu(*params, cpu: bool, id: str | None = None):
    """A parametrize case: in the CPU tier when ``cpu``, else marked ``gpu``."""
    return pytest.param(*params, marks=() if cpu else GPU, id=id)


def call(fn, *args, **kwargs):
    """Run fn; a forced backend that cannot take this call is a skip with its reason."""
    try:
        return fn(*args, **kwargs)
    except BackendUnavailableError as e:
        pytest.skip(str(e))
