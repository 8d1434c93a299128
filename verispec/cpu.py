"""What the CPU offers this process: the cores it may run on and whether bf16 runs natively.

No torch here: the llama.cpp backend sizes its threads with ``cpu_threads`` and must not
load torch to do so.
"""

from __future__ import annotations

import os


def cpu_threads() -> int:
    """The cores this process may run on (affinity-aware), the thread count a backend should use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def cpu_has_native_bf16() -> bool:
    """True on x86 CPUs with avx512_bf16 or AMX-BF16, where bf16 matmuls run natively."""
    try:
        with open("/proc/cpuinfo") as handle:
            flags = next((line for line in handle if line.startswith("flags")), "")
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags
