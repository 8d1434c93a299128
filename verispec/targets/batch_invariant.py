"""Verify rows equal to single decode steps, bit for bit, on the CPU.

Greedy speculative output equals plain greedy output only if every row of a verify pass
(the pending token plus k drafts, M = k + 1 rows) gives exactly the logits a one-token
decode step would. Out of the box it does not, for two reasons measured on the embedded
model (fp32: |difference| up to 1e-4, bf16: up to 1.7 logits and argmax flips in 1.4% of
rows, greedy identity 5/20 prompts):

1. Linear layers: MKL's fp32 GEMM picks a different kernel for 1, 2-3 and 4+ rows, and
   oneDNN's for a single row with a long reduction; each sums in its own order.
2. Attention: a length-1 query and a block of queries go through different SDPA kernels.

The fix, applied to a loaded model by ``make_batch_invariant``:

1. every ``nn.Linear`` runs through oneDNN with its weight prepacked once; oneDNN's kernel
   computes each of M >= 2 rows the same way, and a single row through a layer with a long
   reduction (``in_features >= LONG_REDUCTION``, the MLP down projection) is run as two
   identical rows with the copy dropped, so it takes that same kernel;
2. attention over a verify block is computed one query row at a time, each over its own
   causal prefix of the cache: exactly the call a decode step makes.

Prefill is left as it is (plain and speculative decoding share it). Measured cost and gain
are in README.md; ``TorchTarget(exact=False)`` turns this off.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

LONG_REDUCTION = 1024
ATTENTION_NAME = "verispec_rowwise_sdpa"

_state = threading.local()


def available() -> bool:
    """oneDNN with prepacked linear weights exists in this torch build (CPU only)."""
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise")


@contextmanager
def verify_block() -> Iterator[None]:
    """Within this block, attention over several new queries is computed row by row."""
    previous = getattr(_state, "rowwise", False)
    _state.rowwise = True
    try:
        yield
    finally:
        _state.rowwise = previous


def _rowwise_sdpa(
    module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any, **kwargs: Any
) -> tuple[torch.Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    queries, keys = query.shape[2], key.shape[2]
    if queries == 1 or not getattr(_state, "rowwise", False):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)  # type: ignore[no-any-return]
    past = keys - queries
    # Row i sees the cache plus the block up to itself, with no mask: a decode step's call.
    rows = [
        sdpa_attention_forward(
            module, query[:, :, i : i + 1], key[:, :, : past + i + 1], value[:, :, : past + i + 1], None, **kwargs
        )[0]
        for i in range(queries)
    ]
    return torch.cat(rows, dim=1), None


def _register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, _rowwise_sdpa)


def _packed_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    single_long = self.in_features >= LONG_REDUCTION and x.numel() == x.shape[-1]
    if single_long:
        x = torch.cat([x, x], dim=-2)
    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, self._verispec_packed, self.bias, "none", [], "")
    return out[..., :1, :] if single_long else out


def make_batch_invariant(model: Any) -> None:
    """Patch a loaded transformers model in place (CPU, fp32 or bf16)."""
    if not available():
        raise RuntimeError("exact verify needs oneDNN (torch.backends.mkldnn), which this torch build lacks")
    _register_attention()
    model.set_attn_implementation(ATTENTION_NAME)
    for module in model.modules():
        if isinstance(module, nn.Linear):
            module._verispec_packed = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(), None)
            module.forward = types.MethodType(_packed_forward, module)  # type: ignore[method-assign]
