"""Greedy equivalence: speculative output equals plain output token for token, on the torch
backend (fp32, exact rows) and the native backend (its kernels)."""

import pytest

from tests.engine.prices import drafter_prices
from tests.engine.scripted import ScriptDrafter

PROMPTS = ["the cat sat on the mat. the cat sat", "abc abc abc abc ab", "Hello world"]
MAX_TOKENS = 48
_plain: dict[tuple[int, str], list[int]] = {}


def plain_output(engine, prompt):
    key = (id(engine), prompt)
    if key not in _plain:
        _plain[key] = engine.generate(prompt, drafter="none", temperature=0, max_tokens=MAX_TOKENS).token_ids
    return _plain[key]


@pytest.mark.parametrize("k", [1, 2, 4, 8, "auto"])  # "auto": with the economics governor on
@pytest.mark.parametrize("drafter", ["lookup", "suffix", "model", "none"])
def test_greedy_speculative_equals_plain(either_engine, drafter, k):
    offered = accepted = 0
    # suffix without its cross-request cache here: with it, these prompts' earlier runs make
    # every draft right (the next test), and the mix of kept and rejected drafts is wanted.
    chosen = either_engine.drafter("suffix", suffix_cache_tokens=0) if drafter == "suffix" else drafter
    # Under k "auto" each drafter is priced so that drafting pays (a verify row a fifth of a
    # step): this test is about the output, and the tiny target's measured costs vary with
    # the machine (on a 2-core Zen 4 in CI the governor once drafted nothing for `suffix`).
    # A draft model costs about a step a token here (the tiny target drafting for itself):
    # priced as a small draft model is next to a real target.
    with drafter_prices(either_engine, drafter) as set_costs:
        if drafter != "none":
            set_costs(0.2)
        for prompt in PROMPTS:
            result = either_engine.generate(prompt, drafter=chosen, k=k, temperature=0, max_tokens=MAX_TOKENS)
            assert result.token_ids == plain_output(either_engine, prompt), f"{drafter} k={k} diverged on {prompt!r}"
            offered += result.stats.offered
            accepted += result.stats.accepted
    if drafter != "none":  # drafts were offered, also under the governor ("abc abc ..." repeats)
        assert offered > 0, (offered, accepted)
    if drafter != "none" and k != "auto":  # the comparison exercised both kept and rejected drafts
        assert 0 < accepted < offered, (offered, accepted)


@pytest.mark.parametrize("k", [3, "auto"])
def test_suffix_learns_from_earlier_requests_and_stays_exact(either_engine, k):
    drafter = either_engine.drafter("suffix", scope=f"equivalence-{k}")  # a cache of its own
    # Priced as on the embedded model, where a proposal is nearly free next to a step (it
    # shadows): on the tiny model a proposal costs a step or more, and the governor rightly
    # probes such a drafter too rarely to find the cache's answers within 48 tokens. The
    # prices are set again before each request: the engine learns the tiny model's own.
    passes = []
    with drafter_prices(either_engine) as set_costs:
        for _ in range(2):
            offered = accepted = 0
            for prompt in PROMPTS:
                set_costs(0.1)
                result = either_engine.generate(prompt, drafter=drafter, k=k, temperature=0, max_tokens=MAX_TOKENS)
                assert result.token_ids == plain_output(either_engine, prompt), f"suffix k={k} diverged on {prompt!r}"
                offered += result.stats.offered
                accepted += result.stats.accepted
            passes.append((offered, accepted))
    (_, first), (offered, again) = passes
    # The second pass repeats requests the cache holds whole: their outputs are drafted.
    assert again > first and again >= 0.9 * offered, passes
    assert drafter.cache.documents == 2 * len(PROMPTS)


def branching_suffix(engine, scope):
    """A suffix drafter proposing trees, its cache filled with sampled outputs of the prompts
    so that their continuations branch."""
    drafter = engine.drafter("suffix", suffix_branches=3, suffix_min_score=0.0, scope=scope)
    for seed in range(6):
        for prompt in PROMPTS:
            sampled = engine.generate(prompt, drafter="none", temperature=1.0, seed=seed, max_tokens=MAX_TOKENS)
            drafter.cache.add(engine.encode(prompt) + sampled.token_ids)
    return drafter


@pytest.fixture
def suffix_costs(native_engine):
    """``drafter_prices`` of the native engine's suffix drafter, for the whole test."""
    with drafter_prices(native_engine) as set_costs:
        yield set_costs


@pytest.mark.parametrize("k", [4, "auto"])
def test_suffix_trees_are_verified_in_one_pass_and_stay_exact(native_engine, suffix_costs, k):
    # Trees need a target that verifies them (the native one) and branching continuations;
    # with k auto, rows priced at a hundredth of a step, so that the governor takes alternatives.
    drafter = branching_suffix(native_engine, f"trees-{k}")
    suffix_costs(0.01)
    check_greedy_trees(native_engine, drafter, k)


def check_greedy_trees(engine, drafter, k):
    """Greedy requests of PROMPTS: output identical to plain, trees verified, drafts kept and rejected."""
    trees = offered = accepted = 0
    for prompt in PROMPTS:
        result = engine.generate(prompt, drafter=drafter, k=k, temperature=0, max_tokens=MAX_TOKENS)
        assert result.token_ids == plain_output(engine, prompt), f"{drafter.name} trees k={k} diverged on {prompt!r}"
        trees += result.stats.tree_rounds
        offered += result.stats.offered
        accepted += result.stats.accepted
    assert trees > 0 and 0 < accepted < offered, (trees, offered, accepted)


def test_the_governor_verifies_trees_where_rows_are_cheap_and_chains_where_they_are_dear(native_engine, suffix_costs):
    # Seeded sampled requests run on the calibrated costs, frozen: the choice follows the price.
    drafter = branching_suffix(native_engine, "tree-prices")
    runs = {}
    for per_row in (0.01, 0.45):
        suffix_costs(per_row)
        results = [
            native_engine.generate(p, drafter=drafter, temperature=1.0, seed=3, max_tokens=MAX_TOKENS) for p in PROMPTS
        ]
        runs[per_row] = (sum(r.stats.tree_rounds for r in results), sum(r.stats.offered for r in results))
    # Rows at 0.45 of a step: a second node pays only with a chance of 0.47 or more, which
    # none of the alternatives reaches here: chains only, and still some drafting.
    (cheap_trees, cheap_offered), (dear_trees, dear_offered) = runs.values()
    assert cheap_trees > 0 and dear_trees == 0, runs
    assert 0 < dear_offered < cheap_offered, runs


@pytest.mark.parametrize("k", [1, 3, 8, "auto"])
@pytest.mark.parametrize("kind", ["head", "block", "fused-head", "hybrid"])
def test_greedy_with_trained_drafters_equals_plain(either_engine, tiny_drafters, kind, k):
    # Drafters conditioned on the target's hidden states (trained briefly on the tiny target);
    # "H" is a one-token prompt: no hidden state exists before the first verify. The fused
    # head reads two layers' states at once (EAGLE-3's features).
    # Under the governor, priced as a head is on the embedded model (a round of 2 rows ~1.2
    # steps): next to the tiny model's step a head costs several, and probes so dear come
    # too rarely to draft within these requests.
    # The hybrid drafts suffix's proposals where these prompts repeat and the head's elsewhere
    # (without suffix's cross-request cache, which would make every repeat a sure one).
    if kind == "hybrid":
        drafter = either_engine.drafter(kind, drafter_weights=str(tiny_drafters["head"]), suffix_cache_tokens=0)
    else:
        drafter = either_engine.drafter(kind.removeprefix("fused-"), drafter_weights=str(tiny_drafters[kind]))
    offered = accepted = 0
    with drafter_prices(either_engine, drafter.name) as set_costs:
        set_costs(0.2)
        for prompt in [*PROMPTS, "H"]:
            result = either_engine.generate(prompt, drafter=drafter, k=k, temperature=0, max_tokens=MAX_TOKENS)
            assert result.token_ids == plain_output(either_engine, prompt), f"{kind} k={k} diverged on {prompt!r}"
            offered += result.stats.offered
            accepted += result.stats.accepted
    assert offered > 0, (offered, accepted)  # drafts were offered, also under the governor
    if k != "auto":
        assert 0 < accepted < offered, (offered, accepted)


@pytest.mark.parametrize("k", [1, 3, 8])
def test_drafting_with_the_target_itself_accepts_everything(either_engine, k):
    prompt = PROMPTS[1]
    prompt_ids = either_engine.encode(prompt)
    plain = plain_output(either_engine, prompt)
    oracle = ScriptDrafter(prompt_ids + plain)
    result = either_engine.generate(prompt, drafter=oracle, k=k, temperature=0, max_tokens=MAX_TOKENS)
    assert result.token_ids == plain
    stats = result.stats
    # Every round but the last offers k and keeps all k, plus its bonus: k + 1 tokens.
    assert stats.accepted == stats.offered
    full_rounds = MAX_TOKENS // (k + 1)
    assert stats.k_histogram.get(k, 0) == full_rounds
    assert stats.rounds == full_rounds + (1 if MAX_TOKENS % (k + 1) else 0)
    assert stats.bonus_shortfall == 0


@pytest.mark.parametrize("k", [6, "auto"])
@pytest.mark.parametrize("kind", ["head", "block"])
def test_trained_drafter_trees_are_verified_and_stay_exact(native_engine, tiny_drafters, kind, k):
    # Three candidates a drafted position (k 6: two positions); under the governor rows are
    # priced at a hundredth of a step and drafting free, so that its alternatives pay.
    drafter = native_engine.drafter(kind, drafter_weights=str(tiny_drafters[kind]), draft_branches=3)
    with drafter_prices(native_engine, kind) as set_costs:
        set_costs(0.01)
        check_greedy_trees(native_engine, drafter, k)
