"""HTTP for the soak: every call returns what happened (status, JSON body, error) instead of
raising, so one bad answer becomes a record, not a dead run. The transport is ``eval.http``."""

from __future__ import annotations

import time

from eval import http

Reply = http.Response  # status, body, error, seconds


def request(base: str, path: str, payload: dict | bytes | None = None, timeout: float = 300.0,
            method: str | None = None, headers: dict[str, str] | None = None) -> Reply:
    return http.request(base + path, payload, timeout, method, headers)


def stream_then_disconnect(base: str, path: str, payload: dict, wait: float = 10.0) -> Reply:
    """POST ``payload`` with ``stream: true``, read until the first ``data:`` chunk (the request is
    running), then close the connection: a client that went away mid-request."""
    start = time.monotonic()
    status = None
    try:
        with http.stream_lines(base + path, {**payload, "stream": True}, timeout=wait) as (status, lines):
            for line in lines:
                if line.startswith("data:") or time.monotonic() - start >= wait:
                    break
    except http.NoResponse as exc:
        if exc.timed_out:
            return Reply(status, None, "disconnected (no data before the wait ran out)", time.monotonic() - start)
        return Reply(status, None, f"connection error: {exc}", time.monotonic() - start)
    return Reply(status, None, "disconnected", time.monotonic() - start)


def flush_cache(base: str, deadline_s: float = 60.0, admin_key: str | None = None) -> int | None:
    """``/flush_cache`` (an admin route: with ``admin_key``, else ``$CACHE_POLICY_ADMIN_KEY``) until
    accepted (SGLang answers 400 while requests are in the engine); the number of tries it took,
    or None (never accepted, or refused for the key: 401, 403)."""
    tries = 0
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        tries += 1
        reply = request(base, "/flush_cache", b"", timeout=60, headers=http.admin_headers(admin_key))
        if reply.status in (401, 403):
            return None
        if reply.status == 200:
            return tries
        time.sleep(0.2)
    return None


def wait_idle(base: str, deadline_s: float = 60.0) -> bool:
    """Until ``/v1/loads`` shows no running or waiting request twice in a row (True), or the deadline.
    A server without ``/v1/loads`` counts as idle."""
    end = time.monotonic() + deadline_s
    quiet = 0
    while time.monotonic() < end:
        reply = request(base, "/v1/loads?include=core", timeout=10)
        if reply.status != 200 or not isinstance(reply.body, dict):
            return True
        busy = sum(int(load.get("num_running_reqs", 0)) + int(load.get("num_waiting_reqs", 0))
                   for load in reply.body.get("loads", []))
        quiet = quiet + 1 if busy == 0 else 0
        if quiet >= 2:
            return True
        time.sleep(0.3)
    return False


def context_length(base: str) -> int | None:
    """``max_model_len`` from ``/v1/models`` (SGLang's context length), or None."""
    reply = request(base, "/v1/models", timeout=10)
    try:
        return int(reply.body["data"][0]["max_model_len"])
    except (TypeError, KeyError, IndexError, ValueError):
        return None
