"""Returning freed memory to the system after a long request.

Freed buffers go back to the C allocator, not to the system. glibc's ``malloc`` raises its
threshold for serving large blocks from ``mmap`` each time such a block is freed, so after a
long prompt its big temporaries (attention scores, a grown KV cache on the transformers path)
come from the heap arenas, and the pages stay in the process after they are freed: the
resident size ratchets up with the longest prompt seen and is never returned. ``malloc_trim``
hands the free pages of every arena back (``madvise``), in a few milliseconds; the engine
calls it after a request that used a long context. Elsewhere (musl, macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any

RELEASE_AFTER_TOKENS = 1024  # a request whose context reached this many tokens releases after it


@functools.cache
def _libc() -> Any:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


def release_free_memory() -> bool:
    """Give the allocator's free pages back to the system; False where that is not possible."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
