"""What the two trained drafters (``head``, ``block``) share: config parsing, the decoder
stack under each net's own input parts, loading from a weights directory, and the drafting
side (reading the target's hidden states, ``begin`` and ``observe``, the propose-and-draw loop).

Terms: a trained drafter reads the target's hidden states at committed positions, which the
target keeps from its own passes (``hidden_capture``); ``known`` counts the committed
positions whose states the drafter has read: after prefill and after each verify, every
position but the pending last token. A draft position is one token to propose; the drafter
computes its hidden vector (D,), which the target's LM head, restricted to the draft
vocabulary, turns into draft logits (N,) and those into the row q the token is drawn from
(``SharedTarget.draw``).

Trees (drafter option ``draft_branches``, default 1): with ``branches`` b > 1,
``propose_tree(context, k)`` drafts k positions as ``propose`` does and offers at each b
candidates, the chain's token and b - 1 alternatives beside it (greedy: the next-best draft
logits; sampled: drawn without replacement from the position's row), all from the same
drafter call, so an alternative costs a verify row and no drafting. The nodes are listed
position by position (``DraftTree``); the planner verifies the first k of them at a fixed k,
and under ``--k auto`` those that pay (``Governor.tree``).

What differs stays in the drafters' modules: what a net reads and how it runs
(``_positions``: the draft logits of the draft positions, in order), and what state it
keeps of the committed positions (``_add``, ``reset``).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn

from verispec.accept import sample_index
from verispec.drafters import weights
from verispec.drafters.base import (
    DEFAULT_MIN_CONFIDENCE,
    NO_DRAFT,
    Draft,
    DrafterContext,
    DrafterError,
    check_confidence,
)
from verispec.drafters.layers import DecoderLayer, RMSNorm, SharedTarget
from verispec.sampling import SamplingParams
from verispec.targets.base import HiddenCapture

Config = TypeVar("Config", bound="NetConfig")


class NetConfig:
    """Base of the frozen dataclasses that shape a trained net (``HeadConfig``, ``BlockConfig``).

    Each declares the fields below (hidden: the target's hidden size D; window: how many
    positions back the drafter reads) and ``layers_read``, the target hidden-state indices it
    reads (0 = embeddings, the number of layers = the final normed state). The fields are
    the subclasses' own, so their order in ``config.json`` stays as each declares it.
    """

    kind: ClassVar[str]  # the drafter's registered name, for error messages
    hidden: int
    draft_vocab: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    window: int
    rope_theta: float

    @property
    def layers_read(self) -> tuple[int, ...]:
        raise NotImplementedError

    @classmethod
    def from_dict(cls: type[Config], values: dict[str, Any]) -> Config:
        """The config a ``config.json`` "net" section describes; a DrafterError if it does not fit."""
        try:
            return cls(**values)
        except TypeError as error:
            raise DrafterError(f"bad {cls.kind} config {values}: {error}") from error


class TrainedNet(nn.Module, Generic[Config]):
    """The trainable part of a trained drafter: each net's own input parts, then ``layers``
    decoder layers, an output norm, and the draft vocabulary ``vocab_ids`` (N,) as a buffer.
    A subclass names the class of its config (``config_class``) and adds its input parts
    (``_add_inputs``)."""

    config_class: type[NetConfig]

    def __init__(self, config: Config, vocab_ids: torch.Tensor) -> None:
        super().__init__()
        self.config = config
        # The net's own parts first: parameters are created, and a seeded initialisation
        # draws them, in this order, so a seeded training run stays reproducible.
        self._add_inputs()
        self.layers = nn.ModuleList(
            DecoderLayer(
                config.hidden, config.heads, config.kv_heads, config.head_dim, config.intermediate, config.rope_theta
            )
            for _ in range(config.layers)
        )
        self.out_norm = RMSNorm(config.hidden)
        self.register_buffer("vocab_ids", vocab_ids.to(torch.long))

    def _add_inputs(self) -> None:
        """Register the parts that bring the net's inputs to the decoder layers."""
        raise NotImplementedError

    def logits_input(self, outputs: torch.Tensor) -> torch.Tensor:
        """What the shared LM head reads: the outputs (..., D), normed."""
        return self.out_norm(outputs)


Net = TypeVar("Net", bound=TrainedNet[Any])
Trained = TypeVar("Trained", bound="TrainedDrafter[Any]")


class TrainedDrafter(Generic[Net]):
    """The Drafter part both trained drafters share. A subclass sets ``name`` and the class of
    its net (``net_class``), supplies ``_positions`` (the draft positions' draft logits) and
    ``_add`` (taking in the target's states of committed positions), and extends ``reset``
    with its own state."""

    name: str
    net_class: type[Net]
    pure_proposals = False  # a draw moves the drafter's own cache
    # Candidates a drafted position offers (drafter option ``draft_branches``): 1 drafts chains;
    # more draft trees whose alternatives cost verify rows only, no drafter call (``_branch``).
    branches = 1

    @classmethod
    def load(
        cls: type[Trained],
        target: Any,
        directory: Path,
        min_confidence: float = DEFAULT_MIN_CONFIDENCE,
        **options: Any,
    ) -> Trained:
        """A drafter for ``target`` from a weights directory (checked against the target);
        ``options``: the subclass's own (the head's ``kernels``)."""
        net_class = cls.net_class
        net, shared = weights.load_net(
            directory,
            cls.name,
            target,
            lambda config, vocab_ids: net_class(net_class.config_class.from_dict(config), vocab_ids),
            lambda net: net.config.layers_read,
        )
        return cls(net, shared, target, min_confidence, **options)

    @classmethod
    def from_context(cls: type[Trained], context: DrafterContext) -> Trained:
        """The drafter a registry context asks for: weights from its ``drafter_weights`` option
        (default: the ones shipped for the embedded model), its ``min_confidence`` floor."""
        directory = weights.weights_dir(context.option("drafter_weights"), cls.name)
        min_confidence = context.option("min_confidence", DEFAULT_MIN_CONFIDENCE)
        branches = check_branches(context.option("draft_branches", 1))  # before the weights load
        drafter = cls.load(context.target, directory, min_confidence, **cls.context_options(context))
        drafter.branches = branches
        return drafter

    @classmethod
    def context_options(cls, context: DrafterContext) -> dict[str, Any]:
        """The subclass's own options from a registry context (default: none)."""
        return {}

    def __init__(
        self, net: Net, shared: SharedTarget, target: Any, min_confidence: float = DEFAULT_MIN_CONFIDENCE
    ) -> None:
        self.net = net.eval()
        self.min_confidence = check_confidence(min_confidence)
        self.shared = shared
        self.target = target
        config = net.config
        self.hidden_capture = HiddenCapture(config.layers_read, prefill_rows=config.window)
        self.prompt: list[int] = []
        self.params = SamplingParams()
        self.reset()

    def reset(self) -> None:
        self.known = 0  # committed positions whose target states have been read
        # (states, rows, first position) of verify passes since the last propose, taken in
        # there: a round that does not draft (the governor's plain rounds) copies nothing.
        self.pending: list[tuple[torch.Tensor, int, int]] = []
        self.pending_rows = 0

    def fork(self: Trained, target: Any) -> Trained:
        """The same net and shared weights, reading ``target``'s hidden states; ``reset``
        rebinds every piece of request state, so nothing else is shared."""
        twin = copy.copy(self)
        twin.target = target
        twin._unshare()
        twin.reset()
        return twin

    def _unshare(self) -> None:
        """Give a fork its own copy of any state ``reset`` clears in place (default: none)."""

    @torch.inference_mode()
    def begin(self, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        self.reset()
        self.prompt, self.params = list(prompt_ids), params
        self.known = len(prompt_ids) - 1  # prefill ran over all but the pending token
        rows = min(self.known, self.net.config.window)
        hidden = self._states(rows)
        self._add(hidden[hidden.shape[0] - rows :].to(torch.float32), self.known - rows)

    def propose(self, context: Sequence[int], k: int, rng: np.random.Generator) -> Draft:
        return self._draft(context, k, rng, None)

    def propose_tree(self, context: Sequence[int], k: int, rng: np.random.Generator) -> Draft:
        """A tree of k drafted positions, each offering up to ``branches`` candidates (the
        chain's token first), listed position by position (``DraftTree``); its main chain is
        the chain ``propose`` would draft with the same generator where ``branches`` is 1."""
        return self._draft(context, k, rng, DraftTree() if self.branches > 1 else None)

    def _draft(self, context: Sequence[int], k: int, rng: np.random.Generator, tree: DraftTree | None) -> Draft:
        n = len(context) - 1  # position of the last committed token (the pending one)
        if k <= 0 or self.known < 1 or self.known != n:
            return NO_DRAFT  # no target state yet (a one-token prompt's first round)
        output_ids = list(context[len(self.prompt) :])
        tokens: list[int] = []
        rows = []
        with torch.inference_mode():
            self._take_pending()
            for logits in self._positions(context, n, k, tokens):
                drawn = self.shared.draw(
                    logits, self.params, self.prompt, output_ids + tokens, float(rng.random()), self.min_confidence
                )
                if drawn is None:
                    break  # unsure: stop drafting here
                token, row = drawn  # drawn from exactly the row reported (None: a point mass)
                if tree is not None:
                    self._branch(tree, logits, token, row, self.branches, rng)
                tokens.append(token)
                if row is not None:
                    rows.append(row)
        if tree is not None:
            return tree.draft(self.params.greedy)
        # Greedy draws report point masses (no rows); a mix would fail Draft's row count.
        return Draft(tokens=tokens, probs=np.stack(rows) if rows else None) if tokens else NO_DRAFT

    def _branch(
        self,
        tree: DraftTree,
        logits: torch.Tensor,
        token: int,
        row: NDArray[np.float64] | None,
        count: int,
        rng: np.random.Generator,
    ) -> None:
        """Add a drafted position's candidates to ``tree``: the chain's ``token`` (drawn from
        ``row``) and up to ``count - 1`` alternatives beside it, siblings that continue the
        same parent. Greedy: the next-highest draft logits (point masses). Sampled: each drawn
        from ``row`` without the candidates before it, renormalised, and reported with that
        row (what ``accept_tree`` asks of siblings drawn without replacement); none once the
        row has no mass left.

        Frequencies (the drafter's estimate that the target continues with a candidate; the
        governor sizes the tree from them) come from the plain softmax (T = 1, no filters).
        Greedy: each candidate's own probability. Sampled: the i-th candidate gets the i-th
        largest probability, whichever token it drew, because the nodes verified must not
        depend on the tokens drawn (a draft offered or withheld for its value is no longer
        distributed as the row reported for it); the governor then keeps a prefix of each
        position's siblings, as ``accept_tree`` needs of siblings drawn without replacement."""
        plain = torch.softmax(logits.double(), dim=-1)
        if self.params.greedy:
            ranked = torch.topk(plain, min(count + 1, plain.shape[-1]))
            candidates = self.shared.vocab_ids[ranked.indices].tolist()
            chances = dict(zip(candidates, ranked.values.tolist(), strict=True))
            slot = int(self.shared.label_index[token])
            parent = tree.add(token, None, chances.get(token, float(plain[slot]) if slot >= 0 else 0.0), chain=True)
            for other in [t for t in candidates if t != token][: count - 1]:
                tree.add(other, None, chances[other], parent=parent)
            return
        assert row is not None  # sampled draws report their rows
        by_rank = torch.topk(plain, min(count, plain.shape[-1])).values.tolist()
        parent = tree.add(token, row, by_rank[0], chain=True)
        # A drafted row's mass lies in the draft vocabulary (its other entries are exact zeros),
        # so the draws run on its N entries and each reported row is scattered back to V.
        vocab = self.shared.vocab_np
        rest, taken = row[vocab], int(self.shared.label_index[token])
        for rank in range(1, count):
            rest = rest.copy()
            rest[taken] = 0.0
            total = rest.sum()
            if total <= 0.0:
                return  # the row's whole support is on offer already
            rest /= total
            taken = sample_index(rest, float(rng.random()))
            reported = np.zeros_like(row)
            reported[vocab] = rest
            tree.add(int(vocab[taken]), reported, by_rank[rank], parent=parent)

    def observe(self, context: Sequence[int], accepted: int) -> None:
        fresh = len(context) - 1 - self.known
        if fresh > 0:  # rows 0..accepted of the last verify: the newly committed positions
            self.pending.append((self._states(fresh), fresh, self.known))  # the pass's own tensor: no copy
            self.pending_rows += fresh
            self.known += fresh
            # Neither drafter reads states more than a window back: older passes can go.
            while self.pending_rows - self.pending[0][1] > self.net.config.window + 1:
                self.pending_rows -= self.pending.pop(0)[1]

    def _take_pending(self) -> None:
        """Take in the states that verify passes left since the last propose, in order."""
        for hidden, fresh, first in self.pending:
            self._add(hidden[:fresh].to(torch.float32), first)
        self.pending, self.pending_rows = [], 0

    # --- what each drafter supplies ----------------------------------------------------

    def _positions(self, context: Sequence[int], n: int, k: int, tokens: list[int]) -> Iterator[torch.Tensor]:
        """The draft logits (N,) of draft positions n + 1, n + 2, ... (at most k), each
        computed when the previous one's token has been drawn and appended to ``tokens``."""
        raise NotImplementedError

    def _add(self, states: torch.Tensor, first_position: int) -> None:
        """Take in the target's states (rows, F) of committed positions from ``first_position``."""
        raise NotImplementedError

    # --- internals -------------------------------------------------------------------

    def _states(self, rows: int) -> torch.Tensor:
        """The hidden states of the target's last pass, checked to hold at least ``rows`` rows."""
        hidden = self.target.last_hidden
        if hidden is None or hidden.shape[0] < rows:
            got = 0 if hidden is None else hidden.shape[0]
            raise RuntimeError(f"the {self.name} drafter needs {rows} hidden-state rows from the target, got {got}")
        states: torch.Tensor = hidden
        return states


def check_branches(value: object) -> int:
    """A ``draft_branches`` option: an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DrafterError(f"draft_branches is an integer >= 1 (1: chains), got {value!r}")
    return value


class DraftTree:
    """A trained drafter's tree as ``propose_tree`` builds it: per drafted position the chain's
    candidate, then its alternatives (siblings: the same parent). Nodes are listed parents
    first, position by position, so every prefix of the list is a tree (``Draft.parents``)."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.rows: list[NDArray[np.float64] | None] = []
        self.parents: list[int] = []
        self.frequencies: list[float] = []
        self.chain_end = -1  # the chain's last node: the next position's parent

    def add(
        self,
        token: int,
        row: NDArray[np.float64] | None,
        frequency: float,
        parent: int | None = None,
        chain: bool = False,
    ) -> int:
        """Append a node (a chain node continues the chain; an alternative takes ``parent``);
        returns its parent."""
        parent = self.chain_end if chain or parent is None else parent
        self.tokens.append(token)
        self.rows.append(row)
        self.parents.append(parent)
        self.frequencies.append(frequency)
        if chain:
            self.chain_end = len(self.tokens) - 1
        return parent

    def draft(self, greedy: bool) -> Draft:
        """The tree as a Draft: greedy, point masses; sampled, each node's row."""
        if not self.tokens:
            return NO_DRAFT
        probs = None
        if not greedy:
            rows = [row for row in self.rows if row is not None]
            assert len(rows) == len(self.tokens), "a sampled tree reports every node's row"
            probs = np.stack(rows)
        return Draft(self.tokens, probs, None, self.parents, self.frequencies)
