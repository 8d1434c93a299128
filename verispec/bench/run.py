"""The benchmark loop: one process, warm-up of every configuration, then for each prompt
every configuration in turn (the order rotates from prompt to prompt), so machine drift
hits all configurations alike. With repeats, the whole prompt list is run again (a pass
each), which narrows the noise where a category has few prompts. Writes every per-run
record and the environment as JSON.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from verispec.bench.configs import BenchConfig
from verispec.bench.runners import (
    HFGenerateRunner,
    LlamaCppRunner,
    RunnerUnavailable,
    RunRecord,
    VerispecRunner,
)
from verispec.cpu import cpu_threads
from verispec.prompts import Prompt

WARMUP_TOKENS = 8

# A request's prompt ids, or for a conversation's later turn the function that builds them
# from this configuration's own outputs of the conversation's earlier turns (oldest first).
PromptIds = list[int] | Callable[[list[list[int]]], list[int]]


@dataclass
class BenchSettings:
    model: str
    max_tokens: int
    temperature: float
    seed: int
    default_k: int | str
    prompts_file: str
    repeats: int = 1
    workload: str = "single"  # see verispec.bench.workloads


def build_runners(
    configs: list[BenchConfig],
    engine_for: Callable[[dict[str, object]], Any],
    stock_model_for: Callable[[str | None], tuple[Any, list[int]]],
    gguf_path: str | None,
    default_k: int | str,
) -> tuple[dict[str, Any], dict[str, str]]:
    """Runners by label, and the reasons of those skipped.

    ``engine_for(options)`` gives a (cached) verispec engine for a configuration's engine
    options; ``stock_model_for(dtype)`` the unpatched transformers model (and its EOS ids)
    the transformers peers run, as users of those peers would.
    """
    runners: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for config in configs:
        try:
            if config.name in ("hf-generate", "hf-prompt-lookup"):
                model, eos = stock_model_for(config.options.get("dtype"))
                runners[config.label] = HFGenerateRunner(config, model, eos)
            elif config.name in ("llama.cpp", "llama.cpp-lookup"):
                runners[config.label] = LlamaCppRunner(config, gguf_path, cpu_threads())
            else:
                runners[config.label] = VerispecRunner(config, engine_for(config.engine_options()), default_k)
        except RunnerUnavailable as error:
            skipped[config.label] = str(error)
    return runners, skipped


def environment() -> dict[str, Any]:
    import numpy
    import torch
    import transformers

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            cpu = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), cpu)
    except OSError:
        pass
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    versions.update(transformers=transformers.__version__, numpy=numpy.__version__)
    try:
        import llama_cpp

        versions["llama_cpp_python"] = llama_cpp.__version__
    except ImportError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(), "versions": versions}


def run_bench(
    runners: dict[str, Any],
    prompts: list[tuple[Prompt, PromptIds]],
    settings: BenchSettings,
    progress: Callable[[str], None] | None = None,
    failures: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Warm up, then run every prompt on every runner, interleaved, ``settings.repeats``
    passes over the prompts; returns flat records (``repeat`` says which pass).

    A conversation's later turn (prompt ids given as a function, see ``PromptIds``) is built
    per configuration from what that configuration answered before in the same pass.

    A run that raises (a peer's bug, a prompt over one runtime's context) is appended to
    ``failures`` (config, prompt, error) instead of ending the benchmark; that prompt then
    counts for no ratio of that configuration."""
    labels = list(runners)
    first = prompts[0][1]
    warm_up = first([]) if callable(first) else first
    for label in labels:  # warm-up: first-call costs (allocations, kernels, calibration)
        runners[label].run(warm_up, WARMUP_TOKENS, settings.temperature, settings.seed)
    said: dict[tuple[str, str], list[list[int]]] = {}  # (config, conversation) -> its answers so far
    records: list[dict[str, Any]] = []
    passes = [(repeat, index) for repeat in range(settings.repeats) for index in range(len(prompts))]
    for turn, (repeat, index) in enumerate(passes):
        if index == 0:
            # A drafter that learns across requests (suffix) starts every pass knowing nothing:
            # it may learn from the pass's earlier prompts, never from a run of the same prompt
            # (the warm-up's, an earlier pass's), whose output it would draft whole.
            for runner in runners.values():
                getattr(runner, "start_pass", lambda: None)()
            said.clear()
        prompt, given = prompts[index]
        shift = turn % len(labels)
        for label in labels[shift:] + labels[:shift]:
            earlier = said.setdefault((label, prompt.question_id), [])
            prompt_ids = given(earlier) if callable(given) else given
            try:
                # A conversation's or a prompt's later requests each get a seed of their own.
                seed = settings.seed + prompt.turn - 1
                record: RunRecord = runners[label].run(prompt_ids, settings.max_tokens, settings.temperature, seed)
            except Exception as error:  # one failed run must not lose the others
                if failures is None:
                    raise
                failure = {"config": label, "prompt_index": index, "question_id": prompt.question_id}
                failures.append({**failure, "repeat": repeat, "error": repr(error)})
                earlier.append([])  # a later turn goes on after an empty answer
                continue
            finally:
                if progress is not None:
                    progress(label)
            earlier.append(record.token_ids)
            row = asdict(record)
            row.update(
                turn=prompt.turn,
                config=label,
                prompt_index=index,
                repeat=repeat,
                question_id=prompt.question_id,
                category=prompt.category,
                prompt_tokens=len(prompt_ids),
                tokens_per_second=record.tokens_per_second,
            )
            records.append(row)
    return records


def save(
    path: Path,
    settings: BenchSettings,
    configs: list[BenchConfig],
    skipped: dict[str, str],
    records: list[dict[str, Any]],
    env: dict[str, Any],
    failures: list[dict[str, Any]] | None = None,
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "settings": asdict(settings),
        "configs": [{"label": c.label, "name": c.name, "options": c.options} for c in configs],
        "skipped": skipped,
        "environment": env,
        "records": records,
        "failures": failures or [],
        "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    path.write_text(json.dumps(document, indent=1))


def load(path: Path) -> dict[str, Any]:
    try:
        document: dict[str, Any] = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read benchmark results {path}: {error}") from error
    for key in ("settings", "configs", "records"):
        if key not in document:
            raise ValueError(f"{path} is not a verispec bench result (no {key!r})")
    return document
