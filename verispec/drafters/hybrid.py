"""``hybrid``: ``suffix`` where the text has repeated itself, the trained ``head`` elsewhere.

SuffixDecoding's hybrid with a learnt drafter: a copying drafter is nearly free and drafts
long where the request (or an earlier one) holds what follows, but has nothing good to say
in fresh prose; a trained head drafts everywhere, a token or two deep, at the cost of its
layers. Each round the hybrid first asks ``suffix`` (a pure read of its stores, tens of
microseconds). Where that proposal is strong (a match of at least ``hybrid_min_match``
tokens whose first token followed at least ``hybrid_min_frequency`` of its occurrences) it
is the round's draft, up to k tokens; otherwise the head drafts, at most ``hybrid_head_k``
tokens. Both observe every round: the suffix document and cache stay in step, and the head
takes in the verify passes' states (a round drafted by ``suffix`` is to the head a round it
did not draft, whose states it catches up on at its next proposal).

Exactness: which drafter drafts depends on the committed context alone, never on a draw,
so each round's draft is distributed exactly as the row it reports (a ``suffix`` draft is a
point mass, a head draft carries its q rows); the rule then keeps the output the target's.
With ``hybrid_extend`` (default 0) a head draft goes on with suffix's strong continuation of
the context and the head's tokens: each copied token is a point mass given the tokens
before it, which the rule judges position by position, so a draft whose length depends on
the head's draw is still exact (the whole-engine arm "hybrid-extend" checks it sampled).

A proposal's source is ("suffix", suffix's own source) or "head", so a governor keeps its
acceptance estimates apart for the two. Proposals are pure (``pure_proposals``): suffix's
walk is a read, and the head's proposal only takes in committed positions' states (its
drafted positions are dropped at its next proposal), so the governor decides k with the
proposal in hand, per source, as it does for ``suffix``. A head proposal is not cheap (its
layers: ~10% of a plain step on 2 cores); ``cheap_next`` tells the planner which kind the
next one is, so plain rounds ask for suffix's always and for the head's as the governor's
shadow budget allows. Under ``--k auto`` the governor also overrides the routing where its
estimates say so: a strong suffix proposal from a source that does not pay in this request
gives way to the head's (``propose_fallback``) where the head's would pay. The head's
acceptance is its own, not the prompt's (``steady_sources``): its estimate pools the
engine's memory of it with the request's rounds, where a moving average of a few rounds
kept dipping below break-even at its ~0.43.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from verispec.drafters import head, suffix
from verispec.drafters.base import NO_DRAFT, Draft, DrafterContext, DrafterError, check_fraction
from verispec.sampling import SamplingParams
from verispec.targets.base import HiddenCapture

DEFAULT_MIN_MATCH = 2
DEFAULT_MIN_FREQUENCY = 0.5
DEFAULT_HEAD_K = 1
DEFAULT_EXTEND = 0  # suffix tokens a head proposal may go on with (0: none)
HEAD_SOURCE = "head"


class HybridDrafter:
    name = "hybrid"
    pure_proposals = True  # see the module docstring
    # The head's acceptance is its own (a governor pools its estimate with the engine's
    # memory of it), suffix's the prompt's; the head is what a declined suffix proposal
    # falls back to (``propose_fallback``).
    steady_sources = (HEAD_SOURCE,)
    fallback_source = HEAD_SOURCE

    def __init__(
        self,
        copier: suffix.SuffixDrafter,
        learnt: head.HeadDrafter,
        *,
        min_match: int = DEFAULT_MIN_MATCH,
        min_frequency: float = DEFAULT_MIN_FREQUENCY,
        head_k: int = DEFAULT_HEAD_K,
        extend: int = DEFAULT_EXTEND,
    ) -> None:
        if isinstance(min_match, bool) or not isinstance(min_match, int) or min_match < 1:
            raise DrafterError(f"hybrid_min_match is an integer >= 1, got {min_match!r}")
        min_frequency = check_fraction(min_frequency, "hybrid_min_frequency")
        if isinstance(head_k, bool) or not isinstance(head_k, int) or head_k < 1:
            raise DrafterError(f"hybrid_head_k is an integer >= 1, got {head_k!r}")
        if isinstance(extend, bool) or not isinstance(extend, int) or extend < 0:
            raise DrafterError(f"hybrid_extend is an integer >= 0, got {extend!r}")
        self.copier, self.learnt = copier, learnt
        self.min_match, self.min_frequency, self.head_k = min_match, min_frequency, head_k
        self.extend = extend
        self.copied = 0  # proposals made by suffix, and by the head (for reports and tests)
        self.learnt_rounds = 0
        self.extended = 0  # head proposals that suffix's continuation extended
        self._peek: tuple[int, int, Draft | None] | None = None  # (len(context), k, strong suffix draft)

    @property
    def cache(self) -> suffix.SuffixCache:
        """The cross-request cache of ``suffix`` (the bench clears it between its passes)."""
        return self.copier.cache

    @property
    def hidden_capture(self) -> HiddenCapture:
        return self.learnt.hidden_capture

    def begin(self, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        self._peek = None
        self.copier.begin(prompt_ids, params)
        self.learnt.begin(prompt_ids, params)

    def cheap_next(self, context: Sequence[int], k: int) -> bool:
        """Whether ``propose(context, k)`` will be suffix's (nearly free) rather than the head's."""
        return k > 0 and self._copied(context, k) is not None

    def propose(self, context: Sequence[int], k: int, rng: np.random.Generator) -> Draft:
        if k <= 0:
            return NO_DRAFT
        copied = self._copied(context, k)
        if copied is not None:
            self.copied += 1
            return copied
        return self.propose_fallback(context, k, rng)

    def propose_fallback(self, context: Sequence[int], k: int, rng: np.random.Generator) -> Draft:
        """The head's proposal (at most ``head_k`` tokens), whatever suffix has: a governed
        round's draft where the governor would not draft suffix's (``RequestPlanner._routed``)."""
        if k <= 0:
            return NO_DRAFT
        drafted = self.learnt.propose(context, min(k, self.head_k), rng)
        self.learnt_rounds += 1
        if not drafted.tokens:
            return NO_DRAFT
        tokens, probs = list(drafted.tokens), drafted.probs
        room = min(k, len(tokens) + self.extend) - len(tokens)
        if room > 0:
            # Where suffix has a strong continuation of the head's draft, it follows: the head's
            # token taken, a copy is often right (a point mass given the tokens before it).
            more = self._strong(self.copier.propose_after(context, tokens, room))
            if more is not None:
                self.extended += 1
                if probs is not None:  # sampled: each copied token's row is its point mass
                    rows = np.zeros((len(more.tokens), probs.shape[1]), dtype=probs.dtype)
                    rows[np.arange(len(more.tokens)), more.tokens] = 1.0
                    probs = np.concatenate([probs, rows])
                tokens += more.tokens
        return Draft(tokens, probs, HEAD_SOURCE)

    def _copied(self, context: Sequence[int], k: int) -> Draft | None:
        """suffix's proposal of up to k tokens where it is strong (a match of at least
        ``min_match`` tokens, a first token that followed at least ``min_frequency`` of them),
        else None; kept for the same context and k (``cheap_next`` then ``propose``)."""
        if self._peek is not None and self._peek[:2] == (len(context), k):
            return self._peek[2]
        # suffix's drafts are deterministic (point masses): it draws nothing from a generator.
        found = self._strong(self.copier.propose(context, k, suffix.NO_DRAWS))
        self._peek = (len(context), k, found)
        return found

    def _strong(self, proposal: Draft) -> Draft | None:
        """suffix's latest proposal as the hybrid's where it is strong, else None."""
        copied = proposal.main_chain()
        walk = self.copier.last if copied.tokens else None
        first = copied.frequencies[0] if copied.frequencies else 0.0
        strong = walk is not None and walk.match >= self.min_match and first >= self.min_frequency
        return Draft(copied.tokens, None, (suffix.SuffixDrafter.name, copied.source)) if strong else None

    def observe(self, context: Sequence[int], accepted: int) -> None:
        self._peek = None
        self.copier.observe(context, accepted)
        self.learnt.observe(context, accepted)

    def reset(self) -> None:
        self._peek = None
        self.copier.reset()
        self.learnt.reset()

    def fork(self, target: Any) -> HybridDrafter:
        return HybridDrafter(
            self.copier.fork(target),
            self.learnt.fork(target),
            min_match=self.min_match,
            min_frequency=self.min_frequency,
            head_k=self.head_k,
            extend=self.extend,
        )


def _build(context: DrafterContext) -> HybridDrafter:
    for option in ("suffix_branches", "draft_branches"):  # read by the parts: refused here, not ignored
        if context.option(option, 1) != 1:
            raise DrafterError(f"the hybrid drafter drafts chains: {option} must be 1, got {context.option(option)!r}")
    return HybridDrafter(
        suffix._build(context),
        head._build(context),
        min_match=context.option("hybrid_min_match", DEFAULT_MIN_MATCH),
        min_frequency=context.option("hybrid_min_frequency", DEFAULT_MIN_FREQUENCY),
        head_k=context.option("hybrid_head_k", DEFAULT_HEAD_K),
        extend=context.option("hybrid_extend", DEFAULT_EXTEND),
    )
