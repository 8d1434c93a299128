"""Which format for the LM head: time per pass and agreement with the unrounded head.

The embedded model's tied embedding / LM head is stored as Q8_0 (8-bit codes, a scale per
block of 32). This times the head's matrix product in the kernel formats it could take
(q8_0 as stored, q4 requantised from it, bf16, f32), interleaved, for 1 and 5 rows, and
scores each against the float32 product of the stored values with float32 activations
(the head exactly as the file defines it) on real final hidden states: the share of rows
whose argmax is unchanged and the largest logit error.

    .venv/bin/python benchmarks/head_formats.py --positions 2000
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from verispec import models
from verispec.native import checkpoint, formats, kernels
from verispec.native.decoder import KernelDecoder
from verispec.prompts import load_prompts, select


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--positions", type=int, default=2000, help="final hidden states to score on")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()

    ext = kernels.load()
    source = models.resolve(None)
    ck = checkpoint.read_gguf(source.location)
    tokenizer = models.tokenizer_for(source)
    decoder = KernelDecoder(ck, 4096, ext)
    states = []
    for prompt in select(load_prompts(), per_category=3):
        ids = tokenizer(prompt.text)["input_ids"][:1024]
        _, hidden = decoder.forward(ids, 0, False, (ck.config.num_hidden_layers,))
        states.append(hidden)
        if sum(len(s) for s in states) >= args.positions:
            break
    hidden = torch.cat(states)[: args.positions].contiguous()
    reference = hidden.double() @ torch.from_numpy(ck.head.dequantize()).double().T
    heads = {name: formats.requantize(ck.head, name) for name in ("q8_0", "q4", "bf16", "f32")}
    matrices = {name: decoder._matrix(weights) for name, weights in heads.items()}
    print(f"scored on {len(hidden)} final hidden states of dev prompts; reference: stored Q8_0 values x fp32")
    times: dict[tuple[str, int], list[float]] = {(n, m): [] for n in matrices for m in (1, 5)}
    for _ in range(args.repeats):
        for name, matrix in matrices.items():
            for rows in (1, 5):
                start = time.perf_counter()
                ext.apply(matrix, hidden[:rows])
                times[(name, rows)].append(time.perf_counter() - start)
    for name, matrix in matrices.items():
        logits = torch.cat([ext.apply(matrix, chunk) for chunk in hidden.split(256)]).double()
        same = float((logits.argmax(-1) == reference.argmax(-1)).double().mean())
        error = float((logits - reference).abs().max())
        one, five = (statistics.median(times[(name, m)]) * 1e3 for m in (1, 5))
        print(
            f"{name:>5}: {heads[name].nbytes / 2**20:5.1f} MiB  1 row {one:.2f} ms  5 rows {five:.2f} ms  "
            f"argmax unchanged {same:.4f}  max |logit error| {error:.3f}"
        )


if __name__ == "__main__":
    main()
