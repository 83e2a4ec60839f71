"""The events file (``--cache-events FILE``): its records, their reader and their documentation.

Written by ``patches.launch_server`` (the start-up record) and ``serving/event_writer.py`` (one event
per request); read by ``eval/``. One JSON object per line, appended (``serving/jsonl_append.py``).

**Start-up record**: one line per server start, written by the launcher before SGLang starts, so
the last one in a file describes the server that is running. ``read_startups`` returns them;
``read_events`` skips them. Nothing of a cache survives its process, so every start begins with an
empty cache; the record says so, and says whether an earlier server wrote to this file, so that a
report can split the run at a restart instead of averaging a warm cache with a cold one.

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
| start       | int   | 1 for the file's first start-up record, n for its n-th (absent in older |
|             |       | files: read it as the record's position, ``start_of``)                 |
| restart     | bool  | ``start > 1``: an earlier server wrote to this file, and its cache is gone |
| cache       | str   | ``"cold"``: every start begins with an empty cache (nothing persists across processes) |
| previous    | dict/null | ``{"pid", "ts"}`` of the file's previous start-up record; null for the first |

**Lost-records marker** (``LOST``): written by a writer (``serving/jsonl_append.py``) on its first
good write after one or more records it could not write (a full disk, an I/O error), just before
that write's own record. Readers count it and leave it out of the rows.

| field    | type  | meaning                                                                    |
|----------|-------|----------------------------------------------------------------------------|
| record   | str   | ``"lost"``                                                                 |
| count    | int   | records this writer lost since its last good write (``cut``: 1, the cut line, a lower bound) |
| error    | str   | the errno name of the last failed write (``ENOSPC``, ``EIO``), or ``cut``: |
|          |       | the file ended in a cut line when this writer opened it (an earlier writer stopped mid-line) |
| first_ts | float | unix time of the first of those failures                                   |
| last_ts  | float | unix time of the last                                                      |

**The reader rule** (``read_jsonl``, and through it every reader here). A failed write may leave
part of a line in the file: a *cut line*. A line that is not JSON is skipped, and named in
``JsonlRead.cut`` (``PATH:LINE: a cut line (N bytes) skipped``), when

* it is the file's last line and has no trailing newline (a crash, or a write still failing, cut
  it), or it is followed by cut lines only, up to such a last line (the writer kept failing), or
* the next record after it (blank lines and further cut lines aside) is a ``lost`` marker (the
  writer ended the cut line with a newline on its next good write and said what it lost) or a
  start-up record (the server that wrote it stopped before it could say so, and a new one started
  on the file: a crash; so a damaged file never stops a restart).

Any other line that is not JSON raises ``JsonlError`` (a ``ValueError``) naming ``PATH:LINE``:
corruption is never skipped in silence.

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
import os
from dataclasses import dataclass, field
from typing import Iterable, Iterator

SCHEMA_VERSION = 1
STARTUP = "startup"  # the ``record`` field of a start-up record
LOST = "lost"  # the ``record`` field of a lost-records marker
COLD = "cold"  # the ``cache`` field of every start-up record


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
                   ts: float, serving_profile: str | None = None, *, start: int = 1,
                   previous: dict | None = None) -> dict:
    """The start-up record of one server start (fields in the module docstring); ``start`` and
    ``previous`` come from the file's earlier records (``next_start``)."""
    return {"record": STARTUP, "policy": policy, "settings": settings, "versions": versions,
            "server_args": list(server_args), "serving_profile": serving_profile, "pid": pid, "ts": ts,
            "start": start, "restart": start > 1, "cache": COLD, "previous": previous}


def start_of(record: dict, position: int) -> int:
    """A start-up record's ``start``; a record from before the field is read as its position
    (1 for the file's first start-up record)."""
    return record.get("start", position)


class JsonlError(ValueError):
    """A line no writer could have left behind (not JSON, and not a cut line): ``PATH:LINE: why``."""

    def __init__(self, where: str, line: int, reason: str):
        super().__init__(f"{where}:{line}: {reason}")
        self.where, self.line, self.reason = where, line, reason


@dataclass(frozen=True)
class JsonlRead:
    """A JSONL file as the reader rule reads it (module docstring)."""

    rows: list[tuple[int, dict]]  # (line number, object), lost markers left out
    cut: list[str]  # one message per cut line skipped
    lost: int  # records the writers said they lost (the sum of the lost markers' counts)


def is_lost_marker(row) -> bool:
    return isinstance(row, dict) and row.get("record") == LOST


def _decode(raw: bytes):
    """(object, None), or (None, the reason) for a line that is not JSON."""
    try:
        return json.loads(raw), None
    except ValueError as exc:  # JSONDecodeError, and UnicodeDecodeError for a line cut mid-character
        return None, str(exc)


def is_json(line: bytes) -> bool:
    """Whether ``line`` is a whole JSON value (a writer's tail, a growing file's last line)."""
    return _decode(line)[1] is None


def _cut_message(where: str, line: int, raw: bytes) -> str:
    size = len(raw.rstrip(b"\n"))
    return f"{where}:{line}: a cut line ({size} bytes) skipped"


def _entries(lines: Iterable[tuple[int, bytes]], where: str) -> Iterator[tuple[int, object, str | None]]:
    """``(line, object, None)`` per record, lost markers included, and ``(line, None, message)`` per
    cut line, in file order, lazily (one group of bad lines held back at a time).

    Bad lines are held as a group until the next record decides them: a lost marker after them
    (the writer explains them), a start-up record (the server that wrote them stopped, and a new
    one started: a crash) or the end of the file inside an unterminated line makes them cut
    lines; anything else is corruption, raised at the group's first line."""
    group: list[tuple[int, bytes, str]] = []
    for number, raw in lines:
        if not raw.strip():
            continue
        row, reason = _decode(raw)
        if reason is not None:
            group.append((number, raw, reason))
            continue
        if group:
            yield from _settle(group, where, is_lost_marker(row) or is_startup(row))
            group = []
        yield number, row, None
    if group:
        yield from _settle(group, where, not group[-1][1].endswith(b"\n"))


def _settle(group: list[tuple[int, bytes, str]], where: str, cut: bool) -> Iterator[tuple[int, None, str]]:
    if not cut:
        number, _, reason = group[0]
        raise JsonlError(where, number, reason)
    for number, raw, _ in group:
        yield number, None, _cut_message(where, number, raw)


def _file_lines(path: str) -> Iterator[tuple[int, bytes]]:
    with open(path, "rb") as f:
        yield from enumerate(f, 1)


def _collect(entries: Iterable[tuple[int, object, str | None]]) -> JsonlRead:
    rows, cut, lost = [], [], 0
    for number, row, message in entries:
        if message is not None:
            cut.append(message)
        elif is_lost_marker(row):
            lost += int(row.get("count") or 0)
        else:
            rows.append((number, row))
    return JsonlRead(rows=rows, cut=cut, lost=lost)


def read_jsonl(path: str) -> JsonlRead:
    """Every record of a JSONL file written by ``serving/jsonl_append.py``, under the reader rule
    (module docstring); raises ``JsonlError`` for a bad line that is not a cut line."""
    return _collect(_entries(_file_lines(path), path))


def parse_jsonl(data: bytes, where: str, first_line: int = 1) -> JsonlRead:
    """``read_jsonl`` of bytes already read (a growing file, read piece by piece: ``first_line``
    is the number of the first line of ``data``; ``where`` names the file in messages)."""
    return _collect(_entries(enumerate(data.splitlines(keepends=True), first_line), where))


def events_file_health(path: str) -> dict:
    """What a report says of an events file's writes: ``{"cut": [messages], "lost": n}``."""
    read = read_jsonl(path)
    return {"cut": read.cut, "lost": read.lost}


def event_of(path: str, number: int, row) -> RequestEvent:
    """The request event of one row; a ``ValueError`` naming ``path:number`` if it is not one."""
    try:
        return RequestEvent.from_dict(row)
    except (ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path}:{number}: {exc}") from None


def _records(path: str) -> Iterator[tuple[int, object]]:
    """(line, object) of every record, lazily: lost markers and cut lines left out."""
    for number, row, message in _entries(_file_lines(path), path):
        if message is None and not is_lost_marker(row):
            yield number, row


def is_startup(row) -> bool:
    return isinstance(row, dict) and row.get("record") == STARTUP


def read_events(path: str) -> Iterator[RequestEvent]:
    """The request events of an events file, in order (start-up records, lost markers and cut
    lines skipped)."""
    for number, row in _records(path):
        if not is_startup(row):
            yield event_of(path, number, row)


def read_startups(path: str) -> list[dict]:
    """Every start-up record of an events file, in order: the last describes the current server."""
    return [row for _, row in _records(path) if is_startup(row)]


def next_start(path: str) -> tuple[int, dict | None]:
    """``start`` and ``previous`` for a start-up record about to be appended to ``path``: 1 and
    None for a missing file or one without start-up records."""
    if not os.path.exists(path):
        return 1, None
    startups = [row for _, row in read_jsonl(path).rows if is_startup(row)]
    if not startups:
        return 1, None
    last = startups[-1]
    return start_of(last, len(startups)) + 1, {"pid": last.get("pid"), "ts": last.get("ts")}
