"""The batched torch rule gives the same tokens as the reference on the same uniforms."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from verispec.accept import RuleInputError, accept_chain
from verispec.accept_batched import accept_chain_batched


def _reference(p, drafts, q, u):
    results = [accept_chain(p[b], drafts[b], None if q is None else q[b], u[b]) for b in range(p.shape[0])]
    return (
        np.array([r.accepted for r in results]),
        np.array([r.token for r in results]),
        np.array([r.uniforms_used for r in results]),
    )


def _batched(p, drafts, q, u):
    result = accept_chain_batched(
        torch.from_numpy(p),
        torch.from_numpy(drafts),
        None if q is None else torch.from_numpy(q),
        torch.from_numpy(u),
    )
    return result.accepted.numpy(), result.token.numpy(), result.uniforms_used.numpy()


def _case(seed, batch, k, vocab, point_mass, sharp):
    rng = np.random.default_rng(seed)
    alpha = np.full(vocab, 0.05 if sharp else 1.0)
    p = rng.dirichlet(alpha, size=(batch, k + 1))
    if point_mass:
        q = None
        # Draft the target's likely tokens half the time so chains get long.
        drafts = np.where(rng.random((batch, k)) < 0.5, p[:, :k].argmax(-1), rng.integers(0, vocab, (batch, k)))
    else:
        # Drafts near the target so that some chains survive several positions.
        q = 0.7 * p[:, :k] + 0.3 * rng.dirichlet(alpha, size=(batch, k))
        drafts = np.array([[rng.choice(vocab, p=q[b, i] / q[b, i].sum()) for i in range(k)] for b in range(batch)])
    return p, drafts.astype(np.int64), q, rng.random((batch, 2 * k + 1))


@pytest.mark.parametrize("point_mass", [False, True])
@pytest.mark.parametrize("k", [0, 1, 3, 8])
def test_same_tokens_as_reference(k, point_mass):
    p, drafts, q, u = _case(seed=k, batch=300, k=k, vocab=40, point_mass=point_mass, sharp=False)
    ref = _reference(p, drafts, q, u)
    got = _batched(p, drafts, q, u)
    for a, b in zip(ref, got, strict=True):
        np.testing.assert_array_equal(a, b)
    if k:
        assert 0 < ref[0].mean() < k  # the case exercises both rejections and survivals


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    k=st.integers(0, 5),
    vocab=st.integers(1, 12),
    point_mass=st.booleans(),
    sharp=st.booleans(),
)
def test_same_tokens_property(seed, k, vocab, point_mass, sharp):
    p, drafts, q, u = _case(seed, batch=16, k=k, vocab=vocab, point_mass=point_mass, sharp=sharp)
    for a, b in zip(_reference(p, drafts, q, u), _batched(p, drafts, q, u), strict=True):
        np.testing.assert_array_equal(a, b)


def test_one_hot_rows_are_greedy():
    vocab, k, batch = 7, 4, 64
    rng = np.random.default_rng(3)
    argmaxes = rng.integers(0, vocab, (batch, k + 1))
    drafts = np.where(rng.random((batch, k)) < 0.7, argmaxes[:, :k], rng.integers(0, vocab, (batch, k)))
    p = np.eye(vocab)[argmaxes]
    accepted, token, _ = _batched(p, drafts, np.eye(vocab)[drafts], rng.random((batch, 2 * k + 1)))
    for b in range(batch):
        expected = 0
        while expected < k and drafts[b, expected] == argmaxes[b, expected]:
            expected += 1
        assert accepted[b] == expected and token[b] == argmaxes[b, expected]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda p, d, q, u: (p, d, q, u.clone().fill_(1.0)), "uniforms"),
        (lambda p, d, q, u: (p.clone().fill_(float("nan")), d, q, u), "NaN or inf"),
        (lambda p, d, q, u: (p * 2, d, q, u), "sum to 1"),
        (lambda p, d, q, u: (p, d + 100, q, u), "outside the vocabulary"),
        (lambda p, d, q, u: (p, d, q[:, :, :5], u), "draft_probs must be"),
        (lambda p, d, q, u: (p, d.float(), q, u), "draft_tokens must be integer"),
        (lambda p, d, q, u: (p, d, q, u[:, :-1]), "uniforms must be"),
    ],
)
def test_batched_refusals(mutate, message):
    p, drafts, q, u = _case(seed=1, batch=4, k=2, vocab=10, point_mass=False, sharp=False)
    args = mutate(torch.from_numpy(p), torch.from_numpy(drafts), torch.from_numpy(q), torch.from_numpy(u))
    with pytest.raises(RuleInputError, match=message):
        accept_chain_batched(*args)
