"""``policy.tokens``: the shared common-prefix length."""

from __future__ import annotations

import pytest

from policy.tokens import common_prefix_len


@pytest.mark.parametrize("a, b, expected", [
    pytest.param([], [], 0, id="both-empty"),
    pytest.param([], [1, 2], 0, id="one-empty"),
    pytest.param([1, 2, 3], [1, 2, 3], 3, id="equal"),
    pytest.param([1, 2], [1, 2, 3, 4], 2, id="a-prefix-of-b"),
    pytest.param([1, 2, 3, 4], [1, 2], 2, id="b-prefix-of-a"),
    pytest.param([5, 2, 3], [1, 2, 3], 0, id="first-differs"),
    pytest.param([1, 2, 9, 4], [1, 2, 3, 4], 2, id="equal-again-after-a-difference-does-not-count"),
    pytest.param((1, 2, 3), [1, 2, 4], 2, id="tuple-and-list"),
    pytest.param(range(100), list(range(50)) + [0], 50, id="range"),
])
def test_common_prefix_len(a, b, expected):
    assert common_prefix_len(a, b) == expected
    assert common_prefix_len(b, a) == expected  # symmetric


def test_common_prefix_len_of_long_sequences():
    a = list(range(100_000))
    assert common_prefix_len(a, a[:-1] + [-1]) == 99_999
