"""Agent-like token-id conversations for the soak (pure: a seeded ``random.Random`` in, lists out).

A conversation is a first prompt and then turns, each built from the previous prompt (and the
answer the server gave to it, when there is one) by one edit kind:

| kind            | next prompt                                                                 |
|-----------------|-----------------------------------------------------------------------------|
| ``append``      | previous prompt + answer + new text (a tool result)                          |
| ``delete_middle`` | previous prompt + answer with a span at or after ``keep`` removed, + new text |
| ``replace_tail``  | previous prompt's first ``k >= keep`` tokens + a new tail                  |
| ``repeat``      | the previous prompt again                                                    |

``keep`` (1024) is what ``scr`` needs to match a conversation's session by content (a common
prefix of >= 1024 tokens): every edit of a prompt longer than ``keep`` keeps its first ``keep``
tokens, and so does the cut that holds a prompt under ``max_prompt``. New text is drawn from the
id range ``[low, high)`` (10..399 on the tiny model, as ``tests/engine/prompts.py``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from policy.tokens import common_prefix_len as common_prefix  # noqa: F401  (tests/unit/test_soak.py)

EDIT_KINDS = ("append", "delete_middle", "replace_tail", "repeat")


@dataclass(frozen=True)
class ConversationConfig:
    min_prompt: int = 300
    max_prompt: int = 2500
    keep: int = 1024  # leading tokens every edit of a long prompt keeps (scr's session match)
    short_share: float = 0.2  # share of conversations whose first prompt is shorter than keep
    min_turns: int = 3
    max_turns: int = 8
    low: int = 10  # new tokens are drawn from [low, high)
    high: int = 400
    weights: tuple[float, ...] = (0.4, 0.3, 0.15, 0.15)  # EDIT_KINDS order

    def __post_init__(self):
        if not 1 <= self.min_prompt <= self.max_prompt:
            raise ValueError(f"need 1 <= min_prompt ({self.min_prompt}) <= max_prompt ({self.max_prompt})")
        if self.keep + 64 > self.max_prompt:
            raise ValueError(f"max_prompt ({self.max_prompt}) must exceed keep ({self.keep}) by at least 64")
        if not 0 <= self.short_share <= 1:
            raise ValueError(f"short_share {self.short_share} must be in [0, 1]")
        if not 1 <= self.min_turns <= self.max_turns:
            raise ValueError(f"need 1 <= min_turns ({self.min_turns}) <= max_turns ({self.max_turns})")
        if not 0 <= self.low < self.high:
            raise ValueError(f"need 0 <= low ({self.low}) < high ({self.high})")
        if len(self.weights) != len(EDIT_KINDS) or min(self.weights) < 0 or sum(self.weights) <= 0:
            raise ValueError(f"weights must be {len(EDIT_KINDS)} non-negative numbers, not all 0")


def random_ids(rng: random.Random, n: int, low: int = 10, high: int = 400) -> list[int]:
    return [rng.randrange(low, high) for _ in range(n)]


def first_prompt(rng: random.Random, cfg: ConversationConfig) -> list[int]:
    """Most first prompts are longer than ``keep`` (+ 64); ``short_share`` of them are shorter."""
    long_from = min(cfg.keep + 64, cfg.max_prompt)
    if cfg.min_prompt < long_from and rng.random() < cfg.short_share:
        length = rng.randint(cfg.min_prompt, long_from - 1)
    else:
        length = rng.randint(max(cfg.min_prompt, long_from), cfg.max_prompt)
    return random_ids(rng, length, cfg.low, cfg.high)


def choose_edit(rng: random.Random, cfg: ConversationConfig) -> str:
    return rng.choices(EDIT_KINDS, weights=cfg.weights)[0]


def _floor(length: int, keep: int) -> int:
    """First position an edit may touch: ``keep`` for a long prompt, a quarter of a short one."""
    return keep if length > keep + 32 else length // 4


def fit(prompt: list[int], cfg: ConversationConfig, rng: random.Random) -> list[int]:
    """``prompt`` cut to ``max_prompt`` by removing a span that starts at ``keep`` (or later)."""
    excess = len(prompt) - cfg.max_prompt
    if excess <= 0:
        return prompt
    start = rng.randint(cfg.keep, cfg.max_prompt - 1) if cfg.max_prompt - 1 > cfg.keep else cfg.keep
    start = min(start, len(prompt) - excess)
    return prompt[:start] + prompt[start + excess:]


def apply_edit(kind: str, prompt: list[int], answer: list[int], rng: random.Random,
               cfg: ConversationConfig) -> list[int]:
    """The next prompt after ``prompt`` (answered with ``answer``, possibly empty) under edit ``kind``."""
    if kind == "repeat":
        return list(prompt)
    history = list(prompt) + list(answer)
    if kind == "append":
        return fit(history + random_ids(rng, rng.randint(16, 200), cfg.low, cfg.high), cfg, rng)
    if kind == "delete_middle":
        floor = _floor(len(history), cfg.keep)
        room = len(history) - floor - 16  # leave the last 16 tokens as the "suffix" that survives
        if room < 8:
            return fit(history + random_ids(rng, rng.randint(16, 64), cfg.low, cfg.high), cfg, rng)
        span = rng.randint(min(8, room), max(8, min(room, 400)))
        start = rng.randint(floor, floor + room - span)
        kept = history[:start] + history[start + span:]
        return fit(kept + random_ids(rng, rng.randint(8, 64), cfg.low, cfg.high), cfg, rng)
    if kind == "replace_tail":
        floor = max(_floor(len(prompt), cfg.keep), 1)
        if len(prompt) - 16 <= floor:
            cut = floor
        else:
            cut = rng.randint(max(floor, len(prompt) // 2), len(prompt) - 16)
        tail = random_ids(rng, rng.randint(16, 300), cfg.low, cfg.high)
        return fit(list(prompt[:cut]) + tail, cfg, rng)
    raise ValueError(f"unknown edit kind {kind!r} (one of {', '.join(EDIT_KINDS)})")


@dataclass
class Conversation:
    """One conversation's prompts, built turn by turn from the answers the server gave."""

    index: int
    tenant: int
    rng: random.Random
    cfg: ConversationConfig
    turns: int = 0  # total turns it will have
    turn: int = 0  # turns built so far
    prompt: list[int] = field(default_factory=list)
    edits: list[str] = field(default_factory=list)

    @classmethod
    def start(cls, seed: int, index: int, tenant: int, cfg: ConversationConfig) -> "Conversation":
        rng = random.Random(f"soak:{seed}:conversation:{index}")
        conv = cls(index=index, tenant=tenant, rng=rng, cfg=cfg)
        conv.turns = rng.randint(cfg.min_turns, cfg.max_turns)
        return conv

    @property
    def done(self) -> bool:
        return self.turn >= self.turns

    def next_prompt(self, answer: list[int] | None = None) -> tuple[str, list[int]]:
        """(edit kind, prompt) of the next turn; ``answer`` = the server's reply to the last one."""
        if self.turn == 0:
            kind, self.prompt = "first", first_prompt(self.rng, self.cfg)
        else:
            kind = choose_edit(self.rng, self.cfg)
            self.prompt = apply_edit(kind, self.prompt, answer or [], self.rng, self.cfg)
        self.turn += 1
        self.edits.append(kind)
        return kind, list(self.prompt)
