"""The native backend: verispec's own decoder (``verispec/native``) as a Target.

Weights come straight from the GGUF file or safetensors directory in the format
``--weights`` asks (see ``native/checkpoint.py``); the KV cache is preallocated for the
context and written in place, so a rollback only lowers the cached length. On the CPU the
forward pass runs in the C++ kernels, whose verify rows are bit-identical to single steps
by construction; the load-time ``self_test`` checks it on the real weights, over short
contexts and past 1,024 keys, and falls back to verifying row by row (with a warning) if it
ever fails. Elsewhere (CUDA), or where the kernels cannot be built, the torch path runs.

Prefill goes through the same kernels in chunks of ``PREFILL_CHUNK`` tokens, so a long
prompt costs memory for one chunk at a time.
"""

from __future__ import annotations

import hashlib
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from verispec.native import checkpoint as checkpoints
from verispec.native import kernels
from verispec.native.decoder import KernelDecoder, TorchDecoder
from verispec.targets.base import HiddenCapture, Logits, TargetError

DEFAULT_CONTEXT = 8192  # positions, capped by the model's trained context
PREFILL_CHUNK = 256  # prompt tokens per forward pass while prefilling


class NativeTarget:
    """A Llama-family checkpoint on verispec's native decoder, as a verispec Target.

    source_kind, location: "gguf" and a file, or "dir" and a transformers directory;
    weights: auto, bf16, int8 or int4; device: "cpu" (the C++ kernels) or a torch device;
    context: positions to preallocate (default: the model's, at most ``DEFAULT_CONTEXT``);
    eos_token_ids: ids that end a sequence besides the checkpoint config's (the tokenizer's,
    a generation config's); dtype: the torch path's compute dtype (default float32 on the
    CPU, bfloat16 on CUDA); compile: the torch path's layers through ``torch.compile``
    (default: on a GPU; the CPU runs the C++ kernels, which beat the compiled torch path there,
    see BENCHMARKS.md); torch_path: run the torch path on the CPU too (for comparisons; the
    environment variable VERISPEC_NATIVE_KERNELS=0 does the same).
    """

    def __init__(
        self,
        source_kind: str,
        location: str | Path,
        name: str = "model",
        weights: str = "auto",
        device: str = "cpu",
        context: int | None = None,
        eos_token_ids: Sequence[int] = (),
        dtype: torch.dtype | None = None,
        compile: bool | None = None,
        torch_path: bool = False,
    ) -> None:
        from verispec.cpu import cpu_threads

        self.name = name
        start = time.perf_counter()
        try:
            self.checkpoint = checkpoints.read(source_kind, location, weights)
        except checkpoints.CheckpointError as error:
            raise TargetError(str(error)) from error
        config = self.checkpoint.config
        trained = int(getattr(config, "max_position_embeddings", 0) or DEFAULT_CONTEXT)
        window = _sliding_window(config)
        self._context = min(context or DEFAULT_CONTEXT, trained, window or trained)
        if self._context < 2:
            raise TargetError(f"a context of {self._context} positions leaves no room to generate")
        own = config.eos_token_id if isinstance(config.eos_token_id, (list, tuple)) else [config.eos_token_id]
        self._eos = frozenset(int(t) for t in [*own, *eos_token_ids] if t is not None)
        self.device = torch.device(device)
        if self.device.type == "cpu":
            torch.set_num_threads(cpu_threads())
        wants_kernels = self.device.type == "cpu" and not (torch_path or kernels.disabled())
        module = kernels.load() if wants_kernels else None
        try:
            if module is not None:
                self.decoder: KernelDecoder | TorchDecoder = KernelDecoder(self.checkpoint, self._context, module)
            else:
                if wants_kernels:
                    warnings.warn(
                        f"{name}: the native kernels could not be built ({kernels.build_error()}); "
                        "running the native decoder's torch path (several times slower)",
                        stacklevel=2,
                    )
                use_compile = self.device.type == "cuda" if compile is None else compile
                self.decoder = TorchDecoder(self.checkpoint, self._context, str(self.device), dtype, use_compile)
        except checkpoints.CheckpointError as error:
            raise TargetError(str(error)) from error
        self.load_seconds = time.perf_counter() - start
        self._length = 0
        self._capture: HiddenCapture | None = None
        self._last_hidden: torch.Tensor | None = None
        self._embeddings: torch.Tensor | None = None
        self._head: torch.Tensor | None = None
        self._fingerprint: str | None = None
        self.batched_verify_exact = self.self_test()
        if not self.batched_verify_exact:
            warnings.warn(
                f"{name}: verify rows differ from single steps on the native {self.decoder.path} path; "
                "verifying row by row to stay exact (slower)",
                stacklevel=2,
            )

    # --- the Target protocol -----------------------------------------------------------

    @property
    def path(self) -> str:
        """Which forward runs: "kernels" (C++) or "torch"."""
        return self.decoder.path

    @property
    def description(self) -> str:
        """What runs, for the CLI and the bench: the path and the weights."""
        compiled = getattr(self.decoder, "compile_seconds", None)
        path = f"torch, compiled in {compiled:.0f} s" if compiled is not None else self.decoder.path
        return f"native {path}, {checkpoints.describe(self.checkpoint)}"

    @property
    def vocab_size(self) -> int:
        return int(self.checkpoint.head.rows)

    @property
    def context_length(self) -> int:
        return self._context

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._eos

    @property
    def supports_rollback(self) -> bool:
        return True

    @property
    def cached_tokens(self) -> int:
        return self._length

    def reset(self) -> None:
        self._length = 0
        self._last_hidden = None

    def prefill(self, token_ids: Sequence[int]) -> None:
        for _ in self.prefill_chunks(token_ids):
            pass

    def prefill_chunks(self, token_ids: Sequence[int]) -> Iterator[int]:
        """``prefill`` a chunk of ``PREFILL_CHUNK`` tokens at a time, yielding the positions
        cached after each (the engine lets its consumer stop a request there)."""
        self.reset()
        ids = list(token_ids)
        self._check_room(len(ids))
        keep = self._capture.prefill_rows if self._capture is not None else 0
        if self._capture is not None:
            self._last_hidden = torch.zeros(0, len(self._capture.layers) * self.hidden_size)
        for start in range(0, len(ids), PREFILL_CHUNK):
            _, hidden = self._forward(ids[start : start + PREFILL_CHUNK], logits=False)
            if hidden is not None and self._last_hidden is not None:
                self._last_hidden = torch.cat([self._last_hidden, hidden])[-keep:] if keep else self._last_hidden[:0]
            yield self._length

    def verify(self, token_ids: Sequence[int]) -> Logits:
        if not token_ids:
            raise TargetError("verify needs at least one token")
        self._check_room(len(token_ids))
        ids = list(token_ids)
        if self.batched_verify_exact:
            logits, hidden = self._forward(ids, logits=True)
        else:
            rows = [self._forward([token], logits=True) for token in ids]
            logits = torch.cat([r[0] for r in rows])  # type: ignore[misc]
            hidden = None if rows[0][1] is None else torch.cat([r[1] for r in rows])  # type: ignore[misc]
        self._last_hidden = hidden
        assert logits is not None
        out: Logits = logits.numpy()
        return out

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self._length:
            raise TargetError(f"cannot roll back to {length}: the cache holds {self._length} positions")
        self._length = length  # the cache is written in place: the next pass overwrites the rest

    def self_test(self, contexts: tuple[int, ...] = (24, 1030), rows: tuple[int, ...] = (2, 5, 9)) -> bool:
        """Do verify passes of ``rows`` rows give exactly the logits of single steps? Run at
        load on synthetic contexts (token ids spread over the vocabulary), short and past
        1,024 keys."""
        exact = True
        capture, self._capture = self._capture, None
        for context in sorted({min(c, self._context - max(rows)) for c in contexts}):
            ids = [(7919 * i + 11) % self.vocab_size for i in range(context + max(rows))]
            self.prefill(ids[:context])
            single = [self._forward([token], logits=True)[0] for token in ids[context:]]
            for count in rows:
                self.rollback(context)
                block, _ = self._forward(ids[context : context + count], logits=True)
                assert block is not None
                exact = exact and all(torch.equal(block[i], single[i][0]) for i in range(count))  # type: ignore[index]
        self._capture = capture
        self.reset()
        return exact

    def _check_room(self, count: int) -> None:
        if self._length + count > self._context:
            raise TargetError(f"{self.name}: {self._length + count} positions exceed the context {self._context}")

    def _forward(self, ids: list[int], logits: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        layers = self._capture.layers if self._capture is not None else ()
        out, hidden = self.decoder.forward(ids, self._length, logits, layers)
        self._length += len(ids)
        return out, hidden

    # --- hidden states for trained drafters (HiddenStateTarget) --------------------------

    @property
    def hidden_size(self) -> int:
        return int(self.checkpoint.config.hidden_size)

    @property
    def num_layers(self) -> int:
        return int(self.checkpoint.config.num_hidden_layers)

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    @property
    def last_hidden(self) -> torch.Tensor | None:
        return self._last_hidden

    def capture_hidden(self, capture: HiddenCapture | None) -> None:
        if capture is not None and max(capture.layers) > self.num_layers:
            raise TargetError(
                f"{self.name} has hidden states 0..{self.num_layers}; asked for layers {list(capture.layers)}"
            )
        self._capture = capture
        self._last_hidden = None

    def token_embeddings(self) -> torch.Tensor:
        if self._embeddings is None:
            self._embeddings = torch.from_numpy(self.checkpoint.embed.dequantize())
        return self._embeddings

    def lm_head_weight(self) -> torch.Tensor:
        if self.checkpoint.head is self.checkpoint.embed:
            return self.token_embeddings()
        if self._head is None:
            self._head = torch.from_numpy(self.checkpoint.head.dequantize())
        return self._head

    def weights_fingerprint(self) -> str:
        """The torch backend's fingerprint of the same checkpoint (trained drafters record it):
        SHA-256 over transformers' parameter names, shapes and values rounded to bf16."""
        if self._fingerprint is None:
            self._fingerprint = fingerprint_of(self.checkpoint)
        return self._fingerprint


def _sliding_window(config: Any) -> int | None:
    """Positions within which attention is full, where a sliding window applies (Mistral's;
    Qwen2's when it uses one): it caps the context, since the native forward attends to
    every earlier key."""
    window = getattr(config, "sliding_window", None)
    if not window or (config.model_type == "qwen2" and not getattr(config, "use_sliding_window", False)):
        return None
    return int(window)


def fingerprint_of(checkpoint: checkpoints.Checkpoint) -> str:
    """``torch_target.weights_fingerprint`` of the transformers model this checkpoint loads
    as, computed from the file (GGUF tensors dequantised as transformers does)."""
    digest = hashlib.sha256()
    for name, values in sorted(checkpoints.transformers_parameters(checkpoint)):
        tensor = torch.from_numpy(values).to(torch.bfloat16)
        digest.update(f"{name}{tuple(tensor.shape)}".encode())
        digest.update(tensor.view(torch.int16).numpy().tobytes())
    return digest.hexdigest()
