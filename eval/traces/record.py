"""Recording a trace of a real run: the server's ``--cache-trace`` lines joined with what the
client knows (which rid was which conversation's which turn).

The server knows the exact token ids but not the agent's structure; the client knows the
structure but not the ids the server read (chat template, tokenizer). ``record_trace`` joins the
two by rid into the trace format of ``eval/traces/format.py``.

Server trace file (written by ``patches/trace_writer.py`` when the server runs with
``--cache-trace FILE``; JSONL, one object per request that left the scheduler, in the order they
left it; several runs may share one file)::

    {"rid": str,                     # the request id (the client's rid when it sent one)
     "cache_salt": str | null,       # SGLang's extra_key: cache_salt and extra_key concatenated
     "prompt_ids": [int, ...],       # origin_input_ids: what the server read (after the chat template)
     "completion_ids": [int, ...],   # output_ids: what it produced
     "finish_reason": str | null}    # "stop", "length", "abort", ...

An aborted request is written too (``finish_reason`` ``abort``; one SGLang aborted before reading
has ``prompt_ids`` ``[0]``); the join ignores abort lines, so a rid the client retried is taken from
its last finished line. A rid of the server file that no client call names (another run, a
warm-up) is dropped.

The file is read under the events file's reader rule (``policy.events``, ``parse_jsonl``): a
line a full disk cut is skipped and named in ``ServerTrace.cut``, the writer's ``lost`` markers
are summed in ``ServerTrace.lost``, any other line that is not JSON is a ``TraceError``. Read while
it grows, a line not yet ended waits for the next poll, and so do the bad lines just before it
(the marker that explains them may come with the rest).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Iterable

from eval.traces.format import TraceCall, TraceError, write_trace
from policy.events import JsonlError, is_json, parse_jsonl

SERVER_FIELDS = ("rid", "cache_salt", "prompt_ids", "completion_ids", "finish_reason")


@dataclass
class ClientCall:
    """What the client knows of one LM call (a tuple ``(rid, conversation, turn, ...)`` works too)."""

    rid: str
    conversation: str
    turn: int
    messages: list | None = None
    kind: str | None = None
    meta: dict = field(default_factory=dict)
    chat_template_kwargs: dict | None = None

    @classmethod
    def of(cls, value) -> "ClientCall":
        if isinstance(value, cls):
            return value
        return cls(**value) if isinstance(value, dict) else cls(*value)


def parse_server_line(text: str, where: str) -> dict:
    """One server trace line, checked; ``where`` (``FILE:LINE``) prefixes every error."""
    try:
        row = json.loads(text)
    except ValueError as exc:
        raise TraceError(f"{where}: not JSON ({exc})") from None
    return check_server_row(row, where)


def check_server_row(row, where: str) -> dict:
    """A decoded server trace line, checked; ``where`` (``FILE:LINE``) prefixes every error."""
    if not isinstance(row, dict) or any(k not in row for k in SERVER_FIELDS):
        raise TraceError(f"{where}: a server trace line has the fields {', '.join(SERVER_FIELDS)}")
    if not isinstance(row["rid"], str):
        raise TraceError(f"{where}: rid must be a string")
    return row


class ServerTrace:
    """The lines of a growing server trace file for a set of rids, read incrementally."""

    def __init__(self, path: str | Path, rids: Iterable[str]):
        self.path = Path(path)
        self.wanted = set(rids)
        self.finished: dict[str, dict] = {}
        self.aborted: set[str] = set()
        self.cut: list[str] = []  # the cut lines skipped (policy.events' messages)
        self.lost = 0  # lines the writer said it lost (its lost markers)
        self._offset = 0
        self._lines = 0

    def poll(self) -> None:
        """Read the lines appended since the last poll (a partial last line, and bad lines just
        before it, wait for the next)."""
        if not self.path.exists():
            return
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        ready = data[: settled(data)]
        try:
            self._consume(ready)
        except JsonlError as exc:
            self._consume(b"".join(ready.splitlines(keepends=True)[: exc.line - self._lines - 1]))
            raise TraceError(f"{exc.where}:{exc.line}: not JSON ({exc.reason})") from None

    def _consume(self, ready: bytes) -> None:
        """Take the lines of ``ready`` (whole lines just after the last ones taken)."""
        read = parse_jsonl(ready, str(self.path), self._lines + 1)
        self._offset += len(ready)
        self._lines += ready.count(b"\n")
        self.cut += read.cut
        self.lost += read.lost
        for number, row in read.rows:
            self._take(check_server_row(row, f"{self.path}:{number}"))

    def _take(self, row: dict) -> None:
        if row["rid"] not in self.wanted:
            return
        if row["finish_reason"] == "abort":
            self.aborted.add(row["rid"])
        else:
            self.finished[row["rid"]] = row

    def missing(self) -> list[str]:
        return sorted(self.wanted - set(self.finished))

    def wait(self, timeout: float, interval: float = 0.2) -> None:
        """Poll until every wanted rid has a finished line or ``timeout`` seconds have passed.

        The scheduler writes a request's line as it leaves, which may be just after the client
        has its answer."""
        deadline = time.monotonic() + timeout
        self.poll()
        while self.missing() and time.monotonic() < deadline:
            time.sleep(interval)
            self.poll()


def settled(data: bytes) -> int:
    """How many bytes of ``data`` (what a poll read) can be read now: up to its last newline, or,
    when a line is still unended, up to the last ended line that is JSON (bad lines before an
    unended one may be cut lines whose marker has not come yet)."""
    end = data.rfind(b"\n") + 1
    if end == len(data):
        return end
    while end:
        start = data.rfind(b"\n", 0, end - 1) + 1
        line = data[start:end]
        if line.strip() and is_json(line):
            return end
        end = start
    return 0


def join(client: list[ClientCall], server: ServerTrace) -> list[TraceCall]:
    """Trace calls in client order; a call without a finished server line is an error naming it."""
    calls = []
    for call in client:
        row = server.finished.get(call.rid)
        if row is None:
            why = "only an aborted line" if call.rid in server.aborted else "no line"
            raise TraceError(f"{server.path}: rid {call.rid} (conversation {call.conversation!r} turn "
                             f"{call.turn}) has {why} in the server trace{_losses(server)}")
        calls.append(TraceCall(
            conversation=call.conversation, turn=call.turn, prompt_ids=list(row["prompt_ids"]),
            completion_ids=list(row["completion_ids"]), cache_salt=row["cache_salt"], messages=call.messages,
            chat_template_kwargs=call.chat_template_kwargs, kind=call.kind,
            meta={**call.meta, "rid": call.rid, "finish_reason": row["finish_reason"]},
        ))
    return calls


def _losses(server: ServerTrace) -> str:
    """What the file says of writes that failed, for an error about a missing line."""
    if not (server.lost or server.cut):
        return ""
    return f" (the file records {server.lost} lost writes and {len(server.cut)} cut lines)"


def check_client(client: list[ClientCall]) -> None:
    """Unique rids; per conversation, turns 0, 1, 2, ... in call order (the trace format's rule)."""
    seen: set[str] = set()
    next_turn: dict[str, int] = {}
    for call in client:
        if call.rid in seen:
            raise TraceError(f"rid {call.rid} is named by two client calls")
        seen.add(call.rid)
        expected = next_turn.get(call.conversation, 0)
        if call.turn != expected:
            raise TraceError(f"rid {call.rid}: conversation {call.conversation!r} turn {call.turn}, "
                             f"expected {expected}")
        next_turn[call.conversation] = expected + 1


def record_trace(server_trace: str | Path, calls: Iterable, out: str | Path | IO[str],
                 timeout: float = 30.0) -> list[TraceCall]:
    """Join the server trace file with the client's ``calls`` (``ClientCall``s or tuples
    ``(rid, conversation, turn[, messages, kind, meta])``) and write the trace to ``out``.

    Waits up to ``timeout`` seconds for lines the server has not written yet; raises
    ``TraceError`` naming the first rid still without a finished line. Returns the trace calls.
    """
    client = [ClientCall.of(c) for c in calls]
    check_client(client)
    server = ServerTrace(server_trace, (c.rid for c in client))
    server.wait(timeout)
    trace = join(client, server)
    write_trace(trace, out)
    return trace
