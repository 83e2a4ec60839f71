"""Request bodies read with a size limit and parsed with a depth limit, each a 400 naming the problem.

SGLang's routes read a body whole and parse it with ``json.loads`` whatever its size (FastAPI's
own ``max_body_size`` is set per route at construction and answers a bare "413 Content Too Large"),
and a body nested past Python's recursion limit fails inside the parser with ``RecursionError``,
which FastAPI answers "There was an error parsing the body" without saying what.

* **Size** (``BoundedBody``, on each route ``bound_bodies`` is given; the launcher gives it the
  generating routes): a declared ``Content-Length`` over ``--max-request-body`` is refused before
  anything is read; a body without one (chunked) is counted as it arrives and refused once it
  passes the limit. Either way the rest of the body is read and dropped up to ``DRAIN_FACTOR`` x
  the limit first, so that a client still sending it reads the 400 instead of a reset connection;
  past that the connection is closed. The refusal is raised from the body read, inside FastAPI's
  handler, so SGLang writes it like every other 400 (the OpenAI error shape).
* **Depth** (``around_request_json``, every route): a ``RecursionError`` while parsing becomes a 400
  saying so. What parses is then held to the schema's nesting limit (``serving/schema.MAX_DEPTH``,
  32 levels) on the generating routes.
"""

from __future__ import annotations

from typing import Callable, Iterable

from serving import request_limits, schema
from serving.route_schemas import CHAT, COMPLETIONS, GENERATE

REQUEST_JSON = "starlette.requests.Request.json"
GENERATING_ROUTES = (GENERATE, COMPLETIONS, CHAT)
DRAIN_FACTOR = 4
TOO_DEEP = (f"body: JSON nested deeper than the server parses (a request is refused past "
            f"{schema.MAX_DEPTH} levels)")


def _refusal(detail: str):
    from fastapi import HTTPException  # SGLang's handler is registered for FastAPI's class

    return HTTPException(status_code=400, detail=detail)


class BoundedBody:
    """One route's ASGI app with its request body read within ``limits().max_body_bytes``."""

    def __init__(self, app, limits: Callable[[], request_limits.RequestLimits] = request_limits.current):
        self.app = app
        self.limits = limits

    async def __call__(self, scope, receive, send):
        if scope.get("type") != "http":
            return await self.app(scope, receive, send)
        limit = self.limits()
        declared = _content_length(scope)
        state = {"read": 0, "checked": False, "done": False}

        async def drain() -> None:
            """Read and drop the rest of the body, at most ``DRAIN_FACTOR`` x the limit in all."""
            while not state["done"] and state["read"] <= DRAIN_FACTOR * limit.max_body_bytes:
                message = await receive()
                if message["type"] != "http.request":
                    return
                state["read"] += len(message.get("body", b""))
                state["done"] = not message.get("more_body", False)

        async def bounded_receive():
            if not state["checked"]:
                state["checked"] = True
                if declared is not None and declared > limit.max_body_bytes:
                    if declared <= DRAIN_FACTOR * limit.max_body_bytes:
                        await drain()
                    raise _refusal(request_limits.body_size_problem(declared, limit, declared=True))
            message = await receive()
            if message["type"] == "http.request":
                state["read"] += len(message.get("body", b""))
                state["done"] = not message.get("more_body", False)
                if state["read"] > limit.max_body_bytes:
                    await drain()
                    raise _refusal(request_limits.body_size_problem(state["read"], limit, declared=False))
            return message

        await self.app(scope, bounded_receive, send)


def _content_length(scope) -> int | None:
    for name, value in scope.get("headers") or ():
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def bound_bodies(app, paths: Iterable[str] = GENERATING_ROUTES) -> list[str]:
    """Wrap the ASGI app of every route of ``app`` at ``paths`` in ``BoundedBody``; the paths wrapped.
    A path with no route stops the process (SGLang changed: its bodies would go unbounded)."""
    wanted = set(paths)
    wrapped, bounded = [], set()
    for route in app.router.routes:
        path = getattr(route, "path", None)
        if path not in wanted:
            continue
        if not isinstance(route.app, BoundedBody):
            route.app = BoundedBody(route.app)
            wrapped.append(path)
        bounded.add(path)
    missing = sorted(wanted - bounded)
    if missing:
        raise SystemExit(f"cache-policy overlay: no route {', '.join(missing)} to bound the body of "
                         "(SGLang internals changed?)")
    return wrapped


async def around_request_json(original, request, *args, **kwargs):
    """Starlette's ``Request.json``: a body nested past Python's recursion limit is a 400 saying so."""
    try:
        return await original(request, *args, **kwargs)
    except RecursionError:
        raise _refusal(TOO_DEEP) from None


def install(register) -> None:
    """Register the depth hook (every process; it acts where a request body is parsed)."""
    register(REQUEST_JSON, around_request_json, "around")
