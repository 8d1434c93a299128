"""The held-out score of trained drafter weights, without a benchmark run.

    .venv/bin/python benchmarks/held_out_score.py [--weights head=DIR block=DIR ...] [--k 8]

Scores each (kind, weights directory) on the eval prompts (``verispec.train.sources.eval_prompts``:
52 dev-like prompts, none from Spec-Bench) with ``verispec.train.score``: the target's greedy
answers (native, cached), the drafter's greedy chains along them as it drafts them, and the
acceptance per draft position with the expected tokens per round at k; with ``--temperature T``
its sampled arm (answers sampled at T, expected acceptance sum min(p, q)). Without ``--weights``
it scores the weights shipped for the embedded model. Prints one row per weights and, with
``--json FILE``, writes them.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from verispec.api import load_engine
from verispec.cache import cache_root
from verispec.drafters import weights
from verispec.train import score
from verispec.train.pipeline import _native_answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights", nargs="*", default=["head=shipped", "block=shipped"], help="KIND=DIR")
    parser.add_argument("--k", type=int, default=score.EVAL_K)
    parser.add_argument("--tokens", type=int, default=score.EVAL_TOKENS, help="longest eval answer")
    parser.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="0: greedy chains along greedy answers; T > 0: the sampled arm, along answers sampled at T",
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    engine = load_engine(None, backend="torch", dtype="float32")
    target = engine.target
    fingerprint = weights.target_identity(target)["weights_sha256"]
    prompts = score.default_eval_prompts()
    answer = _native_answers(None, len(prompts), args.temperature)
    probs = score.target_distributions(target.model, args.temperature) if args.temperature > 0 else None
    rows = []
    for spec in args.weights:
        kind, _, directory = spec.partition("=")
        options = {} if directory in ("", "shipped") else {"drafter_weights": directory}
        drafter = engine.drafter(kind, **options)
        layers = drafter.net.config.layers_read
        start = time.perf_counter()
        corpus, made = score.eval_corpus(
            target.model, engine.tokenizer, sorted(target.eos_token_ids), prompts, layers,
            cache_root() / "train-data" / fingerprint[:16], fingerprint, args.tokens, answer=answer,
            temperature=args.temperature,
        )  # fmt: skip
        if probs is None:
            result = score.chain_acceptance(drafter.net, drafter.shared, corpus, args.k).as_dict()
        else:
            result = score.sampled_acceptance(drafter.net, drafter.shared, corpus, args.k, probs, args.temperature)
            result = result.as_dict()
        seconds = time.perf_counter() - start - made
        row = {"kind": kind, "weights": directory or "shipped", **result, "score_seconds": round(seconds, 1)}
        rows.append(row)
        per_position = " ".join(f"{a:.2f}" for a in result["per_position"])
        print(
            f"{kind:5s} {row['weights']}: position 1 {result['first_acceptance']:.3f}, expected tokens/round "
            f"{result['expected_tokens']:.2f} at k {args.k} [{per_position}], {result['anchors']} anchors, "
            f"{seconds:.0f} s (eval answers and states {made:.0f} s)"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
