"""The training set: responses the target writes itself, and its hidden states along them.

Terms and shapes:

- a sequence is a prompt's token ids followed by the target's response (up to and including
  its end-of-sequence token);
- ``Corpus.tokens`` (P,): all positions of all sequences back to back; ``starts``,
  ``lengths``, ``prompt_lengths`` (S,) locate each sequence and its response;
- ``hidden`` (P, len(layers) * D) bf16: the target's hidden states at every position, from
  the hidden-state indices ``layers`` (0 = embeddings, L = the final normed state).

Both are cached on disk as safetensors, keyed by the target's weight hash and the settings,
so a second run (another drafter kind, or a resumed run) does not generate again.
Responses are generated in batches (left-padded ``generate``), greedily unless a temperature
is given: the greedy continuation is what a greedy request verifies.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verispec.train.states import ShardStates

Progress = Callable[[int, int], None]  # (done, total)


@dataclass(frozen=True)
class DataSettings:
    """What makes one training set: enough prompts to write ``tokens`` response tokens."""

    tokens: int
    max_new_tokens: int = 192
    temperature: float = 0.0
    seed: int = 0
    batch_size: int = 32
    # Share of the response tokens written as second turns on the target's own first answers
    # (prompts.second_turns): follow-ups, and passages to summarise, translate, extract from.
    second_turns: float = 0.0

    def key(self, fingerprint: str) -> str:
        fields = dict(self.__dict__)
        if not fields["second_turns"]:
            del fields["second_turns"]  # first turns only: the key of the sets made before the option
        text = json.dumps({"target": fingerprint, **fields, "prompts": "v1"}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class Corpus:
    tokens: torch.Tensor
    starts: torch.Tensor
    lengths: torch.Tensor
    prompt_lengths: torch.Tensor
    hidden: torch.Tensor | ShardStates | None = None  # (P, F): rows in memory, or read from shard files

    @property
    def response_tokens(self) -> int:
        return int((self.lengths - self.prompt_lengths).sum())

    @staticmethod
    def from_sequences(sequences: list[tuple[list[int], list[int]]]) -> Corpus:
        lengths = torch.tensor([len(p) + len(r) for p, r in sequences], dtype=torch.long)
        starts = torch.cumsum(lengths, 0) - lengths
        tokens = torch.tensor([t for p, r in sequences for t in (*p, *r)], dtype=torch.long)
        prompt_lengths = torch.tensor([len(p) for p, _ in sequences], dtype=torch.long)
        return Corpus(tokens, starts, lengths, prompt_lengths)

    def sequence_of(self) -> torch.Tensor:
        """(P,) the index of the sequence each position belongs to."""
        return torch.repeat_interleave(torch.arange(len(self.lengths)), self.lengths)


QUOTE_RUN = 16  # tokens in a row that two sequences must share to count as one quoting the other
QUOTE_COMMON = 8  # a run found in more sequences than this is a stock phrase, not a quote


def quote_groups(corpus: Corpus, run: int = QUOTE_RUN, common: int = QUOTE_COMMON) -> torch.Tensor:
    """(S,) a group id per sequence: sequences that share a run of ``run`` tokens written in
    a response (a second turn quoting or continuing a first answer, and that answer) are in
    one group, transitively. A run shared by more than ``common`` sequences is a stock phrase
    and links nothing. A held-out split by whole groups keeps every response on one side."""
    count = len(corpus.lengths)
    tokens = corpus.tokens.numpy().astype(np.uint64)
    windows = len(tokens) - run + 1
    if windows <= 0:
        return torch.arange(count)
    sequence = corpus.sequence_of().numpy()
    hashes = np.zeros(windows, dtype=np.uint64)
    with np.errstate(over="ignore"):  # a polynomial hash modulo 2^64
        for offset in range(run):
            hashes = hashes * np.uint64(1_000_003) + tokens[offset : offset + windows] + np.uint64(1)
    owner = sequence[:windows]
    inside = owner == sequence[run - 1 :]
    local = np.arange(windows) - corpus.starts.numpy()[owner]
    written = inside & (local >= corpus.prompt_lengths.numpy()[owner])
    keep = inside & np.isin(hashes, hashes[written])
    pairs = np.unique(np.stack([hashes[keep], owner[keep].astype(np.uint64)]), axis=1)  # sorted by hash
    starts = np.flatnonzero(np.r_[True, pairs[0, 1:] != pairs[0, :-1]])
    sizes = np.diff(np.r_[starts, pairs.shape[1]])
    linking = (sizes > 1) & (sizes <= common)
    edges: set[tuple[int, int]] = set()
    for start, size in zip(starts[linking], sizes[linking], strict=True):
        members = pairs[1, start : start + size]
        edges.update((int(members[0]), int(other)) for other in members[1:])
    parent = list(range(count))

    def root(node: int) -> int:
        while parent[node] != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    for a, b in edges:
        parent[root(a)] = root(b)
    return torch.tensor([root(node) for node in range(count)], dtype=torch.long)


def encode_prompt(tokenizer: Any, prompt: str) -> list[int]:
    """Token ids of a training prompt as a user's request: the chat template when there is one."""
    return encode_conversation(tokenizer, [{"role": "user", "content": prompt}])


def encode_conversation(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of a conversation ending in a user turn, ready for the assistant's answer:
    the chat template when there is one, else the turns' texts joined by blank lines."""
    if getattr(tokenizer, "chat_template", None) is not None:
        encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
        return [int(t) for t in ids]
    text = "\n\n".join(message["content"] for message in messages)
    return [int(t) for t in tokenizer(text)["input_ids"]]


@torch.inference_mode()
def generate_responses(
    model: Any,
    prompts: list[list[int]],
    settings: DataSettings,
    eos_ids: list[int],
    pad_id: int,
    progress: Progress | None = None,
) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids) pairs, batch by batch, until ``settings.tokens`` response
    tokens are written (or the prompts run out)."""
    torch.manual_seed(settings.seed)
    pairs: list[tuple[list[int], list[int]]] = []
    written = 0
    sampling = settings.temperature > 0
    options: dict[str, Any] = {"do_sample": sampling}
    if sampling:  # the plain softmax at that temperature, no filtering
        options.update(temperature=settings.temperature, top_p=1.0, top_k=None)
    for first in range(0, len(prompts), settings.batch_size):
        batch = prompts[first : first + settings.batch_size]
        width = max(len(p) for p in batch)
        input_ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        out = model.generate(
            input_ids=input_ids,
            attention_mask=mask,
            max_new_tokens=settings.max_new_tokens,
            eos_token_id=eos_ids,
            pad_token_id=pad_id,
            **options,
        )
        for prompt, row in zip(batch, out[:, width:].tolist(), strict=True):
            response = _until_eos(row, set(eos_ids))
            if response:
                pairs.append((prompt, response))
                written += len(response)
        if progress is not None:
            progress(min(written, settings.tokens), settings.tokens)
        if written >= settings.tokens:
            break
    if written == 0:
        raise ValueError("the target wrote no response tokens for any training prompt")
    return pairs


def _until_eos(row: list[int], eos: set[int]) -> list[int]:
    for index, token in enumerate(row):
        if token in eos:
            return row[: index + 1]
    return row


@torch.inference_mode()
def hidden_states(
    model: Any,
    corpus: Corpus,
    layers: tuple[int, ...],
    batch_size: int = 8,
    progress: Progress | None = None,
    dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """(P, len(layers) * D) ``dtype`` (bf16: a training set's size halved): the target's
    states at every position of every sequence."""
    hidden_size = int(model.config.hidden_size)
    out = torch.zeros(len(corpus.tokens), len(layers) * hidden_size, dtype=dtype)
    order = torch.argsort(corpus.lengths, descending=True).tolist()  # similar lengths share a batch
    device = next(model.parameters()).device
    for done in range(0, len(order), batch_size):
        batch = order[done : done + batch_size]
        width = int(corpus.lengths[batch].max())
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for row, index in enumerate(batch):
            start, length = int(corpus.starts[index]), int(corpus.lengths[index])
            ids[row, :length] = corpus.tokens[start : start + length]
            mask[row, :length] = 1
        states = model(input_ids=ids.to(device), attention_mask=mask.to(device), output_hidden_states=True)
        stacked = torch.cat([states.hidden_states[layer] for layer in layers], dim=-1).cpu()
        for row, index in enumerate(batch):
            start, length = int(corpus.starts[index]), int(corpus.lengths[index])
            out[start : start + length] = stacked[row, :length].to(dtype)
        if progress is not None:
            progress(min(done + batch_size, len(order)), len(order))
    return out


def native_hidden_states(
    target: Any, corpus: Corpus, layers: tuple[int, ...], dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """As ``hidden_states``, from a target with its own kernels (``verispec.targets.native``):
    each sequence prefilled once with its states at ``layers`` kept, so a drafter trains on the
    states it reads at run time on that target (its quantised weights' own, within a few
    percent of the transformers model's). Leaves the target empty and capturing nothing."""
    from verispec.targets.base import HiddenCapture

    width = len(layers) * int(target.hidden_size)
    out = torch.zeros(len(corpus.tokens), width, dtype=dtype)
    try:
        for start, length in zip(corpus.starts.tolist(), corpus.lengths.tolist(), strict=True):
            target.capture_hidden(HiddenCapture(layers, prefill_rows=length))
            target.prefill(corpus.tokens[start : start + length].tolist())
            out[start : start + length] = target.last_hidden.to(dtype)
    finally:
        target.capture_hidden(None)
        target.reset()
    return out


def save_corpus(corpus: Corpus, path: Path, key: str) -> None:
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {"tokens": corpus.tokens, "starts": corpus.starts, "lengths": corpus.lengths}
    tensors["prompt_lengths"] = corpus.prompt_lengths
    staging = path.with_suffix(".partial")
    save_file(tensors, str(staging), metadata={"key": key})
    staging.replace(path)  # a run killed mid-write leaves no half file under the real name


def load_corpus(path: Path, key: str) -> Corpus | None:
    """The cached corpus at ``path`` if it was made with ``key``, else None."""
    tensors = _load_if(path, key)
    if tensors is None:
        return None
    return Corpus(tensors["tokens"], tensors["starts"], tensors["lengths"], tensors["prompt_lengths"])


def save_hidden(hidden: torch.Tensor, path: Path, key: str) -> None:
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_suffix(".partial")
    save_file({"hidden": hidden.contiguous()}, str(staging), metadata={"key": key})
    staging.replace(path)


def hidden_path(directory: Path, key: str, layers: tuple[int, ...]) -> Path:
    return directory / f"hidden-{key}-{'-'.join(map(str, layers))}.safetensors"


def load_hidden_layers(directory: Path, key: str, layers: tuple[int, ...], hidden_size: int) -> torch.Tensor | None:
    """The cached states of ``layers``, from a file holding exactly them or more (a head's
    last layer is among a block drafter's layers: one forward pass over the corpus serves both)."""
    for path in sorted(directory.glob(f"hidden-{key}-*.safetensors")):
        stored = tuple(int(i) for i in path.stem.split("-")[2:])
        if not set(layers) <= set(stored):
            continue
        tensors = _load_if(path, key)
        if tensors is None:
            continue
        columns = [torch.arange(hidden_size) + stored.index(layer) * hidden_size for layer in layers]
        hidden = tensors["hidden"]
        return hidden if stored == layers else hidden[:, torch.cat(columns)].contiguous()
    return None


def _load_if(path: Path, key: str) -> dict[str, torch.Tensor] | None:
    from safetensors import safe_open
    from safetensors.torch import load_file

    if not path.is_file():
        return None
    with safe_open(str(path), framework="pt") as handle:
        if (handle.metadata() or {}).get("key") != key:
            return None
    return load_file(str(path))
