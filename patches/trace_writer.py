"""Writer of the server trace file (``--cache-trace FILE``): the exact token ids of every request.

The events file says what the cache did; this file says what the model read and wrote, so a run
can be turned into a replayable trace (``eval/traces/record.py`` joins these lines with the
client's rid -> conversation/turn map; the line format is documented there, beside its reader).
One line per request that leaves the scheduler, written at the point the events file is written
(``release_kv_cache`` of a finished request), under every policy and without one. Requests the
scheduler pops from its waiting queue on an abort never reach that point: they are written from
the abort hook, with ``finish_reason`` ``abort``. Only the scheduler that writes events writes
(``patches.plugin.is_leader``), through ``patches.jsonl_append``.

The path travels to the scheduler processes in ``TRACE_ENV``, set by ``patches.launch_server``.
"""

from __future__ import annotations

import logging
import os

from patches.jsonl_append import JsonlAppender

logger = logging.getLogger(__name__)

TRACE_ENV = "CACHE_TRACE_FILE"

_state: dict = {"writer": None}


def set_trace_env(path: str | None) -> None:
    """Launcher side: hand the absolute trace path (or none) to every SGLang process it starts."""
    if path:
        os.environ[TRACE_ENV] = os.path.abspath(path)
    else:
        os.environ.pop(TRACE_ENV, None)


def trace_line(req, finish_reason: str | None = None) -> dict:
    """The trace row of an SGLang ``Req`` (``finish_reason`` overrides the request's own)."""
    from patches.executor import finish_type

    return {
        "rid": req.rid,
        "cache_salt": req.extra_key,
        "prompt_ids": [int(t) for t in req.origin_input_ids],
        "completion_ids": [int(t) for t in req.output_ids],
        "finish_reason": finish_reason or finish_type(req.finished_reason),
    }


class TraceWriter(JsonlAppender):
    def write(self, req, finish_reason: str | None = None) -> None:
        self.append(trace_line(req, finish_reason))


def _write(req, finish_reason: str | None = None) -> None:
    writer = _state["writer"]
    if writer is None:
        return
    try:
        writer.write(req, finish_reason)
    except Exception:  # noqa: BLE001 - a lost trace line must not stop the server
        logger.exception("cache trace: line for rid=%s not written", getattr(req, "rid", None))


def install(register) -> bool:
    """Register the trace hooks when ``TRACE_ENV`` names a file; returns whether it did."""
    path = os.environ.get(TRACE_ENV)
    if not path:
        return False
    from patches import plugin

    def after_scheduler_init(result, scheduler, *args, **kwargs):
        if plugin.is_leader(scheduler):
            _state["writer"] = TraceWriter(path)

    def before_release(req, *args, **kwargs):
        if req.finished():  # a retracted request is released too, and read again later
            _write(req)

    def before_abort(scheduler, recv_req, *args, **kwargs):
        from patches.executor import aborted_waiting

        popped = set(aborted_waiting(scheduler, recv_req))
        for req in scheduler.waiting_queue:
            if req.rid in popped:
                _write(req, "abort")

    register(plugin.SCHEDULER_INIT, after_scheduler_init, "after")
    register(plugin.RELEASE_KV, before_release, "before")
    register(plugin.ABORT, before_abort, "before")
    return True
