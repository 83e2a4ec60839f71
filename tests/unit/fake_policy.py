"""A test-only policy with one setting of each type the registry can parse from the command line.

Registered by the fixtures in ``test_registry.py`` as ``unit_test_policy``; never registered by
production code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from policy.api import Arrival, Read, Plan, Release


@dataclass(frozen=True)
class FakeConfig:
    piece_tokens: int = 832
    ratio: float = 0.5
    enabled: bool = True
    mode: Literal["fork", "strict", "none"] = "fork"
    label: str = "x"

    def __post_init__(self):
        if self.piece_tokens <= 0 or self.piece_tokens % 64:
            raise ValueError(f"piece_tokens must be a positive multiple of 64, got {self.piece_tokens}")


class FakePolicy:
    name: ClassVar[str] = "unit_test_policy"

    def __init__(self, config: FakeConfig):
        self.config = config

    def plan(self, arrival: Arrival) -> Plan:
        steps = (Read(arrival.tree_hit, len(arrival.tokens)),) if arrival.tree_hit < len(arrival.tokens) else ()
        return Plan(rid=arrival.rid, resume=arrival.tree_hit, steps=steps)

    def release(self, release: Release) -> None:
        return None

    def check(self) -> None:
        return None
