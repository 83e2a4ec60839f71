"""Deterministic token-id prompts for engine tests (ids avoid the tokenizer's special tokens)."""

from __future__ import annotations

import random


def prompt_ids(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 400) for _ in range(length)]
