"""Where verispec keeps what it derives from models: converted weights, extracted tokenizers,
GGUF indexes, compiled kernels, training data.

A leaf module (models, GGUF files and kernels all ask it), so none of them imports another
just for the path.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """$VERISPEC_CACHE, else the user cache directory."""
    override = os.environ.get("VERISPEC_CACHE")
    if override:
        return Path(override)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("verispec"))
