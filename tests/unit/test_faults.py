"""policy/faults.py: the fault-injection spec the engine tests use (``CACHE_POLICY_FAULTS``)."""

from __future__ import annotations

import pytest

from policy import faults


@pytest.fixture
def plan(monkeypatch):
    """Install a spec in this process (as the environment would), with fresh counters, on rank 0."""
    monkeypatch.setattr(faults, "_CALLS", {})
    monkeypatch.setattr(faults, "_RANK", [0])

    def install(text):
        monkeypatch.setattr(faults, "_PLAN", faults.parse(text))
    return install


@pytest.mark.parametrize("text, parsed", [
    ("a@2", {"a": [("", 2, False, None)]}),
    ("a@2, b~conv-x@1+", {"a": [("", 2, False, None)], "b": [("conv-x", 1, True, None)]}),
    ("scr.place_rows#1@1", {"scr.place_rows": [("", 1, False, 1)]}),
    ("s~tp-#0@3+,s@1", {"s": [("tp-", 3, True, 0), ("", 1, False, None)]}),
    ("", {}),
])
def test_specs_parse(text, parsed):
    assert faults.parse(text) == parsed


@pytest.mark.parametrize("text", ["a@0", "a", "@1", "a@x", "a#@1", "a#one@1", "a~p#-1@1"])
def test_a_malformed_item_is_an_error(text):
    with pytest.raises(ValueError, match="step"):
        faults.parse(text)


def test_check_counts_per_key_prefix(plan):
    plan("s~x@2+")
    faults.check("s", "y.1")  # other keys never count
    faults.check("s", "x.1")
    for _ in range(2):
        with pytest.raises(faults.InjectedFault):
            faults.check("s", "x.2")
    faults.check("other", "x.1")


@pytest.mark.parametrize("rank, fires", [(0, False), (1, True), (2, False)])
def test_a_rank_item_fires_on_that_rank_only(plan, rank, fires):
    plan("s#1@1")
    faults.set_rank(rank)
    if fires:
        with pytest.raises(faults.InjectedFault, match="call 1"):
            faults.check("s", "r")
    else:
        faults.check("s", "r")
        faults.check("s", "r")  # and the other rank's calls do not count here
    assert faults._CALLS == ({("s", 0): 1} if fires else {})


def test_items_of_one_step_count_their_own_calls(plan):
    """``s@2,s#1@1``: on rank 1 the second item fires on the first call and the first item on the
    second call. Each item counts the calls that reach it (a firing item ends the call), never
    another item's."""
    plan("s@2,s#1@1")
    faults.set_rank(1)
    with pytest.raises(faults.InjectedFault, match="call 1"):
        faults.check("s", "r")
    with pytest.raises(faults.InjectedFault, match="call 2"):
        faults.check("s", "r")
    faults.check("s", "r")
    assert faults._CALLS == {("s", 0): 3, ("s", 1): 2}
