"""The scheduler: requests stepped together give exactly what each gives alone (greedy and
seeded sampling, mixed drafters), prefill in chunks beside running decodes, rows bounded,
drafters that cannot fork take turns, a failing or cancelled request leaves the others."""

from __future__ import annotations

import numpy as np
import pytest

from tests.engine.scripted import ScriptDrafter
from verispec.drafters.base import Draft
from verispec.engine import Prefill
from verispec.scheduler import Scheduler

PROMPTS = [
    "the cat sat on the mat and the cat sat",
    "G1qLT?U8bysSU8 the dog",
    "abcabcabcabc",
    "tell me a story about a fox",
    "1 2 3 4 5 6 7 8 9",
    "the the the the",
    "zzzz yyyy xxxx",
    "hello hello world",
]
# (drafter, k) pairs the requests cycle through: fixed and governed lookup, plain, a draft model
# (one cache: its requests take turns), a trained head (forked per request). A fixed k first: a
# request alone must draft whatever this machine's timings say (a governed one may not: its
# alone run before may have taught the acceptance memory not to, and at 0 neighbours it then
# drafted nothing in 4 of 6 runs). The hybrid (suffix or the head, forked per request) without
# suffix's cross-request cache: with it, the alone runs would teach the batched ones.
DRAFTERS = [("lookup", 3), ("none", 0), ("lookup", "auto"), ("model", 2), ("head", 3), ("wrong", 2), ("hybrid", 3)]
SAMPLING = [
    {"temperature": 0.0},
    {"temperature": 1.0, "top_k": 5, "top_p": 0.9},
    {"temperature": 0.7, "min_p": 0.1, "repetition_penalty": 1.3, "presence_penalty": 0.5},
]


@pytest.fixture(scope="module")
def batched(tiny_dir, draft_dir):
    """The tiny target on the native kernels with 17 sequences, the draft model too."""
    from verispec.api import load_engine

    engine = load_engine(str(tiny_dir), backend="native", draft_model=str(draft_dir), slots=17)
    assert engine.target.path == "kernels" and engine.target.batched_verify_exact
    return engine


def drafter_for(engine, name, tiny_drafters):
    if name == "head":
        return engine.drafter("head", drafter_weights=str(tiny_drafters["head"]))
    if name == "hybrid":
        return engine.drafter("hybrid", drafter_weights=str(tiny_drafters["head"]), suffix_cache_tokens=0)
    return name


def requests(engine, count, tiny_drafters, max_tokens=24):
    """``count`` varied requests: prompts, drafters, k and sampling settings cycling, seeded."""
    made = []
    for i in range(count):
        drafter, k = DRAFTERS[i % len(DRAFTERS)]
        sampling = SAMPLING[i % len(SAMPLING)]
        made.append(
            (
                PROMPTS[i % len(PROMPTS)] + f" {i}",
                {"drafter": drafter_for(engine, drafter, tiny_drafters), "k": k, "seed": 100 + i, **sampling},
            )
        )
    return [(prompt, {**options, "max_tokens": max_tokens}) for prompt, options in made]


def run_together(scheduler, engine, asked):
    """Start every request as soon as the scheduler has room (in order), step to the end."""
    pending = [engine.request(prompt, **options) for prompt, options in asked]
    runs, reports = [], []
    while pending or scheduler.running:
        while pending and scheduler.can_start(pending[0]):
            runs.append(scheduler.start(pending.pop(0)))
        reports.append(scheduler.step())
    return runs, reports


@pytest.mark.parametrize("neighbours", [0, 3, 15])
def test_requests_stepped_together_give_what_each_gives_alone(batched, tiny_drafters, neighbours):
    asked = requests(batched, neighbours + 1, tiny_drafters)
    alone = [batched.generate(prompt, **options) for prompt, options in asked]
    runs, reports = run_together(Scheduler(batched, max_running=16), batched, asked)
    assert all(run.error is None and run.result is not None for run in runs)
    for i, (run, single) in enumerate(zip(runs, alone, strict=True)):
        assert run.result.token_ids == single.token_ids, f"request {i} ({asked[i][1]}) differs when batched"
        assert run.result.text == single.text and run.result.finish_reason == single.finish_reason
        if asked[i][1]["k"] != "auto":  # a governed k follows timings and memory; a fixed k, the RNG
            assert (run.stats.offered, run.stats.accepted) == (single.stats.offered, single.stats.accepted)
    assert all(single.stats.mean_batch_size == 1.0 for single in alone)
    if neighbours:
        assert max(report.requests for report in reports) > 1  # passes did hold several requests
        assert max(run.stats.mean_batch_size for run in runs) > 1.0  # and the requests saw it
        first = runs[0].stats
        assert first.mean_rows_per_pass >= first.tokens_per_round - 1e-9 and first.pass_rows > first.rounds
    drafted = sum(run.stats.offered for run in runs)
    assert drafted > 0


def test_a_target_without_sequences_runs_one_request_at_a_time(tiny_engine, tiny_drafters):
    asked = requests(tiny_engine, 4, tiny_drafters)
    asked = [(p, o) for p, o in asked if o["drafter"] != "head"]  # its weights name the native target
    alone = [tiny_engine.generate(prompt, **options) for prompt, options in asked]
    scheduler = Scheduler(tiny_engine, max_running=8)
    assert scheduler.max_running == 1
    runs, reports = run_together(scheduler, tiny_engine, asked)
    assert [r.result.token_ids for r in runs] == [a.token_ids for a in alone]
    assert max(report.requests for report in reports) == 1


def test_long_prompts_prefill_in_chunks_while_others_decode(batched):
    scheduler = Scheduler(batched, max_running=4, max_rows=16, prefill_chunk=8)
    short = scheduler.start(batched.request("the cat", drafter="none", temperature=0, max_tokens=40))
    while not short.stats.rounds:
        scheduler.step()
    long_prompt = " ".join(f"word{i}" for i in range(20))  # the tiny tokenizer: ~150 tokens
    reading = scheduler.start(batched.request(long_prompt, drafter="none", temperature=0, max_tokens=4))
    chunks = 0
    rounds_before = short.stats.rounds
    while isinstance(reading.work, Prefill) or (reading.work is None and not reading.stats.rounds):
        report = scheduler.step()
        assert report.rows <= 16
        chunks += 1
    assert len(reading.request.prompt_ids) > 8 * 4 and chunks >= 4
    assert short.stats.rounds - rounds_before >= chunks - 1  # a decode step rode along every chunk
    while scheduler.running:
        scheduler.step()
    alone = batched.generate(long_prompt, drafter="none", temperature=0, max_tokens=4)
    assert reading.result.token_ids == alone.token_ids


def test_passes_that_read_prompt_chunks_do_not_price_a_governors_rows(batched):
    """A 32-token chunk of another request's prompt rides in the passes of a governed request:
    those passes' times are mostly the chunk's, and do not refine what its rows cost."""
    scheduler = Scheduler(batched, max_running=4, max_rows=64, prefill_chunk=32)
    decoding = scheduler.start(batched.request(PROMPTS[0], drafter="lookup", k="auto", temperature=0, max_tokens=60))
    while not decoding.stats.rounds:
        scheduler.step()
    costs = decoding.request.planner.governor.costs
    priced: list[int] = []
    observe = costs.observe_verify
    costs.observe_verify = lambda rows, seconds: (priced.append(rows), observe(rows, seconds))[1]
    long_prompt = " ".join(f"chunk{i}" for i in range(20))  # its own: no cached prefix
    scheduler.start(batched.request(long_prompt, drafter="none", temperature=0, max_tokens=4))
    shared = []
    while scheduler.running:
        report = scheduler.step()
        if not decoding.finished and report.requests > 1:
            shared.append(report.rows)
    assert max(shared) > 32  # chunks did share its passes
    assert priced and max(priced) <= 1 + 8 + 1  # its own rows, and the other request's decode row


def test_rows_per_step_stay_within_max_rows(batched, tiny_drafters):
    asked = [(p, {**o, "drafter": "lookup", "k": 7}) for p, o in requests(batched, 8, tiny_drafters)]
    runs, reports = run_together(Scheduler(batched, max_running=8, max_rows=12), batched, asked)
    assert all(run.result is not None for run in runs)
    assert max(report.rows for report in reports) <= 12
    alone = [batched.generate(prompt, **options) for prompt, options in asked]
    assert [r.result.token_ids for r in runs] == [a.token_ids for a in alone]


def test_a_drafter_that_cannot_fork_serves_one_request_at_a_time(batched):
    scheduler = Scheduler(batched, max_running=4)
    first = batched.request("the cat", drafter="model", k=2, temperature=0, max_tokens=8)
    second = batched.request("the dog", drafter="model", k=2, temperature=0, max_tokens=8)
    beside = batched.request("the fox", drafter="lookup", temperature=0, max_tokens=8)
    running = scheduler.start(first)
    assert not scheduler.can_start(second)  # the draft model's one cache is in use
    assert scheduler.can_start(beside)  # lookup forks
    scheduler.start(beside)
    while not running.finished:
        scheduler.step()
    assert scheduler.can_start(second)
    scheduler.start(second)
    while scheduler.running:
        scheduler.step()
    assert (
        second.result.token_ids
        == batched.generate("the dog", drafter="model", k=2, temperature=0, max_tokens=8).token_ids
    )


class Exploding(ScriptDrafter):
    """Proposes from a script until its third proposal, which raises."""

    name = "exploding"

    def __init__(self) -> None:
        super().__init__([])
        self.calls = 0

    def propose(self, context, k, rng) -> Draft:
        self.calls += 1
        if self.calls == 3:
            raise RuntimeError("drafter exploded")
        return Draft(tokens=[])

    def fork(self, target):
        return Exploding()


def test_a_failing_or_cancelled_request_leaves_the_others_as_they_were(batched):
    scheduler = Scheduler(batched, max_running=4)
    options = {"temperature": 1.0, "top_k": 5, "max_tokens": 16}
    kept = scheduler.start(batched.request("the cat sat", drafter="lookup", k=3, seed=7, **options))
    failing = scheduler.start(batched.request("the dog", drafter=Exploding(), k=2, seed=8, **options))
    cancelled = scheduler.start(batched.request("a fox", drafter="lookup", k=3, seed=9, **options))
    for _ in range(3):
        scheduler.step()
    scheduler.cancel(cancelled)
    assert cancelled.finished and cancelled.result is None
    assert cancelled.sequence in scheduler._free  # its sequence is free at once
    while scheduler.running:
        scheduler.step()
    assert isinstance(failing.error, RuntimeError) and failing.result is None
    alone = batched.generate("the cat sat", drafter="lookup", k=3, seed=7, **options)
    assert kept.error is None and kept.result.token_ids == alone.token_ids
    # Every sequence is free again, and the engine's lock with them.
    assert len(scheduler._free) == scheduler.max_running and not batched._lock.locked()


def test_the_scheduler_refuses_bad_limits(batched):
    for bad in ({"max_running": 0}, {"max_rows": -1}, {"prefill_chunk": True}):
        with pytest.raises(ValueError, match="must be an integer >= 1"):
            Scheduler(batched, **bad)
    scheduler = Scheduler(batched, max_running=1)
    scheduler.start(batched.request("a", drafter="none", max_tokens=2))
    with pytest.raises(RuntimeError, match="no room"):
        scheduler.start(batched.request("b", drafter="none", max_tokens=2))
    while scheduler.running:
        scheduler.step()


def test_run_gives_each_sequence_its_rows_alone(batched):
    target = batched.target
    prompts = [[(7 * i + s) % 40 + 3 for i in range(10 + 3 * s)] for s in range(4)]
    continuations = [[5, 9, 11, 4, 6][: s + 1] for s in range(4)]
    alone = []
    for prompt, more in zip(prompts, continuations, strict=True):
        target.prefill(prompt)
        alone.append(target.verify(more))
    target.reset()
    sequences = [target.sequence(i + 1) for i in range(4)]
    for sequence, prompt in zip(sequences[:3], prompts[:3], strict=True):
        sequence.prefill(prompt)
    from verispec.targets.base import Pass

    passes = [Pass(sequences[s], continuations[s], True) for s in range(3)]
    passes.insert(1, Pass(sequences[3], prompts[3], False))  # a prefill chunk rides along
    out = target.run(passes)
    assert out[1] is None and sequences[3].cached_tokens == len(prompts[3])
    for got, want in zip([out[0], out[2], out[3]], alone[:3], strict=True):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(sequences[3].verify(continuations[3]), alone[3])
    from verispec.targets.base import TargetError

    with pytest.raises(TargetError, match="at most one piece of each sequence"):
        target.run([Pass(sequences[0], [1], True), Pass(sequences[0], [2], True)])
    with pytest.raises(TargetError, match="holds sequences"):
        target.sequence(17)
    for sequence in sequences:
        sequence.reset()


def test_a_request_starts_on_the_sequence_that_holds_its_prompt(batched):
    # A conversation goes on: the next request carries the first one's prompt and answer. It
    # starts on the sequence that served the first (not the lowest free one), computes only
    # what is new, and gives what a cold prefill gives; another scope (API key) reuses nothing.
    target = batched.target
    target.drop_cache()
    scheduler = Scheduler(batched, max_running=4)
    greedy = {"drafter": "lookup", "k": 3, "temperature": 0, "max_tokens": 12}
    asked = [("zzzz yyyy xxxx wwww", greedy), ("the cat sat on the mat and the dog sat on the log", greedy)]
    runs, _ = run_together(scheduler, batched, asked)
    first = runs[1]
    assert all(run.stats.cached_prompt_tokens == 0 for run in runs)
    assert scheduler._free[0] is runs[0].sequence and first.sequence is not runs[0].sequence
    follow = first.request.prompt_ids + first.result.token_ids + batched.encode(" and then", chat=False)
    again = scheduler.start(batched.request(follow, **greedy))
    assert again.sequence is first.sequence
    while scheduler.running:
        scheduler.step()
    held = len(first.request.prompt_ids) + len(first.result.token_ids) - 1  # its last token was never fed
    assert again.stats.cached_prompt_tokens == held
    other = scheduler.start(batched.request(follow, scope="another key", **greedy))
    assert other.sequence is scheduler._sequences[0]  # nothing of its scope anywhere: the lowest
    while scheduler.running:
        scheduler.step()
    assert other.stats.cached_prompt_tokens == 0
    target.drop_cache()
    alone = batched.generate(follow, **greedy)
    assert alone.stats.cached_prompt_tokens == 0
    assert again.result.token_ids == other.result.token_ids == alone.token_ids
    # One sequence, two scopes taking turns on the same conversation: each finds the other's
    # positions there and reuses none of them; the same scope twice in a row does.
    single = Scheduler(batched, max_running=1)
    cached = []
    for scope in ("key one", "key two", "key one", "key one"):
        run = single.start(batched.request(follow, scope=scope, **greedy))
        while single.running:
            single.step()
        assert run.result.token_ids == alone.token_ids
        cached.append(run.stats.cached_prompt_tokens)
    assert cached[:3] == [0, 0, 0] and cached[3] == len(follow) - 1
