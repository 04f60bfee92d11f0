"""Stopping a child process flashkit started: SIGTERM first, so it can clean up, then SIGKILL."""

from __future__ import annotations

import contextlib
import subprocess


def stop(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM ``proc``, then SIGKILL if it is still there after ``grace_s``; reaps it either way."""
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
