"""The native kernels' thread pool (decoder.cpp ``Pool``): every chunk of a parallel loop runs
exactly once, whichever thread claims it (its own range from the front, another's from the back)."""

import pytest

from verispec.native import kernels


@pytest.fixture(scope="module")
def ext():
    module = kernels.load()
    assert module is not None, f"the native kernels did not build: {kernels.build_error()}"
    yield module
    module.set_threads(0)  # back to torch's count for the other tests


@pytest.mark.parametrize("threads", [2, 3, 4])
def test_every_index_runs_once_per_loop(ext, threads):
    # More threads than this machine's cores, too: a worker that is not running leaves its
    # range to the others, who take it from the back.
    ext.set_threads(threads)
    loops = 25
    for n in [*range(1, 40), 64, 97, 1000]:
        for grain in (1, 3, 16):
            counts = ext.parallel_cover(n, grain, loops)
            assert counts == [loops] * n, f"n={n} grain={grain} threads={threads}: {counts}"


def test_one_thread_runs_the_loop_alone(ext):
    ext.set_threads(1)
    assert ext.parallel_cover(50, 1, 3) == [3] * 50
