"""The bench's workloads: conversations whose later turns carry each configuration's own
answers, and edit requests built from this repository's code."""

from __future__ import annotations

import pytest

from tests.server.harness import chat_model
from verispec.bench import workloads
from verispec.bench.run import BenchSettings, run_bench
from verispec.bench.runners import RunRecord
from verispec.prompts import Prompt, load_prompts


@pytest.fixture(scope="module")
def chat_engine(tmp_path_factory):
    from verispec.api import load_engine

    return load_engine(str(chat_model(tmp_path_factory.mktemp("chat"))), backend="native")


def test_the_dev_set_has_conversations_and_the_workload_takes_every_turn(chat_engine):
    prompts = load_prompts()
    conversations = [p for p in prompts if len(p.turns) > 1]
    assert len(conversations) == 40
    items = workloads.multi_turn(conversations[:3], chat_engine)
    assert [(p.question_id, p.turn) for p, _ in items] == [
        (c.question_id, turn) for c in conversations[:3] for turn in (1, 2)
    ]
    with pytest.raises(workloads.WorkloadError):
        workloads.multi_turn([p for p in prompts if len(p.turns) == 1][:3], chat_engine)


def test_a_later_turn_carries_the_first_and_this_configurations_answer(chat_engine):
    record = Prompt("7", "writing", "the cat", ("the cat", "sat on"))
    (first, first_ids), (second, build) = workloads.multi_turn([record], chat_engine)
    assert (first.turn, second.turn, second.text) == (1, 2, "sat on")
    assert isinstance(first_ids, list) and callable(build)
    answer = chat_engine.encode("mat here", chat=False)
    text = chat_engine.tokenizer.decode(build([answer]))
    assert text.index("the cat") < text.index("mat here") < text.index("sat on")
    with pytest.raises(ValueError):  # the first turn's answer is required
        build([])


class EchoRunner:
    """Answers with a fixed string per configuration; records the prompts it was given."""

    def __init__(self, engine, answer: str):
        self.engine, self.answer, self.seen = engine, engine.encode(answer, chat=False), []

    def run(self, prompt_ids, max_tokens, temperature, seed):
        self.seen.append(self.engine.tokenizer.decode(prompt_ids))
        return RunRecord(tokens=len(self.answer), seconds=1.0, token_ids=list(self.answer), peak_rss_mb=1.0)


def test_each_configuration_continues_its_own_conversation(chat_engine):
    record = Prompt("7", "writing", "hello", ("hello", "and then"))
    runners = {"a": EchoRunner(chat_engine, "aaa"), "b": EchoRunner(chat_engine, "bbb")}
    settings = BenchSettings(model="m", max_tokens=4, temperature=0.0, seed=0, default_k=3, prompts_file="p")
    records = run_bench(runners, workloads.multi_turn([record], chat_engine), settings)
    assert [(r["config"], r["turn"]) for r in records] == [("a", 1), ("b", 1), ("b", 2), ("a", 2)]
    assert "aaa" in runners["a"].seen[-1] and "bbb" not in runners["a"].seen[-1]
    assert "bbb" in runners["b"].seen[-1] and "aaa" not in runners["b"].seen[-1]


def test_edit_requests_ask_for_changes_to_this_repositorys_code(chat_engine):
    found = workloads.snippets(3)
    assert len(found) == 3 and len({name for name, _ in found}) == 3
    low, high = workloads.SNIPPET_LINES
    for name, code in found:
        assert low <= len(code.splitlines()) <= high and (f"def {name}" in code or f"class {name}" in code)
    items = workloads.edit(3, chat_engine, edits=2)
    assert [(p.category, p.turn) for p, _ in items] == [("edit", 1), ("edit", 2)] * 3
    for (prompt, ids), (name, code) in zip(items[::2], found, strict=True):
        assert code in prompt.text and f"`{name}_v2`" in prompt.text
        assert isinstance(ids, list) and len(ids) > len(code)  # the characters' tokens, and the template
    with pytest.raises(workloads.WorkloadError):
        workloads.edit(3, chat_engine, edits=9)


class SeedRunner(EchoRunner):
    """Records the seed of each request."""

    def run(self, prompt_ids, max_tokens, temperature, seed):
        self.seeds = [*getattr(self, "seeds", []), seed]
        return super().run(prompt_ids, max_tokens, temperature, seed)


def test_samples_ask_each_prompt_n_times_each_with_its_own_seed(chat_engine):
    records = [Prompt("1", "qa", "hello"), Prompt("2", "math", "and then")]
    items = workloads.samples(records, chat_engine, 3)
    assert [(p.question_id, p.turn) for p, _ in items] == [("1", 1), ("1", 2), ("1", 3), ("2", 1), ("2", 2), ("2", 3)]
    assert items[0][1] == items[2][1] == chat_engine.encode("hello") != items[3][1]
    runner = SeedRunner(chat_engine, "x")
    settings = BenchSettings(model="m", max_tokens=4, temperature=1.0, seed=10, default_k=3, prompts_file="p")
    run_bench({"a": runner}, items, settings)
    assert runner.seeds == [10, 10, 11, 12, 10, 11, 12]  # the warm-up, then seed + sample - 1
    with pytest.raises(workloads.WorkloadError):
        workloads.samples(records, chat_engine, 0)
