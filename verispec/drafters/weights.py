"""Trained drafter weights on disk: ``config.json`` + ``model.safetensors``, never pickle.

A drafter directory holds:

- ``config.json``: ``{"format": "verispec-drafter", "version": 1, "kind": "head"|"block",
  "net": {...the network's shape...}, "target": {...identity...}, "training": {...}}``;
- ``model.safetensors``: the trained parameters and the draft vocabulary ``vocab_ids``. The
  target's embeddings and LM head are shared at load time, never stored.

The target identity (name, vocabulary size, hidden size, layer count and a SHA-256 of the
target's weights) is checked when the weights are loaded: weights trained for another target
are refused with a message that says what differs and how to train matching ones.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch

from verispec.drafters.base import DrafterError
from verispec.drafters.layers import SharedTarget

FORMAT = "verispec-drafter"
VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
STORED_DTYPE = torch.bfloat16  # halves the files; drafting casts back to float32
SHIPPED_DIR = Path(__file__).parent / "weights"


def shipped_dir(kind: str) -> Path:
    """Where the weights trained for the embedded model live inside the package."""
    return SHIPPED_DIR / kind


def weights_dir(option: str | None, kind: str) -> Path:
    """The directory to load: the shipped one when ``option`` is None; ``option`` itself when it
    holds a drafter; else its ``kind`` subdirectory (one option serving head and block)."""
    if not option:
        return shipped_dir(kind)
    directory = Path(option).expanduser()
    if not (directory / CONFIG_FILE).is_file() and (directory / kind / CONFIG_FILE).is_file():
        return directory / kind
    return directory


def require_hidden_states(target: Any, kind: str) -> None:
    """Refuse a target that cannot hand over its hidden states (the llama.cpp backend)."""
    needed = ("capture_hidden", "token_embeddings", "lm_head_weight", "weights_fingerprint")
    if not all(hasattr(target, name) for name in needed):
        raise DrafterError(
            f"the {kind} drafter reads the target's hidden states, embeddings and LM head; "
            f"{getattr(target, 'name', 'this target')} does not expose them (llama-cpp-python gives "
            "no intermediate layers): use the torch backend (--backend torch)"
        )


def target_identity(target: Any) -> dict[str, Any]:
    """What a drafter records about the target it was trained on."""
    return {
        "name": str(target.name),
        "vocab_size": int(target.vocab_size),
        "hidden_size": int(target.hidden_size),
        "num_layers": int(target.num_layers),
        "weights_sha256": target.weights_fingerprint(),
    }


def check_identity(recorded: dict[str, Any], target: Any, directory: Path, kind: str) -> None:
    """Refuse weights trained for another target, saying what differs."""
    actual = target_identity(target)
    differ = [
        f"{key} {recorded.get(key)!r} (weights) vs {actual[key]!r} (target)"
        for key in ("vocab_size", "hidden_size", "num_layers", "weights_sha256")
        if recorded.get(key) != actual[key]
    ]
    if differ:
        raise DrafterError(
            f"the {kind} drafter weights in {directory} were trained for the target "
            f"{recorded.get('name')!r}, not for {actual['name']!r}: {'; '.join(differ)}. Train weights for "
            f"this target with: verispec train-drafter --target MODEL --kind {kind} --out DIR, "
            "then pass --drafter-weights DIR"
        )


def save(
    directory: Path,
    kind: str,
    net: dict[str, Any],
    state: dict[str, torch.Tensor],
    target: dict[str, Any],
    training: dict[str, Any],
) -> None:
    """Write a drafter directory; floating tensors are stored as bf16."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    tensors = {
        name: (t.detach().to(STORED_DTYPE) if t.is_floating_point() else t.detach()).contiguous().cpu()
        for name, t in state.items()
    }
    save_file(tensors, str(directory / WEIGHTS_FILE), metadata={"format": FORMAT})
    config = {"format": FORMAT, "version": VERSION, "kind": kind, "net": net, "target": target, "training": training}
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")


def load(directory: Path, kind: str, target: Any) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(net config, float32 state) of a drafter directory, checked against ``target``."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    config_path, weights_path = directory / CONFIG_FILE, directory / WEIGHTS_FILE
    if not config_path.is_file() or not weights_path.is_file():
        raise DrafterError(
            f"no {kind} drafter weights in {directory} (expected {CONFIG_FILE} and {WEIGHTS_FILE}); "
            f"train them with: verispec train-drafter --target MODEL --kind {kind} --out {directory}"
        )
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as error:
        raise DrafterError(f"{config_path} is not readable JSON: {error}") from error
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise DrafterError(f"{config_path} is not a verispec drafter config (format {FORMAT!r} expected)")
    if config.get("version") != VERSION:
        raise DrafterError(f"{config_path}: version {config.get('version')!r}, this verispec reads {VERSION}")
    if config.get("kind") != kind:
        raise DrafterError(f"{directory} holds a {config.get('kind')!r} drafter, not a {kind!r} one")
    if not isinstance(config.get("net"), dict) or not isinstance(config.get("target"), dict):
        raise DrafterError(f"{config_path} lacks its 'net' or 'target' section")
    check_identity(config["target"], target, directory, kind)
    try:
        tensors = load_file(str(weights_path))
    except (SafetensorError, OSError) as error:
        raise DrafterError(f"{weights_path} is not a readable safetensors file: {error}") from error
    state = {name: t.to(torch.float32) if t.is_floating_point() else t for name, t in tensors.items()}
    return config["net"], state


Net = TypeVar("Net", bound=torch.nn.Module)


def load_net(
    directory: Path,
    kind: str,
    target: Any,
    make_net: Callable[[dict[str, Any], torch.Tensor], Net],
    layers_read: Callable[[Net], Sequence[int]],
) -> tuple[Net, SharedTarget]:
    """The trained net of a drafter directory and the target's shared, frozen embedding and LM
    head (restricted to the net's draft vocabulary). Checked: the target has hidden states and is
    the one the weights were trained for, it has the layers the net reads, the state fits."""
    require_hidden_states(target, kind)
    net_config, state = load(directory, kind, target)
    net = make_net(net_config, state["vocab_ids"])
    read = list(layers_read(net))
    if max(read) > target.num_layers:
        raise DrafterError(f"{directory}: reads target layers {read}, the target has {target.num_layers}")
    try:
        net.load_state_dict(state)
    except RuntimeError as error:
        raise DrafterError(f"{directory}: the weights do not fit the {kind} config: {error}") from error
    vocab_ids = state["vocab_ids"]
    draft_head = getattr(target, "draft_head", None)  # the target's own kernels, where it has them
    head = draft_head(vocab_ids) if draft_head is not None else None
    return net, SharedTarget(target.token_embeddings(), target.lm_head_weight(), vocab_ids, head)
