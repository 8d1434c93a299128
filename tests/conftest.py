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
