"""The llama.cpp backend: GGUF models at native CPU speed, through llama-cpp-python.

Not bit-exact by default: llama.cpp computes a multi-token decode with other kernels than a
single-token step, so verify rows differ slightly from single steps and greedy speculative
output can part from plain greedy output (measured in README.md). ``exact=True`` verifies
token by token instead, at the cost of all batching gain. The rule stays exact either way:
sampled output follows the model's distribution on every setting.

It uses the binding's low-level C API (``llama_cpp.llama_*``), not its high-level
``Llama`` class: a verify pass is one ``llama_decode`` of k + 1 tokens, every row asking
for logits, read straight from llama.cpp's output buffer (only those rows are copied);
rollback removes the rejected tail from the KV memory with ``llama_memory_seq_rm``. The
model is read from the GGUF file as it is (the embedded model stays Q4_1, no conversion).

Prefix reuse (fast mode): ``reset`` forgets the request but leaves its tokens in the KV
memory, and the next ``prefill`` keeps the longest prefix it shares with them (a system
prompt, an earlier turn of the same chat) and decodes only the rest, as llama.cpp's server
and llama-cpp-python do. The kept positions were computed in another batch, so their
rounding can differ from a fresh prefill's; the exact mode therefore always prefills afresh.

The binding compiles llama.cpp from source at install time (about 6 to 9 minutes here);
it is installed by ``make install`` as the ``llamacpp`` extra.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from verispec.targets.base import Logits, TargetError

DEFAULT_CONTEXT = 8192  # positions, capped by the model's trained context
BATCH = 512  # tokens per llama_decode while prefilling


def available() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def _quiet(llama_cpp: Any) -> Any:
    """Keep llama.cpp quiet: errors only in its log, no progress dots while loading. Returns
    the progress callback for model parameters; cached, so the ctypes callbacks stay alive."""

    @llama_cpp.llama_log_callback
    def log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        if level >= 4:  # GGML_LOG_LEVEL_ERROR
            print(text.decode("utf-8", "replace"), end="")

    @llama_cpp.llama_progress_callback
    def progress(fraction: float, user_data: ctypes.c_void_p) -> bool:
        return True  # keep loading

    llama_cpp.llama_log_set(log, ctypes.c_void_p(0))
    return progress, log


class LlamaCppTarget:
    """A GGUF model in a llama.cpp context, as a verispec Target."""

    def __init__(
        self,
        path: str | Path,
        name: str | None = None,
        context: int | None = None,
        threads: int = 0,
        flash_attention: bool | None = None,
        exact: bool = False,
    ):
        try:
            import llama_cpp
        except ImportError as error:
            raise TargetError(
                "the llama.cpp backend needs llama-cpp-python (pip install 'verispec[llamacpp]')"
            ) from error
        from verispec.cpu import cpu_has_amx_int8, cpu_threads

        self._lib = llama_cpp
        self.name = name or Path(path).name
        llama_cpp.llama_backend_init()
        model_params = llama_cpp.llama_model_default_params()
        model_params.progress_callback = _quiet(llama_cpp)[0]
        # Where the CPU has AMX tiles, ggml moves quantised weights into its AMX buffers, and
        # its AMX matmul crashes the process on the embedded Q4_1 model (a segfault in
        # ggml_backend_amx_mul_mat, llama-cpp-python 0.3.36 built with -march=native). Without
        # the extra buffer types the weights stay in the CPU backend's own kernels.
        model_params.use_extra_bufts = not cpu_has_amx_int8()
        model = llama_cpp.llama_model_load_from_file(str(path).encode("utf-8"), model_params)
        if not model:
            raise TargetError(f"llama.cpp could not load {path}")
        self._model = model
        trained = int(llama_cpp.llama_model_n_ctx_train(model))
        self._context = min(context or DEFAULT_CONTEXT, trained) if trained > 0 else (context or DEFAULT_CONTEXT)
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = self._context
        params.n_batch = params.n_ubatch = BATCH
        params.n_threads = params.n_threads_batch = threads or cpu_threads()
        params.no_perf = True
        if flash_attention is not None:
            params.flash_attn_type = (
                llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attention else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
            )
        ctx = llama_cpp.llama_init_from_model(model, params)
        if not ctx:
            raise TargetError(f"llama.cpp could not create a context of {self._context} tokens for {path}")
        self._ctx = ctx
        self._memory = llama_cpp.llama_get_memory(ctx)
        vocab = llama_cpp.llama_model_get_vocab(model)
        self._vocab = int(llama_cpp.llama_vocab_n_tokens(vocab))
        self._eos = frozenset(t for t in range(self._vocab) if llama_cpp.llama_vocab_is_eog(vocab, t))
        self._batch = llama_cpp.llama_batch_init(BATCH, 0, 1)
        self._length = 0  # positions of the current request
        # Tokens whose K/V the memory holds, position by position: the current request's
        # first ``_length``, then what a reset left for the next prefill to reuse.
        self._held: list[int] = []
        self.reused_tokens = 0  # by the last prefill
        # exact: verify one token per decode, so every row is a single step's. A verify of M
        # rows then costs M steps and speculation cannot pay; it exists to keep greedy
        # output identical to plain decoding for those who need that on this backend.
        self.exact = exact

    def __del__(self) -> None:
        lib = getattr(self, "_lib", None)
        if lib is None:
            return
        if getattr(self, "_batch", None) is not None:
            lib.llama_batch_free(self._batch)
        if getattr(self, "_ctx", None):
            lib.llama_free(self._ctx)
        if getattr(self, "_model", None):
            lib.llama_model_free(self._model)

    @property
    def description(self) -> str:
        """What runs, for the CLI and the bench."""
        return "llama.cpp (llama-cpp-python)" + (", exact (row by row)" if self.exact else "")

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
        return True  # a plain KV cache: positions can be removed from the end

    @property
    def cached_tokens(self) -> int:
        return self._length

    def reset(self) -> None:
        if self.exact:
            self.drop_cache()
        self._length = 0  # what the memory still holds stays in _held, for prefill to reuse

    def drop_cache(self) -> None:
        """Reset and forget what a later prefill could reuse: the next request starts cold."""
        self._lib.llama_memory_clear(self._memory, True)
        self._held = []
        self._length = 0

    def prefill(self, token_ids: Sequence[int]) -> None:
        for _ in self.prefill_chunks(token_ids):
            pass

    def prefill_chunks(self, token_ids: Sequence[int]) -> Iterator[int]:
        """``prefill`` a batch of ``BATCH`` tokens at a time (after the reused prefix),
        yielding the positions cached after each (the engine lets its consumer stop there)."""
        self.reset()
        ids = list(token_ids)
        kept = 0
        for held, token in zip(self._held, ids, strict=False):
            if held != token:
                break
            kept += 1
        self._length = self.reused_tokens = kept
        self._forget_beyond(kept)
        for start in range(kept, len(ids), BATCH):
            self._decode(ids[start : start + BATCH], logits=False)
            yield self._length

    def verify(self, token_ids: Sequence[int]) -> Logits:
        ids = list(token_ids)
        if not ids:
            raise TargetError("verify needs at least one token")
        if len(ids) > BATCH:
            raise TargetError(f"a verify pass takes at most {BATCH} tokens, got {len(ids)}")
        if self._length + len(ids) > self._context:
            raise TargetError(f"{self.name}: {self._length + len(ids)} positions exceed the context {self._context}")
        if self.exact:
            return np.concatenate([self._decode_rows([token]) for token in ids])
        return self._decode_rows(ids)

    def _decode_rows(self, ids: list[int]) -> Logits:
        self._decode(ids, logits=True)
        pointer = self._lib.llama_get_logits(self._ctx)
        # The rows of this decode only; copied because the next decode reuses the buffer.
        rows: Logits = np.ctypeslib.as_array(pointer, shape=(len(ids), self._vocab)).copy()
        return rows

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self._length:
            raise TargetError(f"cannot roll back to {length}: the cache holds {self._length} positions")
        self._forget_beyond(length)
        self._length = length

    def _forget_beyond(self, length: int) -> None:
        """Remove positions ``length``.. from the memory."""
        if len(self._held) > length:
            if not self._lib.llama_memory_seq_rm(self._memory, 0, length, -1):
                raise TargetError(f"llama.cpp refused to remove positions {length}.. from its memory")
            del self._held[length:]

    def _decode(self, ids: list[int], logits: bool) -> None:
        self._forget_beyond(self._length)  # what a reset or prefill left past this request
        batch = self._batch
        batch.n_tokens = len(ids)
        for i, token in enumerate(ids):
            batch.token[i] = token
            batch.pos[i] = self._length + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = logits
        code = self._lib.llama_decode(self._ctx, batch)
        if code != 0:
            # A failed decode may have written part of the batch: trust nothing past the request.
            self._lib.llama_memory_seq_rm(self._memory, 0, self._length, -1)
            raise TargetError(f"llama_decode failed with code {code}")
        self._held.extend(ids)
        self._length += len(ids)
