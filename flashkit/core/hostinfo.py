"""The one probe the planner's callers need: the build host's memory, for compile job sizing.

Kept apart from flashkit.plan.render so rendering stays pure; the CLI (or a build) probes once and passes
the number in. Whole GiB, rounded down, so that kernel-reserved kilobytes do not change the bytes.
"""

from __future__ import annotations

import os
from pathlib import Path


def mem_gib(meminfo: Path = Path("/proc/meminfo")) -> int:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return max(1, int(line.split()[1]) // (1024 * 1024))
    except (OSError, ValueError, IndexError):
        pass
    # Not Linux (or no procfs): ask the C library.
    return max(1, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024**3))
