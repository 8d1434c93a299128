"""Streaming detokenization and stop strings.

Byte-level tokenizers split multi-byte characters across tokens, so text is released only
once it decodes cleanly: the text of a window of recent tokens is compared with the same
window minus the newest tokens, and held back while it ends in a replacement character.
Text that could still grow into a stop string is held back too, so a stop string never
reaches the client, not even in part.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

REPLACEMENT = "\ufffd"


class TextStream:
    """Feed generated token ids one at a time; read the text that is safe to emit."""

    def __init__(self, tokenizer: Any, stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        # A transformers fast tokenizer decodes through its ``tokenizers`` backend: the same
        # text without clean-up (``_decode``), at a quarter of the wrapper's cost, twice a token.
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._backend = backend if backend is not None and hasattr(backend, "decode") else None
        self.stop = tuple(stop)
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0
        self.text = ""  # all decoded text so far (stop string excluded once found)
        self.emitted = 0  # characters of ``text`` already handed out
        self.stopped = False

    def add(self, token_id: int) -> bool:
        """Add one token; True when a stop string completed (the text is cut before it)."""
        self.ids.append(int(token_id))
        if self.tokenizer is None:
            return False
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        window = self._decode(self.ids[self.prefix_offset :])
        if len(window) <= len(prefix) or window.endswith(REPLACEMENT):
            return False  # an incomplete character: wait for more bytes
        search_from = max(0, len(self.text) - self.hold)
        self.text += window[len(prefix) :]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        if self.stop:
            hits = [at for s in self.stop if (at := self.text.find(s, search_from)) >= 0]
            if hits:
                self.text = self.text[: min(hits)]
                self.stopped = True
        return self.stopped

    def take(self, final: bool = False) -> str:
        """Text not yet handed out; unless ``final``, keep back what may start a stop string."""
        if final and not self.stopped and self.tokenizer is not None and self.read_offset < len(self.ids):
            # The sequence ended mid-character: release what the pending bytes decode to.
            prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
            self.text += self._decode(self.ids[self.prefix_offset :])[len(prefix) :]
            self.read_offset = len(self.ids)
        end = len(self.text) if final or self.stopped else max(self.emitted, len(self.text) - self.hold)
        piece = self.text[self.emitted : end]
        self.emitted = end
        return piece

    def _decode(self, ids: Sequence[int]) -> str:
        if self._backend is not None:
            return str(self._backend.decode(ids, skip_special_tokens=True))
        return str(self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False))
