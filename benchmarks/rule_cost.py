"""What the acceptance rule itself costs per round: batched torch vs the NumPy reference.

Batch 64, k = 8 drafts, vocabulary 49,152 (SmolLM2's), sampled drafts with full q rows and
point-mass drafts. Reports the median over repeated rounds after a warm-up; run with
`make bench-rule`. Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from verispec.accept import accept_chain
from verispec.accept_batched import accept_chain_batched


def _median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=49_152)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    b, k, v = args.batch, args.k, args.vocab
    logits = rng.normal(size=(b, k + 1, v)) * 3
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    q = 0.6 * p[:, :k] + 0.4 * np.roll(p[:, :k], 1, axis=-1)
    drafts = p[:, :k].argmax(-1)
    u = rng.random((b, 2 * k + 1))
    tensors = [torch.from_numpy(x) for x in (p, drafts, q, u)]

    print(f"rule cost per round: batch {b}, k {k}, vocabulary {v}, torch threads {torch.get_num_threads()}")
    for label, q_np, q_t in (("sampled drafts (q rows)", q, tensors[2]), ("point-mass drafts", None, None)):
        batched = _median_seconds(
            lambda q_t=q_t: accept_chain_batched(tensors[0], tensors[1], q_t, tensors[3]), args.repeats
        )
        reference = _median_seconds(
            lambda q_np=q_np: [
                accept_chain(p[i], drafts[i], None if q_np is None else q_np[i], u[i]) for i in range(b)
            ],
            max(2, args.repeats // 3),
        )
        print(
            f"  {label:<24} batched torch {batched * 1e3:8.2f} ms/round ({batched / b * 1e6:7.1f} us/sequence)   "
            f"reference NumPy {reference * 1e3:8.2f} ms/round ({reference / b * 1e6:7.1f} us/sequence)"
        )


if __name__ == "__main__":
    main()
