"""scr/side.py: which rows a side-buffer store copies, and FIFO slot reuse."""

from __future__ import annotations

import pytest

from scr.side import CopyRange, SlotList, copy_range


@pytest.mark.parametrize(
    "stored, stored_rows, commit, capacity, expected",
    [
        ([], 0, [1, 2, 3], 10, CopyRange(keep=0, end=3, oversize=False)),  # first store
        ([1, 2, 3], 3, [1, 2, 3, 4, 5], 10, CopyRange(keep=3, end=5, oversize=False)),  # append
        ([1, 2, 3, 4], 4, [1, 9, 3, 4], 10, CopyRange(keep=1, end=4, oversize=False)),  # edit at 1
        ([1, 2, 3, 4], 2, [1, 2, 3, 4], 10, CopyRange(keep=2, end=4, oversize=False)),  # capped by stored rows
        ([1, 2, 3], 3, [1, 2], 10, CopyRange(keep=2, end=2, oversize=False)),  # shorter: nothing to copy
        ([], 0, list(range(12)), 10, CopyRange(keep=0, end=10, oversize=True)),  # longer than a slot
        ([1, 2, 3], 3, [1, 2, 3] + [0] * 9, 10, CopyRange(keep=3, end=10, oversize=True)),
    ],
    ids=["first", "append", "edit", "capped-by-rows", "shorter", "oversize", "append-oversize"],
)
def test_copy_range(stored, stored_rows, commit, capacity, expected):
    assert copy_range(stored, stored_rows, commit, capacity) == expected


def test_slots_are_reused_first_in_first_out_and_owned():
    slots = SlotList(3)
    assert [slots.acquire(s) for s in ("s1", "s2", "s3")] == [0, 1, 2]
    assert slots.acquire("s4") is None
    slots.release(1)
    slots.release(0)
    assert slots.owner == {2: "s3"}
    assert slots.acquire("s5") == 1 and slots.acquire("s6") == 0
    assert slots.owner == {0: "s6", 1: "s5", 2: "s3"}
    with pytest.raises(ValueError, match="side slot 7 is not held"):
        slots.release(7)


def test_every_acquisition_of_a_slot_has_a_new_generation():
    """A plan pins (slot, generation); a slot released and taken again, by anyone, must not look
    like the pinned one."""
    slots = SlotList(2)
    seen = {0: set(), 1: set()}
    for owner in ("s1", "s2", "s1", "s3"):
        slot = slots.acquire(owner)
        assert slots.generation[slot] not in seen[slot]
        seen[slot].add(slots.generation[slot])
        slots.release(slot)
    assert sum(len(v) for v in seen.values()) == 4
