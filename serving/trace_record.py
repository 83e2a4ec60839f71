"""The server trace line (``--cache-trace FILE``): the exact token ids of one request.

The events file says what the cache did; the trace says what the model read and wrote, so a run
can be turned into a replayable trace (``eval/traces/record.py`` joins these lines with the
client's rid -> conversation/turn map; the line format is documented there, beside its reader).
``patches/trace_writer.py`` writes one line per request that leaves the scheduler, to the file
the launcher names in ``TRACE_ENV``.
"""

from __future__ import annotations

import os
from typing import Iterable

TRACE_ENV = "CACHE_TRACE_FILE"


def set_trace_env(path: str | None) -> None:
    """Launcher side: hand the absolute trace path (or none) to every SGLang process it starts."""
    if path:
        os.environ[TRACE_ENV] = os.path.abspath(path)
    else:
        os.environ.pop(TRACE_ENV, None)


def trace_record(rid: str, cache_salt: str | None, prompt_ids: Iterable[int], completion_ids: Iterable[int],
                 finish_reason: str | None) -> dict:
    """One trace line as a dict. The ids are copied into plain ints: SGLang holds them in
    arrays and lists of numpy or Python ints, and the line must be JSON."""
    return {
        "rid": rid,
        "cache_salt": cache_salt,
        "prompt_ids": [int(t) for t in prompt_ids],
        "completion_ids": [int(t) for t in completion_ids],
        "finish_reason": finish_reason,
    }
