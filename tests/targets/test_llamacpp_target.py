"""The llama.cpp backend on a tiny GGUF written in the tests: rows, rollback, the engine on it."""

import subprocess
import sys

import numpy as np
import pytest

from tests.engine.prices import drafter_prices
from tests.engine.scripted import ScriptDrafter
from verispec.engine import Engine
from verispec.targets.base import TargetError
from verispec.targets.llamacpp import LlamaCppTarget

PROMPT = [5, 9, 14, 14, 17, 29, 25, 17, 20, 14, 6, 31]
CONTINUATION = [29, 3, 4, 5, 29, 3, 4, 5, 29]
TEXT = "the cat sat on the mat. the cat sat"


def test_reports_vocab_context_eos(tiny_gguf):
    target = LlamaCppTarget(tiny_gguf)
    assert (target.vocab_size, target.context_length, target.eos_token_ids) == (69, 256, frozenset({1}))
    assert target.supports_rollback


@pytest.mark.parametrize("rows", [2, 5, 9])
def test_verify_rows_against_single_steps(tiny_gguf, rows):
    target = LlamaCppTarget(tiny_gguf)
    target.prefill(PROMPT)
    single = np.concatenate([target.verify([t]) for t in CONTINUATION[:rows]])
    target.prefill(PROMPT)
    batched = target.verify(CONTINUATION[:rows])
    difference = float(np.max(np.abs(batched - single)))
    print(f"\n  llama.cpp verify of {rows} rows vs single steps: max |logit difference| = {difference:.2e}")
    np.testing.assert_array_equal(batched.argmax(-1), single.argmax(-1))
    assert difference < 1e-3


def test_exact_mode_verifies_token_by_token(tiny_gguf):
    target = LlamaCppTarget(tiny_gguf, exact=True)
    target.prefill(PROMPT)
    single = np.concatenate([target.verify([t]) for t in CONTINUATION])
    target.prefill(PROMPT)
    np.testing.assert_array_equal(target.verify(CONTINUATION), single)


def test_rollback_then_continue_equals_fresh_run(tiny_gguf):
    target = LlamaCppTarget(tiny_gguf)
    target.prefill(PROMPT)
    target.verify(CONTINUATION[:6])
    target.rollback(len(PROMPT) + 2)
    after = target.verify([40, 41])
    target.prefill(PROMPT + CONTINUATION[:2])
    fresh = target.verify([40, 41])
    np.testing.assert_allclose(after, fresh, atol=1e-4)
    with pytest.raises(TargetError, match="cannot roll back"):
        target.rollback(target.cached_tokens + 1)


def test_a_prefill_reuses_the_prefix_a_finished_request_left(tiny_gguf):
    target, fresh = LlamaCppTarget(tiny_gguf), LlamaCppTarget(tiny_gguf)
    target.prefill(PROMPT)
    target.verify(CONTINUATION[:5])
    target.reset()
    assert target.cached_tokens == 0
    # A new request sharing the first 8 prompt tokens decodes only the rest.
    other = [*PROMPT[:8], 40, 41, 42]
    target.prefill(other)
    assert target.reused_tokens == 8 and target.cached_tokens == len(other)
    fresh.prefill(other)
    assert fresh.reused_tokens == 0
    reused, anew = target.verify([43, 44]), fresh.verify([43, 44])
    np.testing.assert_array_equal(reused.argmax(-1), anew.argmax(-1))
    np.testing.assert_allclose(reused, anew, atol=1e-4)
    # A prompt that the memory holds whole, then one shorter: nothing is decoded twice, and
    # what the memory held past the new prompt is not read.
    target.reset()
    target.prefill([*other, 43])
    assert target.reused_tokens == len(other) + 1
    target.prefill(other[:5])
    assert target.reused_tokens == 5
    fresh.prefill(other[:5])
    np.testing.assert_allclose(target.verify([7, 8]), fresh.verify([7, 8]), atol=1e-4)
    # The exact mode prefills afresh: rows computed as in plain decoding, whatever came before.
    exact = LlamaCppTarget(tiny_gguf, exact=True)
    exact.prefill(PROMPT)
    exact.reset()
    exact.prefill(PROMPT)
    assert exact.reused_tokens == 0


def test_context_is_enforced(tiny_gguf):
    target = LlamaCppTarget(tiny_gguf)
    target.prefill([i % 60 + 3 for i in range(250)])
    with pytest.raises(TargetError, match="exceed the context"):
        target.verify([5] * 10)


@pytest.mark.parametrize("k", [1, 2, 4, 8, "auto"])
@pytest.mark.parametrize("drafter", ["lookup", "model"])
def test_greedy_equivalence(llama_engine, drafter, k):
    offered = 0
    # A draft model as large as the target never pays, so the governor may rightly decode
    # every token here plainly (a probe waits ~50 rounds): priced as a small draft model is
    # next to a real target, it drafts, and the output must still be the plain one.
    with drafter_prices(llama_engine, "model") as set_costs:
        set_costs(0.2)
        for text in (TEXT, "abc abc abc abc ab"):
            plain = llama_engine.generate(text, drafter="none", temperature=0, max_tokens=48)
            spec = llama_engine.generate(text, drafter=drafter, k=k, temperature=0, max_tokens=48)
            assert spec.token_ids == plain.token_ids, (drafter, k, text)
            offered += spec.stats.offered
    assert offered > 0  # drafts were verified, also under the governor


def test_stops_are_exact(llama_engine, tiny_gguf):
    plain = llama_engine.generate(TEXT, drafter="none", temperature=0, max_tokens=40)
    # max_tokens, and a stop string, with every draft right
    oracle = ScriptDrafter(llama_engine.encode(TEXT) + plain.token_ids)
    for max_tokens in (1, 5, 17):
        result = llama_engine.generate(TEXT, drafter=oracle, k=4, temperature=0, max_tokens=max_tokens)
        assert result.token_ids == plain.token_ids[:max_tokens]
    stop = plain.text[12:15]
    result = llama_engine.generate(TEXT, drafter="lookup", k=4, temperature=0, max_tokens=40, stop=[stop])
    assert result.text == plain.text[: plain.text.find(stop)]
    # an end-of-sequence inside the accepted prefix: declare the 6th token an EOS id
    position = next(i for i in range(5, 40) if plain.token_ids[i] not in plain.token_ids[:i])
    target = LlamaCppTarget(tiny_gguf)
    target._eos = frozenset({plain.token_ids[position]})
    engine = Engine(target, llama_engine.tokenizer)
    result = engine.generate(TEXT, drafter=oracle, k=position + 3, temperature=0, max_tokens=40)
    assert result.token_ids == plain.token_ids[: position + 1]
    assert (result.stats.accepted, result.stats.bonus, result.stats.bonus_shortfall) == (position + 1, 0, 1)


def test_same_seed_same_output(llama_engine):
    options = {"drafter": "model", "k": 3, "temperature": 1.0, "top_p": 0.95, "max_tokens": 30}
    first = llama_engine.generate("abc abc", seed=5, **options)
    assert llama_engine.generate("abc abc", seed=5, **options).token_ids == first.token_ids
    assert llama_engine.target.cached_tokens == 0


def test_the_embedded_model_runs_on_llama_cpp_on_this_cpu():
    # The shipped Q4_1 file through llama.cpp's own kernels, in a child process: on a CPU with
    # AMX tiles, ggml's AMX matmul crashed the process (a segfault, not an exception), so the
    # backend keeps the weights out of ggml's extra buffer types there. Greedy tokens equal to
    # the native decoder's would need the same arithmetic; a finite, well-formed row is asked.
    script = (
        "import numpy as np\n"
        "from verispec import models\n"
        "from verispec.targets.llamacpp import LlamaCppTarget\n"
        "target = LlamaCppTarget(str(models.embedded_gguf_path()))\n"
        "target.prefill([42] * 200)\n"
        "rows = target.verify([42] * 5)\n"
        "assert rows.shape == (5, target.vocab_size) and np.isfinite(rows).all()\n"
        "print('rows', rows.shape)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "rows (5, 49152)" in done.stdout
