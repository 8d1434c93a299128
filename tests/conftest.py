"""Shared fixtures: tiny model directories and engines on them (fp32, CPU)."""

from __future__ import annotations

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
    from verispec.api import load_engine

    return load_engine(str(tiny_dir), dtype="float32", device="cpu", draft_model=str(draft_dir))


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
