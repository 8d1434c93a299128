"""A trained head's layers on the native kernels: drafting's hot path (``drafters/head.py``).

In torch a head call reads its float32 weights (4.5M parameters, 18 MB) on one thread and
runs some forty small operations: about 5 ms a drafted round on the embedded model, as much
as a plain step. ``KernelHeadStack`` runs the same computation in one call of the C++
kernels (``csrc/decoder.cpp: HeadStack``): the input part (the embeddings of the rows' tokens,
the reduce of the target's states where the head reads several layers, the two input norms,
fuse), the decoder layers, their attention over the head's own keys of the last ``window``
positions (kept in a ring inside the kernels), and the last row's draft logits. Its
matrices take the kernels' formats, on the pass threads: ``q4`` by default (an eighth of
float32's bytes, the draft vocabulary's LM head rows requantised to 4 bits too), or ``q8_0``,
``bf16``, ``f32``. A drafting call streams its weights from memory (the target's pass between
calls has swept the caches), so bytes are its cost: on the embedded model's head 4 bits drafted
as well as 8 (the same greedy acceptance, 0.41) for 0.01-0.05 plain steps less a round (BENCHMARKS,
thirty-fifth increment). The head's outputs then differ from torch's by the rounding of weights
and activations, which changes what the head proposes, never whether the rule is exact (the
drafter reports the row it drew from).

Shapes: features (M, F), F the hidden size D or the reduce's input width (the target's states
of the layers read, side by side); ids (M,), the tokens whose embeddings the rows read;
outputs (M, D), before the head's out norm; the last row's logits (N,) over the draft
vocabulary, through the out norm and the target's own LM head rows, in the same call.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from verispec.native import formats

FORMATS = ("q8_0", "q4", "bf16", "f32")  # the kernel formats a head's matrices may take
DEFAULT_FORMAT = "q4"


def rope_tables(head_dim: int, theta: float, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (positions, head_dim / 2) float32, as ``layers.rotary`` computes its angles."""
    half = head_dim // 2
    inv_freq = theta ** (-torch.arange(half, dtype=torch.float32) / half)
    angles = torch.arange(positions, dtype=torch.float32).unsqueeze(-1) * inv_freq
    return angles.cos().contiguous(), angles.sin().contiguous()


class KernelHeadStack:
    """A head net's layers in the kernels, with its own key ring (one per drafting request).

    net: a ``HeadNet`` (read, never changed); make_matrix: a ``formats.Weights`` -> kernels
    matrix (the target decoder's, so the matrices take its layouts); positions: the longest
    position drafted (the target's context); embeddings: the target's token embeddings (V, D)
    float32; draft_head: the kernels matrix of the draft vocabulary's rows of the target's LM
    head (``SharedTarget.draft_head``'s). ``fresh()`` gives another ring on the same matrices
    (a forked drafter).
    """

    def __init__(
        self,
        net: Any,
        kernels: Any,
        make_matrix: Callable[[formats.Weights], Any],
        positions: int,
        embeddings: torch.Tensor,
        draft_head: Any,
        weight_format: str = DEFAULT_FORMAT,
    ) -> None:
        if weight_format not in FORMATS:
            raise ValueError(f"a head's kernel format is one of {FORMATS}, got {weight_format!r}")
        config = net.config
        self.format = weight_format
        self._kernels = kernels

        def matrix(*weights: torch.Tensor) -> Any:
            values = torch.cat([w.detach().to(torch.float32) for w in weights]).numpy()
            return make_matrix(formats.requantize(formats.from_float(np.ascontiguousarray(values)), weight_format))

        def vector(weight: torch.Tensor) -> torch.Tensor:
            return weight.detach().to(torch.float32).contiguous()

        cos, sin = rope_tables(config.head_dim, config.rope_theta, positions)
        self._build = {
            "shape": (config.hidden, config.intermediate, config.heads, config.kv_heads, config.head_dim),
            "eps": float(net.feature_norm.eps),
            "cos": cos,
            "sin": sin,
            "window": config.window,
            "feature_norm": vector(net.feature_norm.weight),
            "embed_norm": vector(net.embed_norm.weight),
            "fuse": matrix(net.fuse.weight),
            "reduce": matrix(net.reduce.weight) if config.low_layers else None,
            "ends": (embeddings.to(torch.float32).contiguous(), vector(net.out_norm.weight), draft_head),
            "layers": [
                (
                    vector(layer.attn_norm.weight),
                    vector(layer.mlp_norm.weight),
                    matrix(layer.attn.q_proj.weight, layer.attn.k_proj.weight, layer.attn.v_proj.weight),
                    matrix(layer.attn.o_proj.weight),
                    matrix(layer.mlp.gate.weight, layer.mlp.up.weight),
                    matrix(layer.mlp.down.weight),
                )
                for layer in net.layers
            ],
        }
        self._stack = self._new_stack()

    def _new_stack(self) -> Any:
        b = self._build
        stack = self._kernels.HeadStack(
            *b["shape"], b["eps"], b["cos"], b["sin"], b["window"], b["feature_norm"], b["embed_norm"], b["fuse"]
        )
        if b["reduce"] is not None:
            stack.set_reduce(b["reduce"])
        stack.set_ends(*b["ends"])
        for layer in b["layers"]:
            stack.add_layer(*layer)
        return stack

    def fresh(self) -> KernelHeadStack:
        """The same matrices with an empty ring of its own."""
        twin = copy.copy(self)
        twin._stack = twin._new_stack()
        return twin

    def run(self, features: torch.Tensor, ids: list[int], start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The head's outputs (M, D) at positions start.., whose tokens are ``ids`` (their keys
        join the ring), and the last row's draft logits (N,)."""
        outputs, logits = self._stack.forward(features.to(torch.float32), torch.tensor(ids, dtype=torch.long), start)
        return outputs, logits

    def truncate(self, position: int) -> None:
        """Forget the keys of positions >= ``position``."""
        self._stack.truncate(position)

    def clear(self) -> None:
        self._stack.clear()


def kernel_format_for(net: Any, wanted: str | None = None) -> str | None:
    """``wanted`` where every matrix of the head fits it (columns in blocks of 32 for 4 and 8 bits,
    8 for floats), else None. Without ``wanted``: the default format where it fits, else f32
    where that does, else None (the head stays in torch)."""
    config = net.config
    widths = {config.hidden, 2 * config.hidden, config.heads * config.head_dim, config.intermediate}
    if config.low_layers:
        widths.add(len(config.layers_read) * config.hidden)

    def fits(name: str) -> bool:
        step = formats.BLOCK if name in formats.QUANTIZED else formats.FLOAT_GROUP
        return all(width % step == 0 for width in widths)

    if wanted is not None:
        return wanted if fits(wanted) else None
    return next((name for name in (DEFAULT_FORMAT, "f32") if fits(name)), None)
