"""Why a scheduler refused to start, passed from the scheduler process to the launcher.

A refusal found inside a scheduler (it needs the loaded model, e.g. no text rotary for scr) would
reach SGLang only as a dead scheduler. So the launcher names a file in ``REFUSAL_ENV``, which every
process it starts inherits; a refusing scheduler appends its reason there, and the launcher prints
the reasons and exits with status 2.
"""

from __future__ import annotations

import os
import tempfile

REFUSAL_ENV = "CACHE_POLICY_REFUSAL_FILE"


def open_channel() -> str:
    """Launcher side: create the file and hand its path to every process started from here."""
    handle, path = tempfile.mkstemp(prefix="cache-policy-refusal-", suffix=".txt")
    os.close(handle)
    os.environ[REFUSAL_ENV] = path
    return path


def record(message: str) -> None:
    """Scheduler side: append one reason (nothing when no launcher opened a channel)."""
    path = os.environ.get(REFUSAL_ENV)
    if path:
        with open(path, "a") as f:
            f.write(message + "\n")


def reasons(path: str) -> list[str]:
    """The distinct reasons recorded, sorted; [] when there are none or the file is gone."""
    try:
        with open(path) as f:
            return sorted(set(filter(None, f.read().splitlines())))
    except OSError:
        return []
