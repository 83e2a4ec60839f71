"""``radix``: stock SGLang prefix caching, run through the same patched path as the other policies.

It is the null policy: reuse exactly what the prefix tree serves and read the rest. With it the
overlay must be inert (same tokens, logprobs and ``cached_tokens`` as unpatched SGLang), which
``tests/engine/test_radix_aa.py`` checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from policy.api import Arrival, Read, Plan, PolicyDefaults, Release


@dataclass(frozen=True)
class RadixConfig:
    """Radix has no settings of its own: SGLang's flags configure it."""


def tree_hit_plan(arrival: Arrival) -> Plan:
    """Reuse what the prefix tree serves, read the rest of the prompt."""
    prompt_len = len(arrival.tokens)
    steps = (Read(arrival.tree_hit, prompt_len),) if arrival.tree_hit < prompt_len else ()
    return Plan(rid=arrival.rid, resume=arrival.tree_hit, steps=steps)


class RadixPolicy(PolicyDefaults):
    name: ClassVar[str] = "radix"

    def __init__(self, config: RadixConfig):
        self.config = config

    def plan(self, arrival: Arrival) -> Plan:
        return tree_hit_plan(arrival)

    def release(self, release: Release) -> None:
        return None

    def check(self) -> None:
        return None
