"""The exact adder hooks (patches/exact_tree.py), checked on a stand-in PrefillAdder:
``whole_piece_budget``: a continuation forward of an exact request covers exactly the plan's next
piece, never cut short by the free-token budget; ``planned_first_piece``: a new request's first
forward is the plan's first piece, or the request waits."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

exact_tree = pytest.importorskip("patches.exact_tree")
from patches import process  # noqa: E402 - after the skip: SGLang is imported above


class Adder:
    """What the hooks touch of SGLang's PrefillAdder: ``rem_total_tokens`` = free - offset, and
    ``rem_chunk_tokens`` (the step's chunk budget, B = 832 here)."""

    def __init__(self, free: int, chunk: int | None = 832):
        self.free, self.rem_total_token_offset, self.rem_chunk_tokens = free, 0, chunk
        self.seen = None

    @property
    def rem_total_tokens(self):
        return self.free - self.rem_total_token_offset


class Executor:
    def __init__(self, needed):
        self.needed = needed

    def next_piece_len(self, req):
        return self.needed


def add_chunked_req(adder, req):
    """SGLang's rule: the forward reads min(chunk budget, free tokens) of the rest (here 2,000)."""
    adder.seen = min(adder.rem_chunk_tokens, int(adder.rem_total_tokens))
    adder.rem_chunk_tokens -= max(adder.seen, 0)
    return "result"


@pytest.mark.parametrize(
    "free, needed, seen",
    [(10, 64, 64), (63, 64, 64), (64, 64, 64), (5000, 64, 64), (5000, 832, 832), (0, 64, 0), (-5, 64, -5),
     (10, None, 10), (5000, None, 832)],
    ids=["short", "one-short", "exact", "plenty-narrowed-to-the-piece", "plenty-whole-B", "zero-stock-overcommit",
         "negative", "no-plan", "no-plan-stock-budget"],
)
def test_piece_budget(monkeypatch, free, needed, seen):
    monkeypatch.setitem(process._state, "executor", Executor(needed))
    adder = Adder(free)
    assert exact_tree.whole_piece_budget(add_chunked_req, adder, req=object()) == "result"
    assert adder.seen == seen
    assert adder.rem_total_token_offset == 0  # restored
    assert adder.rem_chunk_tokens == 832 - max(seen, 0)  # the step's budget, less what the forward used


def add_one_req(adder, req, has_chunked_req, truncation_align_size):
    """SGLang's rule for a new request (rest of the prompt: 2,000 tokens): the whole rest if it fits
    the chunk budget, else a forward of the chunk budget."""
    adder.seen = min(2000, adder.rem_chunk_tokens)
    adder.rem_chunk_tokens -= adder.seen
    return "added"


@pytest.mark.parametrize("needed, chunk, outcome, seen, left", [
    (300, 832, "added", 300, 532),  # a message-cut piece: SGLang truncates exactly at the cut
    (832, 832, "added", 832, 0),
    (None, 832, "added", 832, 0),  # nothing planned: SGLang's own budget
    (832, 500, "wait", None, 500),  # the budget cannot hold the piece: wait, never shorten
])
def test_first_piece(monkeypatch, needed, chunk, outcome, seen, left):
    monkeypatch.setitem(process._state, "executor", Executor(needed))
    adder = Adder(10_000, chunk)
    result = exact_tree.planned_first_piece(add_one_req, adder, object(), False, None)
    assert (result == "added") == (outcome == "added")
    if outcome == "wait":
        assert result.name == "OTHER"
    assert adder.seen == seen and adder.rem_chunk_tokens == left
