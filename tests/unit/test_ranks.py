"""policy/ranks.py: the rows TP ranks exchange after each SCR tensor step, and what they mean."""

from __future__ import annotations

import pytest

from policy import ranks


def test_the_digest_names_the_step_and_the_request():
    digests = {ranks.step_digest(step, rid) for step in ("place_rows", "side_store") for rid in ("a.1", "a.2")}
    assert len(digests) == 4
    assert ranks.step_digest("place_rows", "a.1") == ranks.step_digest("place_rows", "a.1")
    assert all(0 <= d < 2 ** 56 for d in digests)  # fits an int64 tensor element
    assert ranks.step_digest("a", "b\0c") != ranks.step_digest("a\0b", "c")


@pytest.mark.parametrize("failed, expected", [
    ((0,), []), ((1,), [0]), ((0, 0), []), ((0, 1), [1]), ((1, 0), [0]), ((1, 1), [0, 1]), ((0, 0, 1, 0), [2]),
])
def test_failed_ranks(failed, expected):
    rows = [ranks.own_row("save_state", "r", bool(f)) for f in failed]
    assert ranks.failed_ranks(rows, "save_state", "r") == expected


@pytest.mark.parametrize("other", [("side_store", "r"), ("save_state", "q")])
def test_a_rank_at_another_step_or_request_is_a_disagreement(other):
    rows = [ranks.own_row("save_state", "r", False), ranks.own_row(*other, True)]
    with pytest.raises(ranks.RanksDisagree, match=r"step save_state of rid=r: rank\(s\) 1 are at another"):
        ranks.failed_ranks(rows, "save_state", "r")


def test_the_peer_failure_names_the_ranks():
    assert str(ranks.peer_failure("place_rows", [1, 3])) == "place_rows failed on TP rank(s) 1, 3"
    assert isinstance(ranks.peer_failure("x", [1]), ranks.PeerFailed)
