"""Weight matrices in the forms the native kernels multiply, and how they get there.

A ``Weights`` holds one matrix W (``rows`` outputs x ``cols`` inputs, y = x W^T) in one of
the kernel formats, unpacked (one row of W per row of every array):

- ``q4``:   4-bit codes in blocks of 32 along a row, w = scale * code + minimum. GGUF Q4_1
  blocks as they are (codes, scale d and minimum m); Q4_0 blocks keep their codes with
  minimum = -8 d, which is exact in float32. ``codes``: uint8 (rows, blocks, 16), the GGUF
  byte order (low nibbles are weights 0..15 of the block, high nibbles 16..31).
- ``q8_0``: 8-bit codes in blocks of 32, w = scale * code (GGUF Q8_0). ``codes``: int8
  (rows, blocks, 32).
- ``f32``, ``f16``, ``bf16``: the values, ``values`` (rows, cols): float32, float16, and
  bfloat16 as its uint16 bit patterns (numpy has no bfloat16).

Scales and minimums are float32 (rows, blocks), converted exactly from the file's fp16.
``pack`` lays a matrix out in tiles of 4 rows for the C++ kernels; ``dequantize`` gives the
float32 matrix, for the torch path and for tests.

GGUF types without a kernel of their own (the K-quants Q4_K/Q5_K/Q6_K..., Q5_0/Q5_1, the
IQ types) are dequantised by the ``gguf`` package and quantised again to the requested
format, which adds that format's rounding error once (see ``requantize``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from gguf import GGMLQuantizationType as GGML
from gguf import quants

BLOCK = 32  # weights per quantisation block
TILE = 4  # output rows per packed tile (decoder.cpp's TILE)
FLOAT_GROUP = 8  # float formats: columns per packed group (decoder.cpp's FK)

FORMATS = ("f32", "bf16", "q8_0", "q4", "f16")  # index = decoder.cpp's Format
QUANTIZED = ("q8_0", "q4")
# --weights choices and the kernel format each asks every matrix to take
WEIGHT_MODES = {"auto": None, "bf16": "bf16", "int8": "q8_0", "int4": "q4"}
# GGUF tensor types the kernels multiply as they are
NATIVE_GGML = {GGML.Q4_0: "q4", GGML.Q4_1: "q4", GGML.Q8_0: "q8_0", GGML.F32: "f32", GGML.F16: "f16", GGML.BF16: "bf16"}
_QUANTIZE_WITH = {"q4": GGML.Q4_1, "q8_0": GGML.Q8_0}


class WeightFormatError(ValueError):
    """A matrix that cannot be put into the asked format."""


@dataclass(frozen=True)
class Weights:
    """One matrix in a kernel format; see the module docstring for the arrays of each."""

    format: str
    rows: int
    cols: int
    codes: np.ndarray | None = None
    scale: np.ndarray | None = None
    minimum: np.ndarray | None = None
    values: np.ndarray | None = None
    source: str = ""  # the file's type it came from, e.g. "Q4_1", "Q6_K -> q8_0"

    @property
    def nbytes(self) -> int:
        arrays = (self.codes, self.scale, self.minimum, self.values)
        return sum(a.nbytes for a in arrays if a is not None)

    def dequantize(self) -> np.ndarray:
        """The matrix as float32 (rows, cols)."""
        if self.format == "bf16":
            assert self.values is not None
            return (self.values.astype(np.uint32) << 16).view(np.float32)
        if self.values is not None:
            return self.values.astype(np.float32)
        assert self.codes is not None and self.scale is not None
        if self.format == "q8_0":
            codes = self.codes.astype(np.float32)
            return (codes * self.scale[..., None]).reshape(self.rows, self.cols)
        assert self.minimum is not None
        low, high = self.codes & 15, self.codes >> 4
        codes = np.concatenate([low, high], axis=-1).astype(np.float32)
        return (self.scale[..., None] * codes + self.minimum[..., None]).reshape(self.rows, self.cols)

    def take_rows(self, order: np.ndarray) -> Weights:
        """The matrix of the rows ``order`` picks, in that order (a permutation or a subset;
        blocks run along rows, so this is exact)."""

        def pick(array: np.ndarray | None) -> np.ndarray | None:
            return None if array is None else np.ascontiguousarray(array[order])

        return replace(
            self,
            rows=len(order),
            codes=pick(self.codes),
            scale=pick(self.scale),
            minimum=pick(self.minimum),
            values=pick(self.values),
        )

    def pack(self) -> dict[str, np.ndarray]:
        """Arrays for decoder.cpp's ``make_matrix``: rows padded to a multiple of 4 and
        grouped in tiles, so one tile's bytes are contiguous."""
        tiles = -(-self.rows // TILE)
        pad = tiles * TILE - self.rows

        def tiled(array: np.ndarray) -> np.ndarray:
            array = np.concatenate([array, np.zeros((pad, *array.shape[1:]), array.dtype)]) if pad else array
            grouped = array.reshape(tiles, TILE, *array.shape[1:])
            return np.ascontiguousarray(np.swapaxes(grouped, 1, 2))

        if self.values is not None:
            values = self.values.reshape(self.rows, self.cols // FLOAT_GROUP, FLOAT_GROUP)
            view = {"f32": np.float32, "f16": np.int16, "bf16": np.int16}[self.format]
            return {"data": tiled(values.view(view))}
        assert self.codes is not None and self.scale is not None
        packed = {"data": tiled(self.codes), "scale": tiled(self.scale)}
        if self.minimum is not None:
            packed["minimum"] = tiled(self.minimum)
        return packed


def concat_rows(parts: list[Weights]) -> Weights:
    """Stack matrices of one format and width (fused q/k/v, gate/up)."""
    first = parts[0]
    if any(p.format != first.format or p.cols != first.cols for p in parts):
        raise WeightFormatError(f"cannot stack {[(p.format, p.cols) for p in parts]}: formats or widths differ")

    def stack(name: str) -> np.ndarray | None:
        arrays = [getattr(p, name) for p in parts]
        return None if arrays[0] is None else np.concatenate(arrays)

    sources = sorted({p.source for p in parts})
    return Weights(
        first.format,
        sum(p.rows for p in parts),
        first.cols,
        stack("codes"),
        stack("scale"),
        stack("minimum"),
        stack("values"),
        "+".join(sources),
    )


def from_ggml(raw: np.ndarray, ggml_type: GGML, rows: int, cols: int) -> Weights:
    """A GGUF tensor's bytes (rows, bytes per row) or values (rows, cols) as the kernel
    format of its type; types without one are dequantised to float32 (``requantize`` next)."""
    name = ggml_type.name
    if ggml_type not in NATIVE_GGML:
        values = quants.dequantize(raw, ggml_type).reshape(rows, cols).astype(np.float32)
        return Weights("f32", rows, cols, values=values, source=name)
    kind = NATIVE_GGML[ggml_type]
    if kind in ("f32", "f16"):
        dtype = np.float32 if kind == "f32" else np.float16
        return Weights(kind, rows, cols, values=np.ascontiguousarray(raw.view(dtype).reshape(rows, cols)), source=name)
    if kind == "bf16":
        return Weights(
            kind, rows, cols, values=np.ascontiguousarray(raw.view(np.uint16).reshape(rows, cols)), source=name
        )
    blocks = raw.reshape(rows, cols // BLOCK, -1)
    scale = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    if ggml_type == GGML.Q8_0:
        codes = np.ascontiguousarray(blocks[..., 2:].view(np.int8))
        return Weights("q8_0", rows, cols, codes=codes, scale=scale, source=name)
    if ggml_type == GGML.Q4_0:
        codes = np.ascontiguousarray(blocks[..., 2:])
        return Weights("q4", rows, cols, codes=codes, scale=scale, minimum=-8.0 * scale, source=name)
    minimum = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    return Weights(
        "q4", rows, cols, codes=np.ascontiguousarray(blocks[..., 4:]), scale=scale, minimum=minimum, source=name
    )


def from_float(values: np.ndarray, source: str = "F32") -> Weights:
    """A float matrix (any float dtype; bf16 as its uint16 bits is not accepted here)."""
    rows, cols = values.shape
    kind = {np.dtype(np.float16): "f16"}.get(values.dtype, "f32")
    dtype = np.float16 if kind == "f16" else np.float32
    return Weights(kind, rows, cols, values=np.ascontiguousarray(values.astype(dtype)), source=source)


def requantize(weights: Weights, target: str) -> Weights:
    """``weights`` in the format ``target``: float formats by rounding, q4 (as GGUF Q4_1) and
    q8_0 by quantising the float32 matrix with the ``gguf`` package. Q4_0/Q4_1 and Q8_0 blocks
    asked to stay what they are keep their codes."""
    if target not in FORMATS:
        raise WeightFormatError(f"unknown weight format {target!r}; known: {', '.join(FORMATS)}")
    if weights.format == target:
        return weights
    if weights.cols % BLOCK:
        raise WeightFormatError(f"a matrix of {weights.cols} columns cannot be quantised in blocks of {BLOCK}")
    source = f"{weights.source} -> {target}"
    values = weights.dequantize()
    if target in ("f32", "f16"):
        return replace(from_float(values.astype(np.float32 if target == "f32" else np.float16)), source=source)
    if target == "bf16":
        bits = _round_to_bf16_bits(values)
        return Weights("bf16", weights.rows, weights.cols, values=bits, source=source)
    ggml_type = _QUANTIZE_WITH[target]
    raw = quants.quantize(values, ggml_type).reshape(weights.rows, -1)
    return replace(from_ggml(raw, ggml_type, weights.rows, weights.cols), source=source)


def _round_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, rounding to nearest even (as torch does)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)
