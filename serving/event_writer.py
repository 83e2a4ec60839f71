"""Writer of the events file (``--cache-events FILE``); ``policy/events.py`` documents its records.

Request events come from the scheduler of attention-TP rank 0 only; the start-up record from the
launcher. Both go through ``serving.jsonl_append`` (one ``write`` per line on an ``O_APPEND``
descriptor), so lines from several processes never interleave.
"""

from __future__ import annotations

from serving.jsonl_append import JsonlAppender
from policy.events import RequestEvent


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
