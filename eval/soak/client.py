"""HTTP for the soak: every call returns what happened (status, JSON body, error) instead of
raising, so one bad answer becomes a record, not a dead run. Standard library only."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass


@dataclass
class Reply:
    status: int | None  # HTTP status; None when no status came back (timeout, refused, disconnected)
    body: object = None  # parsed JSON, or the text when it is not JSON
    error: str | None = None  # why there is no status, or the error text of a 4xx/5xx
    seconds: float = 0.0


def request(base: str, path: str, payload: dict | bytes | None = None, timeout: float = 300.0,
            method: str | None = None) -> Reply:
    data = None
    if payload is not None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    req = urllib.request.Request(base + path, data=data, method=method or ("POST" if data is not None else "GET"),
                                 headers={"Content-Type": "application/json"})
    start = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            return Reply(response.status, _decode(response.read()), None, time.monotonic() - start)
    except urllib.error.HTTPError as exc:
        text = exc.read().decode(errors="replace")
        return Reply(exc.code, _decode(text.encode()), text[:500], time.monotonic() - start)
    except (TimeoutError, socket.timeout):
        return Reply(None, None, "client timeout", time.monotonic() - start)
    except (urllib.error.URLError, ConnectionError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return Reply(None, None, f"connection error: {reason}", time.monotonic() - start)


def _decode(raw: bytes):
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return raw.decode(errors="replace")


def stream_then_disconnect(base: str, path: str, payload: dict, wait: float = 10.0) -> Reply:
    """POST ``payload`` with ``stream: true``, read until the first ``data:`` chunk (the request is
    running), then close the socket: a client that went away mid-request."""
    parsed = urllib.parse.urlsplit(base)
    body = json.dumps({**payload, "stream": True}).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {parsed.hostname}:{parsed.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    start = time.monotonic()
    status = None
    try:
        with socket.create_connection((parsed.hostname, parsed.port), timeout=wait) as sock:
            sock.sendall(head + body)
            received = b""
            while b"data:" not in received and time.monotonic() - start < wait:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                received += chunk
                if status is None and b"\r\n" in received:
                    try:
                        status = int(received.split(b"\r\n", 1)[0].split()[1])
                    except (IndexError, ValueError):
                        pass
    except (TimeoutError, socket.timeout):
        return Reply(status, None, "disconnected (no data before the wait ran out)", time.monotonic() - start)
    except OSError as exc:
        return Reply(status, None, f"connection error: {exc}", time.monotonic() - start)
    return Reply(status, None, "disconnected", time.monotonic() - start)


def flush_cache(base: str, deadline_s: float = 60.0) -> int | None:
    """``/flush_cache`` until accepted (SGLang answers 400 while requests are in the engine);
    the number of tries it took, or None."""
    tries = 0
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        tries += 1
        reply = request(base, "/flush_cache", b"", timeout=60)
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
