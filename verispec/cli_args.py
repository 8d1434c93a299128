"""Argument types shared by the ``verispec`` subcommands."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def k_value(text: str) -> int | str:
    """``--k``: "auto" (the economics governor) or a fixed number of drafts per round."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"k must be 'auto' or an integer >= 0, got {text!r}") from error
    if value < 0:
        raise argparse.ArgumentTypeError(f"k must be 'auto' or an integer >= 0, got {value}")
    return value


def bounded_int(low: int) -> Callable[[str], int]:
    """An argument type: an integer of at least ``low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from error
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    return parse


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """--model, --backend, --weights, --dtype, --device, --exact, --draft-model: what ``load_engine`` takes."""
    group = parser.add_argument_group("model")
    group.add_argument("--model", default=None, help="GGUF file, transformers directory or hub id (default: embedded)")
    group.add_argument(
        "--backend",
        default="auto",
        choices=["auto", "native", "torch", "llama.cpp"],
        help="auto = native where it covers the architecture (Llama, Mistral, Qwen2), else torch (see README)",
    )
    group.add_argument(
        "--weights",
        default="auto",
        choices=["auto", "bf16", "int8", "int4"],
        help="native: auto keeps the file's formats (GGUF Q4_0/Q4_1/Q8_0/F16/BF16/F32 as stored, other GGUF "
        "types at 8 bits), bf16, int8 or int4 (blocks of 32, quantised at load)",
    )
    group.add_argument("--dtype", default="auto", help="torch: auto (bf16 where native, else fp32), float32, bfloat16")
    group.add_argument("--device", default=None, help="torch: cpu or cuda (default: cuda when present)")
    group.add_argument(
        "--exact",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="torch: verify rows bit-identical to single steps (default: on where possible); "
        "--no-exact is faster but greedy output may then differ from plain decoding (native rows are always exact)",
    )
    group.add_argument("--draft-model", default=None, help="draft model for --drafter model")
    group.add_argument(
        "--drafter-weights",
        default=None,
        help="trained weights for --drafter head/block (a directory from verispec train-drafter, or one "
        "holding head/ and block/); default: the weights shipped for the embedded model",
    )


def model_options(args: argparse.Namespace) -> dict[str, object]:
    """The keyword arguments of ``load_engine`` from parsed ``add_model_options``."""
    return {
        "backend": args.backend,
        "weights": args.weights,
        "dtype": args.dtype,
        "device": args.device,
        "exact": args.exact,
        "draft_model": args.draft_model,
        "drafter_weights": args.drafter_weights,
    }
