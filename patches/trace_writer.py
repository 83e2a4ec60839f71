"""``--cache-trace FILE``: a line (``serving/trace_record.py``) per request leaving the scheduler,
from ``release_kv_cache`` of a finished request, any policy or none; requests popped from the
waiting queue on an abort are written from the abort hook (``abort``). Only the events-writing
scheduler writes (``process.is_leader``); the path arrives in ``TRACE_ENV`` from the launcher.
Each line passes the fault point ``trace.write`` (key: the rid; ``policy/faults.py``); a line the
disk refuses is logged and counted by ``serving/jsonl_append.py``, never raised.
"""

from __future__ import annotations

import logging
import os

from patches import process, targets
from patches.request_book import finish_type
from serving.jsonl_append import JsonlAppender
from serving.trace_record import TRACE_ENV, set_trace_env, trace_record  # noqa: F401 - the launcher's

logger = logging.getLogger(__name__)

FAULT_POINT = "trace.write"

_state: dict = {"writer": None}


def trace_line(req, finish_reason: str | None = None) -> dict:
    """The trace line of an SGLang ``Req`` (``finish_reason`` overrides the request's own)."""
    return trace_record(req.rid, req.extra_key, req.origin_input_ids, req.output_ids,
                        finish_reason or finish_type(req.finished_reason))


def _write(req, finish_reason: str | None = None) -> None:
    writer = _state["writer"]
    if writer is None:
        return
    try:
        writer.append(trace_line(req, finish_reason), key=str(req.rid))
    except Exception:  # noqa: BLE001 - a lost trace line must not stop the server
        logger.exception("cache trace: line for rid=%s not written", getattr(req, "rid", None))


def install(register) -> bool:
    """Register the trace hooks when ``TRACE_ENV`` names a file; returns whether it did."""
    path = os.environ.get(TRACE_ENV)
    if not path:
        return False

    def after_scheduler_init(result, scheduler, *args, **kwargs):
        if process.is_leader(scheduler):
            _state["writer"] = JsonlAppender(path, FAULT_POINT)

    def before_release(req, *args, **kwargs):
        if req.finished():  # a retracted request is released too, and read again later
            _write(req)

    def before_abort(scheduler, recv_req, *args, **kwargs):
        from patches.executor import aborted_waiting

        for req in aborted_waiting(scheduler, recv_req):
            _write(req, "abort")

    register(targets.SCHEDULER_INIT, after_scheduler_init, "after")
    register(targets.RELEASE_KV, before_release, "before")
    register(targets.ABORT, before_abort, "before")
    return True
