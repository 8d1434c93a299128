"""verispec: lossless speculative decoding for language models.

The pure core (``accept``, ``rounds``, ``sampling``, ``stats``) imports only NumPy; the
engine, models and entry points load torch and transformers when first used.
"""

__version__ = "0.1.0"
