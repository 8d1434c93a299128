"""Throughput of ``verispec batch --ray`` with 1 and 2 engine actors, on Spec-Bench dev prompts.

    PYTHONPATH=. .venv/bin/python benchmarks/batch_scaling.py --prompts 20 --max-tokens 64 --repeats 2

One local Ray instance (as ``verispec batch --ray`` starts one), runs interleaved 1, 2, 1, 2
workers, each actor on one CPU (one compute thread). Every run builds a fresh actor pool (its
engines load) and answers the prompts' first turns (chat, greedy); records are timed as they
arrive. Per run: *job seconds*, from the start to the last record (the actors' loading
included), and *generation tok/s*, the completion tokens over the time from the first request's
start in an actor (its completion's ``created``, whole seconds) to the last record: the
engines' throughput once loaded. With few prompts every request runs at once and the records
come back together at the end, so no rate can be read from their arrivals. Prints each run,
the median ratios 2 / 1, and whether every run gave the same texts (greedy: they must).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from verispec.batch.cli import BATCH_MAX_QUEUE
from verispec.batch.ray_job import RayOptions, run_on_ray, start_local_ray
from verispec.batch.reading import BatchRequest
from verispec.models import resolve
from verispec.scheduler import DEFAULT_MAX_RUNNING
from verispec.server.engine_spec import EngineSpec
from verispec.server.state import ServerSettings

DEV = Path(__file__).resolve().parents[1].parent / "shared/data/spec_bench/question_dev.jsonl"


def requests(path: Path, count: int, max_tokens: int, model: str) -> list[BatchRequest]:
    records = [json.loads(text) for text in path.read_text().splitlines() if text.strip()][:count]
    return [
        BatchRequest(
            n,
            f"q{record['question_id']}",
            "/v1/chat/completions",
            {
                "model": model,
                "messages": [{"role": "user", "content": record["turns"][0]}],
                "max_tokens": max_tokens,
                "temperature": 0,
            },
        )
        for n, record in enumerate(records, start=1)
    ]


def one_run(todo: list[BatchRequest], workers: int, spec: EngineSpec, settings: ServerSettings) -> dict:
    created: list[int] = []
    tokens = 0
    texts: dict[str, str] = {}

    def record(request: BatchRequest, line: str) -> None:
        nonlocal tokens
        body = json.loads(line)["response"]["body"]
        created.append(body["created"])
        tokens += body["usage"]["completion_tokens"]
        texts[request.custom_id] = body["choices"][0]["message"]["content"]

    began = time.time()
    run_on_ray(todo, spec, settings, RayOptions(workers=workers, cpus_per_worker=1, batch_size=4), record)
    last = time.time()
    return {
        "workers": workers,
        "tokens": tokens,
        "job_seconds": last - began,
        "generation_seconds": last - min(created),
        "job_tok_s": tokens / (last - began),
        "generation_tok_s": tokens / (last - min(created)),
        "texts": texts,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts-file", type=Path, default=DEV)
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each worker count, interleaved")
    parser.add_argument("--check-local", action="store_true", help="also run locally and compare the texts")
    args = parser.parse_args()
    model = resolve(None).name
    todo = requests(args.prompts_file, args.prompts, args.max_tokens, model)
    spec = EngineSpec(None, slots=DEFAULT_MAX_RUNNING)
    settings = ServerSettings(
        model_names=[model], drafter="lookup", max_queue=BATCH_MAX_QUEUE, max_running=DEFAULT_MAX_RUNNING
    )
    import ray

    temp_dir = tempfile.mkdtemp(prefix="verispec-ray-bench-")
    start_local_ray(2, temp_dir)
    runs = []
    try:
        for repeat in range(args.repeats):
            for workers in (1, 2):
                result = one_run(todo, workers, spec, settings)
                runs.append(result)
                print(
                    f"repeat {repeat} workers {workers}: {result['tokens']} tokens, job {result['job_seconds']:.1f} s "
                    f"({result['job_tok_s']:.1f} tok/s), generation {result['generation_seconds']:.1f} s "
                    f"({result['generation_tok_s']:.1f} tok/s)",
                    flush=True,
                )
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
    for field in ("job_tok_s", "generation_tok_s"):
        ratios = [b[field] / a[field] for a, b in zip(runs[0::2], runs[1::2], strict=True)]
        each = ", ".join(f"{r:.2f}" for r in ratios)
        print(f"{field}: 2 workers / 1 worker = median {statistics.median(ratios):.2f} ({each})")
    same = all(run["texts"] == runs[0]["texts"] for run in runs)
    print(f"texts identical across all Ray runs: {same} ({len(runs[0]['texts'])} prompts)")
    if args.check_local:
        local = local_texts(todo, spec, settings)
        print(f"texts identical to a local run (verispec batch without --ray): {local == runs[0]['texts']}")


def local_texts(todo: list[BatchRequest], spec: EngineSpec, settings: ServerSettings) -> dict[str, str]:
    from verispec.batch.runner import run_locally

    texts: dict[str, str] = {}

    def record(request: BatchRequest, line: str) -> None:
        texts[request.custom_id] = json.loads(line)["response"]["body"]["choices"][0]["message"]["content"]

    run_locally(todo, spec.load(), settings, record)
    return texts


if __name__ == "__main__":
    main()
