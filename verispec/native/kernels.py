"""Building and loading the native decoder's C++ kernels (``csrc/decoder.cpp``).

The kernels are compiled once per machine with the machine's own compiler, for its own CPU
(``-march=native``: AVX2 and FMA where present, a portable scalar path elsewhere), by
``torch.utils.cpp_extension``; the build is cached under the verispec cache directory, keyed
by the source, the flags, the torch version and the CPU, so later loads take milliseconds.
``make install`` builds it ahead of use. Where no compiler works, ``load`` returns None with
the reason in ``build_error()`` and the decoder runs its torch path instead (slower).
"""

from __future__ import annotations

import hashlib
import os
import platform
import threading
import time
import warnings
from pathlib import Path
from types import ModuleType

SOURCE = Path(__file__).parent / "csrc" / "decoder.cpp"
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-std=c++17"]
LDFLAGS = ["-fopenmp"]
STALE_LOCK_SECONDS = 1800.0  # a build lock this old was left by a build that died

_lock = threading.Lock()
_module: ModuleType | None = None
_error: str | None = None
build_seconds: float | None = None  # of the last build in this process (None: loaded from cache or not built)


def _cpu_signature() -> str:
    """What ``-march=native`` sees: the CPU model and its feature flags."""
    try:
        with open("/proc/cpuinfo") as handle:
            lines = [line for line in handle if line.startswith(("model name", "flags", "Features"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor() or platform.machine()


def build_key() -> str:
    import torch

    digest = hashlib.sha256()
    # The source's path too: the build files record it, so checkouts sharing a build folder
    # would rebuild in turn, each waiting on the other's lock.
    parts = (SOURCE.read_bytes(), str(SOURCE.resolve()).encode(), " ".join(CFLAGS + LDFLAGS).encode())
    for part in (*parts, torch.__version__.encode()):
        digest.update(part)
    digest.update(_cpu_signature().encode())
    return digest.hexdigest()[:16]


def build_dir() -> Path:
    from verispec.cache import cache_root

    return cache_root() / "kernels" / f"decoder-{build_key()}"


def load(verbose: bool = False) -> ModuleType | None:
    """The compiled kernels module, building it on first use; None if it cannot be built."""
    global _module, _error, build_seconds
    with _lock:
        if _module is not None or _error is not None:
            return _module
        from torch.utils import cpp_extension

        directory = build_dir()
        directory.mkdir(parents=True, exist_ok=True)
        clear_stale_lock(directory)
        fresh = not any(directory.glob("*.so"))
        start = time.perf_counter()
        try:
            _module = cpp_extension.load(
                name=f"verispec_decoder_{build_key()}",
                sources=[str(SOURCE)],
                extra_cflags=CFLAGS,
                extra_ldflags=LDFLAGS,
                build_directory=str(directory),
                verbose=verbose,
            )
        except (OSError, RuntimeError, ImportError) as error:  # no compiler, a failed build
            _error = f"{type(error).__name__}: {str(error).strip().splitlines()[-1] if str(error).strip() else ''}"
            return None
        if fresh:
            build_seconds = time.perf_counter() - start
        return _module


def clear_stale_lock(directory: Path, stale_after: float = STALE_LOCK_SECONDS) -> bool:
    """Remove a build lock older than ``stale_after`` seconds; True if one was removed.

    torch's builder holds a lock file in the build folder while it compiles and waits, without
    end, while another process holds it; a build that was killed leaves its lock behind, and
    every later load of the native backend would wait forever. A build takes about a minute."""
    lock = directory / "lock"
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return False
    if age < stale_after:
        return False
    warnings.warn(f"removing a stale native kernel build lock ({age / 60:.0f} min old): {lock}", stacklevel=2)
    lock.unlink(missing_ok=True)
    return True


def build_error() -> str | None:
    """Why ``load`` returned None (after it did)."""
    return _error


def disabled() -> bool:
    """VERISPEC_NATIVE_KERNELS=0 runs the torch path even where the kernels build (tests, debugging)."""
    return os.environ.get("VERISPEC_NATIVE_KERNELS", "1") == "0"


if __name__ == "__main__":  # make install: build ahead of first use
    started = time.perf_counter()
    module = load(verbose=False)
    if module is None:
        print(f"verispec: native kernels not built ({build_error()}); the native decoder will use its torch path")
    else:
        print(f"verispec: native kernels ready in {build_dir()} ({time.perf_counter() - started:.1f} s)")
