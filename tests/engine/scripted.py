"""Test drafters with known behaviour, behind the real Drafter protocol."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from verispec.drafters.base import NO_DRAFT, Draft
from verispec.drafters.head import HeadDrafter
from verispec.drafters.model import ModelDrafter
from verispec.sampling import SamplingParams, final_distribution


class ScriptDrafter:
    """Proposes the continuation of ``script`` (a full token sequence) after the context,
    as point masses: with the target's own greedy output as script, every draft is right."""

    name = "script"
    hidden_capture = None
    pure_proposals = False

    def __init__(self, script: Sequence[int]) -> None:
        self.script = list(script)

    def begin(self, prompt_ids, params: SamplingParams) -> None:
        pass

    def propose(self, context, k, rng) -> Draft:
        n = len(context)
        if list(context) != self.script[:n]:
            return NO_DRAFT
        return Draft(tokens=self.script[n : n + k])

    def observe(self, context, accepted) -> None:
        pass

    def reset(self) -> None:
        pass


class GreedyButReportsSoftmax(ModelDrafter):
    """A known peer bug: drafts the argmax of the draft model but reports its softmax as q."""

    name = "greedy-reports-softmax"

    def propose(self, context, k, rng) -> Draft:
        self._trim(context)
        fresh = list(context[len(self.cached) :])
        row = self.draft.verify(fresh)[-1]
        self.cached.extend(fresh)
        output = list(context[len(self.prompt) :])
        tokens, rows = [], []
        for i in range(k):
            probs = final_distribution(row, self.params, self.prompt, output + tokens)
            token = int(np.argmax(probs))  # the bug: not sampled from probs
            tokens.append(token)
            rows.append(probs)
            if i + 1 < k:
                row = self.draft.verify([token])[-1]
                self.cached.append(token)
        return Draft(tokens=tokens, probs=np.stack(rows))


class WrongThenRightDrafter(ScriptDrafter):
    """Wrong at greedy (each token of the target's continuation plus one) while the context
    is shorter than ``switch``, right after it; ``pure`` sets ``pure_proposals``, which lets
    the governor shadow it."""

    name = "wrong-then-right"

    def __init__(self, script, vocab_size: int, switch: int, pure: bool) -> None:
        super().__init__(script)
        self.vocab_size, self.switch, self.pure_proposals = vocab_size, switch, pure

    def propose(self, context, k, rng) -> Draft:
        n = len(context)
        right = self.script[n : n + k]
        return Draft(tokens=right if n >= self.switch else [(t + 1) % self.vocab_size for t in right])


class SiblingsReportTheirParentsRow(HeadDrafter):
    """A mutant head for a negative control: its sampled alternatives are drawn without
    replacement, as the real head's, but reported with the position's whole row, as if drawn
    i.i.d. from it; the tree rule then removes too little mass after each rejection."""

    def _branch(self, tree, logits, token, row, count, rng) -> None:
        first = len(tree.tokens)
        super()._branch(tree, logits, token, row, count, rng)
        for node in range(first + 1, len(tree.tokens)):
            tree.rows[node] = row
