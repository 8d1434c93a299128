"""Memory after long prompts: the server's resident size is bounded, not ratcheted up.

The embedded model on its default (native) backend holds its KV cache preallocated for the
configured context, and prefill runs in chunks, so a long prompt needs no memory a short
one did not; on the transformers backend the cache grows with the prompt and is freed after
it. Either way freed temporaries go back to the system after long requests
(``verispec/memory.py``). Resident size is read from the server's own /metrics
(``process_resident_memory_bytes``) over real HTTP.
"""

from __future__ import annotations

import itertools

import httpx
import pytest

from tests.server.harness import ServerProcess

MiB = 2**20
LONG_WORDS = 900  # ~2,700 prompt tokens with the embedded tokenizer (number-suffixed words)
# Bounds. After a long prompt the resident size may exceed the one after a short request by
# at most STEP (what the allocator keeps of its own bookkeeping); later long prompts of the
# same size must not grow it, within SLACK (page-granular noise of the allocator and Python's
# caches). Without the release after long requests, one such prompt
# left ~100 MiB more resident on the transformers backend here (the issue saw ~490 MiB after
# 4,000 tokens), never returned; with it, both backends end below the short request's size.
STEP = 48 * MiB
SLACK = 24 * MiB


def long_prompt(seed: int) -> str:
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "lambda", "sigma", "omega"]
    return " ".join(f"{words[(i * 7 + seed) % len(words)]}{i % 89}" for i in range(LONG_WORDS))


def rss(server: ServerProcess) -> float:
    return server.gauge("process_resident_memory_bytes")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["native", "torch"])
def test_long_prompts_leave_the_resident_size_bounded(tmp_path, backend):
    # Unpinned: a long prefill on one core would take minutes on the transformers backend.
    server = ServerProcess(None, tmp_path / "memory.log", "--backend", backend, pin=False)
    try:
        server.wait_ready(timeout=600)
        client = httpx.Client(base_url=server.url, timeout=300)

        def complete(prompt: str, max_tokens: int) -> dict:
            body = {"model": "smollm2-135m-instruct", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
            response = client.post("/v1/completions", json=body)
            assert response.status_code == 200, response.text
            return response.json()

        complete("The cat sat on the mat.", 8)
        short = rss(server)
        first = complete(long_prompt(0), 4)
        assert first["usage"]["prompt_tokens"] > 2500  # the prompt is as long as it claims
        after_first = rss(server)
        sizes = []
        for seed in (1, 2, 3):
            complete(long_prompt(seed), 4)
            complete("Name a colour.", 8)
            sizes.append(rss(server))
        print(
            f"\n  resident MiB: after a short request {short / MiB:.0f}, after one long prompt "
            f"{after_first / MiB:.0f}, after three more {[round(s / MiB) for s in sizes]}"
        )
        assert after_first <= short + STEP
        # A leak grows with every prompt (a 2,500-token prompt's cache alone is ~100 MB on torch),
        # so it shows as growth from each of the three to the next: the least of those two steps
        # is above SLACK. A one-off spike of the allocator under a busy suite (50 MB once in CI
        # beside other tests; 9 MB alone), or a step back up to where it stood before (torch:
        # 1,092 MiB after the short request, 1,039 after the first long prompt, then 1,047,
        # 1,092, 1,092), moves one step, not both. Against the sizes before, the allocator may
        # settle a step higher or hand memory back after the first long prompt (torch: 1,102
        # MiB, then 1,057, then 1,071-1,085; once 1,076, then 1,102 three times), so that bound
        # is the first prompt's STEP, not SLACK.
        assert min(later - earlier for earlier, later in itertools.pairwise(sizes)) <= SLACK
        assert sorted(sizes)[1] <= max(short, after_first) + STEP
    finally:
        assert server.terminate() == 0
