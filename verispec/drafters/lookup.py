"""``lookup``: prompt-lookup n-gram drafting over prompt + output so far.

The last n tokens of the context are looked up among earlier positions, longest n first
(from ``max_ngram`` down to ``min_ngram``); the most recent earlier occurrence wins and the
tokens that followed it are proposed. Drafts are deterministic, so q is a point mass. A
proposal's source is n: a match of three tokens is right more often than a match of one, and
the governor keeps its acceptance estimates per source.

An index maps every n-gram to the position right after its latest occurrence; it is
extended with the tokens committed since the last proposal when the next is asked for, so a
proposal costs O(max_ngram) per new token, not a scan.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from verispec.drafters.base import NO_DRAFT, Draft, DrafterContext, DrafterError
from verispec.sampling import SamplingParams


class LookupDrafter:
    name = "lookup"
    hidden_capture = None
    pure_proposals = True  # an index read; see drafters.base

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise DrafterError(f"lookup needs 1 <= min_ngram <= max_ngram, got {min_ngram} and {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.reset()

    def fork(self, target: object) -> LookupDrafter:
        return LookupDrafter(self.max_ngram, self.min_ngram)

    def reset(self) -> None:
        self.tokens: list[int] = []
        # n -> {n-gram: index of the token that followed its most recent occurrence}
        self.index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(self.min_ngram, self.max_ngram + 1)}

    def begin(self, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        self.reset()
        self._extend(prompt_ids)

    def propose(self, context: Sequence[int], k: int, rng: np.random.Generator) -> Draft:
        self._sync(context)
        if k <= 0:
            return NO_DRAFT
        tokens = self.tokens
        for n in range(min(self.max_ngram, len(tokens)), self.min_ngram - 1, -1):
            follow = self.index[n].get(tuple(tokens[-n:]))
            if follow is not None:
                return Draft(tokens=tokens[follow : follow + k], source=n)
        return NO_DRAFT

    def observe(self, context: Sequence[int], accepted: int) -> None:
        # ``propose`` catches the index up with the context: a round whose planner does not
        # ask for a proposal (a plain round beside a load) costs nothing here.
        pass

    def _sync(self, context: Sequence[int]) -> None:
        known = len(self.tokens)
        if len(context) >= known and (known == 0 or context[known - 1] == self.tokens[-1]):
            self._extend(context[known:])
        else:  # the context is not an extension of what we indexed: start over
            self.reset()
            self._extend(context)

    def _extend(self, new_tokens: Sequence[int]) -> None:
        tokens, index, low, high = self.tokens, self.index, self.min_ngram, self.max_ngram
        for token in new_tokens:
            # Every n-gram ending at the current last token is now followed by ``token``.
            end = len(tokens)
            longest = tuple(tokens[end - high : end]) if end >= high else tuple(tokens)
            for n in range(low, len(longest) + 1):
                index[n][longest[-n:]] = end
            tokens.append(int(token))


def _build(context: DrafterContext) -> LookupDrafter:
    return LookupDrafter(max_ngram=context.option("max_ngram", 3), min_ngram=context.option("min_ngram", 1))
