"""The sampling pipeline: parameter validation, each filter, penalties per position."""

import numpy as np
import pytest
from scipy.special import softmax

from verispec.sampling import (
    InvalidParameterError,
    NonFiniteLogitsError,
    SamplingError,
    SamplingParams,
    final_distribution,
    final_distributions,
    final_rows,
    final_tokens,
)

LOGITS = np.log(np.array([0.5, 0.3, 0.15, 0.05]))


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": True}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"min_p": -0.1}, "min_p"),
        ({"min_p": 1.1}, "min_p"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"repetition_penalty": 5e-324}, "repetition_penalty"),
        ({"repetition_penalty": 1e3}, "repetition_penalty"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"seed": -1}, "seed"),
        ({"seed": 1.5}, "seed"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": [""]}, "stop"),
        ({"stop": [1]}, "stop"),
    ],
)
def test_invalid_parameters_name_the_field(kwargs, param):
    with pytest.raises(InvalidParameterError, match=param) as error:
        SamplingParams(**kwargs)
    assert error.value.param == param


def test_valid_parameters_are_normalised():
    params = SamplingParams(temperature=1, top_p=1, stop="END", seed=3, max_tokens=5)
    assert params.temperature == 1.0 and isinstance(params.temperature, float)
    assert params.stop == ("END",)
    assert not params.greedy and SamplingParams(temperature=0).greedy


def test_greedy_is_one_hot_at_argmax_with_lowest_id_on_ties():
    probs = final_distribution(LOGITS, SamplingParams(temperature=0))
    np.testing.assert_array_equal(probs, [1, 0, 0, 0])
    tie = final_distribution(np.array([0.0, 2.0, 2.0, 1.0]), SamplingParams(temperature=0, top_p=0.1))
    np.testing.assert_array_equal(tie, [0, 1, 0, 0])


@pytest.mark.parametrize("temperature", [0.3, 1.0, 1.7])
def test_plain_softmax_with_temperature(temperature):
    probs = final_distribution(LOGITS, SamplingParams(temperature=temperature))
    np.testing.assert_allclose(probs, softmax(LOGITS / temperature), rtol=1e-12)


def test_tiny_temperature_is_near_greedy_not_nan():
    for temperature in (1e-300, 5e-324):
        probs = final_distribution(LOGITS, SamplingParams(temperature=temperature))
        np.testing.assert_array_equal(probs, [1, 0, 0, 0])
    ties = final_distribution(np.array([1.0, 3.0, 3.0]), SamplingParams(temperature=1e-300))
    np.testing.assert_array_equal(ties, [0, 0.5, 0.5])


def test_top_k_keeps_the_k_largest():
    probs = final_distribution(LOGITS, SamplingParams(top_k=2))
    np.testing.assert_allclose(probs, [0.5 / 0.8, 0.3 / 0.8, 0, 0], rtol=1e-12)
    np.testing.assert_allclose(final_distribution(LOGITS, SamplingParams(top_k=10)), softmax(LOGITS))


def test_top_p_keeps_the_smallest_set_reaching_p():
    # Cumulative 0.5, 0.8, 0.95, 1.0: top_p 0.79 keeps two tokens, 0.81 keeps three.
    np.testing.assert_allclose(
        final_distribution(LOGITS, SamplingParams(top_p=0.79)), [0.5 / 0.8, 0.3 / 0.8, 0, 0], rtol=1e-9
    )
    three = final_distribution(LOGITS, SamplingParams(top_p=0.81))
    assert np.count_nonzero(three) == 3
    assert np.count_nonzero(final_distribution(LOGITS, SamplingParams(top_p=0.01))) == 1


@pytest.mark.parametrize("top_p", [0.3, 0.9, 0.99, 0.999999])
@pytest.mark.parametrize("sharpness", [0.3, 1.0, 4.0])
def test_top_p_on_a_large_vocabulary_matches_a_full_sort(top_p, sharpness):
    # The nucleus is found by sorting only the head of the distribution; the kept set must
    # be what sorting everything gives (flat rows make it grow past the first head).
    rng = np.random.default_rng(int(top_p * 1000) + int(sharpness * 10))
    logits = rng.normal(size=20_000) * sharpness
    probs = final_distribution(logits, SamplingParams(top_p=top_p))
    full = softmax(logits)
    order = np.argsort(-full, kind="stable")
    ahead = np.cumsum(full[order]) - full[order]
    expected = np.zeros_like(full)
    keep = order[ahead < top_p * full.sum()]
    expected[keep] = full[keep] / full[keep].sum()
    np.testing.assert_allclose(probs, expected, rtol=1e-9, atol=1e-15)


def test_min_p_is_relative_to_the_top_token():
    probs = final_distribution(LOGITS, SamplingParams(min_p=0.5))  # keep p >= 0.25
    np.testing.assert_allclose(probs, [0.5 / 0.8, 0.3 / 0.8, 0, 0], rtol=1e-12)


def test_filters_compose_in_order():
    probs = final_distribution(LOGITS, SamplingParams(top_k=3, top_p=0.9, temperature=1.0))
    # top_k 3 -> [.5, .3, .15]/.95; cumulative before: 0, .526, .842 < .9 -> all three stay.
    np.testing.assert_allclose(probs, [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0], rtol=1e-9)


def test_repetition_penalty_divides_positive_and_multiplies_negative():
    logits = np.array([2.0, -1.0, 0.5, 1.0])
    params = SamplingParams(temperature=1.0, repetition_penalty=2.0)
    got = final_distribution(logits, params, prompt_tokens=[0], output_tokens=[1])
    np.testing.assert_allclose(got, softmax([1.0, -2.0, 0.5, 1.0]), rtol=1e-12)


def test_presence_and_frequency_penalties_count_output_tokens():
    logits = np.zeros(4)
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    got = final_distribution(logits, params, prompt_tokens=[3], output_tokens=[1, 1, 2])
    np.testing.assert_allclose(got, softmax([0.0, -1.0, -0.75, 0.0]), rtol=1e-12)


def test_each_draft_position_uses_its_own_history():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4, 12))
    params = SamplingParams(temperature=0.8, repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.3)
    prompt, output, drafts = [1, 2, 3], [4, 4, 5], [5, 6, 4]
    rows = final_distributions(logits, params, prompt, output, drafts)
    for j in range(4):
        alone = final_distribution(logits[j], params, prompt, output + drafts[:j])
        np.testing.assert_array_equal(rows[j], alone)
    # One penalty vector for all positions (a known peer bug) would make rows 0 and 3 agree
    # on the drafted tokens' shares; they must not.
    shared = final_distribution(logits[3], params, prompt, output)
    assert not np.allclose(rows[3], shared)


def test_rows_sum_to_one_and_neg_inf_is_zero():
    logits = np.array([0.0, -np.inf, 1.0, -np.inf])
    probs = final_distribution(logits, SamplingParams(temperature=0.7, top_p=0.95))
    assert probs[1] == 0 and probs[3] == 0
    assert probs.sum() == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_and_inf_logits_are_refused(bad, dtype):
    logits = np.array([0.0, bad, 1.0], dtype=dtype)
    for params in (SamplingParams(temperature=0), SamplingParams(), SamplingParams(temperature=0, presence_penalty=1)):
        with pytest.raises(NonFiniteLogitsError):
            final_distribution(logits, params)


def test_greedy_reads_float32_logits_as_float64_would():
    # Greedy without penalties reads float32 logits as given: same one-hot rows (ties to the
    # lowest id) as from their float64 copy, float64 out, the input left untouched.
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((4, 300)).astype(np.float32)
    logits[2, [7, 90]] = logits[2].max() + 1.0  # a tie
    logits[3, :] = -np.inf
    logits[3, 5] = 0.0
    before = logits.copy()
    for params in (SamplingParams(temperature=0), SamplingParams(temperature=0, repetition_penalty=1.3)):
        fast = final_distributions(logits, params, [1, 2], [7], [4, 9, 1])
        slow = final_distributions(logits.astype(np.float64), params, [1, 2], [7], [4, 9, 1])
        assert fast.dtype == np.float64 and np.array_equal(fast, slow)
    assert np.argmax(final_distributions(logits, SamplingParams(temperature=0), [], [], [0, 0, 0])[2]) == 7
    assert np.array_equal(logits, before)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0),
        SamplingParams(temperature=0, repetition_penalty=1.3),
        SamplingParams(temperature=0, presence_penalty=0.8, frequency_penalty=0.5),
    ],
)
def test_greedy_tokens_are_the_one_hot_rows_hot_ids(params):
    # final_tokens is final_distributions' greedy rows by their hot index: ties to the lowest
    # id, penalties per row's own history (the drafts before it), float32 or float64 logits.
    rng = np.random.default_rng(5)
    for dtype in (np.float32, np.float64):
        logits = rng.standard_normal((6, 40)).astype(dtype)
        logits[1, [3, 30]] = logits[1].max() + 1.0  # a tie
        logits[4, :] = -np.inf
        logits[4, 9] = 0.0
        logits[:, 12] = logits.max() + 0.05  # repeated drafts: penalties move the argmax
        drafts = [12, 12, 12, 5, 12]
        tokens = final_tokens(logits, params, [1, 12], [12, 7], drafts)
        rows = final_distributions(logits, params, [1, 12], [12, 7], drafts)
        assert np.array_equal(tokens, rows.argmax(axis=1))
        assert tokens.dtype == np.int64


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_greedy_tokens_refuse_what_the_rows_refuse(dtype):
    greedy = SamplingParams(temperature=0)
    with pytest.raises(NonFiniteLogitsError):
        final_tokens(np.array([[0.0, np.nan]]), greedy, [], [], [])
    # Rows as long as a vocabulary's (argmax runs in vector blocks), the bad entry anywhere:
    # after the maximum, before it, in a later row, beside -inf; every row checked.
    for bad in (np.nan, np.inf):
        for at in (0, 5, 4097, 49151):
            logits = np.random.default_rng(at).standard_normal((3, 49152)).astype(dtype)
            logits[0, 100] = 50.0
            logits[2, :7] = -np.inf
            logits[2, at] = bad
            with pytest.raises(NonFiniteLogitsError, match="NaN or \\+inf"):
                final_tokens(logits, greedy, [], [], [1, 2])
            logits[2, at] = 0.0
            assert final_tokens(logits, greedy, [], [], [1, 2])[0] == 100
            logits[1, :] = -np.inf
            with pytest.raises(NonFiniteLogitsError, match="no finite"):
                final_tokens(logits, greedy, [], [], [1, 2])
    with pytest.raises(NonFiniteLogitsError, match="no finite"):
        final_tokens(np.full((1, 3), -np.inf), SamplingParams(temperature=0), [], [], [])
    with pytest.raises(SamplingError, match="draft tokens"):
        final_tokens(np.zeros((3, 3)), SamplingParams(temperature=0), [], [], [1])
    with pytest.raises(SamplingError, match="greedy"):
        final_tokens(np.zeros((1, 3)), SamplingParams(), [], [], [])


def test_all_neg_inf_is_refused():
    with pytest.raises(NonFiniteLogitsError, match="no finite"):
        final_distribution(np.full(3, -np.inf), SamplingParams())


def test_shape_and_history_errors():
    with pytest.raises(SamplingError, match="one row"):
        final_distribution(np.zeros((2, 3)), SamplingParams())
    with pytest.raises(SamplingError, match="draft tokens"):
        final_distributions(np.zeros((3, 3)), SamplingParams(), [], [], [1])
    with pytest.raises(SamplingError, match="outside the vocabulary"):
        final_distribution(np.zeros(3), SamplingParams(presence_penalty=1.0), [], [7])


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7, top_p=0.9),
        SamplingParams(temperature=1.3, top_k=5, min_p=0.01),
        SamplingParams(temperature=0.8, repetition_penalty=1.3, frequency_penalty=0.4),
        SamplingParams(temperature=0),
        SamplingParams(temperature=0, presence_penalty=0.8),
    ],
)
def test_rows_on_demand_are_the_distributions_rows(params):
    # final_rows(j) is final_distributions(...)[j] bit for bit, whichever rows are asked for
    # and in any order, each made once; float32 logits give the rows of their float64 copy.
    rng = np.random.default_rng(7)
    logits = (rng.standard_normal((5, 60)) * 3).astype(np.float32)
    logits[:, 12] = logits.max() + 0.05  # repeated drafts: penalties move mass
    drafts = [12, 12, 5, 12]
    rows = final_distributions(logits, params, [1, 12], [12, 7], drafts)
    assert np.array_equal(rows, final_distributions(logits.astype(np.float64), params, [1, 12], [12, 7], drafts))
    row = final_rows(logits, params, [1, 12], [12, 7], drafts)
    for j in (3, 0, 4, 1, 2):
        assert np.array_equal(row(j), rows[j])
    assert row(2) is row(2)


def test_rows_on_demand_check_the_logits_at_once():
    # A NaN in a row the rule may never read is still refused: the checks cover every row.
    logits = np.zeros((3, 4))
    logits[2, 1] = np.nan
    with pytest.raises(NonFiniteLogitsError):
        final_rows(logits, SamplingParams(), [], [], [0, 1])
    with pytest.raises(SamplingError, match="draft tokens"):
        final_rows(np.zeros((3, 3)), SamplingParams(), [], [], [1])


def _reference_filtered_softmax(row, params):
    """The filtered softmax as written before its steps ran in place (fresh arrays)."""
    row = np.asarray(row, dtype=np.float64)
    with np.errstate(over="ignore"):
        scaled = (row - row.max()) / params.temperature
    probs = np.exp(scaled)
    vocab = probs.shape[0]
    if 0 < params.top_k < vocab:
        kth = np.partition(scaled, vocab - params.top_k)[vocab - params.top_k]
        probs[scaled < kth] = 0.0
    if params.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        ahead = np.cumsum(probs[order]) - probs[order]
        keep = order[ahead < params.top_p * probs.sum()]
        kept = probs[keep]
        probs[:] = 0.0
        probs[keep] = kept
    if params.min_p > 0.0:
        probs[probs < params.min_p * probs.max()] = 0.0
    return probs / probs.sum()


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.3, top_k=50),
        SamplingParams(temperature=0.9, top_p=0.8),
        SamplingParams(temperature=1.0, min_p=0.05),
        SamplingParams(temperature=1e-6),
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_in_place_softmax_gives_the_fresh_arrays_values_and_leaves_the_logits(params, dtype):
    # Steps in place on one fresh array give the very floats of the same steps on fresh
    # arrays (bit for bit), and the logits handed in (float64 ones are not copied first) stay.
    logits = (np.random.default_rng(5).standard_normal((3, 4096)) * 4).astype(dtype)
    logits[0, :7] = -np.inf
    before = logits.copy()
    got = final_distributions(logits, params, [], [], [1, 2])
    want = np.stack([_reference_filtered_softmax(row, params) for row in logits])
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(logits, before)
