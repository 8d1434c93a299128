"""What the CPU offers this process: the cores it may run on, whether bf16 runs natively, AMX.

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


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU's feature flags as ``cpuinfo`` lists them (empty where there is none)."""
    try:
        with open(cpuinfo) as handle:
            flags = next((line for line in handle if line.startswith("flags")), "")
    except OSError:
        return frozenset()
    return frozenset(flags.partition(":")[2].split())


def cpu_has_native_bf16(flags: frozenset[str] | None = None) -> bool:
    """True on x86 CPUs with avx512_bf16 or AMX-BF16, where bf16 matmuls run natively."""
    return bool({"avx512_bf16", "amx_bf16"} & (cpu_flags() if flags is None else flags))


def cpu_has_amx_int8(flags: frozenset[str] | None = None) -> bool:
    """True on x86 CPUs with AMX tiles for int8 (Sapphire Rapids and later)."""
    return {"amx_tile", "amx_int8"} <= (cpu_flags() if flags is None else flags)


def cpu_has_avx512_vnni(flags: frozenset[str] | None = None) -> bool:
    """True on x86 CPUs with AVX-512 VNNI (Intel from Ice Lake, AMD from Zen 4), where the
    native kernels carry the wide layout for every quantised matrix."""
    return {"avx512f", "avx512bw", "avx512_vnni"} <= (cpu_flags() if flags is None else flags)


def cpu_has_wide_layout(flags: frozenset[str] | None = None) -> bool:
    """True where the native kernels carry the wide layout: AVX-512 VNNI, or AVX2 with FMA
    and F16C and no VNNI of either width (AMD Zen 2 and 3, Intel before Ice Lake), where its
    AVX2 kernel takes 4-bit matrices. AVX-VNNI alone (256 bits) keeps the vector kernels."""
    flags = cpu_flags() if flags is None else flags
    plain_avx2 = {"avx2", "fma", "f16c"} <= flags and not {"avx_vnni", "avx512_vnni"} & flags
    return cpu_has_avx512_vnni(flags) or plain_avx2
