"""``whole_piece_budget``: a continuation forward of an exact request is never cut short by the
free-token budget (patches/exact_tree.py), checked on a stand-in PrefillAdder."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

exact_tree = pytest.importorskip("patches.exact_tree")


class Adder:
    """What the hook touches of SGLang's PrefillAdder: ``rem_total_tokens`` = free - offset."""

    def __init__(self, free: int):
        self.free, self.rem_total_token_offset = free, 0
        self.seen = None

    @property
    def rem_total_tokens(self):
        return self.free - self.rem_total_token_offset


class Executor:
    def __init__(self, needed):
        self.needed = needed

    def next_piece_len(self, req):
        return self.needed


def add_chunked_req(adder, req):  # records the budget SGLang's code would see
    adder.seen = int(adder.rem_total_tokens)
    return "result"


@pytest.mark.parametrize(
    "free, needed, seen",
    [(10, 64, 64), (63, 64, 64), (64, 64, 64), (500, 64, 500), (0, 64, 0), (-5, 64, -5), (10, None, 10)],
    ids=["short", "one-short", "exact", "plenty", "zero-stock-overcommit", "negative", "no-plan"],
)
def test_piece_budget(monkeypatch, free, needed, seen):
    monkeypatch.setattr(exact_tree.ExactRadixCache, "executor", Executor(needed))
    adder = Adder(free)
    assert exact_tree.whole_piece_budget(add_chunked_req, adder, req=object()) == "result"
    assert adder.seen == seen
    assert adder.rem_total_token_offset == 0  # restored
