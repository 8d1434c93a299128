"""States read in place from shard files: every gather equals the same gather from the
concatenated rows, whatever the files' layers, and bad indices or files are refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from verispec.train.states import ShardStates


def write_parts(folder, rows_per_file, width, extra=0, seed=0):
    """Files of random bf16 rows, each with ``extra`` columns more than a row (a file of more
    layers) and the row's columns picked from the back; (parts, the expected (P, width) tensor)."""
    generator = torch.Generator().manual_seed(seed)
    parts, expected = [], []
    for number, rows in enumerate(rows_per_file):
        stored = torch.randn(rows, width + extra, generator=generator).to(torch.bfloat16)
        path = folder / f"{number:06d}-1-2.npy"
        np.save(path, stored.view(torch.int16).numpy())
        columns = list(range(extra, extra + width)) if extra else None
        parts.append((path, columns))
        expected.append(stored[:, extra:])
    return parts, torch.cat(expected)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.integers(1, 9), min_size=1, max_size=5),
    extra=st.sampled_from([0, 3]),
    shape=st.sampled_from([(7,), (3, 4), (2, 2, 5)]),
    data=st.data(),
)
def test_gathers_equal_those_of_the_concatenated_rows(tmp_path_factory, rows, extra, shape, data):
    folder = tmp_path_factory.mktemp("states")
    parts, expected = write_parts(folder, rows, width=4, extra=extra)
    states = ShardStates(parts)
    total = expected.shape[0]
    assert states.shape == tuple(expected.shape) and len(states) == total and states.dtype == torch.bfloat16
    count = int(np.prod(shape))
    flat = data.draw(st.lists(st.integers(-total, total - 1), min_size=count, max_size=count))
    index = torch.tensor(flat, dtype=torch.long).reshape(shape)
    assert torch.equal(states[index], expected[index])
    start, stop = data.draw(st.integers(0, total)), data.draw(st.integers(0, total))
    assert torch.equal(states[start:stop], expected[start:stop])
    assert torch.equal(states[::2], expected[::2])
    assert torch.equal(states.to_tensor(), expected)


def test_bad_indices_and_files_are_refused(tmp_path):
    parts, _ = write_parts(tmp_path, [3, 2], width=4)
    states = ShardStates(parts)
    with pytest.raises(IndexError, match="out of range for 5 positions"):
        states[torch.tensor([5])]
    with pytest.raises(IndexError):
        states[torch.tensor([-6])]
    with pytest.raises(TypeError, match="slice or an integer tensor"):
        states[torch.tensor([0.5])]
    with pytest.raises(TypeError, match="slice or an integer tensor"):
        states[1]  # type: ignore[index]
    assert states[torch.zeros(0, dtype=torch.long)].shape == (0, 4)
    with pytest.raises(ValueError, match="no states files"):
        ShardStates([])
    wider = tmp_path / "wider.npy"
    np.save(wider, np.zeros((2, 6), np.int16))
    with pytest.raises(ValueError, match="rows of 6 columns, the files before it 4"):
        ShardStates([*parts, (wider, None)])
    floats = tmp_path / "floats.npy"
    np.save(floats, np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match="not rows of bf16 words"):
        ShardStates([(floats, None)])
