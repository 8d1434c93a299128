"""``verispec batch INPUT.jsonl --out OUTPUT.jsonl [--ray [ADDRESS]]``: options, and the job
from input to summary (the package docstring names the pieces)."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

from verispec.cli_args import add_model_options, bounded_int

if TYPE_CHECKING:
    from verispec.batch.reading import BatchRequest

BATCH_MAX_QUEUE = 1 << 20  # the job never has a request refused: it chooses how many it submits


def add_batch_parser(commands: Any) -> None:
    from verispec.server.cli import add_request_limits, add_speculation_options

    batch = commands.add_parser(
        "batch",
        help="answer a file of requests (OpenAI Batch API format) as the server would, resumably",
        description="Answers each line of INPUT (one request a line: custom_id, method POST, url "
        "/v1/chat/completions or /v1/completions, body) as `verispec serve` would, and appends one record a "
        "line to --out (OpenAI's batch output: id, custom_id, response {status_code, request_id, body}). A rerun "
        "skips the custom_ids --out already holds. A file with bad lines is refused whole, each one listed.",
    )
    batch.add_argument("input", metavar="INPUT", help="the requests, JSONL (OpenAI Batch API input format)")
    batch.add_argument("--out", required=True, metavar="OUTPUT", help="the records, JSONL; appended to, resumable")
    add_model_options(batch)
    add_speculation_options(batch)
    add_request_limits(batch.add_argument_group("engine"))
    ray = batch.add_argument_group("ray (the ray extra: pip install 'verispec[ray]')")
    ray.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="run as a Ray Data pipeline over an actor pool of engines: without ADDRESS on a Ray instance "
        "started for the job, with one (auto, host:port, ray://host:port) on that cluster; put it after INPUT "
        "or write --ray=ADDRESS",
    )
    ray.add_argument("--ray-workers", type=bounded_int(1), default=2, help="engine actors (default: 2)")
    ray.add_argument(
        "--ray-cpus-per-worker",
        type=bounded_int(1),
        default=1,
        help="CPUs each actor reserves, and its compute threads (default: 1)",
    )
    ray.add_argument(
        "--ray-batch-size",
        type=bounded_int(1),
        default=4,
        help="requests handed to an actor at a time; their records come back together (default: 4)",
    )
    batch.set_defaults(run=run_batch)


def run_batch(args: argparse.Namespace) -> int:
    from rich.console import Console

    from verispec import models
    from verispec.batch.progress import BatchProgress, Tally
    from verispec.batch.reading import read_requests
    from verispec.batch.writer import ResultWriter
    from verispec.server.engine_spec import EngineSpec
    from verispec.server.state import ServerSettings

    console = Console(stderr=True, highlight=False, soft_wrap=True)
    requests = read_requests(args.input)  # a file with bad lines is refused before anything runs
    spec = EngineSpec.from_args(args)
    settings = ServerSettings(
        model_names=[models.resolve(args.model).name],
        drafter=args.drafter,
        k=args.k,
        max_queue=BATCH_MAX_QUEUE,
        max_running=args.max_running,
        max_rows=args.max_rows,
        max_prompt_tokens=args.max_prompt_tokens,
        default_max_tokens=args.default_max_tokens,
    )
    with ResultWriter(args.out) as writer:
        if writer.dropped_partial is not None:
            console.print(
                f"[dim]{args.out}: dropped line {writer.dropped_partial}, written in part by a run that was "
                "stopped; its request runs again[/dim]"
            )
        foreign = len(writer.done - {request.custom_id for request in requests})
        if foreign:
            console.print(f"[yellow]{args.out} holds {foreign} records of custom_ids not in {args.input}[/yellow]")
        todo = [request for request in requests if request.custom_id not in writer.done]
        tally = Tally(total=len(requests), skipped=len(requests) - len(todo))
        progress = BatchProgress(console, tally)
        left = f"{len(todo)} requests to run, {tally.skipped} already answered"

        def written(request: BatchRequest, line: str) -> None:
            if writer.append(request.custom_id, line):
                tally.add(line)
                progress.update()

        try:
            if not todo:
                console.print(f"nothing to do: {args.out} holds a record of every request")
            elif args.ray is None:
                from verispec.batch.runner import run_locally

                began = time.perf_counter()
                engine = spec.load()
                console.print(f"[dim]loaded {engine.name} in {time.perf_counter() - began:.1f} s; {left}[/dim]")
                with progress:  # tok/s counts from here: the job's, not the load's
                    run_locally(todo, engine, settings, written)
            else:
                from verispec.batch.ray_job import RayOptions, ray_cluster, run_on_ray

                options = RayOptions(args.ray or None, args.ray_workers, args.ray_cpus_per_worker, args.ray_batch_size)
                where = f"the Ray cluster at {options.address}" if options.address else "a Ray instance of its own"
                console.print(f"[dim]{options.workers} engine actors on {where}; {left}[/dim]")
                with ray_cluster(options), progress:  # tok/s counts the actors' loading in
                    run_on_ray(todo, spec, settings, options, written)
        except KeyboardInterrupt:
            console.print(f"interrupted: {tally.summary()}\nrerun the same command to resume")
            raise
    console.print(tally.summary())
    return 0
