"""A GGUF file's metadata and tensor table, read once and cached; tensors memory-mapped.

The ``gguf`` package's reader parses every metadata array in Python, the tokenizer's
vocabulary and merges included: seconds for a small model, every time a file is opened.
``GGUFFile.open`` does that once per file (keyed by its path, size and modification time)
and keeps an index in the cache directory: the scalar metadata and, per tensor, its type,
shape and byte offset. Later opens read the index and map the file; a tensor's bytes are
a view of the map, never copied until a format conversion needs it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

INDEX_VERSION = 1


class GGUFFileError(ValueError):
    """A file that is not a readable GGUF file (corrupt, truncated, missing metadata)."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ggml_type: int  # gguf.GGMLQuantizationType value
    shape: tuple[int, ...]  # numpy order: rows first (GGUF stores the reverse)
    offset: int  # bytes from the start of the file
    nbytes: int


class GGUFFile:
    """Scalar metadata (``value``) and tensors (``tensor``) of a GGUF file."""

    def __init__(self, path: Path, metadata: dict[str, Any], tensors: dict[str, TensorInfo]) -> None:
        self.path = path
        self.metadata = metadata
        self.tensors = tensors
        self._map: np.memmap | None = None

    @classmethod
    def open(cls, path: str | Path) -> GGUFFile:
        path = Path(path)
        index = _index_path(path)
        try:
            document = json.loads(index.read_text())
            if document.get("version") != INDEX_VERSION:
                raise ValueError("stale index")
        except (OSError, ValueError):
            document = _build_index(path)
            _write_atomically(index, json.dumps(document))
        tensors = {
            t["name"]: TensorInfo(t["name"], t["type"], tuple(t["shape"]), t["offset"], t["nbytes"])
            for t in document["tensors"]
        }
        return cls(path, document["metadata"], tensors)

    @property
    def architecture(self) -> str:
        value = self.metadata.get("general.architecture")
        if not isinstance(value, str):
            raise GGUFFileError(f"{self.path} is a GGUF file without general.architecture metadata")
        return value

    def value(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def tensor(self, name: str) -> tuple[TensorInfo, np.ndarray]:
        """The tensor's info and its raw bytes (uint8, a view of the mapped file)."""
        if self._map is None:
            self._map = np.memmap(self.path, mode="r")
        info = self.tensors[name]
        return info, self._map[info.offset : info.offset + info.nbytes]


def _index_path(path: Path) -> Path:
    from verispec.cache import cache_root

    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:24]
    return cache_root() / "gguf-index" / f"{key}.json"


def _build_index(path: Path) -> dict[str, Any]:
    from gguf import GGUFReader, GGUFValueType

    try:
        reader = GGUFReader(str(path))
        metadata: dict[str, Any] = {}
        for key, field in reader.fields.items():
            if not field.types or field.types[0] == GGUFValueType.ARRAY:
                continue  # arrays (the vocabulary, merges) are the tokenizer's business
            part = field.parts[field.data[0]]
            if field.types[0] == GGUFValueType.STRING:
                metadata[key] = bytes(part).decode("utf-8")
            else:
                metadata[key] = part.tolist()[0]
        tensors = []
        for tensor in reader.tensors:
            if tensor.data.nbytes != tensor.n_bytes:
                raise ValueError(f"tensor {tensor.name} is cut short")
            offset = int(tensor.data_offset)
            tensors.append(
                {
                    "name": tensor.name,
                    "type": int(tensor.tensor_type),
                    "shape": [int(n) for n in reversed(tensor.shape.tolist())],
                    "offset": offset,
                    "nbytes": int(tensor.n_bytes),
                }
            )
    except (ValueError, IndexError, KeyError, OSError, EOFError) as error:
        raise GGUFFileError(f"{path} is a corrupt or truncated GGUF file: {error}") from error
    return {"version": INDEX_VERSION, "metadata": metadata, "tensors": tensors}


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, staging = tempfile.mkstemp(prefix=".staging-", dir=path.parent)
    with os.fdopen(handle, "w") as out:
        out.write(text)
    os.replace(staging, path)
