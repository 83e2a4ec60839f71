"""Side-buffer bookkeeping that needs no tensors (``docs/scr.md`` §5.1–5.2).

A side slot holds one conversation's K/V rows in the order of its last committed sequence
(prompt + reply). Storing a new turn copies only the rows that changed: everything below the
common prefix of the stored and the new token ids is assumed identical (the tokens are; the KV
content is not compared, as in the authors' code).
"""
# Spec: docs/scr.md

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from policy.tokens import common_prefix_len


@dataclass(frozen=True)
class CopyRange:
    keep: int  # rows [0, keep) are already in the slot
    end: int  # rows [keep, end) are copied; end = min(len(commit), capacity)
    oversize: bool  # the sequence is longer than a slot: the session must be dropped


def copy_range(stored_ids, stored_rows: int, commit_ids, capacity: int) -> CopyRange:
    """Which rows a store must copy (§5.2 steps 5 and 8)."""
    keep = min(common_prefix_len(stored_ids, commit_ids), stored_rows)
    end = min(len(commit_ids), capacity)
    return CopyRange(keep=min(keep, end), end=end, oversize=end < len(commit_ids))


class SlotList:
    """Side-slot allocation: acquire takes the first free slot, release appends it at the back
    (slots are reused first-in, first-out, §5.1); each slot records its owner session.

    Every acquisition bumps the slot's ``generation``: a plan pins ``(slot, generation)`` when it is
    made, and a relocation or state restore refuses a slot whose generation moved on (released and
    taken again, by this session or another, possibly another tenant) since then. The owner alone
    cannot tell: a session that lost its slot and took a fresh one still "owns" the slot number.
    """

    def __init__(self, slots: int):
        self.free = deque(range(slots))
        self.owner: dict[int, str] = {}
        self.generation: list[int] = [0] * slots

    def acquire(self, session_id: str) -> int | None:
        if not self.free:
            return None
        slot = self.free.popleft()
        self.owner[slot] = session_id
        self.generation[slot] += 1
        return slot

    def release(self, slot: int) -> None:
        if slot not in self.owner:
            raise ValueError(f"side slot {slot} is not held")
        del self.owner[slot]
        self.free.append(slot)
