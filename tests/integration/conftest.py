"""Real-docker tests: skipped, with the reason, when no engine answers."""

from __future__ import annotations

import pytest

from flashkit.engine import engine_available, ensure_engine


@pytest.fixture(scope="session")
def engine():
    ok, why = engine_available()
    if not ok:
        pytest.skip(why)
    return ensure_engine(start=False)
