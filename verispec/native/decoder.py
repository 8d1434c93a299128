"""The native decoder's forward pass, in two implementations with one interface.

``forward(ids, start, logits, capture)`` runs the tokens ``ids`` at positions ``start``,
``start + 1``, ... over the KV cache, writing their keys and values in place (the cache is
preallocated for ``context`` positions; rolling back is the caller lowering ``start``), and
returns ``(logits, hidden)``: float32 (len(ids), vocab) when ``logits``, and the hidden
states ``capture`` asks for side by side, (len(ids), len(capture) * hidden) (index 0 = the
embeddings, i = the output of layer i, layers = the final normed state).

- ``KernelDecoder``: the C++ kernels of ``csrc/decoder.cpp`` (CPU). Weights stay in their
  packed formats; every row's arithmetic is its own, so rows are bit-identical to single steps.
- ``TorchDecoder``: the same model in torch operations on dequantised weights, for devices
  other than the CPU (CUDA) and as the fallback where the kernels cannot be built. Its rows
  are as invariant as the device's matmul kernels are: the target's self-test checks.

The model is the Llama family's: x = embed(ids); per layer x += o(attn(rope(qkv(norm(x)))))
then x += down(silu(gate) * up) with gate, up = gate_up(norm(x)); logits = head(norm(x)).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from verispec.native import formats
from verispec.native.checkpoint import Checkpoint, CheckpointError

STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")  # rope whose tables do not depend on length


def rope_tables(checkpoint: Checkpoint, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, float32 (context, head_dim / 2), with the architecture's own rotary
    embedding of transformers (its rope type and scaling), times its attention scaling."""
    import importlib

    config = checkpoint.config
    scaling = getattr(config, "rope_scaling", None) or {}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in STATIC_ROPE_TYPES:
        raise CheckpointError(f"rope type {rope_type!r} is not covered by the native decoder")
    module = importlib.import_module(f"transformers.models.{config.model_type}.modeling_{config.model_type}")
    rotary_class = next(getattr(module, n) for n in dir(module) if n.endswith("RotaryEmbedding"))
    rotary = rotary_class(config=config)
    inv_freq = rotary.inv_freq.float()
    if checkpoint.rope_factors is not None:
        inv_freq = inv_freq / torch.from_numpy(checkpoint.rope_factors)
    if inv_freq.numel() != checkpoint.head_dim // 2:
        raise CheckpointError("partial rotary embeddings are not covered by the native decoder")
    freqs = torch.outer(torch.arange(context, dtype=torch.float32), inv_freq)
    scale = float(getattr(rotary, "attention_scaling", 1.0))
    return (freqs.cos() * scale).contiguous(), (freqs.sin() * scale).contiguous()


class KernelDecoder:
    """The forward pass in the C++ kernels (see the module docstring for ``forward``)."""

    path = "kernels"

    def __init__(self, checkpoint: Checkpoint, context: int, kernels: Any) -> None:
        config = checkpoint.config
        cos, sin = rope_tables(checkpoint, context)
        self._kernels = kernels
        self._decoder = kernels.Decoder(
            config.hidden_size,
            config.intermediate_size,
            config.num_attention_heads,
            config.num_key_value_heads,
            checkpoint.head_dim,
            float(config.rms_norm_eps),
            cos,
            sin,
        )
        for layer in checkpoint.layers:
            self._decoder.add_layer(
                torch.from_numpy(layer.attn_norm),
                torch.from_numpy(layer.ffn_norm),
                self._matrix(layer.qkv, layer.qkv_bias),
                self._matrix(layer.o),
                self._matrix(layer.gate_up),
                self._matrix(layer.down),
            )
        embed = self._matrix(checkpoint.embed)
        head = embed if checkpoint.head is checkpoint.embed else self._matrix(checkpoint.head)
        self._decoder.set_output(embed, torch.from_numpy(checkpoint.norm), head)

    def _matrix(self, weights: formats.Weights, bias: np.ndarray | None = None) -> Any:
        packed = {name: torch.from_numpy(array) for name, array in weights.pack().items()}
        return self._kernels.make_matrix(
            formats.FORMATS.index(weights.format),
            weights.rows,
            weights.cols,
            packed["data"],
            packed.get("scale"),
            packed.get("minimum"),
            None if bias is None else torch.from_numpy(bias),
        )

    def forward(
        self, ids: list[int], start: int, logits: bool, capture: tuple[int, ...] = ()
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        out, hidden = self._decoder.forward(torch.tensor(ids, dtype=torch.long), start, logits, list(capture))
        return out, hidden


@dataclass
class _TorchLayer:
    attn_norm: torch.Tensor
    ffn_norm: torch.Tensor
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


class TorchDecoder:
    """The forward pass in torch operations on dequantised weights (any device)."""

    path = "torch"

    def __init__(self, checkpoint: Checkpoint, context: int, device: str = "cpu", dtype: torch.dtype | None = None):
        config = checkpoint.config
        self.device = torch.device(device)
        self.dtype = dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        self.heads, self.kv_heads, self.head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            checkpoint.head_dim,
        )
        self.eps = float(config.rms_norm_eps)
        cos, sin = rope_tables(checkpoint, context)
        self.cos, self.sin = cos.to(self.device), sin.to(self.device)

        def dense(weights: formats.Weights) -> torch.Tensor:
            return torch.from_numpy(weights.dequantize()).to(self.device, self.dtype)

        def vector(values: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(values).to(self.device, torch.float32)

        self.layers = [
            _TorchLayer(
                vector(layer.attn_norm),
                vector(layer.ffn_norm),
                dense(layer.qkv),
                None if layer.qkv_bias is None else vector(layer.qkv_bias),
                dense(layer.o),
                dense(layer.gate_up),
                dense(layer.down),
            )
            for layer in checkpoint.layers
        ]
        self.embed = dense(checkpoint.embed)
        self.head = self.embed if checkpoint.head is checkpoint.embed else dense(checkpoint.head)
        self.norm = vector(checkpoint.norm)
        shape = (len(self.layers), self.kv_heads, context, self.head_dim)
        self.keys = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.values = torch.zeros(shape, dtype=self.dtype, device=self.device)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x (M, heads, D) rotated at its rows' positions, rotate-half layout."""
        half = self.head_dim // 2
        cos, sin = self.cos[positions][:, None, :], self.sin[positions][:, None, :]
        first, second = x[..., :half], x[..., half:]
        return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)

    def _linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        out = torch.nn.functional.linear(x.to(self.dtype), weight).float()
        return out if bias is None else out + bias

    @torch.inference_mode()
    def forward(
        self, ids: list[int], start: int, logits: bool, capture: tuple[int, ...] = ()
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        M, D, H, G = len(ids), self.head_dim, self.heads, self.kv_heads
        if start + M > self.keys.shape[2]:
            raise CheckpointError(f"positions {start}..{start + M} exceed the context of {self.keys.shape[2]}")
        positions = torch.arange(start, start + M, device=self.device)
        x = self.embed[torch.tensor(ids, device=self.device)].float()
        states = {0: x}
        for index, layer in enumerate(self.layers):
            qkv = self._linear(self._norm(x, layer.attn_norm), layer.qkv, layer.qkv_bias)
            q, k, v = qkv.split([H * D, G * D, G * D], dim=-1)
            q = self._rope(q.view(M, H, D), positions)
            self.keys[index, :, start : start + M] = (
                self._rope(k.view(M, G, D), positions).transpose(0, 1).to(self.dtype)
            )
            self.values[index, :, start : start + M] = v.view(M, G, D).transpose(0, 1).to(self.dtype)
            attn = self._attend(q, index, start + M, positions)
            x = x + self._linear(attn, layer.o)
            gate, up = self._linear(self._norm(x, layer.ffn_norm), layer.gate_up).chunk(2, dim=-1)
            x = x + self._linear(torch.nn.functional.silu(gate) * up, layer.down)
            states[index + 1] = x
        final = self._norm(x, self.norm)
        states[len(self.layers)] = final
        out = self._linear(final, self.head).cpu() if logits else None
        hidden = torch.cat([states[i] for i in capture], dim=-1).cpu() if capture else None
        return out, hidden

    def _attend(self, q: torch.Tensor, layer: int, length: int, positions: torch.Tensor) -> torch.Tensor:
        """Causal grouped-query attention of q (M, H, D) over the cache's first ``length`` keys."""
        M, H, D, G = q.shape[0], self.heads, self.head_dim, self.kv_heads
        keys = self.keys[layer, :, :length].float()  # (G, L, D)
        values = self.values[layer, :, :length].float()
        grouped = q.view(M, G, H // G, D).permute(1, 0, 2, 3).reshape(G, M * (H // G), D)
        scores = torch.matmul(grouped, keys.transpose(1, 2)) / D**0.5  # (G, M * H/G, L)
        visible = torch.arange(length, device=self.device)[None, :] <= positions[:, None]  # (M, L)
        scores = scores.view(G, M, H // G, length).masked_fill(~visible[None, :, None, :], float("-inf"))
        weights = torch.softmax(scores, dim=-1).view(G, M * (H // G), length)
        out = torch.matmul(weights, values).view(G, M, H // G, D).permute(1, 0, 2, 3)
        return out.reshape(M, H * D)
