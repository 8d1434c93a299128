"""The held-out score: how far a trained drafter's greedy chains run along the target's own
greedy answers to a fixed set of prompts, measured without running the engine.

Terms (positions as in ``verispec.drafters.head``): a round's *anchor* s is the position of
its last committed token x_s (the previous round's bonus); the target's features h_0 ..
h_{s-1} are known, h_s is not. From there the drafter drafts x_{s+1} .. x_{s+k} greedily,
exactly as it does at run time (``chain``):

- head: the first draft reads its output at s, from h_{s-1} and x_s, attending to its cache
  of the positions before (each from the target's features); every later draft reads its
  own previous output and its own previous draft, attending to that cache and to its own
  drafted positions;
- block: one pass from the anchor over the target's features of the ``window`` positions
  before it, at most block_size - 1 drafts.

A greedy draft is the argmax of drafting's own bfloat16 logits (``SharedTarget.draft_logits``),
ties to the lowest id, as a request at temperature 0 drafts. Draft position d (0-based) is
*offered* at an anchor when drafts 0 .. d - 1 there were all accepted (equal to the target's
tokens) and the sequence has a token at s + d + 1 (a response cut at its length limit lets
its last token be drafted, as a request asking for one more token would); it is *accepted*
when the draft equals that token. So accepted[d] / offered[d] is the acceptance at d given
that the chain reached d: the a_d of ``rounds.expected_tokens_positional``, and the score's
expected tokens per round is that formula at k.

Its sampled arm (``sampled_acceptance``) scores a drafter served at a temperature T > 0: along
the target's answers sampled at T, the rule's chance of accepting each draft position,
sum min(p, q), with the drafter's earlier drafts set to the answer's tokens. Greedy chains
along greedy answers rank a head trained on sampled answers far below one trained on greedy
ones, while served at T = 1 it drafts better: each arm judges the temperature it scores.

The eval corpus (``eval_corpus``): the target's greedy (or sampled, seeded) answers to the eval
prompts and its hidden states (float32, what the drafter reads at run time) at the drafter's
layers, cached in the data directory's ``eval`` folder keyed by the target's weights, the
prompts, the answer length and the temperature.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from verispec import rounds
from verispec.drafters.block import BlockNet
from verispec.drafters.head import HeadNet
from verispec.drafters.layers import SharedTarget
from verispec.train import data
from verispec.train.loop import TrainError

EvalPrompt = tuple[str, list[dict[str, str]]]  # (category, chat messages ending in a user turn)
EVAL_TOKENS = 128  # the longest answer per eval prompt
EVAL_K = 8  # draft positions scored
NOT_DRAFTED = -1  # a chain's entry past the point where it was no longer computed


def default_eval_prompts() -> list[EvalPrompt]:
    """The eval prompts a training run scores on when given none: ``sources.eval_prompts()``,
    52 dev-like prompts over Spec-Bench's 13 categories, written for verispec."""
    from verispec.train.sources import eval_prompts

    return eval_prompts()


@dataclass(frozen=True)
class HeldOutScore:
    """Offered and accepted counts per draft position over ``anchors`` anchors (see above); the
    sampled arm's accepted are expected counts (``sampled_acceptance``)."""

    offered: tuple[int, ...]
    accepted: tuple[float, ...]

    @property
    def anchors(self) -> int:
        return self.offered[0] if self.offered else 0

    @property
    def per_position(self) -> list[float]:
        """a_d: the acceptance at draft position d given the chain reached it."""
        return rounds.per_position_acceptance(self.accepted, self.offered)

    @property
    def first_acceptance(self) -> float:
        return self.per_position[0] if self.offered else 0.0

    @property
    def expected_tokens(self) -> float:
        """Expected tokens per round at k = len(offered): 1 + a_1 + a_1 a_2 + ..."""
        return rounds.expected_tokens_positional(self.per_position)

    def as_dict(self) -> dict[str, Any]:
        return {
            "k": len(self.offered),
            "anchors": self.anchors,
            "first_acceptance": round(self.first_acceptance, 4),
            "expected_tokens": round(self.expected_tokens, 4),
            "per_position": [round(a, 4) for a in self.per_position],
            "offered": list(self.offered),
            "accepted": [a if isinstance(a, int) else round(a, 2) for a in self.accepted],
        }


def all_anchors(corpus: data.Corpus) -> torch.Tensor:
    """(A,) global positions of every anchor a run would start a round at: from the prompt's
    last token (the first round's) to the one before the sequence's last."""
    sequence = corpus.sequence_of()
    local = torch.arange(len(corpus.tokens)) - corpus.starts[sequence]
    first = torch.clamp(corpus.prompt_lengths - 1, min=1)[sequence]
    return torch.nonzero((local >= first) & (local <= corpus.lengths[sequence] - 2)).flatten()


# One draft step of a walk along a sequence: (step, alive rows, the drafter's outputs there
# (a, D), the positions drafted for (a,)) -> (the tokens it goes on from (a,), which rows go on).
Choose = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
# Per sequence: (its tokens, its anchors' rows among all anchors) -> its Choose.
MakeChoose = Callable[[torch.Tensor, torch.Tensor], Choose]


@torch.inference_mode()
def _walk(
    net: torch.nn.Module, shared: SharedTarget, corpus: data.Corpus, anchors: torch.Tensor, k: int, make: MakeChoose
) -> None:
    """Run the drafter from every anchor, sequence by sequence, as it drafts at run time, each
    step's outputs handed to that sequence's ``make(...)`` choose."""
    if corpus.hidden is None:
        raise ValueError("scoring needs the corpus's hidden states")
    sequence_of = corpus.sequence_of()[anchors]
    for index in torch.unique(sequence_of).tolist():
        rows = torch.nonzero(sequence_of == index).flatten()
        start, length = int(corpus.starts[index]), int(corpus.lengths[index])
        tokens = corpus.tokens[start : start + length]
        features = corpus.hidden[start : start + length].to(torch.float32)
        local = anchors[rows] - start
        choose = make(tokens, rows)
        if isinstance(net, HeadNet):
            _head_walk(net, shared, tokens, features, int(corpus.prompt_lengths[index]), local, k, choose)
        elif isinstance(net, BlockNet):
            _block_walk(net, shared, tokens, features, local, k, choose)
        else:
            raise TypeError(f"cannot score a {type(net).__name__}: a HeadNet or a BlockNet")


def _steps(net: torch.nn.Module, k: int) -> int:
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return min(k, net.config.block_size - 1) if isinstance(net, BlockNet) else k  # one block's drafts at most


def chains(
    net: torch.nn.Module,
    shared: SharedTarget,
    corpus: data.Corpus,
    k: int,
    anchors: torch.Tensor | Sequence[int] | None = None,
    whole: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The greedy chains of k drafts the drafter drafts from each anchor (global positions;
    default ``all_anchors``): (anchors (A,), drafts (A, k) token ids). Unless ``whole``, a
    chain is computed only as far as it is scored (to its first wrong draft or the
    sequence's end) and NOT_DRAFTED after that; a block drafts at most block_size - 1."""
    k = _steps(net, k)
    anchors = _checked_anchors(corpus, anchors)
    drafts = torch.full((len(anchors), k), NOT_DRAFTED, dtype=torch.long)

    def make(tokens: torch.Tensor, rows: torch.Tensor) -> Choose:
        def choose(
            step: int, alive: torch.Tensor, outputs: torch.Tensor, where: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor]:
            token = _greedy(net, shared, outputs)
            drafts[rows[alive], step] = token
            return token, _goes_on(token, where, tokens, whole)

        return choose

    _walk(net, shared, corpus, anchors, k, make)
    return anchors, drafts


def sampled_acceptance(
    net: torch.nn.Module,
    shared: SharedTarget,
    corpus: data.Corpus,
    k: int,
    target_probs: Callable[[torch.Tensor], torch.Tensor],
    temperature: float = 1.0,
    anchors: torch.Tensor | Sequence[int] | None = None,
) -> HeldOutScore:
    """The sampled arm: expected acceptance per draft position along the corpus's answers
    (sampled at ``temperature``, as requests at that temperature are served).

    At each anchor and draft position d where the sequence has a token, the drafter's
    distribution q_d (softmax of drafting's logits at ``temperature`` over its draft vocabulary,
    as it samples at run time) after drafting the answer's own tokens at the positions before,
    against the target's p_d there (``target_probs(tokens)``: (L, V), row j the distribution of
    token j + 1): the chance the rule accepts a draft of q_d is sum_x min(p_d(x), q_d(x)).
    ``accepted[d]`` is its sum over the anchors, ``offered[d]`` their number, so
    ``per_position`` is its mean. Exact at d = 0 (the rule's acceptance at a round's first
    draft); later positions condition on the answer's tokens, standing in for the accepted
    drafts (distributed min(p, q) / sum, not p), and the expected tokens multiply the
    positions' means as if independent. Where the earlier drafts were the answer's tokens
    (accepted), a later position's term is the rule's chance there exactly."""
    if not temperature > 0:
        raise ValueError(f"the sampled arm scores a temperature > 0, got {temperature}")
    k = _steps(net, k)
    anchors = _checked_anchors(corpus, anchors)
    offered = torch.zeros(k, dtype=torch.long)
    accepted = torch.zeros(k, dtype=torch.float64)

    def make(tokens: torch.Tensor, rows: torch.Tensor) -> Choose:
        p = target_probs(tokens)[:, shared.vocab_ids].to(torch.float64)  # (L, N): q is zero elsewhere
        length = len(tokens)

        def choose(
            step: int, alive: torch.Tensor, outputs: torch.Tensor, where: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor]:
            # Every ``where`` holds a token: anchors end 2 before the sequence, and a chain
            # goes on only where the next position exists.
            q = torch.softmax(shared.draft_logits(net.logits_input(outputs)).double() / temperature, -1)  # type: ignore[operator]
            offered[step] += len(where)
            accepted[step] += torch.minimum(p[where - 1], q).sum()
            # The next draft goes on from the answer's own token.
            return tokens[where], where + 1 < length

        return choose

    _walk(net, shared, corpus, anchors, k, make)
    return HeldOutScore(tuple(int(n) for n in offered), tuple(float(a) for a in accepted))


def target_distributions(model: Any, temperature: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """tokens (L,) -> (L, V) float32: the target's softmax at ``temperature`` after each position
    (no top-p, top-k or penalties: the settings the sampled answers were made with)."""

    @torch.inference_mode()
    def probs(tokens: torch.Tensor) -> torch.Tensor:
        logits = model(input_ids=tokens.unsqueeze(0)).logits[0].to(torch.float32)
        return torch.softmax(logits / temperature, dim=-1)

    return probs


def chain_acceptance(
    net: torch.nn.Module,
    shared: SharedTarget,
    corpus: data.Corpus,
    k: int,
    anchors: torch.Tensor | Sequence[int] | None = None,
) -> HeldOutScore:
    """Offered and accepted counts per draft position of the drafter's greedy chains from
    ``anchors`` (default: every anchor of every sequence) against the corpus's tokens."""
    anchors, drafts = chains(net, shared, corpus, k, anchors)
    k = drafts.shape[1]
    ends = (corpus.starts + corpus.lengths)[corpus.sequence_of()[anchors]]  # one past each sequence
    targets = anchors.unsqueeze(1) + torch.arange(1, k + 1)  # (A, k) positions drafted for
    exists = targets < ends.unsqueeze(1)
    right = exists & (drafts == corpus.tokens[targets.clamp_max(len(corpus.tokens) - 1)])
    # Offered at d: a token exists there and every earlier draft was right.
    reached = torch.cat([torch.ones(len(anchors), 1, dtype=torch.bool), right[:, :-1].cummin(dim=1).values], dim=1)
    offered = (reached & exists).sum(0)
    accepted = (reached & right).sum(0)
    return HeldOutScore(tuple(int(n) for n in offered), tuple(int(n) for n in accepted))


def _checked_anchors(corpus: data.Corpus, anchors: torch.Tensor | Sequence[int] | None) -> torch.Tensor:
    every = all_anchors(corpus)
    if anchors is None:
        return every
    chosen = torch.as_tensor(anchors, dtype=torch.long).flatten()
    outside = chosen[~torch.isin(chosen, every)]
    if len(outside):
        raise ValueError(
            f"positions {outside[:5].tolist()} are no anchors: a round starts from the prompt's last token "
            "(position 1 at least) up to the one before a sequence's last"
        )
    return chosen


def _goes_on(token: torch.Tensor, where: torch.Tensor, tokens: torch.Tensor, whole: bool) -> torch.Tensor:
    """(a,) bool: which chains the next draft position is scored for: all of them when
    ``whole``, else those whose draft at ``where`` is right and whose sequence goes on past it."""
    if whole:
        return torch.ones_like(token, dtype=torch.bool)
    length = len(tokens)
    return (where + 1 < length) & (token == tokens[where.clamp_max(length - 1)])


def _greedy(net: torch.nn.Module, shared: SharedTarget, outputs: torch.Tensor) -> torch.Tensor:
    """(..., D) outputs -> (...,) the token ids a greedy request drafts from them."""
    return shared.vocab_ids[shared.draft_logits(net.logits_input(outputs)).argmax(-1)]  # type: ignore[operator]


def _head_walk(
    net: HeadNet,
    shared: SharedTarget,
    tokens: torch.Tensor,
    features: torch.Tensor,
    prompt_length: int,
    anchors: torch.Tensor,
    k: int,
    choose: Choose,
) -> None:
    """One sequence's walk from its anchors (local positions)."""
    window = net.config.window
    # The run-time cache: filled from the target's features, from the first round's window
    # on (its first catch-up starts window - 1 positions before the prompt's last token).
    first = max(1, prompt_length - window)
    positions = torch.arange(first, len(tokens))
    outputs, committed = net(net.target_features(features[positions - 1]), shared.embed(tokens[positions]), positions)
    alive = torch.arange(len(anchors))
    current = outputs[anchors - first]  # (A, D): the output at each anchor, as catch-up leaves it
    drafted: list[list[tuple[torch.Tensor, torch.Tensor]]] = []  # per step, per layer (keys, values)
    for step in range(k):
        where = anchors[alive] + step + 1  # the position this draft is for
        token, keep = choose(step, alive, current, where)
        if step + 1 == k or not bool(keep.any()):
            break
        alive, token, where = alive[keep], token[keep], where[keep]
        drafted = [[(keys[keep], values[keep]) for keys, values in layers] for layers in drafted]
        # Keys: the cache's committed positions up to the anchor (later ones are the future:
        # their positions are set past the query so the window mask hides them), then the drafts.
        anchor = anchors[alive].unsqueeze(1)
        key_positions = torch.where(positions <= anchor, positions, torch.iinfo(torch.long).max // 2)
        drafted_positions = anchor + torch.arange(1, step + 1)
        all_positions = torch.cat([key_positions, drafted_positions], 1)
        past = []
        for layer, (keys, values) in enumerate(committed):
            parts_k = [keys.expand(len(alive), *keys.shape)] + [d[layer][0] for d in drafted]
            parts_v = [values.expand(len(alive), *values.shape)] + [d[layer][1] for d in drafted]
            past.append((torch.cat(parts_k, 1), torch.cat(parts_v, 1), all_positions))
        # The head's own output stands in for the target's feature, its draft for the token.
        out, new = net(current[keep].unsqueeze(1), shared.embed(token).unsqueeze(1), where.unsqueeze(1), past)
        drafted.append(new)
        current = out[:, 0]


def _block_walk(
    net: BlockNet,
    shared: SharedTarget,
    tokens: torch.Tensor,
    features: torch.Tensor,
    anchors: torch.Tensor,
    k: int,
    choose: Choose,
) -> None:
    """One sequence's walk, k <= block_size - 1: each anchor's block in one pass, its slots
    handed on as far as they are scored (the logits cost most)."""
    # Only the positions some anchor's window reaches (a long prompt's start is read by none).
    positions = torch.arange(max(0, int(anchors.min()) - net.config.window), int(anchors.max()))
    context = net.context_keys(features[positions], positions)
    outputs = net(shared.embed(tokens[anchors]), anchors, context, positions)  # (A, B - 1, D)
    alive = torch.arange(len(anchors))
    for step in range(k):
        _, keep = choose(step, alive, outputs[alive, step], anchors[alive] + step + 1)
        alive = alive[keep]
        if not len(alive):
            break


def eval_corpus(
    model: Any,
    tokenizer: Any,
    eos_ids: Sequence[int],
    prompts: Sequence[EvalPrompt],
    layers: tuple[int, ...],
    data_dir: Path,
    fingerprint: str,
    max_new_tokens: int = EVAL_TOKENS,
    stage: Callable[[str, int], Callable[[int, str], None]] | None = None,
    answer: Callable[[list[list[int]], int], list[list[int]]] | None = None,
    temperature: float = 0.0,
) -> tuple[data.Corpus, float]:
    """The target's answers to ``prompts`` with its float32 hidden states at ``layers``, from
    the cache in ``data_dir`` or made (and cached) now; and the seconds spent making them (0
    from the cache). ``answer(prompt ids, max new tokens)``: the answers (``shards.answer_prompts``
    on the native target, many sequences a pass), greedy or sampled at ``temperature`` (the
    sampled arm's answers: seeded, so the same every run); None: ``model.generate`` in
    batches, greedy only."""
    if not prompts:
        raise ValueError("no eval prompts to score on")
    if temperature < 0:
        raise ValueError(f"the eval answers' temperature must be >= 0, got {temperature}")
    if temperature > 0 and answer is None:
        raise TrainError(
            f"sampled eval answers (temperature {temperature}) come from the native target, which did not load"
        )
    how = "native" if answer is not None else "generate"
    text = json.dumps({"target": fingerprint, "prompts": list(prompts), "tokens": max_new_tokens, "eval": "v1"})
    text += "" if answer is None else how  # answers made another way: another cache entry
    text += "" if temperature == 0 else f"T={temperature}"
    key = hashlib.sha256(text.encode()).hexdigest()[:16]
    started, made = time.perf_counter(), False
    data_dir = data_dir / "eval"  # apart from the training sets, which the directory's readers list
    path = data_dir / f"sequences-{key}.safetensors"
    corpus = data.load_corpus(path, key)
    if corpus is None:
        encoded = [data.encode_conversation(tokenizer, list(messages)) for _, messages in prompts]
        # A target with a short context scores on the prompts that leave room for an answer.
        context = int(getattr(model.config, "max_position_embeddings", 0) or 0)
        if context:
            encoded = [ids for ids in encoded if len(ids) + max_new_tokens <= context]
            if not encoded:
                raise TrainError(
                    f"no eval prompt fits the target's context of {context} tokens with {max_new_tokens} to answer"
                )
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos_ids)
        # Every prompt answered: a token budget no batch of answers can reach.
        settings = data.DataSettings(tokens=len(encoded) * max_new_tokens + 1, max_new_tokens=max_new_tokens)
        update = stage("target answers the eval prompts", settings.tokens - 1) if stage else None
        progress = (lambda done, total: update(done, "")) if update else None
        if answer is not None:
            pairs = list(zip(encoded, answer(encoded, max_new_tokens), strict=True))
        else:
            pairs = data.generate_responses(model, encoded, settings, list(eos_ids), int(pad), progress)
        corpus = data.Corpus.from_sequences(pairs)
        data.save_corpus(corpus, path, key)
        made = True
    corpus.hidden = data.load_hidden_layers(data_dir, key, layers, int(model.config.hidden_size))
    if corpus.hidden is None:
        corpus.hidden = data.hidden_states(model, corpus, layers, dtype=torch.float32)
        data.save_hidden(corpus.hidden, data.hidden_path(data_dir, key, layers), key)
        made = True
    return corpus, time.perf_counter() - started if made else 0.0
