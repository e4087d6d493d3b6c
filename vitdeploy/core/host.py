"""Facts of the host this process runs on."""

from __future__ import annotations

import os


def available_cores() -> int:
    """Cores this process may run on (the affinity mask, not the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
