"""``verispec train-drafter``: argument parsing and progress display around ``train_drafter``."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

LOG_SECONDS = 30.0


def add_train_parser(commands: Any) -> None:
    train = commands.add_parser(
        "train-drafter",
        help="train a head or block drafter on the target's own responses (self-distillation)",
        description="Self-distillation: the target answers prompts written in verispec/train/prompts.py "
        "(never the benchmark's), its hidden states are cached, and a drafter learns to predict its tokens.",
    )
    train.add_argument("--target", default=None, help="GGUF file, transformers directory or hub id (default: embedded)")
    train.add_argument("--kind", required=True, choices=["head", "block"])
    train.add_argument("--out", required=True, help="directory for config.json, model.safetensors, loss.png")
    train.add_argument("--dtype", default="auto", help="target dtype: auto (bf16 where native), float32, bfloat16")
    data = train.add_argument_group("data")
    data.add_argument("--tokens", type=int, default=40_000, help="response tokens the target writes")
    data.add_argument("--max-new-tokens", type=int, default=192, help="longest response per prompt")
    data.add_argument("--data-temperature", type=float, default=0.0, help="0: greedy responses (default)")
    data.add_argument("--gen-batch", type=int, default=32, help="prompts per generate() batch")
    data.add_argument(
        "--second-turns",
        type=float,
        default=0.5,
        help="share of the tokens written as second turns on the target's own answers "
        "(follow-ups; passages to summarise, translate, extract from); 0: first turns only",
    )
    data.add_argument("--data-dir", default=None, help="cache of responses and hidden states")
    data.add_argument("--data-only", action="store_true", help="build and cache the training set, then stop")
    data.add_argument(
        "--shards",
        default=None,
        nargs="+",
        help="train on data directories grown by `verispec train-data grow` (several: all of them, "
        "a greedy and a sampled one say) instead of generating here",
    )
    data.add_argument("--sources", default=None, help="with --shards: comma-separated sources to use (default all)")
    data.add_argument(
        "--states",
        default="auto",
        help="with --shards: whose hidden states the drafter trains on: native (the native target's, "
        "what it reads at run time there), transformers (the model's), or auto (native where the target "
        "loads there)",
    )
    net = train.add_argument_group("network")
    net.add_argument("--layers", type=int, default=None, help="drafter layers (default: head 1, block 2)")
    net.add_argument("--block-size", type=int, default=8, help="block: anchor + masks (drafts = size - 1)")
    net.add_argument("--target-layers", type=int, default=4, help="block: evenly spaced target layers read")
    net.add_argument(
        "--feature-layers",
        type=int,
        default=1,
        help="head: evenly spaced target layers fused into its feature (EAGLE-3; 1: the final state only)",
    )
    net.add_argument("--draft-vocab", type=int, default=8192, help="most frequent response tokens it may draft")
    net.add_argument("--window", type=int, default=None, help="positions of context attended")
    net.add_argument("--intermediate", type=int, default=None, help="MLP width")
    fit = train.add_argument_group("training")
    fit.add_argument("--steps", type=int, default=1000)
    fit.add_argument("--items", type=int, default=16, help="items per step")
    fit.add_argument("--span", type=int, default=48, help="positions (head) or anchors (block) per item")
    fit.add_argument("--unroll", type=int, default=2, help="head: steps of feeding its own output back")
    fit.add_argument(
        "--distill",
        type=float,
        default=0.0,
        help="head: weight of the target's whole next-token distribution as soft labels, beside its token "
        "(0: the token alone, 1: the distribution alone)",
    )
    fit.add_argument(
        "--feature-loss",
        type=float,
        default=0.0,
        help="head: weight of regressing its output onto the target's final state (EAGLE-1)",
    )
    fit.add_argument("--lr", type=float, default=1e-3)
    fit.add_argument("--checkpoint-every", type=int, default=100, help="steps between checkpoints (and validations)")
    fit.add_argument(
        "--holdout",
        type=float,
        default=0.0,
        help="share of the responses held out: scored at every checkpoint, and the weights of the best "
        "score are the ones written (early stopping); 0: none",
    )
    fit.add_argument(
        "--patience", type=int, default=0, help="stop after this many validations without a new best (0: never)"
    )
    fit.add_argument(
        "--eval",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="held-out score at every checkpoint: how far the drafter's greedy chains run along the target's "
        "answers to fixed eval prompts (acceptance per position, expected tokens per round); the weights of "
        "the best score are the ones written",
    )
    fit.add_argument("--eval-k", type=int, default=8, help="draft positions the held-out score counts")
    fit.add_argument(
        "--eval-temperature",
        type=float,
        default=0.0,
        help="0: the held-out score runs greedy chains along greedy answers; T > 0: its sampled arm, the "
        "expected acceptance sum min(p, q) along answers sampled at T (for drafters served at T)",
    )
    fit.add_argument("--eval-tokens", type=int, default=128, help="longest target answer per eval prompt")
    fit.add_argument("--seed", type=int, default=0)
    fit.add_argument(
        "--bf16", action=argparse.BooleanOptionalAction, default=None, help="bf16 autocast (default: where native)"
    )
    train.set_defaults(run=run_train)


def run_train(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from verispec.cpu import cpu_has_native_bf16
    from verispec.train.data import DataSettings
    from verispec.train.pipeline import NetSettings, TrainSettings, train_drafter

    console = Console(stderr=True, highlight=False)
    bf16 = cpu_has_native_bf16() if args.bf16 is None else args.bf16
    data_settings = DataSettings(
        tokens=args.tokens,
        max_new_tokens=args.max_new_tokens,
        temperature=args.data_temperature,
        seed=args.seed,
        batch_size=args.gen_batch,
        second_turns=args.second_turns,
    )
    net_settings = NetSettings(
        layers=args.layers,
        block_size=args.block_size,
        target_layers=args.target_layers,
        feature_layers=args.feature_layers,
        draft_vocab=args.draft_vocab,
        window=args.window,
        intermediate=args.intermediate,
    )
    train_settings = TrainSettings(
        steps=args.steps,
        items=args.items,
        span=args.span,
        unroll=args.unroll,
        distill=args.distill,
        feature_loss=args.feature_loss,
        lr=args.lr,
        checkpoint_every=args.checkpoint_every,
        seed=args.seed,
        bf16=bf16,
        holdout=args.holdout,
        patience=args.patience,
        score_k=args.eval_k if args.eval else 0,
        score_tokens=args.eval_tokens,
        score_temperature=args.eval_temperature,
    )
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[note]}"),
    )
    start = time.perf_counter()
    with Progress(*columns, console=console) as progress:
        # Not a terminal (a log file): the bar cannot redraw, so a line every LOG_SECONDS instead.
        last_line = [time.perf_counter()]

        def log(description: str, done: int, total: int, note: str) -> None:
            now = time.perf_counter()
            if not console.is_terminal and (now - last_line[0] >= LOG_SECONDS or done == total):
                last_line[0] = now
                console.print(f"{description}: {done}/{total} at {now - start:.0f} s {note}")

        def stage(description: str, total: int) -> Callable[[int, str], None]:
            task = progress.add_task(description, total=total, note="")

            def update(done: int, note: str) -> None:
                progress.update(task, completed=done, note=note)
                log(description, done, total, note)

            return update

        training = progress.add_task("training steps", total=args.steps, note="", start=False)

        def on_step(done: int, loss: float, accuracy: float) -> None:
            note = f"loss {loss:.3f}  first-draft accuracy {accuracy:.2f}"
            progress.start_task(training)
            progress.update(training, completed=done, note=note)
            log("training steps", done, args.steps, note)

        summary = train_drafter(
            args.kind,
            Path(args.out),
            args.target,
            data_settings,
            net_settings,
            train_settings,
            Path(args.data_dir) if args.data_dir else None,
            None if args.dtype == "auto" else args.dtype,
            stage,
            on_step,
            args.data_only,
            [Path(path) for path in args.shards] if args.shards else None,
            tuple(s.strip() for s in args.sources.split(",")) if args.sources else None,
            states=args.states,
        )
    data = summary["data"]
    if args.data_only:
        console.print(
            f"cached {data['sequences']} responses, {data['response_tokens']:,} tokens, and their hidden states "
            f"({summary['data_seconds']:.0f} s; draft vocabulary covers {summary['draft_vocab_coverage']:.1%})"
        )
        return 0
    console.print(
        f"wrote {args.out}: {summary['parameters']:,} parameters; data {data['sequences']} responses, "
        f"{data['response_tokens']:,} tokens ({summary['data_seconds']:.0f} s, draft vocabulary covers "
        f"{summary['draft_vocab_coverage']:.1%}); training {summary['steps_run']} steps "
        f"in {summary['train_seconds']:.0f} s"
        + (f" (resumed at step {summary['resumed_from_step']})" if summary["resumed_from_step"] else "")
        + f"; final loss {summary['final_loss']:.3f}, "
        f"first-draft accuracy {summary['final_first_draft_accuracy']:.2f}; total {time.perf_counter() - start:.0f} s"
    )
    best = summary.get("validation")
    if best is not None:
        parts = []
        if "score" in best:
            held = best["score"]
            parts.append(
                f"held-out score {held['expected_tokens']:.2f} tokens per round at k={held['k']}, first-draft "
                f"acceptance {held['first_acceptance']:.2f} over {held['anchors']} anchors"
            )
        if "loss" in best:
            parts.append(
                f"held out {summary['held_out_sequences']} responses: loss {best['loss']:.3f}, first-draft "
                f"accuracy {best['accuracy']:.2f}"
            )
        console.print(f"best at step {best['step']} ({'; '.join(parts)}); its weights were written")
    console.print(f"[dim]command: verispec {shlex.join(sys.argv[1:])}[/dim]")
    return 0
