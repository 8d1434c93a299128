"""Reading a Llama-family checkpoint straight from its file into the native decoder's weights.

Two sources: a GGUF file (its blocks read as they are stored, see ``formats``) and a
transformers directory of safetensors. Both give a ``Checkpoint``: the architecture's
transformers config and, per decoder layer, the fused matrices the forward pass multiplies
(q, k and v stacked into ``qkv``, gate and up into ``gate_up``), each in a kernel format
chosen by ``--weights``:

- ``auto``: as the file stores it where a kernel exists (GGUF Q4_0/Q4_1 -> q4, Q8_0, F16,
  BF16, F32; safetensors keep their dtype); other GGUF types (K-quants, Q5_x, IQ) -> q8_0;
- ``bf16``: every matrix in bfloat16;
- ``int8``: every matrix quantised to q8_0 (blocks of 32, symmetric);
- ``int4``: every matrix quantised to q4 (blocks of 32 with a minimum, GGUF Q4_1), but the
  embedding / LM head kept at 8 bits (``INT4_HEAD``), as llama.cpp's Q4 files keep theirs.

GGUF stores a Llama model's q and k rows permuted for llama.cpp's rotary layout; they are
put back in transformers' order here (a row permutation, exact for every block format).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from verispec.native import formats
from verispec.native.formats import Weights

# transformers model_type values the native forward covers: pre-norm decoder, RMSNorm,
# rotary positions (rotate-half), grouped-query attention, SwiGLU; qwen2 adds q/k/v biases.
ARCHITECTURES = ("llama", "mistral", "qwen2")
GGUF_ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "mistral": "mistral"}
INT4_HEAD = "q8_0"  # the embedding / LM head format under --weights int4 (see BENCHMARKS.md)


class CheckpointError(ValueError):
    """A checkpoint the native decoder cannot run; the message says why."""


@dataclass
class LayerWeights:
    attn_norm: np.ndarray  # (hidden,) float32
    ffn_norm: np.ndarray
    qkv: Weights  # ((heads + 2 kv_heads) * head_dim, hidden)
    o: Weights  # (hidden, heads * head_dim)
    gate_up: Weights  # (2 intermediate, hidden)
    down: Weights  # (hidden, intermediate)
    qkv_bias: np.ndarray | None = None


@dataclass
class Checkpoint:
    """A model's config and weights, ready for the native decoder."""

    config: Any  # transformers PretrainedConfig of the architecture
    layers: list[LayerWeights]
    embed: Weights  # (vocab, hidden): rows are looked up
    norm: np.ndarray  # final RMSNorm weight
    head: Weights  # (vocab, hidden); the same object as ``embed`` when tied
    path: Path
    kind: str  # "gguf" or "dir"
    weights_mode: str
    rope_factors: np.ndarray | None = None  # GGUF rope_freqs (Llama 3.1): inv_freq is divided by them
    stored_types: Counter[str] = field(default_factory=Counter)

    @property
    def head_dim(self) -> int:
        config = self.config
        return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)

    @property
    def nbytes(self) -> int:
        matrices = [m for layer in self.layers for m in (layer.qkv, layer.o, layer.gate_up, layer.down)]
        extra = [] if self.head is self.embed else [self.head]
        return sum(m.nbytes for m in [*matrices, self.embed, *extra])

    def formats_used(self) -> dict[str, int]:
        """Matrices per kernel format (the head counted once when tied)."""
        used = Counter(m.format for layer in self.layers for m in (layer.qkv, layer.o, layer.gate_up, layer.down))
        used[f"{self.head.format} (head)"] += 1
        return dict(used)


def target_format(mode: str, stored: str, head: bool) -> str:
    """The kernel format a matrix stored as ``stored`` takes under ``--weights mode``."""
    if mode not in formats.WEIGHT_MODES:
        raise CheckpointError(f"unknown weights mode {mode!r}; use one of {', '.join(formats.WEIGHT_MODES)}")
    if mode == "auto":
        return stored
    if mode == "int4" and head:
        return INT4_HEAD
    return formats.WEIGHT_MODES[mode]  # type: ignore[return-value]


# ------------------------------------------------------------------------------- GGUF


def read_gguf(path: str | Path, weights: str = "auto") -> Checkpoint:
    """A GGUF file's config and weights; refuses architectures the native forward lacks."""
    from gguf import GGMLQuantizationType

    from verispec.gguf_file import GGUFFile, GGUFFileError

    path = Path(path)
    try:
        file = GGUFFile.open(path)
        arch = file.architecture
    except (GGUFFileError, OSError) as error:
        raise CheckpointError(str(error)) from error
    if arch not in GGUF_ARCHITECTURES:
        raise CheckpointError(
            f"{path.name}: GGUF architecture {arch!r} is not covered by the native decoder "
            f"(covered: {', '.join(GGUF_ARCHITECTURES)}); use --backend torch or llama.cpp"
        )
    config = _gguf_config(file, arch)
    stored: Counter[str] = Counter(GGMLQuantizationType(t.ggml_type).name for t in file.tensors.values())
    permute = arch == "llama"  # llama.cpp's convert script permutes q/k of Llama models only

    def raw(name: str) -> tuple[GGMLQuantizationType, tuple[int, ...], np.ndarray]:
        if name not in file.tensors:
            raise CheckpointError(f"{path.name}: tensor {name} is missing")
        info, data = file.tensor(name)
        return GGMLQuantizationType(info.ggml_type), info.shape, data

    def matrix(name: str, head: bool = False, heads: int = 0) -> Weights:
        ggml_type, (rows, cols), data = raw(name)
        loaded = formats.from_ggml(data.reshape(rows, -1), ggml_type, rows, cols)
        if heads:
            loaded = loaded.take_rows(_unpermute_order(rows, heads))
        stored = loaded.format if ggml_type in formats.NATIVE_GGML else "q8_0"
        return formats.requantize(loaded, target_format(weights, stored, head))

    def vector(name: str) -> np.ndarray:
        ggml_type, _, data = raw(name)
        if ggml_type != GGMLQuantizationType.F32:
            raise CheckpointError(f"{path.name}: {name} is {ggml_type.name}; norms and biases must be F32")
        return data.view(np.float32).copy()

    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    layers = []
    for i in range(config.num_hidden_layers):
        prefix = f"blk.{i}"
        q = matrix(f"{prefix}.attn_q.weight", heads=heads if permute else 0)
        k = matrix(f"{prefix}.attn_k.weight", heads=kv_heads if permute else 0)
        v = matrix(f"{prefix}.attn_v.weight")
        bias = None
        if f"{prefix}.attn_q.bias" in file.tensors:
            bias = np.concatenate([vector(f"{prefix}.attn_{x}.bias") for x in "qkv"])
        layers.append(
            LayerWeights(
                attn_norm=vector(f"{prefix}.attn_norm.weight"),
                ffn_norm=vector(f"{prefix}.ffn_norm.weight"),
                qkv=_fuse([q, k, v]),
                o=matrix(f"{prefix}.attn_output.weight"),
                gate_up=_fuse([matrix(f"{prefix}.ffn_gate.weight"), matrix(f"{prefix}.ffn_up.weight")]),
                down=matrix(f"{prefix}.ffn_down.weight"),
                qkv_bias=bias,
            )
        )
    embed = matrix("token_embd.weight", head=True)
    head = matrix("output.weight", head=True) if "output.weight" in file.tensors else embed
    factors = vector("rope_freqs.weight") if "rope_freqs.weight" in file.tensors else None
    return Checkpoint(config, layers, embed, vector("output_norm.weight"), head, path, "gguf", weights, factors, stored)


def _gguf_config(file: Any, arch: str) -> Any:
    def need(key: str) -> Any:
        value = file.value(f"{arch}.{key}")
        if value is None:
            raise CheckpointError(f"{file.path.name}: GGUF metadata {arch}.{key} is missing")
        return value

    heads = int(need("attention.head_count"))
    hidden = int(need("embedding_length"))
    if "token_embd.weight" not in file.tensors:
        raise CheckpointError(f"{file.path.name}: tensor token_embd.weight is missing")
    values: dict[str, Any] = {
        "vocab_size": int(file.tensors["token_embd.weight"].shape[0]),
        "hidden_size": hidden,
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(file.value(f"{arch}.attention.head_count_kv", heads)),
        "head_dim": int(file.value(f"{arch}.attention.key_length", hidden // heads)),
        "max_position_embeddings": int(need("context_length")),
        "rms_norm_eps": float(file.value(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(file.value(f"{arch}.rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in file.tensors,
        "bos_token_id": file.value("tokenizer.ggml.bos_token_id"),
        "eos_token_id": file.value("tokenizer.ggml.eos_token_id"),
    }
    scaling = file.value(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        if scaling != "linear":
            raise CheckpointError(f"rope scaling {scaling!r} is not covered by the native decoder")
        values["rope_scaling"] = {"rope_type": "linear", "factor": float(need("rope.scaling.factor"))}
    return _config_for(GGUF_ARCHITECTURES[arch], values)


def _config_for(model_type: str, values: dict[str, Any]) -> Any:
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **values)


def _unpermute_order(rows: int, heads: int) -> np.ndarray:
    """Row order undoing llama.cpp's q/k permutation: within each head, GGUF row
    (i, s) (i < head_dim / 2, s in 0, 1) holds transformers' row (s, i)."""
    half = rows // heads // 2
    head, s, i = np.meshgrid(np.arange(heads), np.arange(2), np.arange(half), indexing="ij")
    return (head * 2 * half + i * 2 + s).reshape(-1)


PRECISION = ("f32", "f16", "bf16", "q8_0", "q4")  # most precise first


def _fuse(parts: list[Weights]) -> Weights:
    """Stack matrices; where the file stored them in different formats (q and k at 4 bits
    beside v at 8, say) all take the most precise of them."""
    if len({p.format for p in parts}) > 1:
        best = min((p.format for p in parts), key=PRECISION.index)
        parts = [formats.requantize(p, best) for p in parts]
    return formats.concat_rows(parts)


# -------------------------------------------------------------------------- safetensors


def read_directory(directory: str | Path, weights: str = "auto") -> Checkpoint:
    """A transformers directory (config.json + safetensors) of a covered architecture."""
    from safetensors import safe_open
    from transformers import AutoConfig

    directory = Path(directory)
    try:
        config = AutoConfig.from_pretrained(directory)
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{directory}: cannot read its config ({error})") from error
    if config.model_type not in ARCHITECTURES:
        raise CheckpointError(
            f"{directory.name}: architecture {config.model_type!r} is not covered by the native decoder "
            f"(covered: {', '.join(ARCHITECTURES)}); use --backend torch"
        )
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{directory}: no safetensors weights")
    handles = {}
    for file in files:
        handle = safe_open(str(file), framework="pt")
        handles.update(dict.fromkeys(handle.keys(), handle))
    stored: Counter[str] = Counter()

    def tensor(name: str) -> Any:
        if name not in handles:
            raise CheckpointError(f"{directory.name}: tensor {name} is missing")
        value = handles[name].get_tensor(name)
        stored[str(value.dtype).replace("torch.", "")] += 1
        return value

    def matrix(name: str, head: bool = False) -> Weights:
        loaded = _float_weights(tensor(name))
        return formats.requantize(loaded, target_format(weights, loaded.format, head))

    def vector(name: str) -> np.ndarray:
        return tensor(name).float().numpy().reshape(-1).copy()

    layers = []
    for i in range(config.num_hidden_layers):
        prefix = f"model.layers.{i}"
        attn, mlp = f"{prefix}.self_attn", f"{prefix}.mlp"
        bias = None
        if f"{attn}.q_proj.bias" in handles:
            bias = np.concatenate([vector(f"{attn}.{x}_proj.bias") for x in "qkv"])
        layers.append(
            LayerWeights(
                attn_norm=vector(f"{prefix}.input_layernorm.weight"),
                ffn_norm=vector(f"{prefix}.post_attention_layernorm.weight"),
                qkv=_fuse([matrix(f"{attn}.{x}_proj.weight") for x in "qkv"]),
                o=matrix(f"{attn}.o_proj.weight"),
                gate_up=_fuse([matrix(f"{mlp}.gate_proj.weight"), matrix(f"{mlp}.up_proj.weight")]),
                down=matrix(f"{mlp}.down_proj.weight"),
                qkv_bias=bias,
            )
        )
    embed = matrix("model.embed_tokens.weight", head=True)
    tied = bool(getattr(config, "tie_word_embeddings", False)) or "lm_head.weight" not in handles
    head = embed if tied else matrix("lm_head.weight", head=True)
    return Checkpoint(config, layers, embed, vector("model.norm.weight"), head, directory, "dir", weights, None, stored)


def _float_weights(value: Any) -> Weights:
    import torch

    rows, cols = value.shape
    if value.dtype == torch.bfloat16:
        bits = value.contiguous().view(torch.int16).numpy().view(np.uint16)
        return Weights("bf16", rows, cols, values=bits.copy(), source="bf16")
    if value.dtype == torch.float16:
        return formats.from_float(value.numpy().copy(), source="f16")
    return formats.from_float(value.float().numpy().copy(), source=str(value.dtype).replace("torch.", ""))


_GGUF_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def transformers_parameters(checkpoint: Checkpoint) -> Iterator[tuple[str, np.ndarray]]:
    """(name, float32 values) of every parameter of the transformers model the checkpoint's
    file loads as, read again from the file (the weights as stored, whatever --weights
    chose): GGUF tensors dequantised by the gguf package, q and k rows in transformers' order."""
    if checkpoint.kind == "dir":
        from safetensors import safe_open

        for file in sorted(checkpoint.path.glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as handle:
                for name in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
                    if name == "lm_head.weight" and checkpoint.head is checkpoint.embed:
                        continue  # tied: transformers lists the shared parameter once
                    yield name, handle.get_tensor(name).float().numpy()
        return
    from gguf import GGMLQuantizationType, quants

    from verispec.gguf_file import GGUFFile

    config = checkpoint.config
    gguf = GGUFFile.open(checkpoint.path)
    for tensor_name in gguf.tensors:
        parts = tensor_name.split(".")
        if tensor_name in _GGUF_NAMES:
            name = _GGUF_NAMES[tensor_name]
        elif parts[0] == "blk" and parts[2] in _GGUF_LAYER_NAMES:
            name = f"model.layers.{parts[1]}.{_GGUF_LAYER_NAMES[parts[2]]}.{parts[3]}"
        else:
            continue  # not a parameter of the transformers model (rope_freqs)
        info, data = gguf.tensor(tensor_name)
        shape = info.shape
        ggml_type = GGMLQuantizationType(info.ggml_type)
        values = quants.dequantize(data.reshape(shape[0], -1), ggml_type).reshape(shape).astype(np.float32)
        heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}.get(
            parts[2] if len(parts) > 2 else ""
        )
        if heads and config.model_type == "llama" and len(shape) == 2:
            values = values[_unpermute_order(shape[0], heads)]
        yield name, values


def read(kind: str, location: str | Path, weights: str = "auto") -> Checkpoint:
    """``kind`` "gguf" (a file) or "dir" (a transformers directory)."""
    if kind == "gguf":
        return read_gguf(location, weights)
    if kind == "dir":
        return read_directory(location, weights)
    raise CheckpointError(f"the native decoder reads GGUF files and model directories, not {kind!r} sources")


def describe(checkpoint: Checkpoint) -> str:
    """One line: architecture, formats and size."""
    used = ", ".join(f"{n} {f}" for f, n in sorted(checkpoint.formats_used().items()))
    config = checkpoint.config
    return (
        f"{config.model_type} {config.num_hidden_layers} layers, weights {checkpoint.weights_mode}"
        f" ({used}; {checkpoint.nbytes / 2**20:.0f} MiB)"
    )
