"""The one HTTP client of the eval tools (built on httpx): JSON in, JSON (or text) out.

Two styles, because the callers want two things:

* ``request`` / ``post`` / ``get`` never raise: they return a :class:`Response` that says what
  happened (status, body, error, seconds), so a soak or replay records one bad answer and goes on;
* ``post_json`` / ``get_json`` return the parsed body and raise: :class:`HttpError` for a status
  outside 2xx (with the status and the body text), :class:`NoResponse` (an ``OSError``) when no
  status came back (refused, reset, timed out), so ``except OSError`` retry loops keep working.

Every call opens its own connection and closes it after the answer (no keep-alive): a server sees
the same traffic as from one ``curl`` per request. The calls share one ``httpx.Client``, made on
first use and safe across threads, because making a client loads the TLS certificates (about
0.1-0.2 s, more than a whole loopback request). ``stream_lines`` reads a streamed answer line by
line and closes the connection when the caller leaves the block, finished or not.
"""

from __future__ import annotations

import json
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import httpx

DEFAULT_TIMEOUT_S = 300.0
# The admin key of a server started with --admin-api-key, for tools pointed at it by URL
# (eval.soak, eval.bcp.run): the routes the server's route table marks admin need it.
ADMIN_KEY_ENV = "CACHE_POLICY_ADMIN_KEY"
ERROR_TEXT_CHARS = 500  # how much of a 4xx/5xx body goes into Response.error
JSON_HEADERS = {"Content-Type": "application/json"}

Payload = dict | list | bytes | None


@dataclass
class Response:
    """What one request came back with; fields in this order (callers build them positionally)."""

    status: int | None  # HTTP status; None when no status came back (timeout, refused, disconnected)
    body: Any = None  # parsed JSON, or the text when it is not JSON
    error: str | None = None  # why there is no status, or the start of a 4xx/5xx body
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


class HttpError(RuntimeError):
    """The server answered with a status outside 2xx."""

    def __init__(self, method: str, url: str, status: int, text: str):
        super().__init__(f"{method} {url} -> {status}: {text}")
        self.method, self.url, self.status, self.text = method, url, status, text


class NoResponse(OSError):
    """No status came back: connection refused or reset, or the timeout ran out (``timed_out``)."""

    def __init__(self, message: str, timed_out: bool = False):
        super().__init__(message)
        self.timed_out = timed_out


_client: httpx.Client | None = None
_client_lock = threading.Lock()


def _shared_client() -> httpx.Client:
    """The one client, no keep-alive (each request on a fresh connection), no limit on connections."""
    global _client
    with _client_lock:
        if _client is None:
            _client = httpx.Client(limits=httpx.Limits(max_connections=None, max_keepalive_connections=0))
        return _client


def decode(raw: bytes) -> Any:
    """The JSON value in ``raw``, or its text when it is not JSON."""
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return raw.decode(errors="replace")


def _encode(payload: Payload) -> bytes | None:
    if payload is None or isinstance(payload, bytes):
        return payload
    return json.dumps(payload).encode()


def _send(method: str | None, url: str, payload: Payload, timeout: float,
          headers: dict[str, str] | None = None) -> httpx.Response:
    """One request on its own connection; transport failures become :class:`NoResponse`."""
    data = _encode(payload)
    method = method or ("POST" if data is not None else "GET")
    try:
        return _shared_client().request(method, url, content=data, headers={**JSON_HEADERS, **(headers or {})},
                                        timeout=timeout)
    except httpx.TimeoutException as exc:
        raise NoResponse(f"timed out: {exc}", timed_out=True) from None
    except (httpx.RequestError, httpx.InvalidURL, OSError) as exc:
        raise NoResponse(str(exc) or type(exc).__name__) from None


def request(url: str, payload: Payload = None, timeout: float = DEFAULT_TIMEOUT_S,
            method: str | None = None, headers: dict[str, str] | None = None) -> Response:
    """Send ``payload`` (JSON for a dict or list, as is for bytes; POST when there is one, else
    GET) with any extra ``headers`` and say what came back. Never raises for network or HTTP failures."""
    start = time.monotonic()
    try:
        answer = _send(method, url, payload, timeout, headers)
    except NoResponse as exc:
        error = "client timeout" if exc.timed_out else f"connection error: {exc}"
        return Response(None, None, error, time.monotonic() - start)
    seconds = time.monotonic() - start
    if answer.is_success:
        return Response(answer.status_code, decode(answer.content), None, seconds)
    text = answer.content.decode(errors="replace")
    return Response(answer.status_code, decode(answer.content), text[:ERROR_TEXT_CHARS], seconds)


def admin_headers(key: str | None = None) -> dict[str, str]:
    """``Authorization`` for a server's admin routes: ``key``, else ``$CACHE_POLICY_ADMIN_KEY``;
    no header when neither is set (the server then answers 401, or 403 without an admin key)."""
    key = key if key is not None else os.environ.get(ADMIN_KEY_ENV) or None
    return {"Authorization": f"Bearer {key}"} if key else {}


def post(url: str, payload: Payload = b"", timeout: float = DEFAULT_TIMEOUT_S,
         headers: dict[str, str] | None = None) -> Response:
    """:func:`request` with POST (an empty body by default, as ``/flush_cache`` wants)."""
    return request(url, payload, timeout, method="POST", headers=headers)


def get(url: str, timeout: float = DEFAULT_TIMEOUT_S, headers: dict[str, str] | None = None) -> Response:
    return request(url, None, timeout, method="GET", headers=headers)


def _json_or_raise(method: str, url: str, payload: Payload, timeout: float,
                   headers: dict[str, str] | None = None) -> Any:
    answer = _send(method, url, payload, timeout, headers)
    if not answer.is_success:
        raise HttpError(method, url, answer.status_code, answer.content.decode(errors="replace"))
    return json.loads(answer.content)


def post_json(url: str, payload: Payload, timeout: float = DEFAULT_TIMEOUT_S,
              headers: dict[str, str] | None = None) -> Any:
    """POST ``payload`` as JSON and return the JSON answer; raises :class:`HttpError` /
    :class:`NoResponse` (and ``ValueError`` for a 2xx body that is not JSON)."""
    return _json_or_raise("POST", url, payload, timeout, headers)


def get_json(url: str, timeout: float = DEFAULT_TIMEOUT_S, headers: dict[str, str] | None = None) -> Any:
    """GET ``url`` and return the JSON answer; raises like :func:`post_json`."""
    return _json_or_raise("GET", url, None, timeout, headers)


@contextmanager
def stream_lines(url: str, payload: Payload, timeout: float = DEFAULT_TIMEOUT_S) -> Iterator[tuple[int, Iterator[str]]]:
    """POST ``payload`` and yield ``(status, lines)`` while the answer streams; leaving the block
    closes the connection, read to the end or not (a client that goes away mid-request).
    ``timeout`` bounds each network wait, not the whole stream. Raises :class:`NoResponse`."""
    try:
        with _shared_client().stream("POST", url, content=_encode(payload), headers=JSON_HEADERS,
                                     timeout=timeout) as answer:
            yield answer.status_code, answer.iter_lines()
    except httpx.TimeoutException as exc:
        raise NoResponse(f"timed out: {exc}", timed_out=True) from None
    except (httpx.RequestError, httpx.InvalidURL) as exc:
        raise NoResponse(str(exc) or type(exc).__name__) from None


def wait_until_healthy(url: str, timeout: float = 240.0, path: str = "/health", interval: float = 0.5) -> bool:
    """Poll ``GET url+path`` until it answers 2xx (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while True:
        if get(url.rstrip("/") + path, timeout=min(10.0, timeout)).ok:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
