"""The native decoder's forward pass, in two implementations with one interface.

``forward(ids, start, logits, capture, slot)`` runs the tokens ``ids`` at positions
``start``, ``start + 1``, ... of sequence ``slot`` over the KV cache, writing their keys and
values in place (the cache is preallocated for ``slots`` sequences of ``context`` positions;
rolling back is the caller lowering ``start``), and returns ``(logits, hidden)``: float32
(len(ids), vocab) when ``logits``, and the hidden states ``capture`` asks for side by side,
(len(ids), len(capture) * hidden) (index 0 = the embeddings, i = the output of layer i,
layers = the final normed state).

``forward_segments(segments, capture)`` runs several sequences in one pass: ``segments`` a
list of ``Segment(slot, start, ids, logits)``; it returns the logits of the segments that
ask for them, stacked in order (or None), and the hidden states of every row.

``forward_tree(ids, start, parents, logits, capture, slot)`` runs a token tree of one
sequence in one pass (tree verification): ``ids`` = [root, node 0, ..., node n-1], the root
being the pending token; ``parents`` (n,) as in ``accept_tree`` (node j's parent < j, -1 for
the root). Row r writes its keys and values at cache slot ``start + r``, sits at position
``start + depth(r)`` and attends to the prefix [0, start) and its own path (root, ancestors,
itself): its logits are the single step's at that position after decoding that path.
``keep_path(start, path, slot)`` then moves the accepted nodes' keys and values (``path``,
nodes root to leaf) to slots ``start + 1``, ``start + 2``, ..., where plain decoding of the
path would have written them; the cache is then valid up to ``start + 1 + len(path)``.

- ``KernelDecoder``: the C++ kernels of ``csrc/decoder.cpp`` (CPU). Weights stay in their
  packed formats; every row's arithmetic is its own, so rows are bit-identical to single steps.
- ``TorchDecoder``: the same model in torch operations on dequantised weights, for devices
  other than the CPU (CUDA) and as the fallback where the kernels cannot be built. Its rows
  are as invariant as the device's matmul kernels are: the target's self-test checks.

The model is the Llama family's: x = embed(ids); per layer x += o(attn(rope(qkv(norm(x)))))
then x += down(silu(gate) * up) with gate, up = gate_up(norm(x)); logits = head(norm(x)).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from verispec.accept_tree import ancestor_mask, checked_parents, tree_depths
from verispec.native import formats
from verispec.native.checkpoint import Checkpoint, CheckpointError

STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")  # rope whose tables do not depend on length


@dataclass(frozen=True)
class Segment:
    """Rows of one sequence in a pass: ``ids`` at positions ``start``.. of cache slot ``slot``;
    ``logits``: whether its rows' logits are wanted (a prefill chunk needs none)."""

    slot: int
    start: int
    ids: list[int]
    logits: bool


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


_between = threading.local()  # .threads: torch's count before ``torch_alone_between_passes``


@contextmanager
def torch_alone_between_passes() -> Iterator[None]:
    """Torch on one thread on this thread while the body runs: the work between native passes
    (drafting, sampling) is small ops that a second thread does not speed up, and an OpenMP
    worker that spins after them holds a core the next pass's threads need (measured on 2
    cores: a 2-row verify of the embedded model at 11.5 ms in the engine against 7.0 ms alone).
    The passes keep their own thread count (``set_threads``, fixed when a decoder loads)."""
    before = torch.get_num_threads()
    if before == 1 or getattr(_between, "threads", None) is not None:
        yield
        return
    _between.threads = before
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
        _between.threads = None


class KernelDecoder:
    """The forward pass in the C++ kernels (see the module docstring for ``forward``)."""

    path = "kernels"

    def __init__(self, checkpoint: Checkpoint, context: int, kernels: Any, slots: int = 1) -> None:
        config = checkpoint.config
        self.slots = slots
        cos, sin = rope_tables(checkpoint, context)
        self._kernels = kernels
        # Quantised passes run on the wide layout's kernels where the CPU has AVX-512 VNNI (Q4
        # passes of up to 16 rows where it has AVX2 and no VNNI), and on AMX tiles for many
        # rows where it has them (bit-identical rows; see decoder.cpp); the matrices made
        # below then carry that layout's copy of their weights.
        self.wide = bool(kernels.wide_available())
        self.amx = bool(kernels.amx_available())
        # Every pass runs on the process's torch threads as they were outside any
        # ``torch_alone_between_passes`` (a decoder may load inside one: a draft model's).
        kernels.set_threads(getattr(_between, "threads", None) or torch.get_num_threads())
        self._decoder = kernels.Decoder(
            config.hidden_size,
            config.intermediate_size,
            config.num_attention_heads,
            config.num_key_value_heads,
            checkpoint.head_dim,
            float(config.rms_norm_eps),
            cos,
            sin,
            slots,
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

    def matrix(self, weights: formats.Weights) -> Any:
        """``weights`` as a kernels matrix, for ``apply`` beside the decoder's own."""
        return self._matrix(weights)

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
        self, ids: list[int], start: int, logits: bool, capture: tuple[int, ...] = (), slot: int = 0
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        return self.forward_segments([Segment(slot, start, ids, logits)], capture)

    def forward_segments(
        self, segments: Sequence[Segment], capture: tuple[int, ...] = ()
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        # Lists, converted in C++ (``forward_lists``): torch.tensor here cost ~60 us a round.
        ids = [token for segment in segments for token in segment.ids]
        table = [value for s in segments for value in (s.slot, s.start, len(s.ids), int(s.logits))]
        out, hidden = self._decoder.forward_lists(ids, table, list(capture))
        return out, hidden

    def forward_tree(
        self,
        ids: list[int],
        start: int,
        parents: Sequence[int],
        logits: bool,
        capture: tuple[int, ...] = (),
        slot: int = 0,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        ids_t = torch.tensor(ids, dtype=torch.long)
        parents_t = torch.tensor(list(parents), dtype=torch.long)
        out, hidden = self._decoder.forward_tree(ids_t, slot, start, parents_t, logits, list(capture))
        return out, hidden

    def keep_path(self, start: int, path: Sequence[int], slot: int = 0) -> None:
        self._decoder.keep_path(slot, start, torch.tensor(list(path), dtype=torch.long))


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
    """The forward pass in torch operations on dequantised weights (any device).

    compile: run each decoder layer through ``torch.compile`` (Inductor: Triton kernels on a
    GPU, C++ on the CPU), one graph for every layer, with the number of rows and the
    cache position symbolic so a decode step and each verify size reuse it. The first
    passes pay the compilation (its seconds in ``compile_seconds``); Inductor caches its
    artefacts on disk across runs.
    """

    path = "torch"

    def __init__(
        self,
        checkpoint: Checkpoint,
        context: int,
        device: str = "cpu",
        dtype: torch.dtype | None = None,
        compile: bool = False,
        slots: int = 1,
    ) -> None:
        config = checkpoint.config
        self.slots = slots
        self.device = torch.device(device)
        self.dtype = dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        self.shape = _Shape(config.num_attention_heads, config.num_key_value_heads, checkpoint.head_dim)
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
        # Uninitialised, as the kernels' cache: a pass reads only positions its sequence wrote.
        shape = (slots, len(self.layers), self.shape.kv_heads, context, self.shape.head_dim)
        self.keys = torch.empty(shape, dtype=self.dtype, device=self.device)
        self.values = torch.empty(shape, dtype=self.dtype, device=self.device)
        self.compiled = compile
        self.compile_seconds: float | None = None
        self._layer = torch.compile(decoder_layer, dynamic=True) if compile else decoder_layer

    def forward_segments(
        self, segments: Sequence[Segment], capture: tuple[int, ...] = ()
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """One ``forward`` per segment: a device's matmul kernels may not keep rows invariant
        across a batch, so sequences are not stacked here."""
        results = [self.forward(s.ids, s.start, s.logits, capture, s.slot) for s in segments]
        logits = [out for out, _ in results if out is not None]
        hidden = [h for _, h in results if h is not None]
        return (torch.cat(logits) if logits else None), (torch.cat(hidden) if hidden else None)

    @torch.inference_mode()
    def forward(
        self, ids: list[int], start: int, logits: bool, capture: tuple[int, ...] = (), slot: int = 0
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        return self._run(ids, start, logits, capture, slot, None)

    @torch.inference_mode()
    def forward_tree(
        self,
        ids: list[int],
        start: int,
        parents: Sequence[int],
        logits: bool,
        capture: tuple[int, ...] = (),
        slot: int = 0,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        par = checked_parents(parents)
        if len(ids) != par.shape[0] + 1:
            raise CheckpointError(f"{par.shape[0]} nodes take {par.shape[0] + 1} ids (the root first), got {len(ids)}")
        return self._run(ids, start, logits, capture, slot, par)

    @torch.inference_mode()
    def keep_path(self, start: int, path: Sequence[int], slot: int = 0) -> None:
        # In depth order: a node's slot lies at or past its target, so no source is overwritten first.
        for depth, node in enumerate(path, start=1):
            self.keys[slot, :, :, start + depth] = self.keys[slot, :, :, start + 1 + node]
            self.values[slot, :, :, start + depth] = self.values[slot, :, :, start + 1 + node]

    def _run(
        self,
        ids: list[int],
        start: int,
        logits: bool,
        capture: tuple[int, ...],
        slot: int,
        parents: np.ndarray | None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``forward``, or ``forward_tree`` when ``parents`` is given: then each row sits at
        position start + its depth and sees the prefix and its own path (an ancestor mask)."""
        rows = len(ids)
        if start + rows > self.keys.shape[3]:
            raise CheckpointError(f"positions {start}..{start + rows} exceed the context of {self.keys.shape[3]}")
        began = time.perf_counter()
        positions = torch.arange(start, start + rows, device=self.device)
        visible = None
        if parents is not None:
            depths = np.concatenate([[0], tree_depths(parents)])
            positions = start + torch.from_numpy(depths).to(self.device)
            visible = torch.ones(rows, start + rows, dtype=torch.bool, device=self.device)
            visible[:, start:] = torch.from_numpy(ancestor_mask(parents)).to(self.device)
        cos, sin = self.cos[positions][:, None, :], self.sin[positions][:, None, :]
        x = self.embed[torch.tensor(ids, device=self.device)].float()
        states = {0: x}
        for index, layer in enumerate(self.layers):
            keys, values = self.keys[slot, index], self.values[slot, index]
            if visible is None:
                x = self._layer(x, layer, keys, values, cos, sin, start, self.shape, self.eps)
            else:  # not compiled: trees are the rarer pass, and a mask would be one more graph
                x = decoder_layer(x, layer, keys, values, cos, sin, start, self.shape, self.eps, visible)
            states[index + 1] = x
        final = rms_norm(x, self.norm, self.eps)
        states[len(self.layers)] = final
        out = linear(final, self.head).cpu() if logits else None
        hidden = torch.cat([states[i] for i in capture], dim=-1).cpu() if capture else None
        if self.compiled and self.compile_seconds is None:
            self.compile_seconds = time.perf_counter() - began  # the first pass: tracing and compiling
        return out, hidden


@dataclass(frozen=True)
class _Shape:
    heads: int
    kv_heads: int
    head_dim: int


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (float32) @ weight.T in the weight's dtype, back to float32."""
    out = torch.nn.functional.linear(x.to(weight.dtype), weight).float()
    return out if bias is None else out + bias


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (rows, heads, D) rotated by its rows' cos and sin (rows, 1, D / 2), rotate-half layout."""
    half = x.shape[-1] // 2
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


def decoder_layer(
    x: torch.Tensor,
    layer: _TorchLayer,
    keys: torch.Tensor,
    values: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    start: int,
    shape: _Shape,
    eps: float,
    visible: torch.Tensor | None = None,
) -> torch.Tensor:
    """One layer for rows at positions start, start + 1, ...: x (rows, hidden) float32; keys
    and values (kv_heads, context, head_dim) are this layer's cache, written in place at
    slots start, start + 1, .... ``visible`` (rows, start + rows) bool, when given, replaces
    the causal mask (tree rows, whose positions ``cos`` and ``sin`` carry)."""
    rows, heads, kv_heads, dim = x.shape[0], shape.heads, shape.kv_heads, shape.head_dim
    qkv = linear(rms_norm(x, layer.attn_norm, eps), layer.qkv, layer.qkv_bias)
    q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    q = rope(q.view(rows, heads, dim), cos, sin)
    keys[:, start : start + rows] = rope(k.view(rows, kv_heads, dim), cos, sin).transpose(0, 1).to(keys.dtype)
    values[:, start : start + rows] = v.view(rows, kv_heads, dim).transpose(0, 1).to(values.dtype)
    attn = attend(q, keys[:, : start + rows].float(), values[:, : start + rows].float(), start, visible)
    x = x + linear(attn, layer.o)
    gate, up = linear(rms_norm(x, layer.ffn_norm, eps), layer.gate_up).chunk(2, dim=-1)
    return x + linear(torch.nn.functional.silu(gate) * up, layer.down)


def attend(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int, visible: torch.Tensor | None = None
) -> torch.Tensor:
    """Grouped-query attention: q (rows, H, D) at positions start.. over keys and values
    (G, start + rows, D); row r sees keys 0 .. start + r (causal), or those ``visible``
    (rows, start + rows) marks."""
    rows, heads, dim = q.shape
    groups, length = keys.shape[0], keys.shape[1]
    grouped = q.view(rows, groups, heads // groups, dim).permute(1, 0, 2, 3).reshape(groups, -1, dim)
    scores = torch.matmul(grouped, keys.transpose(1, 2)) / dim**0.5  # (G, rows * H/G, length)
    if visible is None:
        position = torch.arange(start, start + rows, device=q.device)[:, None]
        visible = torch.arange(length, device=q.device)[None, :] <= position  # (rows, length)
    scores = scores.view(groups, rows, heads // groups, length).masked_fill(~visible[None, :, None, :], float("-inf"))
    weights = torch.softmax(scores, dim=-1).view(groups, -1, length)
    out = torch.matmul(weights, values).view(groups, rows, heads // groups, dim).permute(1, 0, 2, 3)
    return out.reshape(rows, heads * dim)
