"""argparse ``type=`` converters shared by the eval command lines: a bad value is a one-line usage
error (exit 2) naming the value, never a traceback."""

from __future__ import annotations

import argparse


def int_at_least(minimum: int):
    """An integer >= ``minimum``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r}: must be >= {minimum}")
        return value
    return parse


def positive_number(text: str) -> float:
    """A number > 0 (minutes, seconds)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be > 0")
    return value
