"""Tiny random transformers models and a character tokenizer, built in-process for tests.

The models are Llama-architecture with two layers and a 69-token character vocabulary,
random weights from a fixed seed; the LM head is scaled up so their next-token
distributions are peaked like a trained model's rather than near-uniform. They are saved
as real model directories (config, safetensors, tokenizer) and loaded through the same
path users' models take.
"""

from __future__ import annotations

from pathlib import Path

import torch

CHARS = "abcdefghijklmnopqrstuvwxyz .,!?'\n0123456789ABCDEFGHIJKLMNOPQRSTUVW"
SPECIALS = ["<s>", "</s>", "<unk>"]
BOS, EOS = 0, 1
VOCAB = len(SPECIALS) + len(CHARS)  # 69


def char_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIALS + list(CHARS))}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def tiny_config(vocab_size: int = VOCAB, context: int = 256, layers: int = 2):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=context,
        bos_token_id=BOS,
        eos_token_id=EOS,
        tie_word_embeddings=False,
    )


def tiny_model(seed: int = 0, head_scale: float = 20.0, vocab_size: int = VOCAB, context: int = 256, layers: int = 2):
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_config(vocab_size, context, layers))
    with torch.no_grad():
        model.lm_head.weight.mul_(head_scale)
    return model.eval()


def perturbed_copy(model, seed: int, noise: float):
    """A draft model: the target's weights plus Gaussian noise (same vocabulary)."""
    import copy

    draft = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in draft.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * noise * parameter.std())
    return draft


def save(model, directory: Path, tokenizer=None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    (tokenizer or char_tokenizer()).save_pretrained(directory)
    return directory


# Trained drafters for the tiny target: small enough to train in seconds in a test session.
TINY_NET = {"heads": 4, "kv_heads": 2, "head_dim": 8, "intermediate": 64, "window": 32, "block_size": 5}
TINY_DATA = {"tokens": 1500, "max_new_tokens": 40, "batch_size": 16}


def train_tiny_drafter(
    kind: str,
    target_dir: Path,
    out: Path,
    data_dir: Path,
    steps: int = 250,
    on_step=None,
    eval_prompts=None,
    net=None,
    **train,
):
    """Train a ``kind`` drafter for the tiny target in ``target_dir`` through the real
    pipeline (data cached in ``data_dir``); returns the summary. ``net``: NetSettings
    overrides; ``train``: TrainSettings overrides."""
    from verispec.train.data import DataSettings
    from verispec.train.pipeline import NetSettings, TrainSettings, train_drafter

    settings = {"steps": steps, "items": 8, "span": 24, "lr": 3e-3, "warmup": 10, "checkpoint_every": 50, **train}
    return train_drafter(
        kind,
        out,
        str(target_dir),
        DataSettings(**TINY_DATA),
        NetSettings(**{**TINY_NET, **(net or {})}),
        TrainSettings(**settings),
        data_dir=data_dir,
        dtype="float32",
        on_step=on_step,
        eval_prompts=eval_prompts,
    )
