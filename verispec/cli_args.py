"""Argument types shared by the ``verispec`` subcommands."""

from __future__ import annotations

import argparse


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
