"""Loading an engine from a model spec, and the one-call ``generate``.

import verispec
result = verispec.generate("Summarise: ...", drafter="lookup", k=4, temperature=0)
print(result.text, result.stats.tokens_per_round)
"""

from __future__ import annotations

from typing import Any

from verispec import models
from verispec.engine import Engine, Generation


def load_engine(
    model: str | None = None,
    *,
    dtype: str | None = None,
    device: str | None = None,
    draft_model: str | None = None,
    chat: bool | None = None,
) -> Engine:
    """An engine on the torch backend for ``model`` (None: the embedded default).

    ``draft_model`` loads a second model for the ``model`` drafter on the same device and
    dtype; its vocabulary is checked against the target's when the drafter is built.
    """
    from verispec.targets.torch_target import TorchTarget, default_device, parse_dtype

    device = device or default_device()
    torch_dtype = parse_dtype(dtype, device)
    loaded = models.load(model, dtype=torch_dtype, device=device)
    target = TorchTarget(loaded.model, name=loaded.source.name, eos_token_ids=_eos_ids(loaded))
    options: dict[str, Any] = {}
    if draft_model is not None:
        draft = models.load(draft_model, dtype=torch_dtype, device=device)
        options["draft_target"] = TorchTarget(draft.model, name=draft.source.name, eos_token_ids=_eos_ids(draft))
        options["draft_tokenizer"] = draft.tokenizer
    return Engine(
        target,
        loaded.tokenizer,
        name=loaded.source.name,
        default_chat=chat,
        drafter_options=options,
        load_seconds=loaded.load_seconds,
    )


def _eos_ids(loaded: models.LoadedModel) -> list[int]:
    ids: set[int] = set()
    for source in (getattr(loaded.model, "generation_config", None), loaded.model.config, loaded.tokenizer):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if value is not None:
            ids.update(value if isinstance(value, (list, tuple)) else [value])
    return sorted(int(v) for v in ids)


_ENGINES: dict[tuple[Any, ...], Engine] = {}


def generate(prompt: Any, model: str | None = None, drafter: str = "lookup", k: int = 4, **options: Any) -> Generation:
    """Generate with a cached engine for ``model``; sampling options as in ``SamplingParams``."""
    load_keys = ("dtype", "device", "draft_model")
    load_options = {key: options.pop(key) for key in load_keys if key in options}
    key = (model, *(load_options.get(k_) for k_ in load_keys))
    if key not in _ENGINES:
        _ENGINES[key] = load_engine(model, **load_options)
    return _ENGINES[key].generate(prompt, drafter=drafter, k=k, **options)
