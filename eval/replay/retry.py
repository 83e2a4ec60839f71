"""Retrying a replay's forced calls when (and only when) a retry is safe.

Used by ``eval.replay --router`` (a worker behind the router may die) and by ``eval.chaos``.

A call is retried when its server is gone, not when it answered:

* **no answer at all** (connection refused or reset, the socket closed mid-call: ``status`` None),
  **502 / 503** (the router could not reach a worker, or has none left for the key), or the
  router's **500 with code ``call_upstream_request_error``** (sglang-router 0.3.2's answer when the
  worker it sent the call to died with the call on the wire: measured, a SIGKILLed worker);
* never on 4xx (the request is wrong, a retry repeats it), on any other 500 (the server failed it:
  a real failure to report), or on a timeout: the client's own, or the router's 504 (the first
  attempt may still be running: a retry would be a second copy of the call in the same server).
  ``eval.cluster`` starts the router with a request timeout (7,200 s) above the replay's
  (3,600 s), so the router does not give up on a worker that is still reading a long call.

Why such a retry is safe: the call is forced decoding (its output ids are the trace's, whoever
serves it), and what a served call leaves behind on the server is cache contents (advisory: every
policy checks what it reuses) and one events line. The line is the one thing a retry can double:
a worker killed after it wrote a call's event but before the answer reached the client. When the
worker is restarted on the same events file (``eval.chaos`` does), that line sits in a start that
a restart ended, and ``eval.report ingest`` keeps the later copy and lists the earlier one
(``retried_after_restart``); a worker that stays dead leaves its copy in its file's last start,
and ingest then fails on the rid served twice, naming both files: the run says what happened.

``RetryingSend.retried()`` has the errors of every retried call's failed attempts.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from eval.soak import client

Send = Callable[[str, dict], client.Reply]

RETRY_STATUSES = frozenset({502, 503})
ROUTER_UPSTREAM_ERROR = "call_upstream_request_error"  # sglang-router: the worker went away mid-call
RETRY_FOR_S = 300.0  # how long a call keeps retrying (a worker restart plus the router's health check)
BACKOFF_S = (0.5, 1.0, 2.0, 4.0)


class ServerError(RuntimeError):
    """The server refused or failed a call (exit status 1); also: no server answered a retried call."""


def retryable(reply: client.Reply) -> bool:
    """The server is gone (no answer) or the router found no worker: retry. Everything else is final."""
    if reply.status is None:
        return not (reply.error or "").startswith("client timeout")
    if reply.status == 500:
        return ROUTER_UPSTREAM_ERROR in str(reply.body if reply.body is not None else reply.error)
    return reply.status in RETRY_STATUSES


class RetryingSend:
    """``send(path, payload)`` that retries a gone server's calls; tracks what is in flight."""

    def __init__(self, send: Send, retry_for_s: float = RETRY_FOR_S, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.send, self.retry_for_s, self.clock, self.sleep = send, retry_for_s, clock, sleep
        self.lock = threading.Lock()
        self.in_flight: dict[str, float] = {}  # rid -> when its current attempt was sent
        self.attempts: dict[str, list[str]] = {}  # rid -> the errors of the attempts that were retried
        self.sent_at: dict[str, float] = {}  # rid -> unix time, for the calls a scenario wants timed

    def __call__(self, path: str, payload: dict) -> client.Reply:
        rid = payload.get("rid", "")
        deadline = self.clock() + self.retry_for_s
        errors: list[str] = []
        for attempt in range(10_000):
            with self.lock:
                self.in_flight[rid] = self.clock()
            try:
                reply = self.send(path, payload)
            finally:
                with self.lock:
                    self.in_flight.pop(rid, None)
            if not retryable(reply):
                with self.lock:
                    self.attempts[rid] = errors
                return reply
            errors.append(f"{reply.status}: {(reply.error or str(reply.body))[:120]}")
            if self.clock() > deadline:
                break
            self.sleep(BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)])
        with self.lock:
            self.attempts[rid] = errors
        raise ServerError(f"{rid}: no server answered in {self.retry_for_s:.0f} s ({len(errors)} attempts; "
                          f"last: {errors[-1] if errors else '-'})")

    def flying(self) -> list[str]:
        with self.lock:
            return list(self.in_flight)

    def retried(self) -> dict[str, list[str]]:
        """rid -> the errors of its retried attempts, for the calls that needed a retry."""
        with self.lock:
            return {rid: errors for rid, errors in self.attempts.items() if errors}
