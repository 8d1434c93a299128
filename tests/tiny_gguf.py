"""A tiny Llama-architecture GGUF file written with the ``gguf`` package, for llama.cpp tests.

Same shape family and character vocabulary as tests/tiny.py (two layers, 69 tokens), random
F32 weights from a seed, the LM head scaled up so next-token distributions are peaked. Its
token list is the character tokenizer's vocabulary in the same order, so
``tiny.char_tokenizer()`` encodes text for it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.tiny import BOS, CHARS, EOS, SPECIALS

HIDDEN, FFN, LAYERS, HEADS, KV_HEADS = 32, 64, 2, 4, 2


def write_tiny_gguf(
    path: Path, seed: int = 0, context: int = 256, head_scale: float = 20.0, matrix_type: str = "F32"
) -> Path:
    """``matrix_type``: the GGUF type of the layers' matrices (F32, F16, Q4_0, Q4_1, Q8_0, Q6_K
    ...); the embedding, head and norms stay F32."""
    from gguf import GGMLQuantizationType, GGUFWriter, TokenType, quants

    rng = np.random.default_rng(seed)
    tokens = SPECIALS + list(CHARS)
    vocab = len(tokens)
    head_dim = HIDDEN // HEADS

    def weight(rows: int, cols: int, scale: float = 0.02) -> np.ndarray:
        # numpy (rows, cols) is stored as a GGUF tensor of shape (cols, rows): out x in.
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    writer = GGUFWriter(str(path), arch="llama")
    writer.add_name("verispec-tiny")
    writer.add_context_length(context)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_block_count(LAYERS)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_file_type(0)  # F32 (the matrices may be another type: matrix_type)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * vocab)
    writer.add_token_types([TokenType.CONTROL] * 2 + [TokenType.UNKNOWN] + [TokenType.NORMAL] * (vocab - 3))
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOS)
    ggml_type = GGMLQuantizationType[matrix_type]

    def matrix(name: str, values: np.ndarray) -> None:
        if ggml_type == GGMLQuantizationType.F32:
            writer.add_tensor(name, values)
        elif ggml_type == GGMLQuantizationType.F16:
            writer.add_tensor(name, values.astype(np.float16))
        else:
            raw = quants.quantize(values, ggml_type)
            writer.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=ggml_type)

    writer.add_tensor("token_embd.weight", weight(vocab, HIDDEN, 1.0))
    for layer in range(LAYERS):
        prefix = f"blk.{layer}"
        writer.add_tensor(f"{prefix}.attn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        matrix(f"{prefix}.attn_q.weight", weight(HIDDEN, HIDDEN))
        matrix(f"{prefix}.attn_k.weight", weight(KV_HEADS * head_dim, HIDDEN))
        matrix(f"{prefix}.attn_v.weight", weight(KV_HEADS * head_dim, HIDDEN))
        matrix(f"{prefix}.attn_output.weight", weight(HIDDEN, HIDDEN))
        writer.add_tensor(f"{prefix}.ffn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        matrix(f"{prefix}.ffn_gate.weight", weight(FFN, HIDDEN))
        matrix(f"{prefix}.ffn_up.weight", weight(FFN, HIDDEN))
        matrix(f"{prefix}.ffn_down.weight", weight(HIDDEN, FFN))
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    writer.add_tensor("output.weight", weight(vocab, HIDDEN, 0.02 * head_scale))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
