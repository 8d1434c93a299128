"""One runner per configuration: run a prompt (as token ids) and return a record.

Every runner receives the same token ids (chat template applied once, by verispec's
tokenizer), generates at most ``max_tokens`` new tokens, stops at the model's
end-of-sequence, and is timed over the whole request (prefill included) so that verispec
and the peers are measured alike.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

from verispec.bench.configs import BenchConfig

DEFAULT_LOOKUP_N = 10


class RunnerUnavailable(RuntimeError):
    """A peer that cannot run here (its package is not installed); the message says why."""


@dataclass
class RunRecord:
    """What one configuration did on one prompt."""

    tokens: int
    seconds: float
    token_ids: list[int]
    peak_rss_mb: float
    stats: dict[str, Any] | None = None  # verispec's RequestStats.as_dict(); None for peers
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


class PeakMemory:
    """Samples this process's resident memory every few ms while a run is in progress."""

    def __init__(self, interval: float = 0.005) -> None:
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._process = psutil.Process()

    def __enter__(self) -> PeakMemory:
        self.peak = self._process.memory_info().rss
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, self._process.memory_info().rss)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._process.memory_info().rss)


def _start_cold(target: Any) -> None:
    """Every run starts without a prompt prefix cached by an earlier one. llama.cpp targets
    (verispec's and llama-cpp-python's) reuse the prefix a new prompt shares with the last
    request; in a bench the last request through a shared engine is often the same prompt
    under another configuration, which would skip its whole prefill. Cold starts for all
    keep the runs comparable (prefix reuse itself is left to serving)."""
    drop = getattr(target, "drop_cache", None)
    if drop is not None:
        drop()


class VerispecRunner:
    def __init__(self, config: BenchConfig, engine: Any, default_k: int | str) -> None:
        self.config, self.engine = config, engine
        self.drafter = engine.drafter(config.name, **config.drafter_options())
        if getattr(self.drafter, "cache", None) is not None:
            # One that learns across requests gets its own: configurations with the same
            # drafter options (``suffix``, ``suffix:k_max=7``) would otherwise share its cache,
            # and each would draft from the other's answer to the same prompt.
            self.drafter = engine.drafter(config.name, fresh=True, **config.drafter_options())
        self.k = config.k_option(default_k)
        # k_max only where the configuration sets it: the engine's default otherwise
        self.limits = {"k_max": config.int_option("k_max", 0)} if "k_max" in config.options else {}

    def start_pass(self) -> None:
        """Forget what earlier runs taught a drafter that learns across requests."""
        cache = getattr(self.drafter, "cache", None)
        if cache is not None:
            cache.clear()

    def run(self, prompt_ids: list[int], max_tokens: int, temperature: float, seed: int) -> RunRecord:
        _start_cold(self.engine.target)
        with PeakMemory() as memory:
            start = time.perf_counter()
            result = self.engine.generate(
                prompt_ids,
                drafter=self.drafter,
                k=self.k,
                temperature=temperature,
                seed=seed,
                max_tokens=max_tokens,
                **self.limits,
            )
            seconds = time.perf_counter() - start
        return RunRecord(len(result.token_ids), seconds, result.token_ids, memory.peak / 2**20, result.stats.as_dict())


class HFGenerateRunner:
    """transformers ``generate()`` on an unpatched model of the same weights and dtype."""

    def __init__(self, config: BenchConfig, model: Any, eos_token_ids: list[int]) -> None:
        self.config = config
        self.model = model
        self.eos = sorted(eos_token_ids)
        self.lookup = config.int_option("n", DEFAULT_LOOKUP_N) if config.name == "hf-prompt-lookup" else None

    def run(self, prompt_ids: list[int], max_tokens: int, temperature: float, seed: int) -> RunRecord:
        import torch

        input_ids = torch.tensor([prompt_ids], device=self.model.device)
        options: dict[str, Any] = {
            "max_new_tokens": max_tokens,
            "eos_token_id": self.eos,
            "pad_token_id": self.eos[0],
            "attention_mask": torch.ones_like(input_ids),
        }
        if temperature > 0:
            torch.manual_seed(seed)
            options.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
        else:
            options.update(do_sample=False, temperature=None, top_k=None, top_p=None)
        if self.lookup is not None:
            options["prompt_lookup_num_tokens"] = self.lookup
        with PeakMemory() as memory, torch.inference_mode():
            start = time.perf_counter()
            output = self.model.generate(input_ids, **options)
            seconds = time.perf_counter() - start
        new = output[0, len(prompt_ids) :].tolist()
        return RunRecord(len(new), seconds, new, memory.peak / 2**20)


class LlamaCppRunner:
    """llama-cpp-python on the GGUF file, plain or with its prompt-lookup drafter."""

    def __init__(self, config: BenchConfig, gguf_path: str | None, threads: int) -> None:
        try:
            from llama_cpp import Llama
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
        except ImportError as error:
            raise RunnerUnavailable(f"{config.label}: llama-cpp-python is not installed ({error})") from error
        if gguf_path is None:
            raise RunnerUnavailable(f"{config.label}: the model is not a GGUF file")
        self.config = config
        draft = None
        if config.name == "llama.cpp-lookup":
            draft = LlamaPromptLookupDecoding(num_pred_tokens=config.int_option("n", DEFAULT_LOOKUP_N))
        self.llm = Llama(
            model_path=gguf_path,
            n_ctx=0,  # the model's trained context: the same room the verispec targets get
            n_threads=threads,
            n_threads_batch=threads,
            draft_model=draft,
            # llama-cpp-python turns logits_all on for a draft model but sizes its scores
            # buffer from the argument (n_batch rows): without this its prompt-lookup mode
            # raises once prompt + output pass n_batch (512) tokens.
            logits_all=draft is not None,
            verbose=False,
        )

    def run(self, prompt_ids: list[int], max_tokens: int, temperature: float, seed: int) -> RunRecord:
        self.llm.set_seed(seed)
        self.llm.reset()  # cold: no prefix of an earlier request reused (see _start_cold)
        eos = self.llm.token_eos()
        tokens: list[int] = []
        with PeakMemory() as memory:
            start = time.perf_counter()
            for token in self.llm.generate(
                prompt_ids, temp=temperature, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True
            ):
                tokens.append(int(token))
                if token == eos or len(tokens) >= max_tokens:
                    break
            seconds = time.perf_counter() - start
        return RunRecord(len(tokens), seconds, tokens, memory.peak / 2**20)
