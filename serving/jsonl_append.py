"""One JSON object per line, appended by a server process to a file shared with other processes.

Shared by the per-request files the scheduler writes (``--cache-events``: ``serving/event_writer.py``;
``--cache-trace``: ``patches/trace_writer.py``). Each line goes out in a single ``write`` on an
``O_APPEND`` descriptor, so lines from several scheduler processes (data parallelism) never
interleave, and a reader that polls the file sees whole lines or none.
"""

from __future__ import annotations

import json
import os
import threading


class JsonlAppender:
    def __init__(self, path: str):
        self.path = path
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()

    def append(self, row: dict) -> None:
        """Append ``row`` as one line (keys sorted, so equal rows give equal bytes)."""
        line = (json.dumps(row, sort_keys=True) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)

    def close(self) -> None:
        os.close(self._fd)
