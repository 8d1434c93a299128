"""Exact hand cases and refusals of the reference rule (accept.py)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from verispec.accept import (
    RuleInputError,
    accept_chain,
    accept_chain_rows,
    accept_greedy,
    accept_step,
    acceptance_probability,
    residual,
    sample_index,
)

P = np.array([0.45, 0.35, 0.20])
Q = np.array([0.10, 0.80, 0.10])


def test_accept_iff_u_times_q_below_p():
    # Token 1: p/q = 0.35/0.8 = 0.4375. Just below accepts, just above rejects.
    assert accept_step(P, 1, Q, 0.4374, 0.0).accepted
    rejected = accept_step(P, 1, Q, 0.4376, 0.0)
    assert not rejected.accepted
    # Token 0: p/q > 1, accepted for every uniform.
    assert accept_step(P, 0, Q, 0.999999, 0.5) == accept_step(P, 0, Q, 0.0, 0.5)
    assert accept_step(P, 0, Q, 0.999999, 0.5).token == 0


def test_rejection_draws_from_the_residual():
    # max(0, p - q) = [0.35, 0, 0.10], normalised [0.7778, 0, 0.2222].
    assert accept_step(P, 1, Q, 0.9, 0.0).token == 0
    assert accept_step(P, 1, Q, 0.9, 0.7777).token == 0
    assert accept_step(P, 1, Q, 0.9, 0.7779).token == 2
    assert accept_step(P, 1, Q, 0.9, 0.999999).token == 2


def test_point_mass_draft_is_accepted_with_probability_p_and_residual_excludes_it():
    assert accept_step(P, 1, None, 0.3499, 0.0).accepted
    rejected = accept_step(P, 1, None, 0.3501, 0.5)
    assert not rejected.accepted
    # Residual = p without token 1: [0.45, 0, 0.20] / 0.65; u = 0.5 -> 0.325 < 0.45 -> token 0.
    assert rejected.token == 0
    assert accept_step(P, 1, None, 0.3501, 0.70).token == 2


def test_acceptance_probability_is_the_rules_threshold():
    # The uniform at which accept_step flips is the probability; 0 where q(x) = 0.
    assert acceptance_probability(P, 1, Q) == pytest.approx(0.4375)
    assert acceptance_probability(P, 0, Q) == 1.0
    assert acceptance_probability(P, 2, None) == pytest.approx(0.20)
    assert acceptance_probability(P, 2, np.array([0.5, 0.5, 0.0])) == 0.0
    for x, q in [(1, Q), (2, None)]:
        a = acceptance_probability(P, x, q)
        assert accept_step(P, x, q, a - 1e-9, 0.0).accepted and not accept_step(P, x, q, a + 1e-9, 0.0).accepted
    with pytest.raises(RuleInputError):
        acceptance_probability(P, 3, None)


def test_acceptance_probability_on_checked_rows_skips_only_the_row_checks():
    for x, q in [(0, Q), (1, Q), (2, None), (2, np.array([0.5, 0.5, 0.0]))]:
        assert acceptance_probability(P, x, q, check_rows=False) == acceptance_probability(P, x, q)
    with pytest.raises(RuleInputError):  # unchecked: a row that does not sum to 1 passes ...
        acceptance_probability(2 * P, 1, None)
    assert acceptance_probability(2 * P, 1, None, check_rows=False) == 0.7
    with pytest.raises(RuleInputError):  # ... but a token outside the vocabulary never does
        acceptance_probability(P, 3, None, check_rows=False)


def test_zero_draft_probability_is_rejected_without_nan():
    q = np.array([0.5, 0.5, 0.0])
    step = accept_step(P, 2, q, 0.0, 0.99)
    assert not step.accepted
    assert step.token == 2  # residual max(0, p - q) = [0, 0, 0.2]


def test_residual_without_mass_falls_back_to_p_and_never_a_zero_token():
    p = np.array([0.5, 0.5, 0.0])
    q = np.array([0.5 + 1e-13, 0.5 - 1e-13, 0.0])
    assert residual(p, 0, q) is p
    step = accept_step(p, 0, q, 1 - 1e-15, 0.75)  # u * q[0] > p[0]: rejected
    assert not step.accepted
    assert step.token == 1  # drawn from p itself, u = 0.75


def test_sample_index_never_picks_zero_weight():
    weights = np.array([0.0, 0.3, 0.0, 0.7, 0.0])
    for u in [0.0, 0.1, 0.2999, 0.3, 0.5, 0.999999999999]:
        assert weights[sample_index(weights, u)] > 0
    assert sample_index(weights, 0.0) == 1
    assert sample_index(weights, np.nextafter(1.0, 0.0)) == 3


def dense_draw(weights, u):
    cdf = np.cumsum(weights)
    index = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    return index if index < len(weights) else int(np.flatnonzero(weights)[-1])


@given(
    support=st.lists(st.integers(0, 199), min_size=1, max_size=40, unique=True),
    masses=st.lists(st.floats(1e-12, 1.0), min_size=40, max_size=40),
    u=st.floats(0.0, 1.0, exclude_max=True),
)
def test_sparse_and_point_mass_rows_draw_what_the_dense_search_draws(support, masses, u):
    # Rows with mass on few tokens (greedy's one-hot, top-k, residuals) are searched over their
    # support alone; the token must be the one the inverse CDF over all 200 entries gives.
    weights = np.zeros(200)
    weights[support] = masses[: len(support)]
    for value in (u, np.nextafter(1.0, 0.0)):
        assert sample_index(weights, value) == dense_draw(weights, value)


def test_chain_stops_at_first_rejection_in_the_middle():
    p = np.array([[0.6, 0.4], [0.1, 0.9], [0.6, 0.4], [0.5, 0.5]])
    drafts = np.array([0, 0, 0])
    # position 0: 0.5 * 1 < 0.6 accept; position 1: 0.5 < 0.1? reject, residual [0, 0.9] -> 1;
    # position 2 would accept (0.5 < 0.6): a chain that continued would report 2 or 3.
    u = np.array([0.5, 0.3, 0.5, 0.3, 0.5, 0.3, 0.5])
    result = accept_chain(p, drafts, None, u)
    assert (result.accepted, result.token, result.uniforms_used) == (1, 1, 4)


def test_chain_all_accepted_takes_bonus_from_last_row():
    p = np.array([[1.0, 0.0], [1.0, 0.0], [0.25, 0.75]])
    result = accept_chain(p, np.array([0, 0]), None, np.array([0.9, 0.9, 0.9, 0.9, 0.2]))
    assert (result.accepted, result.token, result.uniforms_used) == (2, 0, 5)
    result = accept_chain(p, np.array([0, 0]), None, np.array([0.9, 0.9, 0.9, 0.9, 0.3]))
    assert result.token == 1


def test_chain_with_no_drafts_is_a_plain_step():
    result = accept_chain(np.array([[0.2, 0.8]]), np.array([], dtype=np.int64), None, np.array([0.5]))
    assert (result.accepted, result.token, result.uniforms_used) == (0, 1, 1)


def test_temperature_zero_is_accept_iff_argmax_else_argmax():
    rng = np.random.default_rng(0)
    for _ in range(200):
        vocab, k = 6, 3
        argmaxes = rng.integers(0, vocab, size=k + 1)
        p = np.eye(vocab)[argmaxes]
        drafts = rng.integers(0, vocab, size=k)
        q = np.eye(vocab)[drafts]
        result = accept_chain(p, drafts, q, rng.random(2 * k + 1))
        expected = 0
        while expected < k and drafts[expected] == argmaxes[expected]:
            expected += 1
        assert result.accepted == expected
        assert result.token == argmaxes[expected]


def draft_rows(vocab, drafts, kinds, masses):
    """Draft rows of the kinds the engine sees: point masses (None), a row with mass on the
    draft (rounded to sum slightly over 1: q[x] may exceed 1 by the rows' tolerance), and a
    row that gives the draft no mass (a contradiction the rule rejects)."""
    rows = np.zeros((len(drafts), vocab))
    for i, (x, kind, mass) in enumerate(zip(drafts, kinds, masses, strict=True)):
        if kind == "over":
            rows[i, x] = 1.0 + 5e-6
        elif kind == "none":
            rows[i, (x + 1) % vocab] = 1.0
        else:
            rows[i, x] = mass
            rows[i, (x + 1) % vocab] += 1.0 - mass
    return rows


@given(
    vocab=st.integers(2, 6),
    k=st.integers(0, 5),
    seed=st.integers(0, 2**32 - 1),
    kinds=st.lists(st.sampled_from(["point", "spread", "over", "none"]), min_size=5, max_size=5),
    near_one=st.booleans(),
)
def test_greedy_verdict_is_the_rules_on_one_hot_rows(vocab, k, seed, kinds, near_one):
    # accept_greedy must return accept_chain's verdict on the one-hot rows, uniforms used
    # included: drafts often equal to the argmax, point-mass and spread draft rows, a draft row
    # over 1 at the draft with uniforms just below 1 (the rule then rejects the argmax and
    # resamples it), a row without mass at the draft.
    rng = np.random.default_rng(seed)
    targets = rng.integers(0, vocab, size=k + 1)
    drafts = np.where(rng.random(k) < 0.7, targets[:k], rng.integers(0, vocab, size=k))
    u = np.full(2 * k + 1, np.nextafter(1.0, 0.0)) if near_one else rng.random(2 * k + 1)
    one_hot = np.eye(vocab)[targets]
    rows = [None, draft_rows(vocab, drafts, kinds[:k], rng.uniform(0.05, 1.0, size=k))]
    for q in rows if k > 0 else rows[:1]:
        verdict = accept_chain(one_hot, drafts, q, u)
        assert accept_greedy(targets, drafts, q, u, vocab) == verdict
        # Lists of Python numbers (as the engine passes them) take a path of their own.
        assert accept_greedy(targets.tolist(), drafts.tolist(), q, u.tolist(), vocab) == verdict


@given(
    vocab=st.integers(2, 6),
    k=st.integers(0, 5),
    seed=st.integers(0, 2**32 - 1),
    kinds=st.lists(st.sampled_from(["point", "spread", "over", "none"]), min_size=5, max_size=5),
    agree=st.floats(0.0, 1.0),
)
def test_rows_on_demand_give_the_rules_verdict_reading_only_up_to_the_rejection(vocab, k, seed, kinds, agree):
    # accept_chain_rows must return accept_chain's verdict, uniforms used included, asking for
    # rows 0..j in order where the chain stops at j (the bonus row k when every draft survives).
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(vocab, 0.5), size=k + 1)
    p[rng.random(k + 1) < 0.3] = np.eye(vocab)[0]  # some one-hot rows: certain rejections and acceptances
    drafts = np.where(rng.random(k) < agree, p[:k].argmax(axis=1), rng.integers(0, vocab, size=k))
    u = rng.random(2 * k + 1)
    rows = [None, draft_rows(vocab, drafts, kinds[:k], rng.uniform(0.05, 1.0, size=k))]
    for q in rows if k > 0 else rows[:1]:
        asked: list[int] = []

        def row(i, asked=asked):
            asked.append(i)
            return p[i]

        result = accept_chain_rows(row, drafts, q, u, vocab)
        assert result == accept_chain(p, drafts, q, u)
        assert asked == list(range(result.accepted + 1))


def test_rows_on_demand_are_checked_as_they_are_read():
    good, bad = np.array([0.0, 1.0]), np.array([0.5, 0.6])
    # Draft 0 is rejected at row 0 (p[0] = 0), so the bad row 1 is never read ...
    assert accept_chain_rows([good, bad].__getitem__, [0], None, [0.5, 0.5, 0.5], vocab=2).accepted == 0
    # ... and refused once the chain reaches it.
    with pytest.raises(RuleInputError, match="sum to 1"):
        accept_chain_rows([good, bad].__getitem__, [1], None, [0.5, 0.5, 0.5], vocab=2)
    with pytest.raises(RuleInputError, match="3 entries, the vocabulary 2"):
        accept_chain_rows(lambda i: np.array([0.0, 1.0, 0.0]), [1], None, [0.5, 0.5, 0.5], vocab=2)
    with pytest.raises(RuleInputError, match="take 3 uniforms"):
        accept_chain_rows([good, good].__getitem__, [1], None, [0.5, 0.5], vocab=2)


def test_greedy_verdict_refuses_what_the_rule_refuses():
    one = np.array([0.5, 0.5, 0.5])
    with pytest.raises(RuleInputError, match="outside the vocabulary"):
        accept_greedy([0, 1], [2], None, one, vocab=2)
    with pytest.raises(RuleInputError, match="needs k \\+ 1"):
        accept_greedy([0], [0], None, one, vocab=2)
    with pytest.raises(RuleInputError, match="uniforms"):
        accept_greedy([0, 1], [0], None, np.array([0.5, 1.0, 0.5]), vocab=2)
    with pytest.raises(RuleInputError, match="draft_probs has shape"):
        accept_greedy([0, 1], [0], np.array([[0.5, 0.5, 0.0]]), one, vocab=2)
    with pytest.raises(RuleInputError, match="NaN or inf"):
        accept_greedy([0, 1], [0], np.array([[np.nan, 0.5]]), one, vocab=2)
    with pytest.raises(RuleInputError, match="ids"):
        accept_greedy([0.5, 1.0], [0], None, one, vocab=2)
    # The same refusals where the uniforms (and ids) are lists of Python numbers.
    for bad in (1.0, -0.1, float("nan")):
        with pytest.raises(RuleInputError, match="uniforms must lie in"):
            accept_greedy([0, 1], [0], None, [0.5, bad, 0.5], vocab=2)
    with pytest.raises(RuleInputError, match="take 3 uniforms"):
        accept_greedy([0, 1], [0], None, [0.5, 0.5], vocab=2)
    with pytest.raises(RuleInputError, match="outside the vocabulary"):
        accept_greedy([0, 2], [0], None, [0.5, 0.5, 0.5], vocab=2)
    with pytest.raises(RuleInputError, match="outside the vocabulary"):
        accept_greedy([0, 1], [-1], None, [0.5, 0.5, 0.5], vocab=2)


@pytest.mark.parametrize(
    ("p", "drafts", "q", "u", "message"),
    [
        ([[0.5, 0.5], [0.5, 0.5]], [0], None, [0.5, 1.0, 0.5], "uniforms"),
        ([[0.5, 0.5], [0.5, 0.5]], [0], None, [-0.1, 0.5, 0.5], "uniforms"),
        ([[0.5, 0.5], [0.5, 0.5]], [0], None, [np.nan, 0.5, 0.5], "uniforms"),
        ([[np.nan, 0.5], [0.5, 0.5]], [0], None, [0.5, 0.5, 0.5], "NaN or inf"),
        ([[0.5, 0.5], [0.5, 0.5]], [0], [[np.inf, 0.0]], [0.5, 0.5, 0.5], "NaN or inf"),
        ([[0.5, 0.6], [0.5, 0.5]], [0], None, [0.5, 0.5, 0.5], "sum to 1"),
        ([[0.0, 0.0], [0.5, 0.5]], [0], None, [0.5, 0.5, 0.5], "no mass"),
        ([[0.5, 0.5], [0.5, 0.5]], [2], None, [0.5, 0.5, 0.5], "outside the vocabulary"),
        ([[0.5, 0.5], [0.5, 0.5]], [-1], None, [0.5, 0.5, 0.5], "outside the vocabulary"),
        ([[0.5, 0.5]], [0], None, [0.5, 0.5, 0.5], "needs k \\+ 1"),
        ([[0.5, 0.5], [0.5, 0.5]], [0], [[0.5, 0.5, 0.0]], [0.5, 0.5, 0.5], "draft_probs has shape"),
        ([[0.5, 0.5], [0.5, 0.5]], [0], None, [0.5, 0.5], "take 3 uniforms"),
        ([[1.5, -0.5], [0.5, 0.5]], [0], None, [0.5, 0.5, 0.5], "negative"),
    ],
)
def test_refusals_name_the_problem(p, drafts, q, u, message):
    with pytest.raises(RuleInputError, match=message):
        accept_chain(np.array(p), np.array(drafts), None if q is None else np.array(q), np.array(u))


def test_step_refusals():
    with pytest.raises(RuleInputError, match="outside the vocabulary"):
        accept_step(P, 3, Q, 0.5, 0.5)
    with pytest.raises(RuleInputError, match="shape"):
        accept_step(P, 0, Q[:2] / Q[:2].sum(), 0.5, 0.5)
    with pytest.raises(RuleInputError, match="uniforms"):
        accept_step(P, 0, Q, 0.5, 1.5)


def test_same_uniforms_same_tokens():
    rng = np.random.default_rng(7)
    p = rng.dirichlet(np.ones(50), size=5)
    q = rng.dirichlet(np.ones(50), size=4)
    drafts = np.array([int(rng.choice(50, p=row)) for row in q])
    u = rng.random(9)
    assert accept_chain(p, drafts, q, u) == accept_chain(p.copy(), drafts.copy(), q.copy(), u.copy())


def test_long_rows_running_sums_are_numpys_bit_for_bit():
    # Long rows take torch's scan where torch is loaded (``_running_sums``): the same
    # left-to-right float64 sums as NumPy's cumsum, so every draw is the one it gave.
    import torch  # noqa: F401  (loaded, as in the engine's processes)

    from verispec.accept import TORCH_SCAN_FROM, _running_sums

    rng = np.random.default_rng(3)
    for size in (TORCH_SCAN_FROM, 8192, 49152):
        weights = np.exp(rng.standard_normal(size) * 4)
        weights /= weights.sum()
        np.testing.assert_array_equal(_running_sums(weights), np.cumsum(weights))
        frozen = weights.copy()
        frozen.flags.writeable = False  # copied, not handed to torch (which warns on these)
        np.testing.assert_array_equal(_running_sums(frozen), np.cumsum(weights))
        np.testing.assert_array_equal(_running_sums(weights[::2]), np.cumsum(weights[::2]))  # a strided view
        for u in rng.random(200):
            assert sample_index(weights, float(u)) == dense_draw(weights, float(u))
