"""One JSON object per line, appended by a server process to a file shared with other processes.

Shared by the per-request files the scheduler writes (``--cache-events``: ``serving/event_writer.py``;
``--cache-trace``: ``patches/trace_writer.py``). Each line goes out in a single ``write`` on an
``O_APPEND`` descriptor, so lines from several scheduler processes (data parallelism) never
interleave, and a reader that polls the file sees whole lines or none.

**A write that fails is logged, not fatal.** The request was served; losing its record must not
stop the server. On a full disk (tmpfs writes what fits, then fails with ``ENOSPC``) or an I/O
error, ``append`` returns False, counts the record in ``lost`` and logs one ERROR line
(``LOST_LINE`` matches it)::

    cache file <path>: record not written (<ERRNO>: <reason>); <n> lost since the last good write, <total> in all

``<ERRNO>`` is the errno name (``ENOSPC``, ``EIO``; ``OSError`` when there is none), ``<reason>``
its text (``No space left on device``; an injected fault adds ``, injected: <what>``), ``<n>`` the
records this writer lost since its last good write, ``<total>`` since it opened the file.

A short write (``os.write`` taking fewer bytes than given) is continued until the line is out.
When a failure leaves part of a line in the file (a *cut line*), the next good write ends it with
a newline first, so it stays a line of its own. That write, the first good one after losses, is
a lost-records marker (``policy.events.LOST``: ``{"record": "lost", "count": n, "error": ...,
"first_ts": ..., "last_ts": ...}``), then the record in a write of its own; the newline and the
marker go in one write, so a reader never sees an ended cut line without the marker that
explains it (``policy.events`` states the reader rule). ``close`` tries once more to write a
marker still owed.

A file that already ends in an unended line when a writer opens it gets the same care: a line
that is JSON is ended with a newline; one that is not (an earlier writer stopped mid-line) is
ended and followed by a marker with ``count`` 1 and ``error`` ``cut``. Other processes appending
to the same file while a line of this one is cut write onto the cut piece: their line is lost
with it, and only this writer's marker follows (a full disk spares no writer).

**Fault injection** (``policy/faults.py``): with ``fault_point`` set, each ``append`` calls
``faults.check(fault_point, key)``; an ``InjectedFault`` acts as a full disk that took the first
half of the record's line: those bytes are written, and the record is lost with ``ENOSPC``.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import threading
import time
from dataclasses import dataclass

from policy import faults
from policy.events import LOST, is_json

logger = logging.getLogger(__name__)

LOST_LINE = re.compile(
    r"cache file (?P<path>.+?): record not written \((?P<error>\w+): (?P<reason>.*)\); "
    r"(?P<since>\d+) lost since the last good write, (?P<total>\d+) in all")
INHERITED_CUT = "cut"  # the ``error`` of a marker for a cut line found at open


class WriteFailed(Exception):
    """A write that did not put all its bytes in the file (``error``: the errno name)."""

    def __init__(self, error: str, reason: str):
        super().__init__(f"{error}: {reason}")
        self.error, self.reason = error, reason


@dataclass
class Losses:
    """Records lost since the last good write: what the next marker says."""

    count: int
    error: str
    first_ts: float
    last_ts: float

    def marker(self) -> dict:
        return {"record": LOST, "count": self.count, "error": self.error, "first_ts": self.first_ts,
                "last_ts": self.last_ts}


def encode(row: dict) -> bytes:
    """``row`` as one line (keys sorted, so equal rows give equal bytes)."""
    return (json.dumps(row, sort_keys=True) + "\n").encode()


def unended_tail(path: str) -> bytes | None:
    """The file's last line when it has no newline yet (None when the file is empty or ends with one)."""
    tail = b""
    try:
        with open(path, "rb") as f:
            position = f.seek(0, os.SEEK_END)
            while position > 0 and b"\n" not in tail:
                step = min(position, 1 << 16)
                position -= step
                f.seek(position)
                tail = f.read(step) + tail
    except OSError:  # not a seekable, readable file (a pipe): nothing to take over
        return None
    last = tail[tail.rfind(b"\n") + 1:]
    return last or None


class JsonlAppender:
    """One process's appends to a JSONL file: whole lines, and a failed write never raised but
    counted (``lost``), logged and marked for readers (module docstring)."""

    def __init__(self, path: str, fault_point: str | None = None):
        self.path = path
        self.fault_point = fault_point
        self.lost = 0  # records this writer could not write, since it opened the file
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()
        self._losses: Losses | None = None  # what the next marker says (an inherited cut included)
        self._since = 0  # this writer's records lost since its last good write (the log line's <n>)
        self._unended = False  # the file ends inside a line: the next write starts with a newline
        self._take_over_tail()

    def _take_over_tail(self) -> None:
        """A file an earlier writer left inside a line: end that line on the first write, with a
        marker when it is a cut one (module docstring)."""
        tail = unended_tail(self.path)
        if tail is None:
            return
        self._unended = True
        if not is_json(tail):
            when = os.path.getmtime(self.path)
            self._losses = Losses(1, INHERITED_CUT, when, when)

    def append(self, row: dict, key: str = "") -> bool:
        """Append ``row`` as one line; True when the whole line reached the file. Never raises
        for a failed write: it is counted, logged (``LOST_LINE``) and marked (module docstring)."""
        line = encode(row)
        with self._lock:
            try:
                self._write_owed_marker()
                self._write_row(line, key)
            except WriteFailed as failure:
                self._note_lost(failure)
                return False
            return True

    def _write_owed_marker(self) -> None:
        if self._losses is not None:
            self._write(encode(self._losses.marker()))
            self._losses, self._since = None, 0

    def _write_row(self, line: bytes, key: str) -> None:
        if self.fault_point is not None:
            try:
                faults.check(self.fault_point, key)
            except faults.InjectedFault as fault:
                self._write(line[: len(line) // 2])
                raise WriteFailed("ENOSPC", f"{os.strerror(errno.ENOSPC)}, injected: {fault}") from None
        self._write(line)

    def _write(self, line: bytes) -> None:
        """Write ``line`` (after the newline an unended file needs), continuing short writes; a
        failure raises ``WriteFailed`` and leaves ``_unended`` true when it cut a line."""
        data = (b"\n" if self._unended else b"") + line
        view, written = memoryview(data), 0
        try:
            while written < len(data):
                count = os.write(self._fd, view[written:])
                if count <= 0:  # no progress and no error: treat as a full disk, never spin
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                written += count
        except OSError as exc:
            if written:
                self._unended = not data[:written].endswith(b"\n")
            name = errno.errorcode.get(exc.errno, "OSError") if exc.errno else "OSError"
            raise WriteFailed(name, exc.strerror or str(exc)) from None
        self._unended = not data.endswith(b"\n")

    def _note_lost(self, failure: WriteFailed) -> None:
        now = time.time()
        if self._losses is None:
            self._losses = Losses(0, failure.error, now, now)
        self._losses.count += 1
        self._losses.error, self._losses.last_ts = failure.error, now
        self._since += 1
        self.lost += 1
        logger.error("cache file %s: record not written (%s: %s); %d lost since the last good write, %d in all",
                     self.path, failure.error, failure.reason, self._since, self.lost)

    def close(self) -> None:
        """Write a marker still owed (if the disk now takes it), then close."""
        with self._lock:
            if self._fd is None:  # closed already: closing twice is harmless
                return
            try:
                self._write_owed_marker()
            except WriteFailed:
                pass
            os.close(self._fd)
            self._fd = None
