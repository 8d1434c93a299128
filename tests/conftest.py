"""Shared fixtures: tiny model directories and engines on them (fp32, CPU)."""

from __future__ import annotations

import os

# Idle OpenMP workers sleep instead of spinning. With spinning (the default), torch's second
# thread on this 2-core machine burns a core between ops and, once other processes want the
# cores, every op waits for a descheduled worker: the tiny engine's 3-token requests took
# 10-20x longer under load (0.35-0.47 s against 0.02-0.05 s), the same as with one thread
# once passive. The thread count, and so what the tests run, is unchanged. Set before torch
# (imported below, through tests.tiny) loads OpenMP, which reads it once; servers and Ray
# workers the tests start inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest

from tests import tiny


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return tiny.save(tiny.tiny_model(seed=0), tmp_path_factory.mktemp("tiny-target"))


@pytest.fixture(scope="session")
def draft_dir(tmp_path_factory):
    target = tiny.tiny_model(seed=0)
    return tiny.save(tiny.perturbed_copy(target, seed=1, noise=0.1), tmp_path_factory.mktemp("tiny-draft"))


@pytest.fixture(scope="session")
def tiny_engine(tiny_dir, draft_dir):
    """The tiny target on the torch backend (transformers, exact rows)."""
    from verispec.api import load_engine

    return load_engine(str(tiny_dir), backend="torch", dtype="float32", device="cpu", draft_model=str(draft_dir))


@pytest.fixture(scope="session")
def native_engine(tiny_dir, draft_dir):
    """The tiny target on the native backend (its C++ kernels), the draft model too."""
    from verispec.api import load_engine

    engine = load_engine(str(tiny_dir), backend="native", draft_model=str(draft_dir))
    assert engine.target.path == "kernels"
    return engine


@pytest.fixture(params=["tiny_engine", "native_engine"], ids=["torch", "native"])
def either_engine(request):
    """Each test using it runs on both backends that keep greedy output exact."""
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="session")
def tiny_train_data(tmp_path_factory):
    """One cache of the tiny target's responses and hidden states for every training test."""
    return tmp_path_factory.mktemp("tiny-train-data")


@pytest.fixture(scope="session")
def tiny_drafters(tiny_dir, tiny_train_data, tmp_path_factory):
    """{"head": dir, "block": dir, "fused-head": dir}: drafters trained briefly for the tiny
    target; "fused-head" is a head reading EAGLE-3's fused features of every layer."""
    root = tmp_path_factory.mktemp("tiny-drafters")
    for kind in ("block", "head"):  # the head reads the block's cached states (its last layer)
        tiny.train_tiny_drafter(kind, tiny_dir, root / kind, tiny_train_data)
    tiny.train_tiny_drafter("head", tiny_dir, root / "fused-head", tiny_train_data, net={"feature_layers": 4})
    return {"head": root / "head", "block": root / "block", "fused-head": root / "fused-head"}


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory):
    from tests.tiny_gguf import write_tiny_gguf

    return write_tiny_gguf(tmp_path_factory.mktemp("tiny-gguf") / "tiny.gguf", seed=0)


@pytest.fixture(scope="session")
def llama_engine(tiny_gguf, tmp_path_factory):
    """The tiny GGUF on the llama.cpp backend, with a draft GGUF (another seed) for ``model``."""
    from tests.tiny_gguf import write_tiny_gguf
    from verispec.engine import Engine
    from verispec.targets.llamacpp import LlamaCppTarget

    draft = write_tiny_gguf(tmp_path_factory.mktemp("tiny-gguf-draft") / "draft.gguf", seed=0, head_scale=14.0)
    options = {"draft_target": LlamaCppTarget(draft), "draft_tokenizer": tiny.char_tokenizer()}
    return Engine(LlamaCppTarget(tiny_gguf), tiny.char_tokenizer(), drafter_options=options)
