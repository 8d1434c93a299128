"""The llama-cpp-python peer runners on a real GGUF (the tiny one written in the tests)."""

import numpy as np
import pytest

from tests.tiny_gguf import write_tiny_gguf
from verispec.bench.configs import parse_config
from verispec.bench.runners import LlamaCppRunner

pytest.importorskip("llama_cpp")


@pytest.mark.parametrize("name", ["llama.cpp", "llama.cpp-lookup"])
def test_llamacpp_peers_run_past_n_batch_tokens(tmp_path, name):
    # llama-cpp-python's prompt-lookup mode sized its logits buffer to n_batch (512) rows
    # and raised once prompt + output passed it (every long Spec-Bench prompt did).
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf", seed=0, context=1024)
    runner = LlamaCppRunner(parse_config(name, []), str(gguf), threads=2)
    prompt = [int(t) for t in np.random.default_rng(0).integers(3, 60, 600)]
    record = runner.run(prompt, 32, temperature=0.0, seed=0)
    assert record.tokens == 32 == len(record.token_ids)
    plain = LlamaCppRunner(parse_config("llama.cpp", []), str(gguf), threads=2).run(prompt, 32, 0.0, 0)
    assert record.token_ids == plain.token_ids  # greedy: its drafting changes nothing here


def test_every_run_starts_cold(tiny_gguf):
    # A bench runs one prompt under several configurations through one engine: a llama.cpp
    # target reusing the previous run's identical prompt would skip its prefill and look fast.
    from tests import tiny
    from verispec.bench.runners import VerispecRunner
    from verispec.engine import Engine
    from verispec.targets.llamacpp import LlamaCppTarget

    engine = Engine(
        LlamaCppTarget(tiny_gguf), tiny.char_tokenizer(), drafter_options={"draft_target": LlamaCppTarget(tiny_gguf)}
    )
    prompt = engine.encode("the cat sat on the mat")
    runs = [VerispecRunner(parse_config(name, ["none", "model"]), engine, 3) for name in ("none", "model", "none")]
    for runner in runs:
        runner.run(prompt, 8, temperature=0.0, seed=0)
        assert engine.target.reused_tokens == 0
    # Outside the bench the same engine reuses the prompt it still holds.
    engine.generate(prompt, drafter="none", max_tokens=4)
    assert engine.target.reused_tokens == len(prompt) - 1


def test_every_run_starts_cold_on_the_native_target(native_engine):
    # The native target reuses a cached prefix too (its sequences keep a finished request's
    # positions); the bench's runs must not.
    from verispec.bench.runners import VerispecRunner

    prompt = native_engine.encode("the cat sat on the mat")
    for name in ("none", "lookup", "none"):
        VerispecRunner(parse_config(name, ["none", "lookup"]), native_engine, 3).run(prompt, 8, 0.0, 0)
        assert native_engine.target.reused_tokens == 0
    native_engine.generate(prompt, drafter="none", max_tokens=4)
    assert native_engine.target.reused_tokens == len(prompt) - 1


def test_k_max_reaches_the_engine(tiny_gguf):
    # ``k_max`` bounds what ``k=auto`` may choose: at 0 the governor never drafts (nor probes),
    # while the same configuration without it offers drafts on a repetitive prompt.
    from tests import tiny
    from verispec.bench.runners import VerispecRunner
    from verispec.engine import Engine
    from verispec.targets.llamacpp import LlamaCppTarget

    engine = Engine(LlamaCppTarget(tiny_gguf), tiny.char_tokenizer())
    prompt = engine.encode("the cat sat on the mat. " * 6)
    offered = {}
    for name in ("lookup:k=auto", "lookup:k=auto,k_max=0"):
        record = VerispecRunner(parse_config(name, ["none", "lookup"]), engine, "auto").run(prompt, 24, 0.0, 0)
        offered[name] = record.stats["offered"]
    assert offered["lookup:k=auto"] > 0
    assert offered["lookup:k=auto,k_max=0"] == 0


def test_configurations_never_share_a_drafter_that_learns_across_requests(tiny_gguf):
    # Two suffix configurations with the same drafter options ran one drafter, whose cache
    # then held the other configuration's answer to the same prompt (5.6 tokens a round
    # against 3.2 on the edit workload); each must learn only from its own runs.
    from tests import tiny
    from verispec.bench.runners import VerispecRunner
    from verispec.engine import Engine
    from verispec.targets.llamacpp import LlamaCppTarget

    engine = Engine(LlamaCppTarget(tiny_gguf), tiny.char_tokenizer())
    prompt = engine.encode("the cat sat on the mat. " * 6)
    names = ["none", "suffix"]
    first, second = (VerispecRunner(parse_config(n, names), engine, "auto") for n in ("suffix", "suffix:k_max=4"))
    first.run(prompt, 24, 0.0, 0)
    assert len(first.drafter.cache) > 0 and len(second.drafter.cache) == 0
    # Drafters without such a cache are still shared (trained weights load once).
    assert engine.drafter("lookup") is engine.drafter("lookup")
