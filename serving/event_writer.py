"""Writer of the events file (``--cache-events FILE``); ``policy/events.py`` documents its records.

Request events come from the scheduler of attention-TP rank 0 only; the start-up record from the
launcher. Both go through ``serving.jsonl_append`` (one ``write`` per line on an ``O_APPEND``
descriptor), so lines from several processes never interleave.
"""

from __future__ import annotations

import os
import time

from policy.events import RequestEvent, startup_record
from serving.jsonl_append import JsonlAppender
from serving.versions import recorded_versions


class EventWriter(JsonlAppender):
    def write(self, event: RequestEvent) -> None:
        self.append(event.to_dict())


def write_startup(path: str, record: dict) -> None:
    """Append one start-up record (``policy.events.startup_record``) to the events file."""
    writer = JsonlAppender(path)
    try:
        writer.append(record)
    finally:
        writer.close()


def write_startup_record(events_path: str | None, policy: str, config: dict, sglang_argv: list[str],
                         serving_profile: str | None = None) -> None:
    """The launcher's start: with ``--cache-events``, append this start's record to the file."""
    if events_path is not None:
        record = startup_record(policy, config, recorded_versions(), sglang_argv, os.getpid(), time.time(),
                                serving_profile)
        write_startup(events_path, record)
