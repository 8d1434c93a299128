"""Prefill time by prompt length, per backend, interleaved: is prompt processing linear?

Each backend reads prompts of ``--lengths`` tokens (a Spec-Bench passage repeated), cold
(no prefix reused), ``--repeats`` times in turn; the medians are printed in ms per prompt
token. The attention over a prompt is quadratic in its length by nature; the question is
whether that term stays small beside the weights, which cost the same for every token.

    .venv/bin/python benchmarks/prefill_cost.py --configs native llama.cpp --lengths 256 1024 2048 4096
"""

from __future__ import annotations

import argparse
import statistics
import time

from verispec import models
from verispec.prompts import load_prompts, select
from verispec.targets.base import Target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--configs", nargs="*", default=["native", "llama.cpp"])
    parser.add_argument("--lengths", nargs="*", type=int, default=[256, 1024, 2048, 4096])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    source = models.resolve(args.model)
    tokenizer = models.tokenizer_for(source)
    text = " ".join(p.text for p in select(load_prompts(), categories=["summarization", "rag"], per_category=5))
    ids = tokenizer(text)["input_ids"]
    while len(ids) < max(args.lengths):
        ids = ids + ids
    targets: dict[str, Target] = {}
    for config in args.configs:
        kind, _, rest = config.partition(":")
        if kind == "native":
            from verispec.targets.native import NativeTarget

            targets[config] = NativeTarget(source.kind, source.location, name=config, weights=rest or "auto")
        elif kind == "llama.cpp":
            from verispec.targets.llamacpp import LlamaCppTarget

            targets[config] = LlamaCppTarget(source.location, name=config)
        else:
            from verispec.targets.torch_target import TorchTarget, parse_dtype

            loaded = models.load(args.model, dtype=parse_dtype(kind, "cpu"))
            targets[config] = TorchTarget(loaded.model, name=config, exact=rest != "stock")
    times: dict[tuple[str, int], list[float]] = {(c, n): [] for c in targets for n in args.lengths}
    for _ in range(args.repeats):
        for length in args.lengths:
            for config, target in targets.items():
                drop = getattr(target, "drop_cache", None)
                if drop is not None:
                    drop()  # llama.cpp would reuse the previous prompt
                start = time.perf_counter()
                target.prefill(ids[:length])
                times[(config, length)].append(time.perf_counter() - start)
                target.reset()
    print(f"median ms per prompt token over {args.repeats} cold prefills (total seconds)")
    for config in targets:
        cells = []
        for length in args.lengths:
            seconds = statistics.median(times[(config, length)])
            cells.append(f"{length}: {seconds / length * 1e3:.2f} ({seconds:.2f} s)")
        print(f"{config:<12} " + "  ".join(cells))


if __name__ == "__main__":
    main()
