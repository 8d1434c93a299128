"""verispec: lossless speculative decoding for language models.

The pure core (``accept``, ``rounds``, ``sampling``, ``stats``) imports only NumPy; the
engine, models and entry points load torch and transformers when first used.
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["Engine", "GenerateOptions", "Generation", "SamplingParams", "generate", "load_engine"]


def __getattr__(name: str) -> Any:
    # Lazy: ``import verispec.accept`` must not pull in torch.
    if name in ("GenerateOptions", "generate", "load_engine"):
        from verispec import api

        return getattr(api, name)
    if name in ("Engine", "Generation"):
        from verispec import engine

        return getattr(engine, name)
    if name == "SamplingParams":
        from verispec.sampling import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'verispec' has no attribute {name!r}")
