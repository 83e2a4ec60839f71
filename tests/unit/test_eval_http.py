"""``eval.http`` against a loopback server: what each style returns or raises, per answer kind."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from eval import http

ROUTES = {  # path -> (status, body bytes)
    "/json": (200, b'{"a": 1}'),
    "/text": (200, b"Cache flushed."),
    "/bad": (400, b'{"error": "no"}'),
    "/boom": (500, b"x" * 1000),
}


class Handler(BaseHTTPRequestHandler):
    seen: list = []
    streams: list = []

    def _answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        Handler.seen.append((self.command, self.path, body, self.headers.get("Content-Type")))
        if self.path == "/slow":
            time.sleep(1.0)
        if self.path == "/stream":  # a long answer; records whether the client stayed to the end
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            try:
                for n in range(100):
                    self.wfile.write(b'data: {"n": %d}\n\n' % n)
                    self.wfile.flush()
                    time.sleep(0.02)
                Handler.streams.append("read to the end")
            except (BrokenPipeError, ConnectionResetError):
                Handler.streams.append("client gone")
            return
        status, payload = ROUTES.get(self.path, (404, b"missing"))
        try:
            self.send_response(status)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):  # /slow: the client gave up first
            pass

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def base():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


@pytest.fixture()
def closed_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("path, payload, status, body, error", [
    ("/json", None, 200, {"a": 1}, None),
    ("/text", b"", 200, "Cache flushed.", None),
    ("/bad", {"x": 1}, 400, {"error": "no"}, '{"error": "no"}'),
    ("/boom", {"x": 1}, 500, "x" * 1000, "x" * http.ERROR_TEXT_CHARS),
])
def test_request_says_what_came_back(base, path, payload, status, body, error):
    answer = http.request(base + path, payload, timeout=5)
    assert (answer.status, answer.body, answer.error) == (status, body, error)
    assert answer.ok == (status == 200) and answer.seconds >= 0


def test_request_method_follows_the_payload(base):
    Handler.seen.clear()
    http.request(base + "/json", None, timeout=5)
    http.request(base + "/json", {"k": 2}, timeout=5)
    http.post(base + "/text", timeout=5)
    assert [(m, body) for m, _, body, _ in Handler.seen] == [("GET", b""), ("POST", b'{"k": 2}'), ("POST", b"")]
    assert Handler.seen[1][3] == "application/json"


def test_request_without_answer_never_raises(base, closed_url):
    refused = http.request(closed_url + "/json", timeout=5)
    assert refused.status is None and refused.error.startswith("connection error: ")
    slow = http.request(base + "/slow", timeout=0.2)
    assert (slow.status, slow.error) == (None, "client timeout")


def test_json_style_raises(base, closed_url):
    assert http.post_json(base + "/json", {"k": 1}, timeout=5) == {"a": 1}
    assert http.get_json(base + "/json", timeout=5) == {"a": 1}
    with pytest.raises(http.HttpError) as caught:
        http.post_json(base + "/bad", {}, timeout=5)
    assert caught.value.status == 400 and str(caught.value) == f'POST {base}/bad -> 400: {{"error": "no"}}'
    assert isinstance(caught.value, RuntimeError)
    with pytest.raises(OSError):  # NoResponse: retry loops that catch OSError keep working
        http.get_json(closed_url + "/json", timeout=5)
    with pytest.raises(http.NoResponse) as slow:
        http.get_json(base + "/slow", timeout=0.2)
    assert slow.value.timed_out


def test_stream_lines_reads_then_closes(base):
    """Leaving the block mid-answer closes the connection: the server sees the client go away."""
    Handler.streams.clear()
    with http.stream_lines(base + "/stream", {"stream": True}, timeout=5) as (status, lines):
        first = next(line for line in lines if line)
    assert status == 200 and json.loads(first.removeprefix("data: ")) == {"n": 0}
    deadline = time.monotonic() + 5
    while not Handler.streams and time.monotonic() < deadline:
        time.sleep(0.05)
    assert Handler.streams == ["client gone"]


def test_wait_until_healthy(base, closed_url):
    assert http.wait_until_healthy(base, timeout=2, path="/json")
    assert not http.wait_until_healthy(closed_url, timeout=0.3, interval=0.1)


def test_admin_headers_from_the_key_or_the_environment(monkeypatch):
    monkeypatch.delenv(http.ADMIN_KEY_ENV, raising=False)
    assert http.admin_headers() == {} and http.admin_headers("") == {}
    assert http.admin_headers("k") == {"Authorization": "Bearer k"}
    monkeypatch.setenv(http.ADMIN_KEY_ENV, "from-env")
    assert http.admin_headers() == {"Authorization": "Bearer from-env"}
    assert http.admin_headers("given") == {"Authorization": "Bearer given"}  # the caller's key wins
