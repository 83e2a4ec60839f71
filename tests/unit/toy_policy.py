"""A toy policy written by following docs/ARCHITECTURE.md "How to add a policy", and nothing else:
keep recurrent states only where a message starts.

Each prompt is read in pieces that end where a message starts (a ``message_start`` token); a
snapshot is kept at every such position; a later prompt resumes at the deepest kept snapshot the
tree holds on its path. It plans inside the tree (``plans_at = "tree"``), so it runs on the hook
set and executor that already exist. Registered only by its test (``test_toy_policy.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from policy.api import Arrival, Read, Plan, PolicyDefaults, Release, Snapshot


@dataclass(frozen=True)
class MessageStartsConfig:
    message_start: int = 1  # the token id that opens a message

    def __post_init__(self):
        if self.message_start < 0:
            raise ValueError(f"message_start must be a token id, got {self.message_start}")


class MessageStartsPolicy(PolicyDefaults):
    name: ClassVar[str] = "message_starts"
    plans_at: ClassVar[str] = "tree"

    def __init__(self, config: MessageStartsConfig):
        self.config = config

    def starts(self, tokens) -> list[int]:
        """Positions where a message starts, after position 0 and before the last token."""
        return [p for p in range(1, len(tokens) - 1) if tokens[p] == self.config.message_start]

    def plan(self, arrival: Arrival) -> Plan:
        starts = self.starts(arrival.tokens)
        held = [p for p in arrival.tree_states if p in starts and p <= arrival.tree_match]
        resume = max(held, default=0)
        steps, cursor = [], resume
        for end in [p for p in starts if p > resume] + [len(arrival.tokens)]:
            steps.append(Read(cursor, end))
            if end < len(arrival.tokens):
                steps.append(Snapshot(end, "message_start"))
            cursor = end
        return Plan(arrival.rid, resume, tuple(steps))

    def release(self, release: Release) -> None:
        return None

    def check(self) -> None:
        return None
