"""Verify rows equal to single decode steps, bit for bit, on the CPU.

Greedy speculative output equals plain greedy output only if every row of a verify pass
(the pending token plus k drafts, M = k + 1 rows) gives exactly the logits a one-token
decode step would. Out of the box it does not, measured on the embedded model over 2540
rows per M: fp32 rows differ by up to 1e-4 (no argmax flipped); bf16 rows by up to 1.75
logits with 1.4% of argmaxes flipped, and greedy speculative output matched plain output
on only 5 of 20 prompts. The causes:

1. Linear layers: MKL's fp32 GEMM picks different kernels for 1, 2-3 and 4+ rows (and for
   leftover row blocks); oneDNN, which bf16 uses, picks a different kernel for a single row
   when the reduction is long (the MLP down projection, 1536 inputs). Each sums in its own
   order.
2. Attention: SDPA over a block of M queries differs from M single-query calls (fp32 at every
   M). Matmul attention in bf16 agrees row by row as long as the reduction over keys has the
   same length, but a block reduces every row over the block's full key count; once that
   passes 1024 the sum is blocked differently (found at 1021 to 1025 keys).

``make_batch_invariant`` patches a loaded model in place:

1. every ``nn.Linear`` (the LM head included) runs through oneDNN with its weight prepacked
   once, whose kernel computes each of M >= 2 rows alike; a single row through a layer with
   ``in_features >= LONG_REDUCTION`` runs as two identical rows, the copy dropped;
2. attention over a verify block is computed one query row at a time, each over exactly its
   own causal prefix of the cache: the computation a decode step makes for that position.
   (One call over the whole block is not enough even with a causal mask: the rows then
   reduce over the block's full key length, and past ~1024 keys a longer reduction is
   blocked, and so summed, differently.) bf16 uses two matmuls and a softmax, fp32 SDPA.

It is also faster than the stock model (oneDNN with prepacked weights beats MKL here); the
measured costs are in README.md. These are observed properties of this torch build's
kernels, not guarantees, so ``self_test`` checks them on the model at load time and the
target falls back to verifying row by row when they do not hold.
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
ATTENTION_NAME = "verispec_batch_invariant"

_state = threading.local()


def available(dtype: torch.dtype = torch.float32) -> bool:
    """oneDNN can prepack linear weights of ``dtype`` here (CPU only). bf16 needs AVX-512
    (BW, VL, DQ) or AVX-NE-CONVERT; an AVX2 CPU has neither, so it is tried, not assumed."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    if dtype == torch.float32:
        return True
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(2, 2, dtype=dtype), None)
    except RuntimeError:
        return False
    return True


@contextmanager
def verify_block() -> Iterator[None]:
    """Within this block, attention over several new queries is computed row by row."""
    previous = getattr(_state, "rowwise", False)
    _state.rowwise = True
    try:
        yield
    finally:
        _state.rowwise = previous


def _attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention of the last Q positions over all K keys, grouped-query aware.

    query: (B, H, Q, D); key, value: (B, KVH, K, D) with H a multiple of KVH. Returns
    (B, H, Q, D). Row r may see the keys up to its own position, K - Q + r.
    """
    batch, heads, queries, dim = query.shape
    kv_heads, keys = key.shape[1], key.shape[2]
    causal = None
    if queries > 1:
        rows = torch.arange(keys - queries, keys, device=query.device).unsqueeze(-1)
        causal = torch.arange(keys, device=query.device) <= rows
    if query.dtype == torch.bfloat16:
        # Two matmuls and a softmax, the query heads of a key head stacked as rows, so the
        # cache is never copied per head: several times cheaper than SDPA for single bf16 rows.
        grouped = query.reshape(batch, kv_heads, heads // kv_heads * queries, dim)
        scores = (torch.matmul(grouped, key.transpose(2, 3)) * scale).view(batch, heads, queries, keys)
        if causal is not None:
            scores = scores.masked_fill(~causal, float("-inf"))
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
        grouped_weights = weights.view(batch, kv_heads, heads // kv_heads * queries, keys)
        return torch.matmul(grouped_weights, value).view(batch, heads, queries, dim)
    return torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=causal, scale=scale, enable_gqa=True
    )


def _batch_invariant_attention(
    module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any, **kwargs: Any
) -> tuple[torch.Tensor, None]:
    """transformers attention hook. In a verify block each query row attends over exactly its
    own prefix of the cache, the same computation a decode step makes for that position;
    elsewhere (prefill, decode) one causal call. Causality comes from positions: the engine
    runs one unpadded sequence, so ``attention_mask`` adds nothing."""
    scale = kwargs.get("scaling") or query.shape[-1] ** -0.5
    queries, keys = query.shape[2], key.shape[2]
    if queries > 1 and getattr(_state, "rowwise", False):
        past = keys - queries
        out = torch.cat(
            [
                _attend(query[:, :, i : i + 1], key[:, :, : past + i + 1], value[:, :, : past + i + 1], scale)
                for i in range(queries)
            ],
            dim=2,
        )
    else:
        out = _attend(query, key, value, scale)
    return out.transpose(1, 2).contiguous(), None


def _register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, _batch_invariant_attention)


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
