"""The route table (``serving/route_policy.py``) in front of SGLang's HTTP app, in the main process.

``install(app, admin_key)``, called by the launcher next to ``validation.serve_schema``, does three
things to SGLang's FastAPI app before it serves:

* **The gate**: ``RouteGate`` wraps the app's whole middleware stack (``app.build_middleware_stack``),
  so it sees every HTTP and WebSocket request first, before SGLang's CORS and key middlewares and
  before any route code, and answers what the table refuses itself: 404 closed (or not in the
  table), 405 a method the route does not serve, 403 admin without ``--admin-api-key``, 401 admin
  without the key; a refused WebSocket handshake is closed (code 1008). Outermost, because
  SGLang's own key middleware, added later, would otherwise answer 401 for some closed routes.
* **SGLang's key levels follow the table**: each endpoint's ``_auth_level`` (SGLang's
  ``sglang.srt.utils.auth``) is set to ``ADMIN_OPTIONAL`` for an admin route and ``NORMAL`` for an
  open or validated one, so SGLang's middleware, which runs after the gate when a key is
  configured, asks for the same key the table does (without this, ``/server_info`` would want
  ``--api-key`` where both keys are set).
* ``GET /cache_policy/routes``: the table as JSON (``route_policy.to_json``), with the routes this
  server registered and any it registered that the table does not name (closed).

Start-up logs one line with the counts, and one warning per difference between the table and
what SGLang registered (``route_policy.registered_problems``).

One hook for an open route, registered by ``patches.plugin`` with the others (``install_hooks``):

| target | kind | why |
|---|---|---|
| ``TokenizerControlMixin.get_loads`` | before | ``GET /v1/loads?include=`` with a section SGLang does not know raised ``ValueError`` outside the endpoint's ``try`` (a 500 and a traceback, found by the soak's route fuzz); refused first, inside it: SGLang's own 400 |
"""

from __future__ import annotations

import json
import logging

from serving import route_policy

logger = logging.getLogger(__name__)

# One line at start-up, format fixed (operators grep it).
INSTALLED_LINE = ("[cache-policy] route table: {validated} validated, {open} open, {admin} admin, {closed} closed "
                  "(method, path) pairs; admin routes {admin_state}")


GET_LOADS = "sglang.srt.managers.tokenizer_control_mixin.TokenizerControlMixin.get_loads"
TARGETS = (GET_LOADS,)


def before_get_loads(tokenizer_manager, include=None, *args, **kwargs) -> None:
    """An unknown ``include`` section is a ``ValueError`` here, where ``/v1/loads`` answers it 400."""
    from sglang.srt.managers.load_snapshot import LoadSnapshot

    unknown = sorted(set(include or ()) - LoadSnapshot.VALID_SECTIONS)
    if unknown:
        raise ValueError(f"include: unknown section(s) {', '.join(map(repr, unknown))}; one of "
                         f"{', '.join(sorted(LoadSnapshot.VALID_SECTIONS))}")


def install_hooks(register) -> None:
    """The hooks of the open routes (every process; they act where a tokenizer manager runs)."""
    register(GET_LOADS, before_get_loads, "before")


def registered(app) -> list[tuple[str, str, object]]:
    """(method, path, endpoint) of every route the app serves, included routers flattened; a
    WebSocket route's method is ``WEBSOCKET``, a mount's ``GET``."""
    from fastapi.routing import iter_route_contexts
    from starlette.routing import Mount, WebSocketRoute

    out = []
    for context in iter_route_contexts(app.routes):
        route = context.original_route
        if isinstance(route, WebSocketRoute):
            methods = {route_policy.WEBSOCKET}
        elif isinstance(route, Mount):
            methods = {"GET"}
        else:
            methods = set(context.methods or ())
        out.extend((method, context.path, context.endpoint) for method in sorted(methods))
    return out


def registered_pairs(app) -> set[tuple[str, str]]:
    return {(method, path) for method, path, _ in registered(app)}


def align_auth_levels(app) -> None:
    """SGLang's per-endpoint key level, from the table (see the module docstring)."""
    from sglang.srt.utils.auth import AuthLevel

    wanted = {route_policy.ADMIN: AuthLevel.ADMIN_OPTIONAL, route_policy.OPEN: AuthLevel.NORMAL,
              route_policy.VALIDATED: AuthLevel.NORMAL}
    levels: dict[object, tuple] = {}
    for method, path, endpoint in registered(app):
        route = route_policy.lookup(method, path).route
        if endpoint is None or route is None or route.verdict not in wanted:
            continue
        level = wanted[route.verdict]
        earlier = levels.setdefault(endpoint, (level, f"{method} {path}"))
        if earlier[0] != level:
            raise SystemExit(f"cache-policy overlay: the route table gives {earlier[1]} and {method} {path} "
                             "different verdicts, but SGLang serves them with one function")
        endpoint._auth_level = level


def serve_table(app, admin_key: str | None) -> None:
    """``GET /cache_policy/routes``."""

    async def route_table():
        return route_policy.to_json(bool(admin_key), registered_pairs(app))

    app.add_api_route(route_policy.ROUTES_PATH, route_table, methods=["GET"])


class RouteGate:
    """The ASGI app in front of SGLang's middleware stack: a request the table refuses is answered
    here (``route_policy.decide``); anything else goes on unchanged."""

    def __init__(self, app, admin_key: str | None):
        self.app, self.admin_key = app, admin_key or None

    async def __call__(self, scope, receive, send) -> None:
        kind = scope.get("type")
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        from starlette._utils import get_route_path

        method = scope.get("method", "GET") if kind == "http" else route_policy.WEBSOCKET
        path = get_route_path(scope)
        refusal = route_policy.decide(method, path, self.admin_key, _header(scope, b"authorization"))
        if refusal is None:
            await self.app(scope, receive, send)
        elif kind == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": refusal.kind})
        else:
            await _answer(refusal, method, send)


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return value.decode("latin-1")
    return None


async def _answer(refusal: route_policy.Refusal, method: str, send) -> None:
    body = json.dumps(refusal.to_json()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if refusal.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    if refusal.allow:
        headers.append((b"allow", ", ".join(refusal.allow).encode()))
    await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if method == "HEAD" else body})


def install(app, admin_key: str | None) -> None:
    """Put the table in front of ``app`` (SGLang's, before it serves); see the module docstring."""
    if getattr(app, "middleware_stack", None) is not None:
        raise SystemExit("cache-policy overlay: the route table must be installed before the HTTP app serves")
    own = {key for route in route_policy.OWN_ROUTES for key in route.keys()}
    for problem in route_policy.registered_problems(registered_pairs(app) - own):
        logger.warning("cache-policy route table: %s (closed)", problem)
    align_auth_levels(app)
    serve_table(app, admin_key)
    build = app.build_middleware_stack
    app.build_middleware_stack = lambda: RouteGate(build(), admin_key)
    counts = route_policy.counts(route_policy.table())
    state = "need the --admin-api-key" if admin_key else "refused (no --admin-api-key)"
    logger.info(INSTALLED_LINE.format(**counts, admin_state=state))
