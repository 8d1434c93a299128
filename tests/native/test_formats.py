"""Weight formats: GGUF blocks parsed with their codes kept, requantisation, tiling."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GGML
from gguf import quants

from verispec.native import formats
from verispec.native.checkpoint import _unpermute_order

RNG = np.random.default_rng(0)
ROWS, COLS = 12, 96


def matrix(scale=0.05, rows=ROWS, cols=COLS):
    return (RNG.standard_normal((rows, cols)) * scale).astype(np.float32)


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q8_0"])
def test_gguf_blocks_dequantize_as_the_gguf_package_does(name):
    ggml_type = GGML[name]
    raw = quants.quantize(matrix(), ggml_type).reshape(ROWS, -1)
    weights = formats.from_ggml(raw, ggml_type, ROWS, COLS)
    assert weights.format == formats.NATIVE_GGML[ggml_type]
    expected = quants.dequantize(raw, ggml_type).reshape(ROWS, COLS)
    if name == "Q4_0":  # kept as codes with minimum -8 d: d * q - 8 d rounds once more than d * (q - 8)
        np.testing.assert_allclose(weights.dequantize(), expected, rtol=0, atol=1e-6)
    else:
        np.testing.assert_array_equal(weights.dequantize(), expected)


def test_q4_0_minimum_is_exactly_minus_eight_scales():
    raw = quants.quantize(matrix(), GGML.Q4_0).reshape(ROWS, -1)
    weights = formats.from_ggml(raw, GGML.Q4_0, ROWS, COLS)
    np.testing.assert_array_equal(weights.minimum, -8 * weights.scale)
    # the codes are the file's bytes, untouched
    np.testing.assert_array_equal(weights.codes, raw.reshape(ROWS, COLS // 32, 18)[..., 2:])


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_float_tensors_keep_their_values(dtype):
    values = matrix().astype(dtype)
    ggml_type = GGML.F32 if dtype == np.float32 else GGML.F16
    weights = formats.from_ggml(values.view(np.uint8).reshape(ROWS, -1), ggml_type, ROWS, COLS)
    np.testing.assert_array_equal(weights.dequantize(), values.astype(np.float32))


def test_bf16_rounds_to_nearest_even_as_torch_does():
    import torch

    values = matrix()
    weights = formats.requantize(formats.from_float(values), "bf16")
    expected = torch.from_numpy(values).to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(weights.dequantize(), expected)


def test_k_quants_are_dequantised_and_quantised_again():
    # Q6_K blocks are 256 wide; the kernels have no Q6_K path, so auto stores it as q8_0.
    # gguf cannot write Q6_K: random blocks (ql 128, qh 64, scales 16, d fp16) with a sane d
    raw = RNG.integers(0, 256, size=(4, 210), dtype=np.uint8)
    raw[:, 208:] = np.full((4, 1), 0.01, dtype=np.float16).view(np.uint8)
    loaded = formats.from_ggml(raw, GGML.Q6_K, 4, 256)
    assert loaded.format == "f32" and loaded.source == "Q6_K"
    np.testing.assert_array_equal(loaded.dequantize(), quants.dequantize(raw, GGML.Q6_K).reshape(4, 256))
    converted = formats.requantize(loaded, "q8_0")
    assert converted.format == "q8_0" and converted.source == "Q6_K -> q8_0"


@pytest.mark.parametrize(("target", "levels"), [("q8_0", 254), ("q4", 15)])
def test_quantising_at_load_stays_within_half_a_step(target, levels):
    values = matrix(rows=64, cols=256)
    weights = formats.requantize(formats.from_float(values), target)
    blocks = values.reshape(64, -1, 32)
    # q8_0 is symmetric (step = 2 max|w| / 254), q4 (Q4_1) spans [min, max] in 15 steps
    span = 2 * np.abs(blocks).max(-1) if target == "q8_0" else blocks.max(-1) - blocks.min(-1)
    step = np.repeat(span / levels, 32, axis=-1).reshape(64, 256)
    largest = np.repeat(np.abs(blocks).max(-1), 32, axis=-1).reshape(64, 256)
    error = np.abs(weights.dequantize() - values)
    # half a step of rounding, plus the fp16 rounding of the block's scale (and minimum):
    # at most 2^-11 relative, times codes up to the block's largest |w|, twice over
    assert np.all(error <= 0.5 * step + 2**-10 * largest)
    print(f"\n  {target} at load: max |error| / step = {np.max(error / step):.3f} (bound 0.5 + fp16 scales)")


def test_a_format_asked_to_stay_keeps_its_codes():
    raw = quants.quantize(matrix(), GGML.Q4_1).reshape(ROWS, -1)
    weights = formats.from_ggml(raw, GGML.Q4_1, ROWS, COLS)
    assert formats.requantize(weights, "q4") is weights


def test_pack_groups_four_rows_per_tile_and_pads():
    rows = 6  # not a multiple of 4: the second tile has two rows of zeros
    raw = quants.quantize(matrix(rows=rows), GGML.Q8_0).reshape(rows, -1)
    weights = formats.from_ggml(raw, GGML.Q8_0, rows, COLS)
    packed = weights.pack()
    assert packed["data"].shape == (2, COLS // 32, 4, 32)
    for row in range(rows):
        np.testing.assert_array_equal(packed["data"][row // 4, :, row % 4], weights.codes[row])
        np.testing.assert_array_equal(packed["scale"][row // 4, :, row % 4], weights.scale[row])
    assert not packed["data"][1, :, 2:].any()


def test_unpermute_undoes_llama_cpps_q_k_permutation():
    heads, head_dim = 3, 8
    hf = np.arange(heads * head_dim)  # row labels in transformers' order
    # llama.cpp's convert script: reshape (heads, 2, head_dim / 2) and swap the last two axes
    gguf = hf.reshape(heads, 2, head_dim // 2).swapaxes(1, 2).reshape(-1)
    np.testing.assert_array_equal(gguf[_unpermute_order(len(hf), heads)], hf)


def test_stacking_refuses_mixed_widths():
    a = formats.from_float(matrix(cols=32))
    b = formats.from_float(matrix(cols=64))
    with pytest.raises(formats.WeightFormatError, match="widths differ"):
        formats.concat_rows([a, b])


def test_unknown_target_format():
    with pytest.raises(formats.WeightFormatError, match="unknown weight format"):
        formats.requantize(formats.from_float(matrix()), "q3")
