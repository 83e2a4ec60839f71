"""The events file (``--cache-events FILE``): its records, their reader and their documentation.

Written by ``patches.launch_server`` (the start-up record) and ``serving/event_writer.py`` (one event
per request); read by ``eval/``. One JSON object per line, appended (``patches/jsonl_append.py``).

**Start-up record**: one line per server start, written by the launcher before SGLang starts, so
the last one in a file describes the server that is running. ``read_startups`` returns them;
``read_events`` skips them.

| field       | type  | meaning                                                                |
|-------------|-------|------------------------------------------------------------------------|
| record      | str   | ``"startup"`` (request events have no ``record`` field)                |
| policy      | str   | the ``--cache-policy`` served                                          |
| settings    | dict  | the policy's resolved config (defaults, ``KVREUSE_*``, command line)   |
| versions    | dict  | ``sglang``, ``torch``, ``transformers``, ``overlay`` (this project); null if absent |
| server_args | list  | the argv the launcher handed to SGLang (the policy's and profile's settings added) |
| serving_profile | str/null | the ``--serving-profile`` (``serving/profile.py``); null: written before profiles |
| pid         | int   | the launcher's process id                                              |
| ts          | float | unix time of the start                                                 |

**Request event** (``RequestEvent``): one line when a request leaves the scheduler (finished or
aborted), written by the scheduler of attention-TP rank 0 only.

| field          | type        | meaning                                                              |
|----------------|-------------|----------------------------------------------------------------------|
| schema         | int         | 1                                                                    |
| rid            | str         | request id (the client's ``rid`` when it sent one)                   |
| policy         | str         | cache policy that served it (``radix``, ...)                          |
| prompt_tokens  | int         | prompt length in tokens                                              |
| prefix_reused  | int         | prompt tokens served from the prefix cache (SGLang ``cached_tokens``) |
| moved          | int         | prompt tokens relocated from elsewhere (0 for prefix-only policies)  |
| read           | int         | prompt tokens run through the model = prompt - prefix_reused - moved |
| decode_tokens  | int         | generated tokens                                                     |
| cache_salt     | str / null  | the request's cache namespace (SGLang ``extra_key``; policy/namespace.py) |
| plan_resume    | int / null  | reuse length the policy planned at admission (null if never planned) |
| finish_reason  | str / null  | ``stop``, ``length``, ``abort``, ...                                 |
| queued_ts      | float       | unix time the policy first saw the request                           |
| finished_ts    | float       | unix time it left the scheduler                                      |
| snapshots      | list        | ``[position, kind]`` of each recurrent-state snapshot this read kept  |
|                |             | (``exact``: periodic, prompt_end, junction, *_back, message); [] else |
| pieces         | list        | ``[start, end]`` of each prefill forward this read ran, so the cuts   |
|                |             | it read at (``exact``); [] for policies that do not track forwards    |
| forwards_off_plan | int      | prefill forwards that were not the plan's next piece (must be 0)     |
| blocks         | int         | blocks of rows relocated into the prompt (``scr``; else 0)            |
| fallback       | str / null  | why a policy step fell back to a plain read (``scr``: the step and    |
|                |             | the error, or ``retracted: …``); null when the plan ran as decided     |
| retractions    | int         | times SGLang retracted or preempted the request and read it again     |
| match_cap      | int / null  | the prefix match was capped at this many tokens (a request asking for |
|                |             | prompt logprobs from ``logprob_start_len``); null when not capped      |

Identity, always: ``prompt_tokens == prefix_reused + moved + read``. The counts are raw: ``scr``
writes ``prefix_reused = cached_tokens - 2 * moved`` unclamped, so a wrong rule shows up as a
negative count that the accounting check I1 reports.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Iterator

SCHEMA_VERSION = 1
STARTUP = "startup"  # the ``record`` field of a start-up record


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
    pieces: list = field(default_factory=list)  # [[start, end], ...] of the prefill forwards read (exact)
    blocks: int = 0  # blocks of rows relocated into the prompt (scr; 0 for other policies)
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


def startup_record(policy: str, settings: dict, versions: dict, server_args: list[str], pid: int,
                   ts: float, serving_profile: str | None = None) -> dict:
    """The start-up record of one server start (fields in the module docstring)."""
    return {"record": STARTUP, "policy": policy, "settings": settings, "versions": versions,
            "server_args": list(server_args), "serving_profile": serving_profile, "pid": pid, "ts": ts}


def _rows(path: str) -> Iterator[tuple[int, dict]]:
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield number, json.loads(line)
                except ValueError as exc:
                    raise ValueError(f"{path}:{number}: {exc}") from None


def read_events(path: str) -> Iterator[RequestEvent]:
    """The request events of an events file, in order (start-up records skipped)."""
    for number, row in _rows(path):
        if isinstance(row, dict) and row.get("record") == STARTUP:
            continue
        try:
            yield RequestEvent.from_dict(row)
        except (ValueError, TypeError, AttributeError) as exc:
            raise ValueError(f"{path}:{number}: {exc}") from None


def read_startups(path: str) -> list[dict]:
    """Every start-up record of an events file, in order: the last describes the current server."""
    return [row for _, row in _rows(path) if isinstance(row, dict) and row.get("record") == STARTUP]
