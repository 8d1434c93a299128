"""Prompt sources: reproducible by index, distinct, short enough, sharing no phrase with the
benchmark, and a held-out scoring set that no training source overlaps."""

import collections
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.train.overlap import shingles, spec_bench_shingles
from verispec.train import held_out, sources
from verispec.train.sources import SOURCES, eval_prompts, get_source, self_instruct
from verispec.train.stdlib_texts import _from_json, _to_json, is_reserved, stdlib_index

ROOT = Path(__file__).resolve().parents[2]
CATEGORIES = (
    "writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities", "translation",
    "summarization", "qa", "math_reasoning", "rag",
)  # fmt: skip
MAX_TOKENS = 700  # the bound every prompt keeps, chat template included


def first(name: str, count: int) -> list[str]:
    """The text of the first ``count`` prompts of a source (all of them if it has fewer)."""
    source = SOURCES[name]
    end = count if source.size is None else min(count, source.size)
    return [json.dumps(source.prompt(i)) for i in range(end)]


def digest_of_sources() -> str:
    """A hash of the first 50 prompts of every source and of the held-out set."""
    digest = hashlib.sha256()
    for name in SOURCES:
        digest.update("".join(first(name, 50)).encode())
    digest.update(json.dumps(eval_prompts()).encode())
    return digest.hexdigest()


def test_every_source_is_reproducible_and_its_prompts_distinct():
    assert set(SOURCES) == {"templates", "roleplay", "passages", "code", "math", "questions", "reports"}
    for name, source in SOURCES.items():
        assert source.name == name and source.licence
        prompts = first(name, 500)
        assert len(set(prompts)) == len(prompts) == 500, name
        for index in (0, 7, 499):
            messages = source.prompt(index)
            assert messages == source.prompt(index) and messages[-1]["role"] == "user", name
    # A fresh process with another string-hash salt makes the same prompts.
    code = "from tests.train.test_sources import digest_of_sources; print(digest_of_sources())"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "12345"}
    fresh = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True)
    assert fresh.returncode == 0, fresh.stderr
    assert fresh.stdout.strip() == digest_of_sources()


def test_the_sizes_count_distinct_prompts():
    templates = SOURCES["templates"]
    assert templates.size == len(sources.template_prompts()) == len(set(sources.template_prompts()))
    assert len({templates.prompt(i)[0]["content"] for i in range(templates.size)}) == templates.size
    assert SOURCES["math"].size == len(sources.MATH_TEMPLATES) * min(c for c, _ in sources.math_layout())
    index = stdlib_index()
    assert SOURCES["passages"].size == len(index.passages) * len(sources.PASSAGE_TASKS)
    assert SOURCES["code"].size == len(index.snippets) * len(sources.CODE_TASKS)
    assert len(index.passages) > 500 and len(index.snippets) > 2000  # the library is there


def test_bad_names_and_indices_are_refused():
    with pytest.raises(ValueError, match="unknown prompt source 'nope'; known: templates, roleplay"):
        get_source("nope")
    assert get_source("code") is SOURCES["code"]
    for source in SOURCES.values():
        with pytest.raises(IndexError, match="outside"):
            source.prompt(-1)
        if source.size is not None:
            source.prompt(source.size - 1)
            with pytest.raises(IndexError, match=f"has {source.size} prompts"):
                source.prompt(source.size)
    with pytest.raises(TypeError):
        SOURCES["math"].prompt(1.0)  # type: ignore[arg-type]


def test_no_prompt_or_quoted_text_shares_a_phrase_with_spec_bench():
    bench = spec_bench_shingles()
    for name in SOURCES:
        for prompt in first(name, 1500):
            assert not shingles(prompt) & bench, (name, prompt[:300])
    for category, messages in eval_prompts():
        assert not shingles(messages[0]["content"]) & bench, (category, messages)
    index = stdlib_index()  # every text any prompt can quote, not only the first ones
    for text in (*index.passages, *index.snippets):
        assert not shingles(text.text) & bench, (text.module, text.name)
    wordings = [w for kind in (*sources.PASSAGE_TASKS, *sources.CODE_TASKS) for w in kind]
    for wording in (*wordings, *sources.QUESTION_FRAMES, *(t for t, _ in sources.MATH_TEMPLATES)):
        assert not shingles(wording) & bench, wording


def test_held_out_prompts_are_disjoint_from_training():
    held = eval_prompts()
    assert collections.Counter(c for c, _ in held) == {c: 4 for c in CATEGORIES}
    assert len({json.dumps(m) for _, m in held}) == 52
    held_runs = set().union(*(shingles(m[0]["content"]) for _, m in held))
    topic = re.compile("|".join(rf"\b{re.escape(t)}\b" for t in held_out.EVAL_TOPICS), re.IGNORECASE)
    for name in SOURCES:
        for prompt in first(name, 2000):
            assert not shingles(prompt) & held_runs, (name, prompt[:300])
            assert not topic.search(json.loads(prompt)[0]["content"]), (name, prompt[:300])
    for word in (*sources.TOPICS, *sources.QUESTION_TOPICS):  # seed lists, searched whole
        assert not topic.search(word), word
    # Training quotes no reserved module; the held-out set quotes only reserved ones.
    index = stdlib_index()
    assert not any(is_reserved(t.module) for t in (*index.passages, *index.snippets))
    reserved = (*index.reserved_passages, *index.reserved_snippets)
    assert reserved and all(is_reserved(t.module) for t in reserved)
    quoting = [m[0]["content"] for c, m in held if c in ("extraction", "summarization", "rag", "coding")]
    assert sum(any(t.text in text for t in reserved) for text in quoting) == 4 * 3 + 2


def test_prompts_fit_the_length_bound():
    from verispec.models import ModelLoadError, resolve, tokenizer_for
    from verispec.train.data import encode_conversation

    try:
        tokenizer = tokenizer_for(resolve(None))
    except ModelLoadError as error:
        pytest.skip(f"no embedded tokenizer: {error}")
    seen: list[int] = []

    def fits(messages, what) -> None:
        seen.append(len(encode_conversation(tokenizer, messages)))  # as generation will see it
        assert seen[-1] <= MAX_TOKENS, (what, seen[-1], messages[-1]["content"][:200])

    for name, source in SOURCES.items():
        prompts = [source.prompt(i) for i in range(min(2000, source.size))]
        for messages in sorted(prompts, key=lambda m: -len(m[-1]["content"]))[:15] + prompts[:40]:
            fits(messages, name)
    for category, messages in eval_prompts():
        fits(messages, category)
    # The longest quoted texts with the longest wording: the worst case of the two sources.
    index = stdlib_index()
    wording = max((w for kind in sources.CODE_TASKS for w in kind), key=len)
    for snippet in sorted(index.snippets, key=lambda t: -len(t.text))[:40]:
        fits(sources.user(wording.format(code=snippet.text)), (snippet.module, snippet.name))
    wording = max((w for kind in sources.PASSAGE_TASKS for w in kind), key=len)
    for passage in sorted(index.passages, key=lambda t: -len(t.text))[:20]:
        fits(sources.user(wording.format(passage=passage.text, first=passage.text, name="x" * 40)), passage.module)
    assert max(seen) > MAX_TOKENS // 2  # the counts are real token counts of long prompts


def test_self_instruct_keeps_one_clean_question_per_reply():
    replies = [
        '"How do I keep basil alive on a windowsill?"',  # quoted
        "Question: Why does bread go stale faster in the fridge?",  # prefixed
        "Sure! Here is a question:\n\n**Question:** What is the best way to learn touch typing?",  # preamble
        "1. Write a short poem about a rainy Monday morning.",  # numbered request
        "how do I keep BASIL alive on a windowsill?",  # a repeat, ignoring case
        "Bicycles are a great way to get around town and stay healthy.",  # an answer, not a question
        "Why?",  # too short
        "Can you explain " + "very " * 80 + "slowly?",  # too long
        "",  # empty
        "Here is one:\n- Q: Could you compare tea and coffee for an afternoon energy boost?\nMore text.",
        # Replies of the embedded target to ``questions`` prompts (greedy), good and bad:
        "I'm sorry for any confusion, but as a chatbot designed to assist with tennis, I can't.",  # refusal
        'A traveller might ask: "What do you do when you\'re stuck in a bad situation?"',  # lead-in
        "What's a factual question about saving money?",  # about the task, not a question
        "What a great question! What would you like to know about personal loans?",  # the assistant's voice
        'What a delightful question! A student might ask: "What do you think of the Tyrannosaurus Rex?"',
        "I'm just going to send you a message. I'm going to send you a message.",  # not a request
        "Why, I'm not sure I'm ready to discuss the latest fashion trends.",  # no question mark
        "I need a plan for my garden. I need a plan for my garden.",  # a loop
        "I'm looking for a weekly plan to improve my productivity at work.",  # a first-person request
    ]
    assert self_instruct(replies) == [
        [{"role": "user", "content": "How do I keep basil alive on a windowsill?"}],
        [{"role": "user", "content": "Why does bread go stale faster in the fridge?"}],
        [{"role": "user", "content": "What is the best way to learn touch typing?"}],
        [{"role": "user", "content": "Write a short poem about a rainy Monday morning."}],
        [{"role": "user", "content": "Could you compare tea and coffee for an afternoon energy boost?"}],
        [{"role": "user", "content": "What do you do when you're stuck in a bad situation?"}],
        [{"role": "user", "content": "What do you think of the Tyrannosaurus Rex?"}],
        [{"role": "user", "content": "I'm looking for a weekly plan to improve my productivity at work."}],
    ]
    assert self_instruct([]) == []


def test_questions_ask_the_target_for_one_request_on_a_seed_topic():
    source = SOURCES["questions"]
    assert "SmolLM2-135M-Instruct" in source.licence and "Apache-2.0" in source.licence
    texts = [source.prompt(i)[0]["content"] for i in range(200)]
    assert all(any(t in text for t in sources.QUESTION_TOPICS) for text in texts)
    assert len({next(t for t in sources.QUESTION_TOPICS if t in text) for text in texts}) > 50  # varied


def test_the_stdlib_index_survives_its_cache_file():
    index = stdlib_index()
    assert _from_json(_to_json(index)) == index
    assert "Python Software Foundation License" in SOURCES["passages"].licence
    assert sources.PYTHON_VERSION in SOURCES["code"].licence
