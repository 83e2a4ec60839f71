"""The route table and its decisions (``serving/route_policy.py``), without SGLang.

The table against the routes SGLang 0.5.16 really registers is ``tests/integration/test_routes.py``;
here: the table is well formed, every verdict answers as documented (each route of the table sent
its own concrete request), and the pure helpers (matching, keys, the comparison, the JSON, the
launch settings that would go around the table)."""

from __future__ import annotations

import re

import pytest

from serving import route_policy as rp
from serving.route_policy import ADMIN, CLOSED, OPEN, VALIDATED, WEBSOCKET, Route

KEY = "s3cret-key"
BEARER = f"Bearer {KEY}"


def concrete(path: str) -> str:
    """A request path for a route template: each parameter filled with a plain value."""
    return re.sub(r"\{[^}]+\}", "x1", path)


def every(verdict: str) -> list[tuple[str, str]]:
    return [(method, route.path) for route in rp.table() if route.verdict == verdict for method in route.methods]


# ------------------------------------------------------------------------------------ the table


def test_the_table_names_each_method_and_path_once_with_a_reason():
    keys = [key for route in rp.table() for key in route.keys()]
    assert len(keys) == len(set(keys))
    for route in rp.table():
        assert route.reason.strip() and route.verdict in rp.VERDICTS
        assert route.methods == tuple(dict.fromkeys(route.methods))


def test_counts_are_per_method_and_path():
    assert rp.counts() == {VALIDATED: 4, OPEN: 12, ADMIN: 61, CLOSED: 42}
    assert rp.counts(rp.table()) == {VALIDATED: 4, OPEN: 14, ADMIN: 61, CLOSED: 42}
    assert sum(rp.counts(rp.table()).values()) == sum(len(r.methods) for r in rp.table())


def test_the_validated_routes_are_the_schema_routes():
    from serving.route_schemas import CHAT, COMPLETIONS, GENERATE

    assert {path for _, path in every(VALIDATED)} == {GENERATE, COMPLETIONS, CHAT}


def test_every_route_that_deserializes_client_bytes_is_admin():
    for path in ("/update_weights_from_tensor", "/update_weights_from_ipc", "/load_lora_adapter_from_tensors",
                 "/update_weights_from_disk", "/configure_logging", "/abort_request", "/server_info", "/slow_down",
                 "/pause_generation", "/start_profile", "/flush_cache"):
        assert {route.verdict for route in rp.table() if route.path == path} == {ADMIN}, path


def test_the_issues_generating_routes_outside_the_schema_are_closed():
    for path in ("/vertex_generate", "/api/chat", "/api/generate", "/v1/messages", "/v1/responses", "/v1/tokenize",
                 "/v1/detokenize", "/parse_function_call", "/separate_reasoning", "/invocations"):
        assert {route.verdict for route in rp.table() if route.path == path} == {CLOSED}, path


def test_a_bad_route_is_refused_when_the_table_is_built():
    with pytest.raises(ValueError, match="verdict"):
        Route(("GET",), "/x", "maybe", "why")
    with pytest.raises(ValueError, match="upper-case"):
        Route(("get",), "/x", OPEN, "why")
    with pytest.raises(ValueError, match="converter 'int'"):
        Route(("GET",), "/x/{n:int}", OPEN, "why")
    with pytest.raises(ValueError, match="starts with"):
        Route(("GET",), "x", OPEN, "why")


# ------------------------------------------------------------------------------------ matching


@pytest.mark.parametrize("path, template", [
    ("/v1/models/default", "/v1/models/{model:path}"),
    ("/v1/models/org/name/v2", "/v1/models/{model:path}"),
    ("/v1/responses/abc", "/v1/responses/{response_id}"),
    ("/v1/responses/abc/cancel", "/v1/responses/{response_id}/cancel"),
    ("/dumper/start", "/dumper/{method}"),
    ("/", "/"),
])
def test_templates_match_like_starlette(path, template):
    method = rp.lookup("GET", path).route or rp.lookup("POST", path).route
    assert method is not None and method.path == template


@pytest.mark.parametrize("path", ["/flush_cache/", "//flush_cache", "/FLUSH_CACHE", "/flush_cache%2F", "/v1/responses/a/b",
                                  "/v1/models", "/dumper/a/b", "", "/generate/x"])
def test_a_path_the_table_does_not_name_has_no_entry(path):
    found = rp.lookup("POST", path)
    if path == "/v1/models":  # named for GET only
        assert found.route is None and found.allowed == ("GET",)
        return
    assert found == rp.Match(None, ())


def test_a_template_parameter_is_one_segment_unless_it_is_a_path():
    assert rp.lookup("GET", "/v1/responses/a/b").route is None
    assert rp.lookup("GET", "/v1/responses/").route is None  # an empty segment is not a value
    assert rp.lookup("GET", "/v1/models/").route.path == "/v1/models/{model:path}"  # Starlette's .* matches ""


def test_the_stricter_verdict_holds_where_two_entries_match():
    routes = (Route(("GET",), "/a/{x}", OPEN, "open"), Route(("GET",), "/a/b", ADMIN, "admin"),
              Route(("GET",), "/c/{x:path}", CLOSED, "closed"), Route(("GET",), "/c/d", OPEN, "open"))
    templates = rp._templates(routes)
    assert rp.lookup("GET", "/a/b", templates).route.verdict == ADMIN
    assert rp.lookup("GET", "/a/z", templates).route.verdict == OPEN
    assert rp.lookup("GET", "/c/d", templates).route.verdict == CLOSED


def test_methods_of_closed_entries_are_not_offered():
    assert rp.lookup("GET", "/vertex_generate") == rp.Match(None, ())  # POST only, and closed: a plain 404
    assert rp.lookup("DELETE", "/generate").allowed == ("POST", "PUT")
    assert rp.lookup("POST", "/hicache/storage-backend").allowed == ("DELETE", "GET", "PUT")


# ------------------------------------------------------------------------------------ decisions


@pytest.mark.parametrize("method, path", every(VALIDATED) + every(OPEN))
@pytest.mark.parametrize("key", [None, KEY])
def test_open_and_validated_routes_go_on_without_a_key(method, path, key):
    assert rp.decide(method, concrete(path), key, None) is None


@pytest.mark.parametrize("method, path", every(CLOSED))
@pytest.mark.parametrize("authorization", [None, BEARER])
def test_closed_routes_are_404_with_their_reason_even_with_the_admin_key(method, path, authorization):
    refusal = rp.decide(method, concrete(path), KEY, authorization)
    route = rp.lookup(method, concrete(path)).route
    assert refusal.status == 404 and refusal.kind == "Not Found"
    assert refusal.message == (f"{method} {concrete(path)}: closed on this server ({route.reason}); "
                               f"GET {rp.ROUTES_PATH} lists the routes")


@pytest.mark.parametrize("method, path", every(ADMIN))
def test_admin_routes_without_an_admin_key_configured_are_403_for_everyone(method, path):
    for authorization in (None, BEARER, "Bearer "):
        refusal = rp.decide(method, concrete(path), None, authorization)
        assert refusal.status == 403 and refusal.kind == "Forbidden"
        assert "was started without --admin-api-key, so it is refused to everyone" in refusal.message
    assert rp.decide(method, concrete(path), "", BEARER).status == 403  # an empty key is no key


@pytest.mark.parametrize("method, path", every(ADMIN))
def test_admin_routes_need_the_configured_key(method, path):
    path = concrete(path)
    missing = rp.decide(method, path, KEY, None)
    assert missing.status == 401 and missing.message.endswith("(no bearer token was sent)")
    for wrong in (f"Bearer {KEY}x", f"Bearer {KEY[:-1]}", "Bearer x", f"Bearer  {KEY}"):
        refusal = rp.decide(method, path, KEY, wrong)
        assert refusal.status == 401 and refusal.message.endswith("the bearer token sent is not the server's "
                                                                  "--admin-api-key"), wrong
    for not_bearer in (KEY, f"Basic {KEY}", "Bearer", ""):
        assert rp.decide(method, path, KEY, not_bearer).message.endswith("(no bearer token was sent)")
    assert rp.decide(method, path, KEY, BEARER) is None
    assert rp.decide(method, path, KEY, f"bearer {KEY}") is None  # the scheme is case-insensitive


def test_unknown_routes_and_wrong_methods():
    refusal = rp.decide("GET", "/no/such/route", KEY, BEARER)
    assert (refusal.status, refusal.message) == (404, "GET /no/such/route: no such route on this server "
                                                      "(GET /cache_policy/routes lists the routes)")
    refusal = rp.decide("GET", "/generate", None, None)
    assert (refusal.status, refusal.allow) == (405, ("POST", "PUT"))
    assert refusal.message == "GET /generate: this route is served for POST, PUT only"
    assert rp.decide(WEBSOCKET, "/generate", None, None).status == 405
    assert rp.decide(WEBSOCKET, "/v1/realtime", KEY, BEARER).status == 404
    assert rp.decide("GET", "/v1/realtime", None, None).status == 404  # closed: its method is not offered


def test_a_cors_preflight_goes_on_where_a_method_is_served():
    assert rp.decide("OPTIONS", "/generate", None, None) is None
    assert rp.decide("OPTIONS", "/flush_cache", None, None) is None  # the request itself still needs the key
    assert rp.decide("OPTIONS", "/vertex_generate", KEY, BEARER).status == 404
    assert rp.decide("OPTIONS", "/nope", None, None).status == 404


def test_a_long_path_is_cut_in_the_message():
    refusal = rp.decide("GET", "/" + "a" * 5000, None, None)
    assert len(refusal.message) < 400 and "GET /" + "a" * (rp.PATH_CHARS - 1) + "...: no such route" in refusal.message


def test_a_refusal_has_sglangs_error_shape():
    assert rp.Refusal(401, "why").to_json() == {"object": "error", "message": "why", "type": "Unauthorized",
                                                "param": None, "code": 401}


@pytest.mark.parametrize("header, token", [
    (None, None), ("", None), ("Bearer abc", "abc"), ("BEARER abc", "abc"), ("Bearer", None), ("Bearer ", None),
    ("Basic abc", None), ("Bearer a b", "a b"), ("abc", None),
])
def test_bearer_token(header, token):
    assert rp.bearer_token(header) == token


# ------------------------------------------------------------------------------------ the check against SGLang


def test_registered_problems_name_both_directions_and_skip_conditional_routes():
    table = (Route(("GET", "POST"), "/a", OPEN, "a"), Route(("GET",), "/m", OPEN, "m", only_when="--flag"))
    assert rp.registered_problems({("GET", "/a"), ("POST", "/a")}, table) == []
    assert rp.registered_problems({("GET", "/a"), ("POST", "/a"), ("GET", "/m")}, table) == []
    assert rp.registered_problems({("GET", "/a"), ("PUT", "/new")}, table) == [
        "PUT /new: registered by SGLang, not in the route table (serving/route_policy.py)",
        "POST /a: in the route table, not registered by SGLang"]


def test_the_json_table_says_what_is_registered_and_what_is_not_in_the_table():
    registered = {key for route in rp.table() if route.only_when is None for key in route.keys()} | {("POST", "/new")}
    out = rp.to_json(True, registered)
    assert out["admin_key_configured"] is True and out["counts"] == rp.counts(rp.table())
    assert out["unlisted"] == [{"method": "POST", "path": "/new", "verdict": CLOSED}]
    by_path = {row["path"]: row for row in out["routes"]}
    assert by_path["/metrics"]["registered"] is False and by_path["/generate"]["registered"] is True
    assert by_path["/generate"]["methods"] == ["POST", "PUT"] and by_path["/generate"]["verdict"] == VALIDATED
    assert len(out["routes"]) == len(rp.table())
    assert "refused to everyone" in rp.to_json(False, registered)["admin_routes"]


def test_unlisted_routes_are_closed():
    assert rp.unlisted({("POST", "/my/ollama/chat"), ("POST", "/generate")}) == [("POST", "/my/ollama/chat")]
    assert rp.decide("POST", "/my/ollama/chat", KEY, BEARER).status == 404


# ------------------------------------------------------------------------------------ launch settings


def test_settings_that_would_go_around_the_table_are_launch_problems():
    assert rp.launch_problems({"tokenizer_worker_num": 1, "grpc_port": None}) == []
    assert rp.launch_problems({}) == []
    problems = rp.launch_problems({"tokenizer_worker_num": 2, "grpc_port": 50051, "smg_grpc_mode": True,
                                   "grpc_mode": True})
    assert [p.split(":")[0].split(" (")[0] for p in problems] == [
        "--tokenizer-worker-num 2", "--grpc-port 50051", "--smg-grpc-mode", "--grpc-mode"]
