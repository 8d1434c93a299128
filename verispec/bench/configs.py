"""What ``verispec bench`` compares: configurations written as ``NAME[:key=value,...]``.

NAME is a verispec drafter (``none``, ``lookup``, ``model``, ...) or a peer baseline:

- ``hf-generate``: transformers ``generate()`` plain decoding;
- ``hf-prompt-lookup``: ``generate(prompt_lookup_num_tokens=n)`` (option ``n``, default 10);
- ``llama.cpp``, ``llama.cpp-lookup``: llama-cpp-python plain and with its prompt-lookup
  drafter (option ``n``), when llama-cpp-python is installed.

Options of verispec configurations: ``k`` (drafts per round: ``auto`` or a number), ``dtype``,
``backend`` (native, torch or llama.cpp), ``quant`` (the native backend's ``--weights``: auto,
bf16, int8, int4), ``exact`` (on or off; torch), ``confidence`` (the trained
drafters' ``min_confidence``: stop drafting below it), ``weights`` (the trained drafters'
weights directory, as ``--drafter-weights``: two trainings compared in one run), ``cache``
(the suffix drafter's cross-request cache in tokens; 0: off), ``branches`` (the suffix
drafter's candidates per node, the trained drafters' per drafted position: 1 drafts chains,
more drafts trees), ``k_max`` (the most drafts ``k=auto`` may choose a round; the engine's
default otherwise), ``kernels`` (where the head's layers run: auto, off = torch, or a kernel
format q4, q8_0, bf16, f32), ``spec_factor``, ``min_score`` and ``max_match`` (the suffix
drafter's longest draft per matched token, its score floor, and the longest match it measures),
``phrases`` (the suffix drafter's phrase table: auto, off or a table file), ``min_match``,
``min_frequency``, ``head_k`` and ``extend`` (the hybrid drafter's: when a suffix proposal
drafts, the head's longest draft, and the suffix tokens that may follow it).
Examples: ``none``, ``lookup:k=8``, ``head:confidence=0.3``, ``head:weights=runs/head``,
``lookup:k=auto,dtype=float32``,
``none:backend=llama.cpp``, ``none:backend=torch``, ``lookup:quant=int4``, ``hf-prompt-lookup:n=10``.

The baseline of every speed-up is ``none`` with no options (verispec's own plain decoding on
the default backend); it is added when not listed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from verispec.drafters.base import DrafterError, check_confidence
from verispec.drafters.registry import check_options
from verispec.errors import UserError

PEERS = ("hf-generate", "hf-prompt-lookup", "llama.cpp", "llama.cpp-lookup")
BASELINE = "none"
VERISPEC_OPTIONS = {
    *("k", "k_max", "dtype", "backend", "quant", "exact", "confidence", "weights", "cache", "branches", "kernels"),
    *("spec_factor", "min_score", "max_match", "phrases", "native", "min_match", "min_frequency", "head_k"),
    "extend",
}
PEER_OPTIONS = {"n", "dtype"}
QUANT_CHOICES = ("auto", "bf16", "int8", "int4")  # the native backend's --weights


class BenchConfigError(UserError, ValueError):
    """A configuration string that cannot be run."""


@dataclass(frozen=True)
class BenchConfig:
    label: str  # as written, used in tables, JSON and plots
    name: str  # drafter or peer name
    options: dict[str, str] = field(default_factory=dict)

    @property
    def is_peer(self) -> bool:
        return self.name in PEERS

    @property
    def is_baseline(self) -> bool:
        return self.name == BASELINE and not self.options

    def engine_options(self) -> dict[str, object]:
        """Keyword arguments of ``load_engine`` this configuration asks for."""
        options: dict[str, object] = {}
        if "dtype" in self.options:
            options["dtype"] = self.options["dtype"]
        if "backend" in self.options:
            options["backend"] = self.options["backend"]
        if "quant" in self.options:
            if self.options["quant"] not in QUANT_CHOICES:
                raise BenchConfigError(f"{self.label}: quant is one of {', '.join(QUANT_CHOICES)}")
            options["weights"] = self.options["quant"]
        if "exact" in self.options:
            if self.options["exact"] not in ("on", "off"):
                raise BenchConfigError(f"{self.label}: exact is on or off, got {self.options['exact']!r}")
            options["exact"] = self.options["exact"] == "on"
        return options

    def drafter_options(self) -> dict[str, object]:
        """Keyword arguments of ``Engine.drafter`` this configuration asks for."""
        options: dict[str, object] = {}
        if "confidence" in self.options:
            options["min_confidence"] = check_confidence(self.options["confidence"])
        if "weights" in self.options:
            if not Path(self.options["weights"]).is_dir():
                raise BenchConfigError(f"{self.label}: weights {self.options['weights']!r} is not a directory")
            options["drafter_weights"] = self.options["weights"]
        if "cache" in self.options:
            options["suffix_cache_tokens"] = self.int_option("cache", 0)
        if "branches" in self.options:  # the suffix drafter's own option; the trained drafters share one
            key = "suffix_branches" if self.name == "suffix" else "draft_branches"
            options[key] = self.int_option("branches", 1)
        if "kernels" in self.options:
            options["head_kernels"] = self.options["kernels"]
        for key in ("spec_factor", "min_score"):
            if key in self.options:
                options[f"suffix_{key}"] = self.float_option(key)
        if "max_match" in self.options:
            options["suffix_max_match"] = self.int_option("max_match", 1)
        if "phrases" in self.options:
            options["suffix_phrases"] = self.options["phrases"]
        if "native" in self.options:
            options["suffix_native"] = self.options["native"]
        for key in ("min_match", "head_k"):
            if key in self.options:
                options[f"hybrid_{key}"] = self.int_option(key, 1)
        if "extend" in self.options:
            options["hybrid_extend"] = self.int_option("extend", 0)
        if "min_frequency" in self.options:
            options["hybrid_min_frequency"] = self.float_option("min_frequency")
        return options

    def k_option(self, default: int | str) -> int | str:
        """Drafts per round: "auto" (the economics governor) or a fixed number."""
        return "auto" if self.options.get("k") == "auto" else self.int_option("k", default)  # type: ignore[arg-type]

    def float_option(self, key: str) -> float:
        try:
            return float(self.options[key])
        except ValueError as error:
            raise BenchConfigError(f"{self.label}: {key} must be a number, got {self.options[key]!r}") from error

    def int_option(self, key: str, default: int) -> int:
        value = self.options.get(key)
        if value is None:
            return default
        try:
            number = int(value)
        except ValueError as error:
            raise BenchConfigError(f"{self.label}: {key} must be an integer, got {value!r}") from error
        if number < 0:
            raise BenchConfigError(f"{self.label}: {key} must be >= 0, got {number}")
        return number


def parse_config(text: str, drafters: list[str]) -> BenchConfig:
    """Parse one configuration; ``drafters`` are the verispec drafter names known."""
    name, _, rest = text.strip().partition(":")
    options: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise BenchConfigError(f"{text!r}: options are key=value, got {item!r}")
        options[key] = value
    if name in PEERS:
        allowed = PEER_OPTIONS
    elif name in drafters:
        allowed = VERISPEC_OPTIONS
    else:
        known = ", ".join([*drafters, *PEERS])
        raise BenchConfigError(f"unknown configuration {name!r}; known: {known}")
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise BenchConfigError(f"{text!r}: unknown option(s) {unknown}; {name} takes {sorted(allowed)}")
    config = BenchConfig(label=text.strip(), name=name, options=options)
    config.k_option(0)
    config.int_option("n", 0)
    config.int_option("k_max", 0)
    config.engine_options()
    try:
        config.drafter_options()
    except DrafterError as error:
        raise BenchConfigError(f"{text!r}: {error}") from error
    if name in drafters:  # each option alone: the message names the option as written
        for key, value in options.items():
            try:
                check_options(name, BenchConfig(text, name, {key: value}).drafter_options())
            except DrafterError as error:
                raise BenchConfigError(f"{text!r}: option {key} does not apply to {name}") from error
    return config


def parse_configs(texts: list[str], drafters: list[str]) -> list[BenchConfig]:
    """Parse all; the plain baseline ``none`` is added first when missing."""
    if not texts:
        raise BenchConfigError("no configurations given")
    configs = [parse_config(text, drafters) for text in texts]
    labels = [c.label for c in configs]
    if len(set(labels)) != len(labels):
        raise BenchConfigError(f"configurations repeat: {labels}")
    if not any(c.is_baseline for c in configs):
        configs.insert(0, BenchConfig(label=BASELINE, name=BASELINE))
    return configs


# A peer's own plain decoding: the run its speculative mode must be compared with.
PEER_PLAIN = {"hf-prompt-lookup": "hf-generate", "llama.cpp-lookup": "llama.cpp"}


def own_plain(configs: list[BenchConfig], fallback: str) -> dict[str, str]:
    """For each speculative configuration, the plain decoding of the same runtime.

    A verispec configuration's own plain run is ``none`` with the same backend, dtype and
    exactness; a peer's speculative mode's is that peer's plain mode with the same dtype.
    Identity (greedy output equal token for token) and the cost of a round in plain steps
    mean something only against that run: another runtime's plain output differs by its
    kernels and quantisation, not by speculation. Plain configurations, and speculative ones
    without such a run in the bench, are held to ``fallback`` (verispec's plain decoding)."""

    def settings(config: BenchConfig) -> tuple[tuple[str, str], ...]:
        kept = ("backend", "quant", "dtype", "exact")
        return tuple(sorted((key, value) for key, value in config.options.items() if key in kept))

    plain_names = {BASELINE, *PEER_PLAIN.values()}
    plain_runs = {(c.name, settings(c)): c.label for c in configs if c.name in plain_names}
    result = {}
    for config in configs:
        if config.name in plain_names:
            result[config.label] = fallback
        else:
            plain = PEER_PLAIN.get(config.name, BASELINE)
            result[config.label] = plain_runs.get((plain, settings(config)), fallback)
    return result
