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


def write_tiny_gguf(path: Path, seed: int = 0, context: int = 256, head_scale: float = 20.0) -> Path:
    from gguf import GGUFWriter, TokenType

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
    writer.add_file_type(0)  # all F32
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * vocab)
    writer.add_token_types([TokenType.CONTROL] * 2 + [TokenType.UNKNOWN] + [TokenType.NORMAL] * (vocab - 3))
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOS)
    writer.add_tensor("token_embd.weight", weight(vocab, HIDDEN, 1.0))
    for layer in range(LAYERS):
        prefix = f"blk.{layer}"
        writer.add_tensor(f"{prefix}.attn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        writer.add_tensor(f"{prefix}.attn_q.weight", weight(HIDDEN, HIDDEN))
        writer.add_tensor(f"{prefix}.attn_k.weight", weight(KV_HEADS * head_dim, HIDDEN))
        writer.add_tensor(f"{prefix}.attn_v.weight", weight(KV_HEADS * head_dim, HIDDEN))
        writer.add_tensor(f"{prefix}.attn_output.weight", weight(HIDDEN, HIDDEN))
        writer.add_tensor(f"{prefix}.ffn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        writer.add_tensor(f"{prefix}.ffn_gate.weight", weight(FFN, HIDDEN))
        writer.add_tensor(f"{prefix}.ffn_up.weight", weight(FFN, HIDDEN))
        writer.add_tensor(f"{prefix}.ffn_down.weight", weight(HIDDEN, FFN))
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    writer.add_tensor("output.weight", weight(vocab, HIDDEN, 0.02 * head_scale))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
