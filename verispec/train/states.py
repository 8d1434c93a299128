"""A training set's hidden states read in place from the files of its shards.

A grown data directory caches the target's states shard by shard (``hidden/NNNNNN-...npy``,
one row a position, int16 words of bf16 values). A corpus is the concatenation of the chosen
shards, so its states are the concatenation of those files: ``ShardStates`` maps them all and
answers a gather of rows from the files themselves. Nothing is copied to disk (an assembled
copy of a few million positions of four layers is ~25 GB) and nothing is read before a row is
asked for (the states of a large set do not fit in memory).

Terms: P positions in the corpus, F columns a row (len(layers) x the target's hidden size).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch


class ShardStates:
    """(P, F) bf16 hidden states over the files ``parts``, in order: each a ``.npy`` file of
    int16 rows (bf16 bit patterns) and the columns of it that make a row here (None: all of
    them, in order). Indexing with a slice of rows or an integer tensor of any shape gives a
    bf16 tensor of that many rows, as indexing a (P, F) tensor would; negative indices count
    from the end."""

    def __init__(self, parts: Sequence[tuple[Path, Sequence[int] | None]]) -> None:
        if not parts:
            raise ValueError("no states files")
        self._arrays: list[np.ndarray] = []
        self._columns: list[np.ndarray | None] = []
        width = None
        for path, columns in parts:
            array = np.load(path, mmap_mode="r")
            if array.dtype != np.int16 or array.ndim != 2:
                raise ValueError(f"{path} holds {array.dtype} of {array.ndim} dimensions, not rows of bf16 words")
            chosen = None if columns is None else np.asarray(columns, dtype=np.int64)
            if chosen is not None and np.array_equal(chosen, np.arange(array.shape[1])):
                chosen = None  # the whole row, in order: no column gather
            row_width = array.shape[1] if chosen is None else len(chosen)
            if width is not None and row_width != width:
                raise ValueError(f"{path} gives rows of {row_width} columns, the files before it {width}")
            width = row_width
            self._arrays.append(array)
            self._columns.append(chosen)
        rows = np.array([a.shape[0] for a in self._arrays], dtype=np.int64)
        self._ends = np.cumsum(rows)
        self._starts = self._ends - rows
        assert width is not None
        self.shape = (int(self._ends[-1]), width)
        self.dtype = torch.bfloat16

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: slice | torch.Tensor) -> torch.Tensor:
        if isinstance(index, slice):
            wanted = np.arange(*index.indices(len(self)), dtype=np.int64)
        elif isinstance(index, torch.Tensor) and not index.is_floating_point() and index.dtype != torch.bool:
            wanted = index.detach().cpu().numpy().astype(np.int64, copy=False)
        else:
            raise TypeError(f"states are indexed by a slice or an integer tensor, not {type(index).__name__}")
        flat = wanted.reshape(-1)
        flat = np.where(flat < 0, flat + len(self), flat)
        if flat.size and (flat.min() < 0 or flat.max() >= len(self)):
            raise IndexError(f"row index out of range for {len(self)} positions")
        out = np.empty((flat.size, self.shape[1]), dtype=np.int16)
        part = np.searchsorted(self._ends, flat, side="right")
        for p in np.unique(part):
            where = np.nonzero(part == p)[0]
            rows = flat[where] - self._starts[p]
            # Rows in ascending order read the mapped file front to back.
            order = np.argsort(rows, kind="stable")
            block = self._arrays[p][rows[order]]
            columns = self._columns[p]
            out[where[order]] = block if columns is None else block[:, columns]
        return torch.from_numpy(out).view(torch.bfloat16).reshape(*wanted.shape, self.shape[1])

    def to_tensor(self) -> torch.Tensor:
        """All rows in memory: for small sets and tests."""
        return self[:]
