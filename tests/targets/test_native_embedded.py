"""The embedded model in its default configuration (native kernels, the file's Q4_1 and
Q8_0 blocks): speculative greedy output equals plain greedy output, token for token, on
Spec-Bench dev prompts of every category."""

import pytest

from verispec.prompts import load_prompts, select

pytestmark = pytest.mark.slow

PER_CATEGORY = 2  # 13 categories: 26 prompts
MAX_TOKENS = 96


@pytest.fixture(scope="module")
def embedded():
    from verispec.api import load_engine

    engine = load_engine(None)  # the defaults: backend auto, weights auto
    assert engine.target.path == "kernels" and engine.target.batched_verify_exact
    return engine


def test_speculative_greedy_equals_plain_on_dev_prompts(embedded):
    prompts = select(load_prompts(), per_category=PER_CATEGORY)
    assert len(prompts) >= 20
    offered = accepted = 0
    for prompt in prompts:
        ids = embedded.encode(prompt.text)
        plain = embedded.generate(ids, drafter="none", temperature=0, max_tokens=MAX_TOKENS)
        speculative = embedded.generate(ids, drafter="lookup", k="auto", temperature=0, max_tokens=MAX_TOKENS)
        assert speculative.token_ids == plain.token_ids, f"{prompt.category} {prompt.question_id} diverged"
        offered += speculative.stats.offered
        accepted += speculative.stats.accepted
    print(f"\n  {len(prompts)} dev prompts identical; lookup/auto offered {offered}, accepted {accepted}")
    assert 0 < accepted < offered  # drafts were verified, kept and rejected: the test exercised rows


def test_long_fixed_blocks_stay_identical(embedded):
    # Verify blocks of 9 rows on long prompts (summarization reads ~500 tokens).
    prompts = select(load_prompts(), categories=["summarization", "translation", "coding"], per_category=1)
    for prompt in prompts:
        ids = embedded.encode(prompt.text)
        plain = embedded.generate(ids, drafter="none", temperature=0, max_tokens=MAX_TOKENS)
        fixed = embedded.generate(ids, drafter="lookup", k=8, temperature=0, max_tokens=MAX_TOKENS)
        assert fixed.token_ids == plain.token_ids, f"{prompt.category} {prompt.question_id} diverged at k=8"


@pytest.fixture(scope="module")
def embedded_sequences():
    """The embedded model with 17 sequences of its cache, for requests stepped together."""
    from verispec.api import load_engine

    return load_engine(None, slots=17)


@pytest.mark.parametrize(("neighbours", "mixed"), [(1, True), (4, True), (16, True), (16, False)])
def test_requests_stepped_together_equal_each_alone_on_dev_prompts(embedded_sequences, neighbours, mixed):
    # Each request with 1, 4 or 16 others in its passes (dev prompts of every category,
    # speculative greedy with lookup k = 3 and plain mixed, or all plain: every segment one
    # row, attention's groups of 3 queries): its tokens are the ones it gets alone.
    from verispec.scheduler import Scheduler

    engine = embedded_sequences
    prompts = select(load_prompts(), per_category=2)[: neighbours + 1]
    options = [
        {"drafter": "lookup", "k": 3} if mixed and i % 2 == 0 else {"drafter": "none"} for i in range(len(prompts))
    ]
    asked = [
        (engine.encode(p.text), o | {"temperature": 0, "max_tokens": 48}) for p, o in zip(prompts, options, strict=True)
    ]
    alone = [engine.generate(ids, **o) for ids, o in asked]
    scheduler = Scheduler(engine, max_running=neighbours + 1)
    runs = [scheduler.start(engine.request(ids, **o)) for ids, o in asked]
    widest = single_rows = 0
    while scheduler.running:
        report = scheduler.step()
        widest = max(widest, report.requests)
        single_rows += report.rows == report.requests == len(asked)
    assert widest == len(asked)  # a pass held every request
    assert [run.result.token_ids for run in runs] == [a.token_ids for a in alone]
    if mixed:
        assert sum(run.stats.offered for run in runs) > 0  # drafts were verified beside the others
    else:
        assert single_rows > 10  # passes of one row per request, every request in them
