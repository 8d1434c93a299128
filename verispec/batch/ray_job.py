"""``verispec batch --ray``: the job as a Ray Data pipeline over an actor pool of engines.

    from_items(the requests still to do, ``batch_size`` a block)
      -> map_batches(EngineActor, ``workers`` actors of ``cpus_per_worker`` CPUs each)
      -> iter_rows() in this process -> the resumable writer, a record at a time

An ``EngineActor`` loads the engine once, in ``__init__``, and answers each batch with the
same ``BatchRunner`` as a local run. Its ``__call__`` is a coroutine, so Ray Data runs several
batches on one actor at once (``max_concurrent_calls_per_actor``): their requests meet in the
actor's engine worker and are stepped together, as a local run's are. Records stream back as
batches finish and are written at once, so a crash loses none already written.

A worker that dies (killed, out of memory) is replaced and its unfinished batches run again:
Ray Data's actor pools restart actors and retry their tasks by default (``max_restarts`` and
``max_task_retries`` -1). A retried batch may hold requests whose records were written
already; the writer keeps the first.

Outputs equal a local run's when they depend only on the request: greedy requests always
(speculation is lossless), sampled ones when seeded with a fixed k (the same drafts and the
same uniforms) and a drafter that does not learn across requests (suffix's cross-request
cache depends on which requests a worker saw before).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verispec.batch.reading import BatchRequest
from verispec.batch.runner import BatchRunner, OnRecord
from verispec.server.engine_spec import EngineSpec
from verispec.server.state import ServerSettings

LOCAL_OBJECT_STORE_BYTES = 256 << 20  # records are small; a local instance needs little shared memory
DEFAULT_BATCH_SIZE = 4
# How long the job waits for every actor's engine to load before it hands out work (else the
# first one ready takes all of a small job); a cluster without room for them fails after it.
ACTOR_START_SECONDS = 1800


@dataclass(frozen=True)
class RayOptions:
    """address: a cluster to join ("auto", "ray://host:port", host:port), None: start a local
    instance; workers: engine actors; cpus_per_worker: CPUs each actor reserves (and its
    torch threads); batch_size: requests Ray Data hands an actor at a time."""

    address: str | None = None
    workers: int = 2
    cpus_per_worker: int = 1
    batch_size: int = DEFAULT_BATCH_SIZE


@contextlib.contextmanager
def ray_cluster(options: RayOptions) -> Iterator[None]:
    """Ray connected for the job: ``options.address`` joined, or a local instance started in a
    private temporary folder (removed afterwards, but kept for its logs after a failure)."""
    import ray

    temp_dir = None
    if options.address is not None:
        ray.init(address=options.address, logging_level=logging.WARNING)
    else:
        temp_dir = tempfile.mkdtemp(prefix="verispec-ray-")
        start_local_ray(options.workers * options.cpus_per_worker, temp_dir)
    failed = False
    try:
        yield
    except Exception:
        failed = True  # its logs stay in temp_dir (an interrupt is no failure)
        raise
    finally:
        ray.shutdown()
        if temp_dir is not None and not failed:
            shutil.rmtree(temp_dir, ignore_errors=True)


def start_local_ray(cpus: int, temp_dir: str) -> None:
    """A Ray instance on this machine for one job: at least ``cpus`` CPUs to schedule (more
    than the machine has when asked: the workers then share its cores), a small object store,
    its files in ``temp_dir``, and workers that import this process's verispec."""
    import ray

    package_root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)
    ray.init(
        num_cpus=max(os.cpu_count() or 1, cpus),
        object_store_memory=LOCAL_OBJECT_STORE_BYTES,
        _temp_dir=temp_dir,
        include_dashboard=False,
        logging_level=logging.WARNING,
        runtime_env={"env_vars": {"PYTHONPATH": path}},
    )


class EngineActor:
    """One engine per Ray actor (the callable class of ``map_batches``): loaded once, then
    answering batches {line, custom_id, url, body (JSON text)} with their records."""

    def __init__(self, spec: EngineSpec, settings: ServerSettings, threads: int) -> None:
        import torch

        engine = spec.load()
        torch.set_num_threads(threads)  # the CPUs this actor reserved, not the whole machine's
        self.runner = BatchRunner(engine, settings)

    async def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        import numpy as np

        requests = [
            BatchRequest(int(line), str(custom_id), str(url), json.loads(body))
            for line, custom_id, url, body in zip(
                batch["line"], batch["custom_id"], batch["url"], batch["body"], strict=True
            )
        ]
        records = await self.runner.answer_all(requests)
        answered = [(r.custom_id, record) for r, record in zip(requests, records, strict=True) if record is not None]
        return {
            "custom_id": np.array([custom_id for custom_id, _ in answered], dtype=object),
            "record": np.array([record for _, record in answered], dtype=object),
        }


def run_on_ray(
    requests: list[BatchRequest],
    spec: EngineSpec,
    settings: ServerSettings,
    options: RayOptions,
    on_record: OnRecord,
    actor: type[EngineActor] = EngineActor,
) -> None:
    """Answer ``requests`` on Ray (connected: see ``ray_cluster``), ``on_record`` called in
    this process as each record arrives."""
    import ray.data

    if not requests:
        return
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # the job's own bar counts records as they are written
    logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)  # "progress bars disabled"
    context.wait_for_min_actors_s = ACTOR_START_SECONDS
    by_id = {request.custom_id: request for request in requests}
    rows = [{"line": r.line, "custom_id": r.custom_id, "url": r.url, "body": json.dumps(r.body)} for r in requests]
    batch_size = max(1, min(options.batch_size, len(requests)))
    # Enough batches in flight per actor to keep its engine's sequences busy as requests end.
    calls = max(1, math.ceil(2 * settings.max_running / batch_size))
    dataset = ray.data.from_items(rows, override_num_blocks=math.ceil(len(rows) / batch_size)).map_batches(
        actor,
        fn_constructor_kwargs={"spec": spec, "settings": settings, "threads": options.cpus_per_worker},
        batch_size=batch_size,
        batch_format="numpy",
        num_cpus=options.cpus_per_worker,
        compute=ray.data.ActorPoolStrategy(size=options.workers, max_concurrent_calls_per_actor=calls),
    )
    for row in dataset.iter_rows():
        on_record(by_id[str(row["custom_id"])], str(row["record"]))
