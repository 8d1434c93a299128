"""Drafter weight directories: what is refused, and how."""

import json

import pytest

from tests import tiny
from verispec.drafters import weights
from verispec.drafters.base import DrafterError
from verispec.targets.torch_target import TorchTarget


@pytest.fixture(scope="module")
def target():
    return TorchTarget(tiny.tiny_model(seed=0), name="tiny", exact=False)


def test_a_missing_directory_says_how_to_train(target, tmp_path):
    with pytest.raises(DrafterError, match=r"no head drafter weights in .*verispec train-drafter"):
        weights.load(tmp_path / "nothing", "head", target)


def test_a_foreign_or_damaged_config_is_refused(target, tiny_drafters, tmp_path):
    directory = tmp_path / "copy"
    directory.mkdir()
    (directory / "model.safetensors").write_bytes((tiny_drafters["head"] / "model.safetensors").read_bytes())
    config = json.loads((tiny_drafters["head"] / "config.json").read_text())
    (directory / "config.json").write_text("{not json")
    with pytest.raises(DrafterError, match="not readable JSON"):
        weights.load(directory, "head", target)
    (directory / "config.json").write_text(json.dumps({**config, "version": 99}))
    with pytest.raises(DrafterError, match="version 99"):
        weights.load(directory, "head", target)
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(DrafterError, match="not a readable safetensors file"):
        weights.load(directory, "head", target)


def test_a_directory_with_both_kinds_serves_each(tiny_drafters):
    root = tiny_drafters["head"].parent
    assert weights.weights_dir(str(root), "block") == root / "block"
    assert weights.weights_dir(str(tiny_drafters["head"]), "head") == tiny_drafters["head"]
    assert weights.weights_dir(None, "head") == weights.SHIPPED_DIR / "head"
