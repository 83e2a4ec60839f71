"""Writer of the events file (``--cache-events FILE``); ``policy/events.py`` documents its records.

Request events come from the scheduler of attention-TP rank 0 only; the start-up record from the
launcher. Both go through ``serving.jsonl_append`` (one ``write`` per line on an ``O_APPEND``
descriptor), so lines from several processes never interleave; a write the disk refuses is
logged and counted there, never raised. Request events pass the fault point ``events.write``
(``policy/faults.py``, key: the rid); the start-up record passes none.

A start-up record written to a file that already has one is a restart: the launcher's log says so
in one INFO line (``RESTART_LINE`` matches it)::

    cache-events <path>: start <n> of this file: a restart, the cache starts cold (previous pid <pid>)

``<n>`` is the record's ``start``, ``<pid>`` the previous start-up record's pid.
"""

from __future__ import annotations

import logging
import os
import re
import time

from policy.events import RequestEvent, next_start, startup_record
from serving.jsonl_append import JsonlAppender
from serving.versions import recorded_versions

logger = logging.getLogger(__name__)

FAULT_POINT = "events.write"
RESTART_LINE = re.compile(r"cache-events (?P<path>.+?): start (?P<start>\d+) of this file: a restart, "
                          r"the cache starts cold \(previous pid (?P<pid>\S+)\)")


class EventWriter(JsonlAppender):
    def __init__(self, path: str, fault_point: str | None = FAULT_POINT):
        super().__init__(path, fault_point)

    def write(self, event: RequestEvent) -> bool:
        """Append the event; True when its whole line reached the file (``JsonlAppender.append``)."""
        return self.append(event.to_dict(), key=str(event.rid))


def write_startup(path: str, record: dict) -> bool:
    """Append one start-up record (``policy.events.startup_record``) to the events file; True when
    it reached the file."""
    writer = JsonlAppender(path)
    try:
        return writer.append(record)
    finally:
        writer.close()


def write_startup_record(events_path: str | None, policy: str, config: dict, sglang_argv: list[str],
                         serving_profile: str | None = None) -> dict | None:
    """The launcher's start: with ``--cache-events``, append this start's record to the file (its
    ``start`` and ``previous`` read from the records already there) and return it; log
    ``RESTART_LINE`` when it is a restart."""
    if events_path is None:
        return None
    start, previous = next_start(events_path)
    record = startup_record(policy, config, recorded_versions(), sglang_argv, os.getpid(), time.time(),
                            serving_profile, start=start, previous=previous)
    write_startup(events_path, record)
    if record["restart"]:
        logger.info("cache-events %s: start %d of this file: a restart, the cache starts cold (previous pid %s)",
                    events_path, start, (previous or {}).get("pid"))
    return record
