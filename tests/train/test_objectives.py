"""The head's objective: soft labels are the target's distribution where the head predicts,
and the feature regression adds its own term. A made-up target whose LM head rows are unit
vectors, so a final state of c * e_j puts (nearly) all of the target's mass on token j."""

import pytest
import torch

from verispec.drafters.head import HeadConfig, HeadNet
from verispec.drafters.layers import SharedTarget
from verispec.train.data import Corpus
from verispec.train.objectives import HeadObjective

DIM, VOCAB = 16, 12


def made_up(final_of: str) -> tuple[HeadNet, SharedTarget, Corpus]:
    """A corpus of 3 sequences whose stored final state at position t points at the token
    at t + 1 (``final_of`` "next", as the target's states do) or at t itself ("same": states
    one position late, the misalignment the objective must not make)."""
    generator = torch.Generator().manual_seed(0)
    sequences = []
    for _ in range(3):
        tokens = torch.randint(VOCAB, (40,), generator=generator).tolist()
        sequences.append((tokens[:6], tokens[6:]))
    corpus = Corpus.from_sequences(sequences)
    shift = 1 if final_of == "next" else 0
    pointed = torch.roll(corpus.tokens, -shift)  # the token each position's final state names
    corpus.hidden = 40.0 * torch.eye(DIM)[pointed]  # one layer read: the final state alone
    shared = SharedTarget(torch.randn(VOCAB, DIM, generator=generator), torch.eye(DIM)[:VOCAB], torch.arange(VOCAB))
    torch.manual_seed(0)
    config = HeadConfig(hidden=DIM, feature_layer=1, draft_vocab=VOCAB, heads=2, kv_heads=1, head_dim=8,
                        intermediate=32, window=8)  # fmt: skip
    return HeadNet(config, torch.arange(VOCAB)), shared, corpus


def loss(final_of: str, distill: float = 0.0, feature_loss: float = 0.0, unroll: int = 2) -> float:
    net, shared, corpus = made_up(final_of)
    objective = HeadObjective(net, shared, corpus, 4, 8, unroll, seed=3, distill=distill, feature_loss=feature_loss)
    with torch.no_grad():
        return float(objective.step(0).loss)


def test_the_soft_labels_are_the_targets_distribution_where_the_head_predicts():
    # The target's distribution at t is one-hot on x_{t+1} up to exp(-40): soft labels then
    # give the hard labels' loss. States read one position off would name x_t instead.
    hard = loss("next")
    assert loss("next", distill=1.0) == pytest.approx(hard, rel=1e-4)
    assert loss("next", distill=0.5) == pytest.approx(hard, rel=1e-4)
    assert abs(loss("same", distill=1.0) - hard) > 0.05 * hard


def test_the_feature_regression_adds_its_own_weighted_term():
    base = loss("next")
    one, two = loss("next", feature_loss=1.0) - base, loss("next", feature_loss=2.0) - base
    assert one > 0.1  # the untrained head's normed outputs are far from 40 * e_j
    assert two == pytest.approx(2 * one, rel=1e-4)


@pytest.mark.parametrize("distill, feature_loss", [(-0.1, 0.0), (1.5, 0.0), (0.0, -1.0)])
def test_bad_weights_are_refused(distill, feature_loss):
    net, shared, corpus = made_up("next")
    with pytest.raises(ValueError, match="distill"):
        HeadObjective(net, shared, corpus, 4, 8, 1, seed=0, distill=distill, feature_loss=feature_loss)
