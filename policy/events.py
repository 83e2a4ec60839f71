"""The per-request event record shared by the writer (``patches/events.py``, which documents the
file format) and the readers in ``eval/``."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Iterator

SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class RequestEvent:
    rid: str
    policy: str
    prompt_tokens: int
    prefix_reused: int
    moved: int
    read: int
    decode_tokens: int
    cache_salt: str | None
    plan_resume: int | None
    finish_reason: str | None
    queued_ts: float
    finished_ts: float
    snapshots: list = field(default_factory=list)  # [[position, kind], ...] kept by this read
    forwards_off_plan: int = 0  # prefill forwards that were not the plan's next piece
    blocks: int = 0  # blocks of relocated rows spliced into the prompt (scr; 0 for other policies)
    fallback: str | None = None  # why a policy step fell back to a plain read (null when none did)
    retractions: int = 0  # times the request was retracted or preempted and read again
    match_cap: int | None = None  # SGLang capped the prefix match here (logprob_start_len); else null
    schema: int = SCHEMA_VERSION

    def __post_init__(self):
        # Token counts are recorded raw (``prefix_reused`` may even be negative when a policy's
        # accounting rule is wrong): the accounting check I1 is there to catch it, so neither the
        # writer nor the reader may clamp or refuse it. Only the identity is structural.
        if self.prefix_reused + self.moved + self.read != self.prompt_tokens:
            raise ValueError(
                f"{self.rid}: prompt {self.prompt_tokens} != reused {self.prefix_reused} "
                f"+ moved {self.moved} + read {self.read}"
            )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "RequestEvent":
        if data.get("schema") != SCHEMA_VERSION:
            raise ValueError(f"unsupported event schema {data.get('schema')!r}")
        return cls(**data)


def read_events(path: str) -> Iterator[RequestEvent]:
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield RequestEvent.from_dict(json.loads(line))
                except (ValueError, TypeError) as exc:
                    raise ValueError(f"{path}:{number}: {exc}") from None
