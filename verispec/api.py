"""Loading an engine from a model spec, and the one-call ``generate``.

import verispec
result = verispec.generate("Summarise: ...", drafter="lookup", k=4, temperature=0)
print(result.text, result.stats.tokens_per_round)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from verispec import models
from verispec.engine import Engine, Generation
from verispec.models import ModelLoadError

WEIGHT_MODES = ("auto", "bf16", "int8", "int4")  # native/formats.WEIGHT_MODES, without importing torch

BACKENDS = ("auto", "native", "torch", "llama.cpp")


def load_engine(
    model: str | None = None,
    *,
    backend: str = "auto",
    dtype: str | None = None,
    device: str | None = None,
    draft_model: str | None = None,
    chat: bool | None = None,
    exact: bool | None = None,
    drafter_weights: str | None = None,
    weights: str = "auto",
) -> Engine:
    """An engine for ``model`` (None: the embedded default).

    backend: "native" (verispec's own decoder for the Llama family, weights read from GGUF or
    safetensors as stored; rows always exact), "torch" (transformers), "llama.cpp" (GGUF
    files, llama-cpp-python), or "auto": native where it covers the architecture (see
    ``native_covers``), else torch. Greedy output is identical to plain decoding on native
    and (exact) torch; llama.cpp's verify rows do not always match its single steps.
    weights: native only; auto (as the file stores them), bf16, int8 or int4.
    dtype: torch backend (and the native torch path on GPUs). device: torch and native.
    exact: torch: verify rows bit-identical to single steps (default on where it can be
    done); llama.cpp: off by default, since there exactness means verifying token by token
    (no speed-up); native rows are exact whatever it says. ``draft_model`` loads a second
    model on the same backend for the ``model`` drafter; its vocabulary is checked when the
    drafter is built. ``drafter_weights``: a directory of trained ``head``/``block`` weights
    (default: the ones shipped for the embedded model); checked against the target when the
    drafter is built.
    """
    if backend not in BACKENDS:
        raise ModelLoadError(f"unknown backend {backend!r}; use one of {', '.join(BACKENDS)}")
    if weights not in WEIGHT_MODES:
        raise ModelLoadError(f"unknown weights {weights!r}; use one of {', '.join(WEIGHT_MODES)}")
    if weights != "auto" and backend not in ("auto", "native"):
        raise ModelLoadError(f"--weights {weights} applies to the native backend, not {backend}")
    if backend == "llama.cpp":
        return _load_llamacpp(model, draft_model, chat, bool(exact), drafter_weights)
    source = models.resolve(model)
    if backend == "native" or (backend == "auto" and native_covers(source)):
        return _load_native(source, weights, device, dtype, draft_model, chat, drafter_weights)
    from verispec.targets.torch_target import TorchTarget, default_device, parse_dtype

    device = device or default_device()
    torch_dtype = parse_dtype(dtype, device)
    loaded = models.load(model, dtype=torch_dtype, device=device)
    target = TorchTarget(loaded.model, name=loaded.source.name, eos_token_ids=eos_ids(loaded), exact=exact)
    options: dict[str, Any] = {"drafter_weights": drafter_weights} if drafter_weights else {}
    if draft_model is not None:
        draft = models.load(draft_model, dtype=torch_dtype, device=device)
        options["draft_target"] = TorchTarget(
            draft.model, name=draft.source.name, eos_token_ids=eos_ids(draft), exact=exact
        )
        options["draft_tokenizer"] = draft.tokenizer
    return Engine(
        target,
        loaded.tokenizer,
        name=loaded.source.name,
        default_chat=chat,
        drafter_options=options,
        load_seconds=loaded.load_seconds,
    )


def native_covers(source: models.ModelSource) -> bool:
    """Whether the native decoder runs this model: a GGUF file or model directory of a
    covered architecture (hub ids go to the torch backend, which can download them)."""
    from verispec.native.checkpoint import ARCHITECTURES, GGUF_ARCHITECTURES

    if source.kind == "gguf":
        return models.gguf_architecture(Path(source.location)) in GGUF_ARCHITECTURES
    if source.kind == "dir":
        return models.directory_model_type(Path(source.location)) in ARCHITECTURES
    return False


def _load_native(
    source: models.ModelSource,
    weights: str,
    device: str | None,
    dtype: str | None,
    draft_model: str | None,
    chat: bool | None,
    drafter_weights: str | None,
) -> Engine:
    import time

    from verispec.targets.native import NativeTarget
    from verispec.targets.torch_target import default_device, parse_dtype

    start = time.perf_counter()
    device = device or default_device()
    torch_dtype = parse_dtype(dtype, device) if dtype not in (None, "auto") else None

    def native(spec: models.ModelSource) -> tuple[NativeTarget, Any]:
        if spec.kind not in ("gguf", "dir"):
            raise ModelLoadError(f"the native backend loads GGUF files and model directories; {spec.name} is a hub id")
        tokenizer = models.tokenizer_for(spec)
        eos = models.eos_token_ids(spec, tokenizer)
        target = NativeTarget(
            spec.kind, spec.location, spec.name, weights, device, eos_token_ids=eos, dtype=torch_dtype
        )
        return target, tokenizer

    target, tokenizer = native(source)
    options: dict[str, Any] = {"drafter_weights": drafter_weights} if drafter_weights else {}
    if draft_model is not None:
        options["draft_target"], options["draft_tokenizer"] = native(models.resolve(draft_model))
    return Engine(
        target,
        tokenizer,
        name=source.name,
        default_chat=chat,
        drafter_options=options,
        load_seconds=time.perf_counter() - start,
    )


def _load_llamacpp(
    model: str | None, draft_model: str | None, chat: bool | None, exact: bool, drafter_weights: str | None
) -> Engine:
    import time

    from verispec.targets.llamacpp import LlamaCppTarget

    start = time.perf_counter()
    source = models.resolve(model)
    if source.kind != "gguf":
        raise ModelLoadError(f"the llama.cpp backend loads GGUF files; {source.name} is a {source.kind} model")
    target = LlamaCppTarget(source.location, name=f"{source.name} (llama.cpp)", exact=exact)
    tokenizer = models.tokenizer_for(source)
    options: dict[str, Any] = {"drafter_weights": drafter_weights} if drafter_weights else {}
    if draft_model is not None:
        draft = models.resolve(draft_model)
        if draft.kind != "gguf":
            raise ModelLoadError(f"the llama.cpp backend loads GGUF draft models; {draft.name} is a {draft.kind} model")
        options["draft_target"] = LlamaCppTarget(draft.location, name=f"{draft.name} (llama.cpp)")
        options["draft_tokenizer"] = models.tokenizer_for(draft)
    return Engine(
        target,
        tokenizer,
        name=source.name,
        default_chat=chat,
        drafter_options=options,
        load_seconds=time.perf_counter() - start,
    )


def eos_ids(loaded: models.LoadedModel) -> list[int]:
    ids: set[int] = set()
    for source in (getattr(loaded.model, "generation_config", None), loaded.model.config, loaded.tokenizer):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if value is not None:
            ids.update(value if isinstance(value, (list, tuple)) else [value])
    return sorted(int(v) for v in ids)


_ENGINES: dict[tuple[Any, ...], Engine] = {}


def generate(prompt: Any, model: str | None = None, drafter: str = "lookup", k: int = 4, **options: Any) -> Generation:
    """Generate with a cached engine for ``model``; sampling options as in ``SamplingParams``."""
    load_keys = ("backend", "dtype", "device", "draft_model", "exact", "drafter_weights", "weights")
    load_options = {key: options.pop(key) for key in load_keys if key in options}
    key = (model, *(load_options.get(k_) for k_ in load_keys))
    if key not in _ENGINES:
        _ENGINES[key] = load_engine(model, **load_options)
    return _ENGINES[key].generate(prompt, drafter=drafter, k=k, **options)
