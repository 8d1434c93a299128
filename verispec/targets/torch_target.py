"""The PyTorch backend: any transformers causal LM under its own KV cache.

Device and dtype: CUDA when present, else the CPU with as many threads as the process may
use; the dtype is chosen by ``default_dtype`` unless given. Rollback crops the transformers
``DynamicCache``; a cache with layers that cannot be cropped (sliding windows, recurrent
state) reports ``supports_rollback = False`` and the engine refuses to run on it.

Hidden states for drafters trained on them (``capture_hidden``) come out of the same forward
passes (``output_hidden_states``): the cost is slicing and concatenating a few rows.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from verispec.cpu import cpu_has_native_bf16, cpu_threads
from verispec.targets import batch_invariant
from verispec.targets.base import HiddenCapture, Logits, TargetError

PREFILL_CHUNK = 512  # prompt tokens per forward pass while prefilling


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_dtype(device: str) -> torch.dtype:
    """bf16 where the hardware runs it natively, else fp32."""
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_has_native_bf16() else torch.float32


DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
DTYPES.update({"float16": torch.float16, "fp16": torch.float16})


def parse_dtype(name: str | None, device: str) -> torch.dtype:
    if name is None or name == "auto":
        return default_dtype(device)
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; use auto, {', '.join(sorted(DTYPES))}")
    return DTYPES[name]


class TorchTarget:
    """A transformers causal LM as a verispec Target.

    model: an ``AutoModelForCausalLM`` instance (patched in place when ``exact``);
    eos_token_ids: ids that end a sequence (taken from the model's generation config when
    not given); exact: make verify rows bit-identical to single steps (default: on the CPU).
    """

    def __init__(
        self, model: Any, name: str = "model", eos_token_ids: Sequence[int] | None = None, exact: bool | None = None
    ) -> None:
        from transformers import DynamicCache

        self.model = model.eval()
        self.name = name
        self.device = next(model.parameters()).device
        if self.device.type == "cpu":
            torch.set_num_threads(cpu_threads())
        # exact: verify rows bit-identical to single decode steps (see batch_invariant.py).
        # Default: on where it can be done (the CPU with oneDNN).
        can_be_exact = self.device.type == "cpu" and batch_invariant.available()
        if exact and not can_be_exact:
            raise TargetError("exact verify is implemented for the CPU with oneDNN only")
        self.exact = can_be_exact if exact is None else exact
        # Whether one forward pass gives exact rows; if the self-test finds it does not, or
        # oneDNN cannot prepack this dtype here (bf16 on an AVX2 CPU), verify passes run row
        # by row (exact, but without batching's gain).
        self.batched_verify_exact = not self.exact
        prepacked = self.exact and batch_invariant.available(next(model.parameters()).dtype)
        if prepacked:
            batch_invariant.make_batch_invariant(model)
        self._cache_type = DynamicCache
        self._cache = DynamicCache(config=model.config)
        self._length = 0
        config = model.config
        self._vocab = int(model.get_output_embeddings().weight.shape[0])
        self._context = int(getattr(config, "max_position_embeddings", 0) or 2048)
        self._eos = frozenset(eos_token_ids if eos_token_ids is not None else _eos_from(model))
        self._capture: HiddenCapture | None = None
        self._last_hidden: torch.Tensor | None = None
        self._fingerprint: str | None = None
        if self.exact:
            self.batched_verify_exact = prepacked and self.self_test()
            if not self.batched_verify_exact:
                reason = (
                    "verify rows differ from single steps on this machine's kernels"
                    if prepacked
                    else f"oneDNN cannot prepack {str(self.dtype).replace('torch.', '')} weights on this CPU"
                )
                warnings.warn(
                    f"{name}: {reason}; verifying row by row to stay exact "
                    "(slower; exact=False trades exactness for speed)",
                    stacklevel=2,
                )

    @property
    def description(self) -> str:
        """What runs, for the CLI and the bench."""
        rows = "exact rows" if self.exact else "stock kernels"
        return f"torch (transformers), {str(self.dtype).replace('torch.', '')}, {rows}"

    @property
    def vocab_size(self) -> int:
        return self._vocab

    @property
    def context_length(self) -> int:
        return self._context

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._eos

    @property
    def supports_rollback(self) -> bool:
        return bool(getattr(self._cache, "is_croppable", True))

    @property
    def cached_tokens(self) -> int:
        return self._length

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def num_layers(self) -> int:
        return int(self.model.config.num_hidden_layers)

    @property
    def last_hidden(self) -> torch.Tensor | None:
        """(rows, len(layers) * hidden) of the last prefill or verify, when capturing."""
        return self._last_hidden

    def capture_hidden(self, capture: HiddenCapture | None) -> None:
        if capture is not None and max(capture.layers) > self.num_layers:
            raise TargetError(
                f"{self.name} has hidden states 0..{self.num_layers}; asked for layers {list(capture.layers)}"
            )
        self._capture = capture
        self._last_hidden = None

    def token_embeddings(self) -> torch.Tensor:
        weight: torch.Tensor = self.model.get_input_embeddings().weight
        return weight.detach()

    def lm_head_weight(self) -> torch.Tensor:
        weight: torch.Tensor = self.model.get_output_embeddings().weight
        return weight.detach()

    def weights_fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = weights_fingerprint(self.model)
        return self._fingerprint

    def reset(self) -> None:
        self._cache = self._cache_type(config=self.model.config)
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
        keep = self._capture.prefill_rows if self._capture is not None else 0
        kept = None
        if self._capture is not None:
            kept = torch.zeros(0, len(self._capture.layers) * self.hidden_size, dtype=self.dtype)
            self._last_hidden = kept
        for start in range(0, len(ids), PREFILL_CHUNK):
            self._forward(ids[start : start + PREFILL_CHUNK], keep_logits=False)
            if kept is not None and self._last_hidden is not None:
                kept = torch.cat([kept, self._last_hidden])[-keep:] if keep else kept
                self._last_hidden = kept  # the prompt's last rows, not only this chunk's
            yield self._length

    def verify(self, token_ids: Sequence[int]) -> Logits:
        if not token_ids:
            raise TargetError("verify needs at least one token")
        if self._length + len(token_ids) > self._context:
            raise TargetError(
                f"{self.name}: {self._length + len(token_ids)} positions exceed the context {self._context}"
            )
        if self.exact and not self.batched_verify_exact:
            logits_rows, hidden_rows = [], []
            for token in token_ids:
                logits_rows.append(self._forward([token], keep_logits=True))
                if self._last_hidden is not None:
                    hidden_rows.append(self._last_hidden)
            logits = torch.cat(logits_rows)
            if hidden_rows:  # row by row: the verify's hidden states are the rows' in order
                self._last_hidden = torch.cat(hidden_rows)
        else:
            with batch_invariant.verify_block():
                logits = self._forward(list(token_ids), keep_logits=True)
        out: Logits = logits.float().cpu().numpy()
        return out

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self._length:
            raise TargetError(f"cannot roll back to {length}: the cache holds {self._length} positions")
        if length < self._length:
            self._cache.crop(length - self._length)  # transformers 5: negative = tokens to drop
            self._length = length

    def self_test(self, contexts: tuple[int, ...] = (24, 1020), rows: tuple[int, ...] = (2, 5, 9)) -> bool:
        """Do verify passes of ``rows`` rows give exactly the logits of single steps? Run
        once at load, on synthetic contexts (token ids spread over the vocabulary), short and
        straddling 1024 keys, where some reductions change their blocking."""
        exact = True
        for context in sorted({min(c, self._context - max(rows)) for c in contexts}):
            ids = [(7919 * i + 11) % self._vocab for i in range(context + max(rows))]
            self.prefill(ids[:context])
            single = [self.verify([token]) for token in ids[context : context + max(rows)]]
            for count in rows:
                self.rollback(context)
                with batch_invariant.verify_block():
                    block = self._forward(ids[context : context + count], keep_logits=True).float().cpu().numpy()
                exact = exact and all(np.array_equal(block[i], single[i][0]) for i in range(count))
        self.reset()
        return exact

    @torch.inference_mode()
    def _forward(self, ids: list[int], keep_logits: bool) -> torch.Tensor:
        """Logits of one forward pass over ``ids``; sets ``_last_hidden`` when capturing."""
        input_ids = torch.tensor([ids], dtype=torch.long, device=self.device)
        positions = torch.arange(self._length, self._length + len(ids), device=self.device)
        capture = self._capture
        out = self.model(
            input_ids=input_ids,
            past_key_values=self._cache,
            use_cache=True,
            cache_position=positions,
            position_ids=positions.unsqueeze(0),
            logits_to_keep=0 if keep_logits else 1,
            output_hidden_states=capture is not None,
        )
        self._length += len(ids)
        if capture is not None:
            states = out.hidden_states
            self._last_hidden = torch.cat([states[layer][0] for layer in capture.layers], dim=-1).cpu()
        return out.logits[0]


def weights_fingerprint(model: Any) -> str:
    """SHA-256 over a model's parameters (names, shapes, values rounded to bf16).

    Rounding to bf16 first makes the hash the same whether the model was loaded in fp32 or
    bf16 (loading rounds to nearest even, as ``to(bfloat16)`` does), so drafter weights trained
    on one load of a target are recognised on the other.
    """
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, parameter in sorted(model.named_parameters()):
            values = parameter.detach().to(device="cpu", dtype=torch.bfloat16).contiguous()
            digest.update(f"{name}{tuple(values.shape)}".encode())
            digest.update(values.view(torch.int16).numpy().tobytes())
    return digest.hexdigest()


def _eos_from(model: Any) -> list[int]:
    candidates: list[int] = []
    for config in (getattr(model, "generation_config", None), model.config):
        value = getattr(config, "eos_token_id", None) if config is not None else None
        if value is None:
            continue
        candidates.extend(value if isinstance(value, (list, tuple)) else [value])
    return sorted({int(v) for v in candidates})
