"""What to load and how to speculate by default, as ``verispec serve`` and ``verispec batch``
are told it: ``EngineSpec``, a plain value (a Ray actor receives one and loads the same engine)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from verispec.cli_args import model_options

if TYPE_CHECKING:
    from verispec.engine import Engine


@dataclass(frozen=True)
class EngineSpec:
    """model: what ``load_engine`` loads (None: the embedded default), with ``load_options``
    (backend, weights, ...); slots: requests the target's cache holds at once (the server's
    --max-running); drafter and k: the defaults requests may override (k None: the engine's);
    suffix_cache: tokens of earlier requests the suffix drafter keeps to draft from."""

    model: str | None
    load_options: dict[str, Any] = field(default_factory=dict)
    slots: int = 1
    drafter: str = "lookup"
    k: int | str | None = None
    suffix_cache: int = 0

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> EngineSpec:
        """From parsed ``add_model_options``, ``add_speculation_options`` and --max-running."""
        return cls(
            model=args.model,
            load_options=model_options(args),
            slots=args.max_running,
            drafter=args.drafter,
            k=args.k,
            suffix_cache=args.suffix_cache,
        )

    def load(self) -> Engine:
        """The engine, checked: one short request tries the default drafter and k (a bad one
        fails here, not on the first request) and pays first-call costs now."""
        from verispec.api import load_engine

        engine = load_engine(self.model, slots=self.slots, **self.load_options)
        engine.drafter_options["suffix_cache_tokens"] = self.suffix_cache
        options: dict[str, Any] = {"drafter": self.drafter}
        if self.k is not None:
            options["k"] = self.k
        engine.generate(engine.encode("Hello", chat=False), max_tokens=2, temperature=0.0, **options)
        return engine
