"""The C++ kernels: each format against a plain numpy model of its arithmetic, and rows
that do not depend on the other rows of a pass."""

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as GGML
from gguf import quants
from hypothesis import given, settings
from hypothesis import strategies as st

from verispec import cpu
from verispec.native import formats, kernels

RNG = np.random.default_rng(1)
FORMATS = ["Q4_0", "Q4_1", "Q8_0", "F32", "F16", "BF16"]


@pytest.fixture(scope="module")
def ext():
    module = kernels.load()
    assert module is not None, f"the native kernels did not build: {kernels.build_error()}"
    return module


def weights_in(name, rows, cols):
    values = (RNG.standard_normal((rows, cols)) * 0.05).astype(np.float32)
    if name == "F32":
        return formats.from_float(values)
    if name == "F16":
        return formats.from_float(values.astype(np.float16))
    if name == "BF16":
        return formats.requantize(formats.from_float(values), "bf16")
    raw = quants.quantize(values, GGML[name]).reshape(rows, -1)
    return formats.from_ggml(raw, GGML[name], rows, cols)


def matrix(ext, weights):
    packed = {k: torch.from_numpy(v) for k, v in weights.pack().items()}
    index = formats.FORMATS.index(weights.format)
    return ext.make_matrix(
        index, weights.rows, weights.cols, packed["data"], packed.get("scale"), packed.get("minimum")
    )


def quantised_activations(x):
    """What the quantised kernels multiply: each row in blocks of 32, q = round(x / d) with
    d = max|x| / 127 (nearest even), as values d * q."""
    blocks = x.reshape(x.shape[0], -1, 32)
    d = np.abs(blocks).max(-1, keepdims=True) / np.float32(127)
    inverse = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    return (np.rint(blocks * inverse) * d).reshape(x.shape)


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize(("rows", "cols"), [(69, 32), (960, 576), (576, 1536)])
def test_matmul_matches_its_arithmetic(ext, name, rows, cols):
    weights = weights_in(name, rows, cols)
    x = RNG.standard_normal((9, cols)).astype(np.float32)
    y = ext.apply(matrix(ext, weights), torch.from_numpy(x)).numpy()
    inputs = quantised_activations(x) if weights.format in formats.QUANTIZED else x
    expected = inputs.astype(np.float64) @ weights.dequantize().astype(np.float64).T
    error = np.abs(y - expected).max() / np.abs(expected).max()
    # float32 sums of <= 1536 products: relative error well under 1e-5 of the largest output
    assert error < 1e-5, error


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(FORMATS), count=st.integers(1, 12), data=st.data())
def test_rows_do_not_depend_on_their_neighbours(ext, name, count, data):
    weights = weights_in(name, 20, 64)
    m = matrix(ext, weights)
    x = torch.from_numpy(RNG.standard_normal((count, 64)).astype(np.float32))
    whole = ext.apply(m, x)
    start = data.draw(st.integers(0, count - 1))
    stop = data.draw(st.integers(start + 1, count))
    assert torch.equal(ext.apply(m, x[start:stop].contiguous()), whole[start:stop])


def test_bad_shapes_are_refused(ext):
    weights = weights_in("Q8_0", 8, 64)
    m = matrix(ext, weights)
    with pytest.raises(RuntimeError, match="x must be"):
        ext.apply(m, torch.zeros(2, 32))
    packed = weights.pack()
    with pytest.raises(RuntimeError, match="wrong size"):
        ext.make_matrix(2, 8, 64, torch.from_numpy(packed["data"])[:1], torch.from_numpy(packed["scale"]))


def test_a_build_lock_left_by_a_dead_build_is_removed_and_a_fresh_one_kept(tmp_path):
    lock = tmp_path / "lock"
    assert not kernels.clear_stale_lock(tmp_path)  # no lock: nothing to do
    lock.write_text("")
    assert not kernels.clear_stale_lock(tmp_path) and lock.exists()  # a build may be running
    old = lock.stat().st_mtime - kernels.STALE_LOCK_SECONDS - 60
    os.utime(lock, (old, old))
    with pytest.warns(UserWarning, match="stale native kernel build lock"):
        assert kernels.clear_stale_lock(tmp_path)
    assert not lock.exists()


def test_two_checkouts_of_one_source_build_in_separate_folders(tmp_path, monkeypatch):
    # Their build files name the source's path: one shared folder would be rebuilt by each in turn.
    here = kernels.build_key()
    copy = tmp_path / "decoder.cpp"
    copy.write_bytes(kernels.SOURCE.read_bytes())
    monkeypatch.setattr(kernels, "SOURCE", copy)
    assert kernels.build_key() != here


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q8_0"])
@pytest.mark.parametrize("count", [2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 15])
@pytest.mark.parametrize("layout", ["default", "vector"])
def test_each_row_of_a_quantised_pass_equals_that_row_alone(ext, name, count, layout):
    # Passes of 2 to 4 rows take another kernel than a single row where the CPU has VNNI (a
    # transposed tile, one horizontal add a row; 8-bit codes biased to unsigned), and 8 rows
    # the lanes kernel; without VNNI, 2 rows (and the first 2 of 3) take the duo kernel, and
    # Q4 rows past the groups of 8 a lanes group padded with zero rows (5 to 7 of them: 5, 6,
    # 7, 13, 15) or the quads kernel (4: 4, 12): every row must still equal its single-row
    # result bit for bit. "vector" turns the wide layout off (where a CPU has it, it takes
    # these passes by default), so both layouts' kernels are checked on every CPU. The 8-bit
    # weights include the code -128, whose magnitude does not fit a signed byte.
    values = (RNG.standard_normal((36, 96)) * 0.05).astype(np.float32)
    raw = quants.quantize(values, GGML[name]).reshape(36, -1).copy()
    if name == "Q8_0":
        raw.reshape(36, 3, 34)[:, :, 2:6] = 0x80  # the first 4 codes of every block: -128
    weights = formats.from_ggml(raw, GGML[name], 36, 96)
    m = matrix(ext, weights)
    x = torch.from_numpy(RNG.standard_normal((count, 96)).astype(np.float32) * 3)
    try:
        ext.set_amx_min_rows(0 if layout == "vector" else -1)
        whole = ext.apply(m, x)
        for r in range(count):
            assert torch.equal(ext.apply(m, x[r : r + 1].contiguous()), whole[r : r + 1]), f"row {r} of {count}"
    finally:
        ext.set_amx_min_rows(-1)
    inputs = quantised_activations(x.numpy())
    expected = inputs.astype(np.float64) @ weights.dequantize().astype(np.float64).T
    assert np.abs(whole.numpy() - expected).max() / np.abs(expected).max() < 1e-5


def test_a_q4_matrix_whose_scales_float16_does_not_hold_keeps_float32_scales(ext):
    # The wide layout keeps Q4's scales and minimums as float16 (on AVX2 without VNNI, and
    # with AVX-512 VNNI where no AMX tiles run), which holds every value a GGUF block stores.
    # A matrix with one it does not hold (0.1 here) must not be rounded: on AVX2 it keeps no
    # wide layout, with AVX-512 the float32 scales; its rows are what its arithmetic gives.
    weights = weights_in("Q4_1", 36, 96)
    exact = matrix(ext, weights)
    assert exact.wide == bool(ext.wide_available())
    avx2_layout = ext.wide_available() and not cpu.cpu_has_avx512_vnni()
    halves_expected = avx2_layout or (
        ext.wide_available() and not ext.amx_available() and os.environ.get("VERISPEC_WIDE_HALVES") != "0"
    )
    assert exact.wide_halves == halves_expected
    inexact = replace(weights, scale=weights.scale.copy())
    inexact.scale[5, 1] = np.float32(0.1)
    assert np.float32(np.float16(inexact.scale[5, 1])) != inexact.scale[5, 1]
    m = matrix(ext, inexact)
    assert not m.wide_halves
    assert m.wide == (ext.wide_available() and not avx2_layout)
    x = RNG.standard_normal((3, 96)).astype(np.float32)
    y = ext.apply(m, torch.from_numpy(x)).numpy()
    expected = quantised_activations(x).astype(np.float64) @ inexact.dequantize().astype(np.float64).T
    assert np.abs(y - expected).max() / np.abs(expected).max() < 1e-5


# The wide kernels against the vector kernels with the wide layout's scales as float32 arrays
# (VERISPEC_WIDE_HALVES=0: the layout wherever AMX tiles run), in a process of its own: the
# setting is read once a process. Every row count from 1 to 11 and 16, 17, 40 rows.
WIDE_FLOAT32_CHECK = """
import numpy as np, torch
from gguf import GGMLQuantizationType as GGML
from gguf import quants
from tests.native.test_kernels import matrix
from verispec.native import formats, kernels
ext = kernels.load()
rng = np.random.default_rng(2)
for name in ("Q4_0", "Q4_1", "Q8_0"):
    raw = quants.quantize((rng.standard_normal((36, 96)) * 0.05).astype(np.float32), GGML[name]).reshape(36, -1)
    m = matrix(ext, formats.from_ggml(raw, GGML[name], 36, 96))
    assert m.wide and not m.wide_halves, (m.wide, m.wide_halves)
    for count in (*range(1, 12), 16, 17, 40):
        x = torch.from_numpy(rng.standard_normal((count, 96)).astype(np.float32) * 3)
        ext.set_amx_min_rows(0)
        vector = ext.apply(m, x)
        ext.set_amx_min_rows(-1)
        assert torch.equal(ext.apply(m, x), vector), (name, count)
print("checked")
"""


def test_the_wide_kernels_with_float32_scales_give_what_the_vector_kernels_give(ext):
    if not (ext.wide_available() and cpu.cpu_has_avx512_vnni()):
        pytest.skip("the float32 scales of the wide layout are AVX-512 VNNI's (this CPU has no such layout)")
    env = {**os.environ, "VERISPEC_WIDE_HALVES": "0"}
    root = Path(__file__).resolve().parents[2]  # where ``tests`` imports from
    done = subprocess.run([sys.executable, "-c", WIDE_FLOAT32_CHECK], env=env, cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "checked"


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q8_0"])
@pytest.mark.parametrize("count", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 16, 17, 40])
@pytest.mark.parametrize("tiles_from", [-1, 2])
def test_the_wide_kernels_give_each_row_what_the_vector_kernels_give(ext, name, count, tiles_from):
    # Where the CPU has AVX-512 VNNI, quantised passes run on the wide layout: rows on its VNNI
    # kernel (one dpbusd serves 16 outputs), in chunks of 4 whose last takes up to 2 more
    # rows (5, 6: one chunk; 9, 10: 4 + 5, 4 + 6; 11: 4 + 4 + 3); where it has AMX tiles, passes of
    # many rows on tile products of whole blocks; where it has AVX2 and no VNNI, Q4 passes of
    # up to 16 rows on its AVX2 kernel (maddubs against broadcast codes; Q8 keeps the vector
    # kernels there, so its arm compares them with themselves). All run the vector kernels'
    # float steps in their order. tiles_from -1: the default split; 2: the tiles from 2 rows up
    # (verify_cost's native-amx2; without tiles the same as -1). 36 outputs:
    # two groups of 16 and a part group; 96 columns: three blocks (an odd number: the tile
    # kernel works on blocks in pairs); -128 among the 8-bit codes. Rows past a multiple of
    # 16 are padding.
    if not ext.wide_available():
        pytest.skip(
            "no wide layout on this CPU (it needs AVX-512 VNNI, or AVX2 without VNNI) or VERISPEC_WIDE=0: "
            "the vector kernels run every pass"
        )
    values = (RNG.standard_normal((36, 96)) * 0.05).astype(np.float32)
    raw = quants.quantize(values, GGML[name]).reshape(36, -1).copy()
    if name == "Q8_0":
        raw.reshape(36, 3, 34)[:, :, 2:6] = 0x80
    m = matrix(ext, formats.from_ggml(raw, GGML[name], 36, 96))
    x = torch.from_numpy(RNG.standard_normal((count, 96)).astype(np.float32) * 3)
    try:
        ext.set_amx_min_rows(0)
        vector = ext.apply(m, x)
        ext.set_amx_min_rows(tiles_from)
        wide = ext.apply(m, x)
    finally:
        ext.set_amx_min_rows(-1)
    assert torch.equal(wide, vector)


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1"])
@pytest.mark.parametrize("count", [1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 14, 20])
def test_two_groups_at_a_time_give_what_one_group_at_a_time_gives(ext, name, count):
    # From WIDE_PAIR_ROWS rows (9) a 4-bit matrix with the float16 line runs two groups of 16
    # outputs at a time (wide_rows_pair), in chunks of 6 rows (the last 1-6 as one chunk, 7 as
    # 3 + 4, 8 as 4 + 4). Forced here from 1 row: every chunk size, against one group at a
    # time (the pair kernel off), and each row against that row alone. 56 outputs: two pairs,
    # the second's last group holding 8 outputs; 72 outputs: a last odd group alone.
    if not ext.set_wide_pair_rows(1):
        pytest.skip("the pair kernel runs on the AVX-512 VNNI wide layout only; this CPU has none")
    try:
        for outputs in (56, 72):
            values = (RNG.standard_normal((outputs, 96)) * 0.05).astype(np.float32)
            raw = quants.quantize(values, GGML[name]).reshape(outputs, -1)
            m = matrix(ext, formats.from_ggml(raw, GGML[name], outputs, 96))
            assert m.wide_halves, "the pair kernel needs the float16 line"
            x = torch.from_numpy(RNG.standard_normal((count, 96)).astype(np.float32) * 3)
            ext.set_wide_pair_rows(1)
            pairs = ext.apply(m, x)
            alone = [ext.apply(m, x[r : r + 1].contiguous()) for r in range(count)]
            ext.set_wide_pair_rows(0)
            groups = ext.apply(m, x)
            assert torch.equal(pairs, groups), f"{outputs} outputs, {count} rows"
            for r in range(count):
                assert torch.equal(alone[r], groups[r : r + 1]), f"row {r} of {count}, {outputs} outputs"
    finally:
        ext.set_wide_pair_rows(-1)
