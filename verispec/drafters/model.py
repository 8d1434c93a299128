"""``model``: a draft language model with the target's vocabulary.

It SAMPLES each draft from its own final distribution, computed by the same sampling
pipeline with the request's parameters and the draft position's own history, and reports
exactly that row as q; at temperature 0 the row is one-hot. Its KV cache is kept in step
with the committed tokens: positions that were not committed are rolled back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from verispec.accept import sample_index
from verispec.drafters.base import NO_DRAFT, Draft, DrafterContext, DrafterError
from verispec.sampling import SamplingParams, final_distribution
from verispec.targets.base import Target


class ModelDrafter:
    name = "model"
    hidden_capture = None
    pure_proposals = False  # a draw moves the draft model's cache

    def __init__(self, draft: Target, target: Target, draft_tokenizer: Any = None, target_tokenizer: Any = None):
        check_same_vocabulary(draft, target, draft_tokenizer, target_tokenizer)
        if not draft.supports_rollback:
            raise DrafterError(f"draft model {draft.name} cannot roll back its cache")
        self.draft = draft
        self.cached: list[int] = []  # tokens held in the draft model's cache
        self.prompt: list[int] = []
        self.params = SamplingParams()

    def begin(self, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        self.reset()
        self.prompt, self.params = list(prompt_ids), params

    def reset(self) -> None:
        self.draft.reset()
        self.cached = []

    def fork(self, target: object) -> None:
        return None  # one draft model, one cache: its requests take turns

    def propose(self, context: Sequence[int], k: int, rng: np.random.Generator) -> Draft:
        k = min(k, self.draft.context_length - len(context))
        if k <= 0:
            return NO_DRAFT
        self._trim(context)
        fresh = list(context[len(self.cached) :])  # at least the last committed token
        row = self.draft.verify(fresh)[-1]
        self.cached.extend(fresh)
        output = list(context[len(self.prompt) :])
        tokens: list[int] = []
        rows = []
        for i in range(k):
            probs = final_distribution(row, self.params, self.prompt, output + tokens)
            token = sample_index(probs, float(rng.random()))
            tokens.append(token)
            rows.append(probs)
            if i + 1 < k:
                row = self.draft.verify([token])[-1]
                self.cached.append(token)
        return Draft(tokens=tokens, probs=np.stack(rows))

    def observe(self, context: Sequence[int], accepted: int) -> None:
        self._trim(context)

    def _trim(self, context: Sequence[int]) -> None:
        """Roll the draft cache back to its longest prefix shared with context[:-1]."""
        limit = min(len(self.cached), len(context) - 1)
        cached = np.asarray(self.cached[:limit])
        differ = np.flatnonzero(cached != np.asarray(context[:limit]))
        keep = int(differ[0]) if differ.size else limit
        if keep < len(self.cached):
            self.draft.rollback(keep)
            del self.cached[keep:]


def check_same_vocabulary(draft: Target, target: Target, draft_tokenizer: Any, target_tokenizer: Any) -> None:
    """Refuse a draft model whose token ids mean something else than the target's."""
    if draft.vocab_size != target.vocab_size:
        raise DrafterError(
            f"draft model {draft.name} has a vocabulary of {draft.vocab_size} tokens but the target "
            f"{target.name} has {target.vocab_size}: a draft model must share the target's vocabulary"
        )
    both = draft_tokenizer is not None and target_tokenizer is not None
    if both and draft_tokenizer.get_vocab() != target_tokenizer.get_vocab():
        raise DrafterError(
            f"draft model {draft.name} and target {target.name} have the same vocabulary size but "
            "different tokenizers: token ids would not mean the same text"
        )


def _build(context: DrafterContext) -> ModelDrafter:
    draft = context.option("draft_target")
    if draft is None:
        raise DrafterError("the model drafter needs a draft model (--draft-model PATH)")
    return ModelDrafter(draft, context.target, context.option("draft_tokenizer"), context.tokenizer)
