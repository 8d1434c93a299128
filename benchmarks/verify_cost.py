"""Time of a verify pass by number of rows, per dtype and exact/stock mode, interleaved.

The cost side of speculation: a round verifying k drafts costs r(k + 1) / r(1) plain steps.
Loads the model once per configuration, builds a cache of ``--context`` tokens, then for
``--repeats`` rounds times every configuration at every row count in turn (interleaved, so
machine drift hits all alike) and reports medians.

    .venv/bin/python benchmarks/verify_cost.py --configs float32:exact bfloat16:exact float32:stock

A configuration ``native`` times verispec's native decoder with the file's own formats, and
``native:WEIGHTS`` with ``--weights WEIGHTS`` (bf16, int8, int4); ``native-torch`` and
``native-compiled`` time the native decoder's torch path, eager and through ``torch.compile``
(its compile time is spent in the load's self-test, before any timing); ``native-vector`` times
the native decoder with its wide-layout kernels off (the vector kernels on every pass; where the
CPU has no wide layout, neither AVX-512 VNNI nor AVX2 without VNNI, it is ``native``) and
``native-amxN`` with AMX tile products from N rows up, the wide layout's VNNI kernel below
(the threshold's A/B, where the CPU has tiles); ``native-single`` with the AVX-512 wide layout's
4-bit passes one group of outputs at a time at every row count (the pair kernel's A/B);
``llama.cpp`` times the llama.cpp backend on the embedded GGUF file, and ``llama.cpp:PATH`` on
another GGUF file (another quantisation type, say):

    .venv/bin/python benchmarks/verify_cost.py --configs native native:int8 native:bf16 llama.cpp
    .venv/bin/python benchmarks/verify_cost.py --configs llama.cpp llama.cpp:/tmp/q4_0.gguf
"""

from __future__ import annotations

import argparse
import statistics
import time

from verispec import models
from verispec.targets.base import Target
from verispec.targets.torch_target import TorchTarget, parse_dtype


def use_amx(config: str) -> None:
    """The wide-layout kernels at their default for every configuration but ``native-vector``
    (off), ``native-amxN`` (tiles from N rows up) and ``native-single`` (no pair kernel): one
    switch per process, set before each one's passes."""
    from verispec.native import kernels

    module = kernels.load()
    if module is not None:
        kind = config.partition(":")[0]
        rows = 0 if kind == "native-vector" else int(kind[10:]) if kind.startswith("native-amx") else -1
        module.set_amx_min_rows(rows)
        module.set_wide_pair_rows(0 if kind == "native-single" else -1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument(
        "--configs", nargs="*", default=["native", "llama.cpp", "native:int8", "native:bf16", "float32:exact"]
    )
    parser.add_argument("--rows", nargs="*", type=int, default=[1, 2, 3, 5, 9])
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()

    text = "The history of the city begins with a small settlement on the river. " * (args.context // 10 + 20)
    source = models.resolve(args.model)
    ids = models.tokenizer_for(source)(text)["input_ids"][: args.context]
    targets: dict[str, Target] = {}
    for config in args.configs:
        kind, _, rest = config.partition(":")
        target: Target
        if kind.startswith("native"):
            from verispec.targets.native import NativeTarget

            path = {
                "native": {},
                "native-vector": {},
                "native-single": {},
                "native-torch": {"torch_path": True},
                "native-compiled": {"torch_path": True, "compile": True},
            }
            if kind.startswith("native-amx") and kind[10:].isdigit():
                path[kind] = {}
            if kind not in path:
                raise SystemExit(f"unknown configuration {config!r}")
            target = NativeTarget(source.kind, source.location, name=config, weights=rest or "auto", **path[kind])
            print(f"{config}: {target.description}")
        elif kind == "llama.cpp":
            from verispec.targets.llamacpp import LlamaCppTarget

            path = rest or (args.model if args.model else str(models.embedded_gguf_path()))
            target = LlamaCppTarget(path, name=config)
        else:
            loaded = models.load(args.model, dtype=parse_dtype(kind, "cpu"))
            target = TorchTarget(loaded.model, name=config, exact=rest == "exact")
        target.prefill(ids)
        targets[config] = target
    times: dict[tuple[str, int], list[float]] = {(c, m): [] for c in targets for m in args.rows}
    for repeat in range(args.repeats + 3):
        for config, target in targets.items():
            use_amx(config)
            for rows in args.rows:
                start = time.perf_counter()
                target.verify([42] * rows)
                elapsed = time.perf_counter() - start
                target.rollback(args.context)
                if repeat >= 3:  # warm-up
                    times[(config, rows)].append(elapsed)
    base = statistics.median(times[(args.configs[0], 1)])
    print(
        f"median ms per verify pass, cache of {args.context} tokens, {args.repeats} repeats; "
        f"(x) relative to the same configuration's single row, [x] to {args.configs[0]} single row"
    )
    for config in targets:
        one = statistics.median(times[(config, 1)])
        medians = {m: statistics.median(times[(config, m)]) for m in args.rows}
        cells = [f"M{m}={medians[m] * 1e3:6.1f}ms ({medians[m] / one:.2f}x)" for m in args.rows]
        print(f"{config:<16} {'  '.join(cells)}  [{one / base:.2f}x]")


if __name__ == "__main__":
    main()
