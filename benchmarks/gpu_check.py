"""The native decoder on a GPU: one short prepared check (a few minutes on one device).

    .venv/bin/python benchmarks/gpu_check.py            # needs CUDA; exits 2 without it

On CUDA the native backend runs its torch path (dequantised bf16 weights) with each layer
through ``torch.compile``. This prints: the load (with the compile time of the self-test's
passes), whether verify rows equal single steps there (the self-test), the time of a verify
pass by rows at context 200 with and without compile, and whether speculative greedy output
equals plain greedy output on a few dev prompts.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 2
    from verispec import models
    from verispec.api import load_engine
    from verispec.prompts import load_prompts, select
    from verispec.targets.native import NativeTarget

    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    source = models.resolve(None)
    ids = models.tokenizer_for(source)("The history of the city begins with a small settlement. " * 30)["input_ids"]
    for compiled in (False, True):
        start = time.perf_counter()
        target = NativeTarget(source.kind, source.location, name="gpu", device="cuda", compile=compiled)
        print(
            f"compile={compiled}: loaded in {time.perf_counter() - start:.1f} s "
            f"(compile {getattr(target.decoder, 'compile_seconds', None)}), rows exact: {target.batched_verify_exact}"
        )
        target.prefill(ids[:200])
        cells = []
        for rows in (1, 2, 3, 5, 9):
            times = []
            for _ in range(20):
                torch.cuda.synchronize()
                began = time.perf_counter()
                target.verify(ids[200 : 200 + rows])
                torch.cuda.synchronize()
                times.append(time.perf_counter() - began)
                target.rollback(200)
            cells.append(f"M{rows}={statistics.median(times[5:]) * 1e3:.2f}ms")
        print("  ", "  ".join(cells))
    engine = load_engine(None, device="cuda")
    same = 0
    prompts = select(load_prompts(), per_category=1)[:6]
    for prompt in prompts:
        plain = engine.generate(prompt.text, drafter="none", temperature=0, max_tokens=64)
        fast = engine.generate(prompt.text, drafter="lookup", k="auto", temperature=0, max_tokens=64)
        same += fast.token_ids == plain.token_ids
        speeds = f"plain {plain.stats.tokens_per_second:.0f} tok/s, lookup {fast.stats.tokens_per_second:.0f}"
        print(f"  {prompt.category}: {speeds}")
    print(f"greedy speculative == plain on {same}/{len(prompts)} prompts")
    return 0 if same == len(prompts) else 1


if __name__ == "__main__":
    sys.exit(main())
