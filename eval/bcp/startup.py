"""The server's start-up record, checked against what a BCP run was told.

The events file (``--cache-events``) opens with one JSON line per server start:
``{"record": "startup", "policy": ..., "settings": {...}, "versions": {...}, "server_args": ...,
"pid": ..., "ts": ...}`` (read by ``policy.events.read_startups``). The last one describes the
server now running. ``eval.bcp.run`` compares its policy and the settings the run was given
(``--policy-set``) with it, refuses to run on a mismatch, and copies it into the manifest
(``startup``; null for a server from before start-up records).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Iterable


def last_startup(events_path: Path) -> dict | None:
    """The last start-up record of the events file; None when the file or the record is absent."""
    from policy.events import read_startups

    if not Path(events_path).exists():
        return None
    records = read_startups(str(events_path))
    return records[-1] if records else None


def given_settings(policy: str, assignments: Iterable[tuple[str, str]]) -> dict:
    """The ``(KEY, VALUE)`` settings a run was told (``--policy-set``, split by
    ``eval.cli_types.key_value``; a later key wins), typed as the policy's config types them (a bool
    given as ``1`` compares equal to the server's ``true``). Raises ``PolicyError`` for a key or
    value the policy does not accept."""
    from policy import registry

    raw = {key.strip(): value.strip() for key, value in assignments}
    resolved = dataclasses.asdict(registry.resolve_config(policy, raw))
    return {key: resolved[key] for key in raw}


def _plain(value):
    """JSON's view of a value (tuples become lists), so typed and read-back values compare."""
    return json.loads(json.dumps(value))


def startup_mismatches(record: dict, policy: str, settings: dict) -> list[str]:
    """What differs between the start-up record and what the run was told; [] when nothing does."""
    problems = []
    if record.get("policy") != policy:
        problems.append(f"policy: the server runs {record.get('policy')!r}, the run was told {policy!r}")
    served = record.get("settings") or {}
    for key, value in settings.items():
        if key not in served:
            problems.append(f"setting {key}: the server's start-up record has no such setting")
        elif _plain(served[key]) != _plain(value):
            problems.append(f"setting {key}: the server runs {served[key]!r}, the run was told {value!r}")
    return problems
