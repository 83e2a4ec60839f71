"""Request bodies read within ``--max-request-body`` and parsed with a depth limit
(``patches/request_bodies.py``), on a FastAPI app shaped like SGLang's: a dataclass body on
``/generate``, a model body on ``/v1/chat/completions``, SGLang's HTTPException handler (the OpenAI
error shape), and an unbounded route beside them."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient
from pydantic import BaseModel

from patches import request_bodies
from serving.request_limits import KIB, LIMITS_ENV, RequestLimits

pytestmark = pytest.mark.integration
LIMIT = 4 * KIB


@dataclass
class Generate:
    input_ids: list | None = None
    text: str | None = None


class Chat(BaseModel):
    messages: list


def make_app() -> FastAPI:
    app = FastAPI()

    @app.exception_handler(HTTPException)
    async def sglang_like(request: Request, exc: HTTPException):
        return JSONResponse({"object": "error", "message": exc.detail, "code": exc.status_code}, exc.status_code)

    @app.post("/generate")
    async def generate(obj: Generate):
        return {"prompt": len(obj.input_ids or obj.text or "")}

    @app.post("/v1/chat/completions")
    async def chat(request: Chat):
        return {"messages": len(request.messages)}

    @app.post("/v1/completions")
    async def completions(body: dict):
        return {"keys": len(body)}

    @app.post("/unbounded")
    async def unbounded(body: dict):
        return {"keys": len(body)}

    return app


@pytest.fixture
def client(monkeypatch):
    monkeypatch.setenv(LIMITS_ENV, RequestLimits(max_body_bytes=LIMIT).to_json())
    original = Request.json

    async def json_with_hook(self):
        return await request_bodies.around_request_json(original, self)

    monkeypatch.setattr(Request, "json", json_with_hook)  # what the plugin's hook registry does
    app = make_app()
    assert sorted(request_bodies.bound_bodies(app)) == sorted(request_bodies.GENERATING_ROUTES)
    assert request_bodies.bound_bodies(app) == []  # wrapping twice wraps nothing more
    return TestClient(app)


def post(client, path, body: bytes, **headers):
    return client.post(path, content=body, headers={"Content-Type": "application/json", **headers})


def test_a_body_within_the_limit_is_served(client):
    body = json.dumps({"input_ids": list(range(500))}).encode()
    assert len(body) <= LIMIT
    reply = post(client, "/generate", body)
    assert reply.status_code == 200 and reply.json() == {"prompt": 500}


@pytest.mark.parametrize("path", request_bodies.GENERATING_ROUTES)
def test_a_declared_body_over_the_limit_is_a_400_naming_the_flag(client, path):
    body = json.dumps({"text": "x" * LIMIT, "messages": []}).encode()
    reply = post(client, path, body)
    assert reply.status_code == 400
    assert reply.json()["message"] == (f"body: {len(body)} bytes, over the limit of {LIMIT} bytes "
                                       "(--max-request-body 4K)")


def test_a_chunked_body_over_the_limit_is_refused_as_it_arrives(client):
    def chunks():
        for _ in range(100):
            yield b"[" * KIB

    reply = client.post("/generate", content=chunks(), headers={"Content-Type": "application/json"})
    assert reply.status_code == 400
    assert reply.json()["message"] == (f"body: more than {LIMIT} bytes, over the limit of {LIMIT} bytes "
                                       "(--max-request-body 4K)")


class Transport:
    """The ASGI receive side of one request: ``chunks`` body messages of 1 KiB."""

    def __init__(self, chunks: int):
        self.left, self.taken = chunks, 0

    async def receive(self):
        self.taken += 1
        self.left -= 1
        return {"type": "http.request", "body": b"x" * KIB, "more_body": self.left > 0}


async def reads_the_body(scope, receive, send):
    while (await receive()).get("more_body"):
        pass


@pytest.mark.parametrize("chunks, declared, taken", [
    (100, None, 4 * 4 + 1),  # counted as it arrives: past the limit, then dropped up to 4 x the limit
    (100, 100 * KIB, 0),  # declared far over: refused before reading anything (the connection closes)
    (12, 12 * KIB, 12),  # declared within 4 x the limit: read and dropped, so the client reads the 400
    (12, None, 12),
])
def test_the_rest_of_a_refused_body_is_read_up_to_four_times_the_limit(monkeypatch, chunks, declared, taken):
    import asyncio

    monkeypatch.setenv(LIMITS_ENV, RequestLimits(max_body_bytes=LIMIT).to_json())
    transport = Transport(chunks)
    headers = [] if declared is None else [(b"content-length", str(declared).encode())]
    with pytest.raises(HTTPException) as info:
        asyncio.run(request_bodies.BoundedBody(reads_the_body)({"type": "http", "headers": headers},
                                                               transport.receive, None))
    assert info.value.status_code == 400 and info.value.detail.startswith("body: ")
    assert transport.taken == taken


def test_a_body_within_the_limit_reaches_the_app_whole(monkeypatch):
    import asyncio

    monkeypatch.setenv(LIMITS_ENV, RequestLimits(max_body_bytes=LIMIT).to_json())
    transport = Transport(4)
    asyncio.run(request_bodies.BoundedBody(reads_the_body)({"type": "http", "headers": [(b"content-length", b"4096")]},
                                                           transport.receive, None))
    assert transport.taken == 4


def test_an_unlisted_route_reads_any_size(client):
    reply = post(client, "/unbounded", json.dumps({"a": "x" * (10 * LIMIT)}).encode())
    assert reply.status_code == 200


@pytest.mark.parametrize("path", ["/generate", "/v1/chat/completions", "/unbounded"])
def test_a_body_nested_past_the_parser_is_a_400_saying_so(client, monkeypatch, path):
    """FastAPI answered "There was an error parsing the body" (the RecursionError hidden)."""
    monkeypatch.setenv(LIMITS_ENV, RequestLimits(max_body_bytes=1 << 20).to_json())
    deep = b'{"input_ids": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    reply = post(client, path, deep)
    assert reply.status_code == 400
    assert reply.json()["message"] == request_bodies.TOO_DEEP


def test_a_body_that_is_not_json_keeps_its_own_error(client):
    reply = post(client, "/generate", b'{"input_ids": [1,')
    assert reply.status_code == 422 and "JSON decode error" in reply.text


def test_a_missing_route_stops_the_process():
    app = FastAPI()

    @app.post("/generate")
    async def generate(body: dict):
        return body

    with pytest.raises(SystemExit, match="no route /v1/chat/completions, /v1/completions to bound"):
        request_bodies.bound_bodies(app)
