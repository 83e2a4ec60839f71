"""Token-sequence helpers every policy and tool shares (standard library only)."""

from __future__ import annotations

from typing import Sequence


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading token ids ``a`` and ``b`` share: the largest ``n`` with ``a[:n] == b[:n]``.

    0 when either is empty or the first ids differ; ``min(len(a), len(b))`` when one is a prefix
    of the other. Any two sequences whose items compare with ``==`` work (lists, tuples, ranges).
    """
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
