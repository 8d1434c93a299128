"""The training loop: AdamW with warm-up and cosine decay, checkpoints, resume, loss curve.

A checkpoint (``OUT/checkpoint/state.safetensors``) holds the network's parameters, the
optimiser's moments and, in its metadata, the progress (step, loss history, and the run
key: a hash of everything that defines the run). A run started again with the same key continues
from the checkpoint; since each step's batch comes from (seed, step) and the learning rate
is a function of the step, the resumed run computes what the uninterrupted one would have.
A checkpoint left by a different run is refused, not mixed in.

Validation (optional): an objective over held-out sequences, scored at every checkpoint on
the same fixed batches (so scores compare like with like). The weights with the lowest
validation loss are kept (in the checkpoint too, so a resumed run keeps them) and are what
the run returns: early stopping. With ``patience`` > 0 training also ends once that many
validations in a row have not improved on the best.

Held-out score (optional, ``verispec.train.score``): a scorer called at every checkpoint
too; where there is one, the best checkpoint is the one of the most expected tokens per
round (the first of equals) rather than the lowest validation loss.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from verispec.errors import UserError
from verispec.train.objectives import StepResult

CHECKPOINT_DIR = "checkpoint"
CHECKPOINT_FILE = "state.safetensors"
GRAD_CLIP = 1.0


class TrainError(UserError, ValueError):
    """A training run that cannot start or continue as asked."""


class Objective(Protocol):
    def step(self, step: int) -> StepResult: ...


@dataclass(frozen=True)
class Schedule:
    """Optimiser settings; the learning rate at a step is a pure function of the step."""

    steps: int
    lr: float = 1e-3
    warmup: int = 50
    weight_decay: float = 0.01
    checkpoint_every: int = 100  # also how often validation runs, when there is one
    bf16: bool = False  # autocast matmuls to bf16 (fast on CPUs with native bf16)
    patience: int = 0  # validations without a new best before stopping; 0: run every step

    def lr_at(self, step: int) -> float:
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        progress = (step - self.warmup) / max(1, self.steps - self.warmup)
        return self.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


@dataclass
class History:
    losses: list[float] = field(default_factory=list)
    accuracies: list[float] = field(default_factory=list)
    seconds: float = 0.0
    resumed_from: int = 0
    # One entry per checkpoint validated: {"step", "loss", "accuracy"} (first-draft accuracy)
    # with a validation objective, "score" (``HeldOutScore.as_dict``) with a scorer.
    validations: list[dict[str, Any]] = field(default_factory=list)

    @property
    def step(self) -> int:
        return len(self.losses)

    @property
    def best(self) -> dict[str, Any] | None:
        """The validation with the most expected tokens per round where they were scored,
        else the lowest loss (the first of equals); None without validation."""
        if not self.validations:
            return None
        if all("score" in v for v in self.validations):
            return max(self.validations, key=lambda v: v["score"]["expected_tokens"])
        return min(self.validations, key=lambda v: v["loss"])

    def patience_spent(self, patience: int) -> bool:
        best = self.best
        if patience <= 0 or best is None:
            return False
        return sum(1 for v in self.validations if v["step"] > best["step"]) >= patience


StepCallback = Callable[[int, float, float], None]  # (steps done, loss, first-draft accuracy)
Scorer = Callable[[], dict[str, Any]]  # the held-out score of the net as it is now


def run(
    net: nn.Module,
    objective: Objective,
    schedule: Schedule,
    out: Path,
    run_key: str,
    on_step: StepCallback | None = None,
    validation: Objective | None = None,
    validation_batches: int = 16,
    scorer: Scorer | None = None,
) -> History:
    """Train ``net`` for ``schedule.steps`` steps, resuming from OUT/checkpoint when present.
    With ``validation`` or ``scorer``, ``net`` ends with the weights of the best checkpoint
    (see above)."""
    parameters = [p for p in net.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=schedule.lr, weight_decay=schedule.weight_decay)
    checkpoint = out / CHECKPOINT_DIR
    history, best_weights = _resume(checkpoint, run_key, net, optimizer)
    started = time.perf_counter() - history.seconds
    for step in range(history.step, schedule.steps):
        if history.patience_spent(schedule.patience):
            break
        for group in optimizer.param_groups:
            group["lr"] = schedule.lr_at(step)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=schedule.bf16):
            result = objective.step(step)
        optimizer.zero_grad(set_to_none=True)
        result.loss.backward()
        nn.utils.clip_grad_norm_(parameters, GRAD_CLIP)
        optimizer.step()
        history.losses.append(result.loss.item())
        history.accuracies.append(result.accuracy)
        history.seconds = time.perf_counter() - started
        done = step + 1
        if done % schedule.checkpoint_every == 0 or done == schedule.steps:
            if validation is not None or scorer is not None:
                entry: dict[str, Any] = {"step": done}
                if validation is not None:
                    entry.update(_validate(net, validation, validation_batches, schedule))
                if scorer is not None:
                    net.eval()
                    entry["score"] = scorer()
                    net.train()
                history.validations.append(entry)
                if history.best is history.validations[-1]:
                    best_weights = {name: t.detach().clone() for name, t in net.state_dict().items()}
            _save(checkpoint, run_key, net, optimizer, history, best_weights)
            plot_loss(history, out / "loss.png")
        if on_step is not None:
            on_step(done, history.losses[-1], result.accuracy)
    if best_weights:
        net.load_state_dict(best_weights)
    return history


def _validate(net: nn.Module, validation: Objective, batches: int, schedule: Schedule) -> dict[str, float]:
    """Mean loss and first-draft accuracy over the validation's first ``batches`` batches
    (always the same ones: batch i is drawn from the validation's seed and i)."""
    net.eval()
    losses, accuracies = [], []
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=schedule.bf16):
        for index in range(batches):
            result = validation.step(index)
            losses.append(result.loss.item())
            accuracies.append(result.accuracy)
    net.train()
    return {"loss": sum(losses) / batches, "accuracy": sum(accuracies) / batches}


def remove_checkpoint(out: Path) -> None:
    shutil.rmtree(out / CHECKPOINT_DIR, ignore_errors=True)


def _save(
    directory: Path,
    run_key: str,
    net: nn.Module,
    optimizer: torch.optim.Optimizer,
    history: History,
    best_weights: dict[str, torch.Tensor],
) -> None:
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    tensors = {f"net.{name}": t.detach().clone() for name, t in net.state_dict().items()}
    tensors.update({f"best.{name}": t for name, t in best_weights.items()})
    for index, state in optimizer.state_dict()["state"].items():
        for name, value in state.items():
            tensors[f"opt.{index}.{name}"] = torch.as_tensor(value).clone()
    progress = {"run": run_key, "step": history.step, "losses": history.losses}
    progress.update({"accuracies": history.accuracies, "seconds": history.seconds})
    if history.validations:
        progress["validations"] = history.validations
    # One file, tensors and progress together, replaced atomically: a run killed while
    # saving resumes from the previous checkpoint, never from a mixed one.
    staging = directory / "state.partial"
    save_file(tensors, str(staging), metadata={"progress": json.dumps(progress)})
    staging.replace(directory / CHECKPOINT_FILE)


def _resume(
    directory: Path, run_key: str, net: nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[History, dict[str, torch.Tensor]]:
    """The progress saved in ``directory`` (loaded into ``net`` and ``optimizer``) and the
    best validation's weights; a fresh History and {} when there is no checkpoint."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    path = directory / CHECKPOINT_FILE
    if not path.is_file():
        return History(), {}
    with safe_open(str(path), framework="pt") as handle:
        progress = json.loads((handle.metadata() or {}).get("progress", "{}"))
    if progress.get("run") != run_key:
        raise TrainError(
            f"{directory} holds a checkpoint of a different training run (other settings, data or "
            "target); remove it, or train into another --out directory"
        )
    tensors = load_file(str(path))
    net.load_state_dict({name[4:]: t for name, t in tensors.items() if name.startswith("net.")})
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        if name.startswith("opt."):
            _, index, key = name.split(".", 2)
            state.setdefault(int(index), {})[key] = value
    saved = optimizer.state_dict()
    saved["state"] = state
    optimizer.load_state_dict(saved)
    history = History(list(progress["losses"]), list(progress["accuracies"]), float(progress["seconds"]))
    history.validations = list(progress.get("validations", []))
    history.resumed_from = history.step
    best_weights = {name[5:]: t for name, t in tensors.items() if name.startswith("best.")}
    return history, best_weights


def plot_loss(history: History, path: Path) -> None:
    """The loss curve (per step, and a moving average) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = range(1, history.step + 1)
    figure, axis = plt.subplots(figsize=(7, 4))
    axis.plot(steps, history.losses, color="tab:blue", alpha=0.3, linewidth=0.8, label="loss per step")
    width = max(1, history.step // 50)
    if history.step >= width:
        kernel = torch.ones(width) / width
        smooth = torch.conv1d(torch.tensor(history.losses).view(1, 1, -1), kernel.view(1, 1, -1)).flatten()
        axis.plot(range(width, history.step + 1), smooth.tolist(), color="tab:blue", label=f"mean of {width}")
    if history.validations:
        lossed = [v for v in history.validations if "loss" in v]
        if lossed:
            steps_seen = [v["step"] for v in lossed]
            axis.plot(steps_seen, [v["loss"] for v in lossed], "o-", color="tab:orange", label="held out")
        best = history.best
        assert best is not None
        axis.axvline(best["step"], color="tab:orange", alpha=0.4, linestyle="--", label=f"best, step {best['step']}")
    axis.set_xlabel("step")
    axis.set_ylabel("cross-entropy (nats)")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
