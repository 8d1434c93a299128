"""The engine worker's admission: free slots first, then at most --max-queue waiting.

In-process, on the tiny native model with two sequences. The worker thread is started only
where a test says so, so jobs stay exactly where ``submit`` put them: this is the race a
burst of requests hits on a real server (both arrive before the worker thread picks up the
first), made deterministic.
"""

from __future__ import annotations

import asyncio

import pytest

from verispec.sampling import SamplingParams
from verispec.server.errors import APIError
from verispec.server.metrics import Metrics
from verispec.server.worker import EngineWorker, GenerationJob


@pytest.fixture(scope="module")
def two_slot_engine(tiny_dir):
    from verispec.api import load_engine

    return load_engine(str(tiny_dir), backend="native", slots=2)


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def job(loop: asyncio.AbstractEventLoop, i: int) -> GenerationJob:
    return GenerationJob(
        id=f"job-{i}",
        prompt=[1, 2, 3, 4 + i],
        chat=False,
        params=SamplingParams(temperature=0.0, max_tokens=1),
        max_tokens=6,
        default_max_tokens=6,
        drafter="none",
        k=0,
        prompt_param="prompt",
        loop=loop,
    )


@pytest.mark.parametrize("max_queue", [0, 1, 3])
def test_a_burst_fills_the_free_slots_then_the_queue_then_gets_429(two_slot_engine, loop, max_queue):
    worker = EngineWorker(two_slot_engine, Metrics(), max_queue=max_queue, max_running=2)
    assert worker.scheduler.max_running == 2
    admitted = [job(loop, i) for i in range(2 + max_queue)]
    for each in admitted:  # none of them has reached the scheduler yet
        worker.submit(each)
    with pytest.raises(APIError) as refused:
        worker.submit(job(loop, 99))
    assert refused.value.status == 429
    assert refused.value.code == "queue_full"
    assert "--max-running 2" in str(refused.value) and f"--max-queue {max_queue}" in str(refused.value)
    assert int(refused.value.headers["Retry-After"]) >= 1
    # A waiting job that leaves gives its place to the next request.
    worker.cancel(admitted[-1])
    worker.submit(job(loop, 100))
    with pytest.raises(APIError):
        worker.submit(job(loop, 101))


def test_admitted_jobs_of_a_burst_all_run_to_their_end(two_slot_engine, loop):
    worker = EngineWorker(two_slot_engine, Metrics(), max_queue=1, max_running=2)
    jobs = [job(loop, i) for i in range(3)]
    for each in jobs:
        worker.submit(each)
    worker.start()
    try:

        async def last_event(each: GenerationJob) -> tuple[str, object]:
            while True:
                kind, value = await asyncio.wait_for(each.events.get(), timeout=120)
                if kind in ("done", "failed", "aborted"):
                    return kind, value

        ends = [loop.run_until_complete(last_event(each)) for each in jobs]
    finally:
        worker.stop()
    assert [kind for kind, _ in ends] == ["done"] * 3
    for _, generation in ends:
        assert generation.token_ids and (len(generation.token_ids) == 6 or generation.finish_reason == "stop")
