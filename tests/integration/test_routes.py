"""The route table (``serving/route_policy.py``) against SGLang 0.5.16's real HTTP app, and its gate
(``patches/routes.py``) in front of that app, without a model.

The table must name exactly the routes SGLang registers (a new upstream route fails here until it
is decided), and its conditional routes must still be registered by SGLang's source under their
setting. The gate is installed on SGLang's own ``app`` as the launcher installs it, with SGLang's
key middleware added as a server started with ``--admin-api-key`` adds it, and driven with
FastAPI's ``TestClient`` without the lifespan (no tokenizer manager): every closed route answers
404, every admin route 401 without the key and 403 when no key is configured, open and validated
routes reach SGLang's code, and with the key an admin route acts (``/flush_cache`` on a stand-in
tokenizer manager). The app is put back as it was after the module.
"""

from __future__ import annotations

import inspect
import logging
import re
from types import SimpleNamespace

import pytest

from patches import routes, validation
from serving import route_policy as rp

pytestmark = pytest.mark.integration

KEY = "integration-admin-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


def concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "x1", path)


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[tuple[int, str]] = []

    def emit(self, record):
        self.lines.append((record.levelno, record.getMessage()))


class StandInTokenizerManager:
    """What ``/flush_cache`` calls, recorded."""

    def __init__(self):
        self.flushes = 0

    async def flush_cache(self, timeout_s=0.0):
        self.flushes += 1
        return SimpleNamespace(success=True, message="")


@pytest.fixture(scope="module")
def sglang_app():
    from sglang.srt.entrypoints import http_server

    return http_server


@pytest.fixture(scope="module")
def registered_before(sglang_app):
    """SGLang's own routes, before the overlay adds its two."""
    return routes.registered_pairs(sglang_app.app)


@pytest.fixture(scope="module")
def served(sglang_app, registered_before):
    """SGLang's app with the gate (key ``KEY``) and SGLang's key middleware; a client and the
    stand-in tokenizer manager. Restored afterwards."""
    from fastapi.testclient import TestClient
    from sglang.srt.utils.auth import add_api_key_middleware

    app = sglang_app.app
    saved_routes, saved_middleware = list(app.router.routes), list(app.user_middleware)
    saved_levels = {endpoint: endpoint.__dict__.get("_auth_level") for _, _, endpoint in routes.registered(app)
                    if endpoint is not None}
    saved_state = sglang_app.get_global_state()
    manager = StandInTokenizerManager()
    sglang_app.set_global_state(SimpleNamespace(tokenizer_manager=manager, template_manager=None, scheduler_info={}))
    validation.serve_schema(app)
    said, logger = _Lines(), logging.getLogger(routes.__name__)
    level = logger.level
    logger.addHandler(said)
    logger.setLevel(logging.DEBUG)
    try:
        routes.install(app, KEY)
    finally:
        logger.removeHandler(said)
        logger.setLevel(level)
    add_api_key_middleware(app, api_key=None, admin_api_key=KEY)  # as _setup_and_run_http_server does, later
    client = TestClient(app, raise_server_exceptions=False)
    try:
        yield SimpleNamespace(app=app, client=client, manager=manager, install_log=said.lines)
    finally:
        app.router.routes[:] = saved_routes
        app.user_middleware[:] = saved_middleware
        app.__dict__.pop("build_middleware_stack", None)
        app.middleware_stack = None
        for endpoint, level in saved_levels.items():
            if level is None:
                endpoint.__dict__.pop("_auth_level", None)
            else:
                endpoint._auth_level = level
        sglang_app.set_global_state(saved_state)


def gate_said(reply, status: int) -> bool:
    """The reply is the gate's refusal with ``status`` (SGLang's own 404s say something else; an
    answer to HEAD has no body)."""
    if reply.request.method == "HEAD":
        return reply.status_code == status and reply.content == b""
    try:
        body = reply.json()
    except ValueError:
        return False
    return reply.status_code == status and body.get("object") == "error" and body.get("code") == status


def send(client, method: str, path: str, headers=None):
    body = {} if method in ("POST", "PUT", "DELETE") else None
    return client.request(method, path, json=body, headers=headers or {})


def pairs_of(verdict: str, registered) -> list[tuple[str, str]]:
    return sorted((m, p) for route in rp.ROUTES if route.verdict == verdict
                  for m, p in route.keys() if (m, p) in registered and m != rp.WEBSOCKET)


# ------------------------------------------------------------------------------------ the table is SGLang's


def test_the_table_names_exactly_the_routes_sglang_registers(registered_before):
    assert rp.registered_problems(registered_before) == []
    assert len(registered_before) == 117
    # every route of the table that SGLang does not register by default is a conditional one
    missing = {key for route in rp.ROUTES for key in route.keys()} - registered_before
    assert {path for _, path in missing} == {"/metrics", "/dumper/{method}"}


def test_the_conditional_routes_are_still_sglangs(sglang_app):
    from sglang.srt.utils import common

    source = inspect.getsource(sglang_app)
    assert 'if os.environ.get("DUMPER_SERVER_PORT") == "reuse":' in source
    assert '@app.api_route("/dumper/{method}", methods=["POST"])' in source
    assert 'Mount("/metrics"' in inspect.getsource(common.add_prometheus_middleware)
    assert "add_prometheus_middleware(app)" in inspect.getsource(sglang_app.lifespan)
    assert 'openapi_url=None if get_bool_env_var("DISABLE_OPENAPI_DOC")' in source


def test_the_overlay_adds_its_own_two_routes(served, registered_before):
    now = routes.registered_pairs(served.app)
    assert now - registered_before == {key for route in rp.OWN_ROUTES for key in route.keys()}
    assert rp.registered_problems(now - {key for route in rp.OWN_ROUTES for key in route.keys()}) == []


def test_install_logs_the_counts_and_no_difference(served):
    assert served.install_log == [(logging.INFO, "[cache-policy] route table: 4 validated, 14 open, 61 admin, "
                                                 "42 closed (method, path) pairs; admin routes need the --admin-api-key")]


def test_our_templates_match_what_starlette_matches(registered_before):
    from starlette.routing import compile_path

    samples = ["/", "/x1", "/x1/x2", "/v1/models/a/b", "/v1/responses/x1/cancel", "/v1/responses/", "/dumper/x1"]
    for route in rp.table():
        ours = rp._compile(route.path)
        theirs = compile_path(route.path)[0]
        for sample in samples + [concrete(route.path), route.path]:
            assert bool(ours.fullmatch(sample)) == bool(theirs.match(sample)), (route.path, sample)


# ------------------------------------------------------------------------------------ the gate


def test_closed_routes_answer_404_with_and_without_the_key(served, registered_before):
    closed = pairs_of(rp.CLOSED, registered_before)
    assert len(closed) == 41  # and the WebSocket route, below
    for method, path in closed:
        for headers in (None, AUTH):
            reply = send(served.client, method, concrete(path), headers)
            assert gate_said(reply, 404), (method, path, reply.status_code, reply.text)
            if method != "HEAD":
                assert "closed on this server" in reply.json()["message"]


def test_the_closed_websocket_is_closed_before_it_is_accepted(served):
    from starlette.websockets import WebSocketDisconnect

    with pytest.raises(WebSocketDisconnect) as caught:
        with served.client.websocket_connect("/v1/realtime"):
            pass
    assert caught.value.code == 1008


def test_admin_routes_need_the_key(served, registered_before):
    admin = pairs_of(rp.ADMIN, registered_before)
    assert len(admin) == 60  # /dumper/{method} is not registered by default
    for method, path in admin:
        missing = send(served.client, method, concrete(path))
        assert gate_said(missing, 401), (method, path, missing.status_code, missing.text)
        assert missing.headers["www-authenticate"] == "Bearer"
        wrong = send(served.client, method, concrete(path), {"Authorization": "Bearer not-the-key"})
        assert gate_said(wrong, 401) and "is not the server's --admin-api-key" in wrong.json()["message"]


def test_admin_routes_without_a_configured_key_are_403(served, registered_before):
    served.client.get("/ping")  # the middleware stack is built
    gate = served.app.middleware_stack
    assert isinstance(gate, routes.RouteGate)
    gate.admin_key = None
    try:
        for method, path in pairs_of(rp.ADMIN, registered_before):
            reply = send(served.client, method, concrete(path), AUTH)
            assert gate_said(reply, 403), (method, path, reply.status_code)
            assert "started without --admin-api-key" in reply.json()["message"]
    finally:
        gate.admin_key = KEY


def test_with_the_key_an_admin_route_acts(served):
    before = served.manager.flushes
    reply = served.client.post("/flush_cache", headers=AUTH)
    assert reply.status_code == 200 and reply.text.startswith("Cache flushed"), reply.text
    assert served.manager.flushes == before + 1


def test_open_routes_reach_sglangs_code_without_a_key(served):
    assert (served.client.get("/").status_code, served.client.get("/").json()) == (200, "SGLang is running")
    assert served.client.head("/").status_code == 200
    assert (served.client.get("/ping").status_code, served.client.get("/ping").text) == (200, "")
    table = served.client.get(rp.ROUTES_PATH)
    assert table.status_code == 200 and table.json()["counts"] == rp.counts(rp.table())
    assert table.json()["admin_key_configured"] is True and table.json()["unlisted"] == []
    assert served.client.get(rp.SCHEMA_PATH).json()["routes"].keys() == {"/generate", "/v1/completions",
                                                                          "/v1/chat/completions"}


def test_validated_routes_reach_sglangs_body_validation(served):
    for method, path in [("POST", "/generate"), ("PUT", "/generate"), ("POST", "/v1/completions"),
                         ("POST", "/v1/chat/completions")]:
        reply = served.client.request(method, path, content=b"[1, 2", headers={"Content-Type": "application/json"})
        assert reply.status_code == 400 and not gate_said(reply, 404), (path, reply.text)
        assert "JSON decode error" in reply.text


def test_unknown_paths_wrong_methods_and_near_misses(served):
    for path in ("/nope", "/flush_cache/", "/FLUSH_CACHE", "/generate/", "/flush_cache%2F"):
        reply = served.client.post(path, headers=AUTH)
        assert gate_said(reply, 404) and "no such route" in reply.json()["message"], path
    reply = served.client.get("/generate")
    assert gate_said(reply, 405) and reply.headers["allow"] == "POST, PUT"


def test_a_cors_preflight_of_a_served_route_reaches_sglangs_cors_middleware(served):
    preflight = {"Origin": "http://example.test", "Access-Control-Request-Method": "POST"}
    reply = served.client.options("/generate", headers=preflight)
    assert reply.status_code == 200 and reply.headers["access-control-allow-origin"] == "http://example.test"
    assert gate_said(served.client.options("/vertex_generate", headers=preflight), 404)


def test_sglangs_key_levels_follow_the_table(served):
    """SGLang's key middleware (after the gate) resolves each route's level from the endpoint: admin
    routes ask for the admin key, open and validated ones are NORMAL (``/abort_request`` was
    ADMIN_OPTIONAL and ``/server_info`` NORMAL in SGLang; both are admin here).

    SGLang's middleware cannot see the level of a route of an included router (``/v1/loads``, the
    elastic-EP routes): under FastAPI 0.165 its match gives no endpoint, so it reads NORMAL even
    for SGLang's ADMIN_OPTIONAL ``/scale_elastic_ep``; the gate is what refuses those."""
    from fastapi.routing import APIRoute
    from sglang.srt.utils.auth import AuthLevel, _get_auth_level_from_app_and_scope, decide_request_auth

    direct = {route.path for route in served.app.router.routes if isinstance(route, APIRoute)}
    assert {"/v1/loads", "/scale_elastic_ep", "/is_scaling_elastic_ep"}.isdisjoint(direct)
    for route in rp.ROUTES:
        for method, path in route.keys():
            if route.verdict == rp.CLOSED or route.only_when or method == rp.WEBSOCKET or path not in direct:
                continue
            scope = {"type": "http", "method": method, "path": concrete(path), "root_path": "", "headers": []}
            level = _get_auth_level_from_app_and_scope(served.app, scope)
            assert level == (AuthLevel.ADMIN_OPTIONAL if route.verdict == rp.ADMIN else AuthLevel.NORMAL), path
            both_keys = decide_request_auth(method=method, path=path, authorization_header=AUTH["Authorization"],
                                            api_key="user-key", admin_api_key=KEY, auth_level=level)
            assert both_keys.allowed == (route.verdict == rp.ADMIN) or path.startswith("/health"), path


def test_an_unknown_loads_section_is_refused_where_sglang_answers_400():
    """``/v1/loads?include=<unknown>`` raised inside ``LoadSnapshot.to_dict``, outside the endpoint's
    ``try``: a 500. The hook (``routes.before_get_loads``, on ``get_loads``, inside the ``try``)
    raises the ``ValueError`` first; SGLang's handler turns it into its 400."""
    from sglang.srt.entrypoints import v1_loads

    assert routes.before_get_loads(None, include=["core", "memory"]) is None
    assert routes.before_get_loads(None) is None and routes.before_get_loads(None, ["all"]) is None
    with pytest.raises(ValueError, match="^include: unknown section.s. 'x', '\ufffd'; one of all, core, disagg"):
        routes.before_get_loads(None, include=["core", "x", "\ufffd"])
    source = inspect.getsource(v1_loads.get_loads)
    assert "load_results = await tokenizer_manager.get_loads(" in source
    assert source.index("except ValueError as e:") < source.index("d = load.to_dict(include_set)")
