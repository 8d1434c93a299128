"""Loading an engine from a model spec, and the one-call ``generate``.

import verispec
result = verispec.generate("Summarise: ...", drafter="lookup", k=4, temperature=0)
print(result.text, result.stats.tokens_per_round)

options = verispec.GenerateOptions(drafter="lookup", k=4, sampling=verispec.SamplingParams(temperature=0))
result = verispec.generate("Summarise: ...", options=options)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from verispec import models
from verispec.engine import DEFAULT_K_MAX, Engine, Generation
from verispec.models import ModelLoadError
from verispec.sampling import SamplingParams

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
    slots: int = 1,
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
    drafter is built. ``slots``: native only, sequences the target's cache holds, so a
    ``verispec.scheduler.Scheduler`` can run that many requests in shared passes (other
    backends run one at a time).
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
        return _load_native(source, weights, device, dtype, draft_model, chat, drafter_weights, slots)
    from verispec.targets.torch_target import TorchTarget, default_device, parse_dtype

    device = device or default_device()
    torch_dtype = parse_dtype(dtype, device)
    loaded = models.load(model, dtype=torch_dtype, device=device)
    target = TorchTarget(loaded.model, name=loaded.source.name, eos_token_ids=loaded.eos_ids, exact=exact)
    options: dict[str, Any] = {"drafter_weights": drafter_weights} if drafter_weights else {}
    if draft_model is not None:
        draft = models.load(draft_model, dtype=torch_dtype, device=device)
        options["draft_target"] = TorchTarget(
            draft.model, name=draft.source.name, eos_token_ids=draft.eos_ids, exact=exact
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
    slots: int = 1,
) -> Engine:
    import time

    from verispec.targets.native import NativeTarget
    from verispec.targets.torch_target import default_device, parse_dtype

    start = time.perf_counter()
    device = device or default_device()
    torch_dtype = parse_dtype(dtype, device) if dtype not in (None, "auto") else None

    def native(spec: models.ModelSource, slots: int = 1) -> tuple[NativeTarget, Any]:
        if spec.kind not in ("gguf", "dir"):
            raise ModelLoadError(f"the native backend loads GGUF files and model directories; {spec.name} is a hub id")
        tokenizer = models.tokenizer_for(spec)
        eos = models.eos_token_ids(spec, tokenizer)
        target = NativeTarget(
            spec.kind, spec.location, spec.name, weights, device, eos_token_ids=eos, dtype=torch_dtype, slots=slots
        )
        return target, tokenizer

    target, tokenizer = native(source, slots)
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


@dataclass(frozen=True)
class GenerateOptions:
    """Everything ``generate`` may be told besides the prompt and the model.

    Loading (as in ``load_engine``; one engine is kept per model and distinct set of these):
    backend, weights, dtype, device, draft_model, exact, drafter_weights.
    The request (as in ``Engine.stream``): drafter (a registered name), k (drafts per round,
    or "auto" for the governor), k_max (the most "auto" may choose), chat (None: the
    tokenizer's chat template for text prompts where it has one), sampling (temperature,
    top_k, ..., max_tokens, stop: see ``SamplingParams``).
    """

    backend: str = "auto"
    weights: str = "auto"
    dtype: str | None = None
    device: str | None = None
    draft_model: str | None = None
    exact: bool | None = None
    drafter_weights: str | None = None
    drafter: str = "lookup"
    k: int | str = 4
    k_max: int = DEFAULT_K_MAX
    chat: bool | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)

    LOAD_FIELDS: ClassVar[tuple[str, ...]] = (
        "backend",
        "weights",
        "dtype",
        "device",
        "draft_model",
        "exact",
        "drafter_weights",
    )

    def with_keywords(self, **keywords: Any) -> GenerateOptions:
        """These options with ``keywords`` replacing fields: a field of this class, or a
        ``SamplingParams`` field, which replaces that field of ``sampling``."""
        own = {f.name for f in dataclasses.fields(self)}
        sampling = {key: keywords.pop(key) for key in list(keywords) if key not in own}
        try:
            params = dataclasses.replace(self.sampling, **sampling) if sampling else self.sampling
        except TypeError:
            known = sorted(own | {f.name for f in dataclasses.fields(SamplingParams)})
            raise TypeError(f"generate() got unknown options {sorted(sampling)}; known: {', '.join(known)}") from None
        return dataclasses.replace(self, **keywords, sampling=params)

    def load_options(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.LOAD_FIELDS}


_ENGINES: dict[tuple[Any, ...], Engine] = {}


def generate(
    prompt: Any, model: str | None = None, *, options: GenerateOptions | None = None, **keywords: Any
) -> Generation:
    """Generate with an engine for ``model`` (None: the embedded default), loaded on the first
    call and kept. ``options``: a ``GenerateOptions``; ``keywords`` (its fields, or sampling
    fields such as ``temperature``) replace fields of ``options`` (default: the defaults)."""
    options = (options or GenerateOptions()).with_keywords(**keywords)
    load = options.load_options()
    key = (model, *load.values())
    if key not in _ENGINES:
        _ENGINES[key] = load_engine(model, **load)
    return _ENGINES[key].generate(
        prompt, drafter=options.drafter, k=options.k, k_max=options.k_max, chat=options.chat, params=options.sampling
    )
