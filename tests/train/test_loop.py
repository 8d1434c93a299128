"""The training loop's validation: the weights of the lowest held-out loss are the ones a run
ends with, patience stops it, and an interrupted run resumes to the same best weights.

A one-parameter "network" makes the held-out curve known in advance: training pulls w from 0
towards 5, the held-out loss is (w - 2) ** 2, so the best validation is the checkpoint whose
w is nearest 2, and everything after it is worse."""

import pytest
import torch
from torch import nn

from verispec.train import loop
from verispec.train.objectives import StepResult


class Scalar(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(()))


class Pull:
    def __init__(self, net: Scalar, goal: float) -> None:
        self.net, self.goal = net, goal

    def step(self, step: int) -> StepResult:
        loss = (self.net.w - self.goal) ** 2
        return StepResult(loss, float(-loss.detach()))


def train(out, steps=40, patience=0, on_step=None):
    net = Scalar()
    seen = {}

    def record(done, loss, accuracy):
        seen[done] = net.w.item()
        if on_step is not None:
            on_step(done, loss, accuracy)

    schedule = loop.Schedule(steps, lr=0.2, warmup=1, weight_decay=0.0, checkpoint_every=4, patience=patience)
    history = loop.run(
        net, Pull(net, 5.0), schedule, out, "key", record, validation=Pull(net, 2.0), validation_batches=2
    )
    return net, history, seen


def test_the_run_ends_with_the_weights_of_the_best_validation(tmp_path):
    net, history, seen = train(tmp_path)
    assert [v["step"] for v in history.validations] == list(range(4, 41, 4))
    best = history.best
    assert best is not None
    # The held-out loss is (w - 2)^2 at the checkpoint: the best is the checkpoint nearest w = 2.
    nearest = min(range(4, 41, 4), key=lambda s: abs(seen[s] - 2.0))
    assert best["step"] == nearest < 40
    assert best["loss"] == pytest.approx((seen[nearest] - 2.0) ** 2)
    assert net.w.item() == seen[nearest]  # not the last step's w
    assert seen[40] > 3.0  # training itself went on past the best


def test_patience_stops_after_that_many_validations_without_a_new_best(tmp_path):
    _, whole, _ = train(tmp_path / "whole")
    net, history, seen = train(tmp_path / "patient", patience=2)
    best = whole.best
    assert best is not None and history.best == best
    assert history.step == best["step"] + 2 * 4  # two validations past the best, then stop
    assert net.w.item() == seen[best["step"]]


def test_an_interrupted_run_resumes_with_its_best_weights(tmp_path):
    whole_net, whole, _ = train(tmp_path / "whole")
    best = whole.best
    assert best is not None
    stop_at = best["step"] + 6  # past the best, and past a checkpoint after it

    def interrupt(done, loss, accuracy):
        if done == stop_at:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(tmp_path / "cut", on_step=interrupt)
    net, resumed, _ = train(tmp_path / "cut")
    assert resumed.resumed_from == stop_at - stop_at % 4
    assert resumed.validations == whole.validations
    assert net.w.item() == whole_net.w.item()
