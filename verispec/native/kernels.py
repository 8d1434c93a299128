"""Building and loading verispec's C++ extensions: the native decoder's kernels
(``csrc/decoder.cpp``) and the drafters' helpers (``csrc/drafting.cpp``).

The kernels are compiled once per machine with the machine's own compiler, for its own CPU
(``-march=native``: AVX2 and FMA where present, a portable scalar path elsewhere), by
``torch.utils.cpp_extension``; the build is cached under the verispec cache directory, keyed
by the source, the flags, the torch version and the CPU, so later loads take milliseconds.
``make install`` builds both ahead of use. Where no compiler works, ``load`` returns None with
the reason in ``build_error()`` and the decoder runs its torch path instead (slower); likewise
``load_drafting`` / ``drafting_error()``, and the drafters run their Python walks (the reference
the C++ must equal).
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
DRAFTING_SOURCE = Path(__file__).parent / "csrc" / "drafting.cpp"
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-std=c++17"]
LDFLAGS = ["-fopenmp"]
STALE_LOCK_SECONDS = 1800.0  # a build lock this old was left by a build that died

_lock = threading.Lock()
_modules: dict[str, ModuleType] = {}  # by source name, once built or loaded
_errors: dict[str, str] = {}  # by source name, why it could not be
build_seconds: float | None = None  # of the last build in this process (None: loaded from cache or not built)


def _cpu_signature() -> str:
    """What ``-march=native`` sees: the CPU model and its feature flags."""
    try:
        with open("/proc/cpuinfo") as handle:
            lines = [line for line in handle if line.startswith(("model name", "flags", "Features"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor() or platform.machine()


def build_key(source: Path | None = None) -> str:
    """The build's key for ``source`` (default: the decoder's)."""
    import torch

    source = SOURCE if source is None else source
    digest = hashlib.sha256()
    # The source's path too: the build files record it, so checkouts sharing a build folder
    # would rebuild in turn, each waiting on the other's lock.
    parts = (source.read_bytes(), str(source.resolve()).encode(), " ".join(CFLAGS + LDFLAGS).encode())
    for part in (*parts, torch.__version__.encode()):
        digest.update(part)
    digest.update(_cpu_signature().encode())
    return digest.hexdigest()[:16]


def build_dir(source: Path | None = None) -> Path:
    from verispec.cache import cache_root

    source = SOURCE if source is None else source
    return cache_root() / "kernels" / f"{source.stem}-{build_key(source)}"


def load(verbose: bool = False) -> ModuleType | None:
    """The compiled kernels module, building it on first use; None if it cannot be built."""
    global build_seconds
    start = time.perf_counter()
    module, fresh = _load(SOURCE, verbose)
    if fresh:
        build_seconds = time.perf_counter() - start
    return module


def load_drafting(verbose: bool = False) -> ModuleType | None:
    """The drafting helpers' module (``csrc/drafting.cpp``), built on first use; None if it
    cannot be built or VERISPEC_NATIVE_DRAFTING=0 (the drafters' Python walks then run)."""
    if os.environ.get("VERISPEC_NATIVE_DRAFTING", "1") == "0":
        return None
    return _load(DRAFTING_SOURCE, verbose)[0]


def _load(source: Path, verbose: bool) -> tuple[ModuleType | None, bool]:
    """``source``'s module (built here if no build of it is cached) and whether it was built."""
    with _lock:
        name = source.stem
        if name in _modules or name in _errors:
            return _modules.get(name), False
        from torch.utils import cpp_extension

        directory = build_dir(source)
        directory.mkdir(parents=True, exist_ok=True)
        clear_stale_lock(directory)
        fresh = not any(directory.glob("*.so"))
        try:
            _modules[name] = cpp_extension.load(
                name=f"verispec_{name}_{build_key(source)}",
                sources=[str(source)],
                extra_cflags=CFLAGS,
                extra_ldflags=LDFLAGS,
                build_directory=str(directory),
                verbose=verbose,
            )
        except (OSError, RuntimeError, ImportError) as error:  # no compiler, a failed build
            text = str(error).strip()
            _errors[name] = f"{type(error).__name__}: {text.splitlines()[-1] if text else ''}"
            return None, False
        return _modules[name], fresh


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
    return _errors.get(SOURCE.stem)


def drafting_error() -> str | None:
    """Why ``load_drafting`` returned None after a build was tried."""
    return _errors.get(DRAFTING_SOURCE.stem)


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
    started = time.perf_counter()
    if load_drafting(verbose=False) is None:
        print(f"verispec: drafting helpers not built ({drafting_error()}); the drafters will use their Python walks")
    else:
        seconds = time.perf_counter() - started
        print(f"verispec: drafting helpers ready in {build_dir(DRAFTING_SOURCE)} ({seconds:.1f} s)")
