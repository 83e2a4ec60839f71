"""eval/soak/route_fuzz.py and the soak's ``routes`` check, against a stand-in server whose gate is
``serving.route_policy.decide`` (the real one, as ``patches/routes.py`` calls it) in front of
handlers that answer 200: the fuzz passes a correct gate, with and without an admin key, and
names each way a broken one lets a route through. (Against SGLang itself:
tests/engine/test_validation_server.py and the soak's engine test.)"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from eval.http import Response
from eval.soak import route_fuzz, safety, schema_fuzz
from eval.soak.checks import FAIL, PASS
from serving import route_policy as rp

KEY = "fuzz-key"


class Gate:
    """What the stand-in serves: the table of a server with ``admin_key``, a ``leak`` set of
    (method, template) the gate lets through anyway, and every request seen."""

    def __init__(self, admin_key, leak=(), five_hundred=()):
        self.admin_key, self.leak, self.five_hundred = admin_key, set(leak), set(five_hundred)
        self.registered = {key for route in rp.table() if route.only_when is None for key in route.keys()}
        self.seen: list[tuple[str, str, str | None]] = []
        self.lock = threading.Lock()


def start(gate: Gate):
    class Handler(BaseHTTPRequestHandler):
        def answer(self, status, body):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def handle_any(self):
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            path = self.path.split("?")[0]
            with gate.lock:
                gate.seen.append((self.command, self.path, self.headers.get("Authorization")))
            found = rp.lookup(self.command, path)
            template = found.route.path if found.route else None
            refusal = rp.decide(self.command, path, gate.admin_key, self.headers.get("Authorization"), found)
            if refusal is not None and (self.command, template) not in gate.leak:
                return self.answer(refusal.status, refusal.to_json())
            if (self.command, template) in gate.five_hundred and "?" in self.path:
                return self.answer(500, {"detail": "boom"})
            if path == rp.ROUTES_PATH:
                return self.answer(200, rp.to_json(bool(gate.admin_key), gate.registered))
            if path == rp.SCHEMA_PATH:
                return self.answer(200, {"routes": {p: {} for _, p in
                                                    [k for r in rp.ROUTES if r.verdict == rp.VALIDATED for k in r.keys()]}})
            if path == "/server_info":
                return self.answer(200, {"version": "0.5.16", "admin_api_key": gate.admin_key})
            return self.answer(200, {"ok": True})

        do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = handle_any

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


@pytest.fixture
def serve():
    servers = []

    def run(gate):
        httpd, url = start(gate)
        servers.append(httpd)
        return url

    yield run
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


def always_alive(base):
    return True


# ------------------------------------------------------------------------------------ probes


def test_concrete_paths():
    assert route_fuzz.concrete("/v1/models/{model:path}", "org/m") == "/v1/models/org/m"
    assert route_fuzz.concrete("/v1/responses/{response_id}/cancel", "m") == "/v1/responses/x1/cancel"


def test_probes_cover_every_registered_route_as_its_verdict_says():
    registered = {key for route in rp.table() if route.only_when is None for key in route.keys()}
    table = rp.to_json(True, registered | {("POST", "/renamed")})
    probes = route_fuzz.probes(table, KEY)
    named = {p.name.split(" (")[0].split(" <- ")[0] for p in probes}
    validated = {key for route in rp.ROUTES if route.verdict == rp.VALIDATED for key in route.keys()}
    assert named == {f"{m} {p}" for m, p in registered - validated} | {"POST /renamed"}  # validated: schema_fuzz
    by_name = {p.name: p for p in probes}
    assert by_name["GET /health"].expect == "2xx" and by_name["GET /health <- nested body"].expect == "not5xx"
    assert by_name["POST /vertex_generate"].expect == "404" and by_name["POST /vertex_generate"].body == b"{}"
    assert by_name["POST /vertex_generate (admin key)"].headers == {"Authorization": f"Bearer {KEY}"}
    assert by_name["POST /flush_cache (no key)"].expect == "401" and not by_name["POST /flush_cache (no key)"].headers
    assert by_name["GET /server_info (wrong key)"].expect == "401"
    assert by_name["WEBSOCKET /v1/realtime"].method == "GET"
    assert by_name["POST /renamed (not in the table)"].expect == "404"
    assert "GET /metrics" not in named  # not registered on this server
    assert not any("Bearer " + KEY in str(p.headers) for p in probes if p.verdict == rp.ADMIN)


def test_without_a_configured_key_admin_probes_expect_403():
    registered = {key for route in rp.ROUTES if route.only_when is None for key in route.keys()}
    probes = route_fuzz.probes(rp.to_json(False, registered), None)
    assert {p.expect for p in probes if p.verdict == rp.ADMIN} == {"403"}
    assert not any("admin key" in p.name for p in probes)


@pytest.mark.parametrize("probe_expect, reply, ok, why", [
    ("2xx", Response(200, {}), True, ""),
    ("2xx", Response(404, {}), False, "expected a 2xx"),
    ("not5xx", Response(400, {}), True, ""),
    ("not5xx", Response(500, {}), False, "a 5xx"),
    ("404", Response(404, {"object": "error", "code": 404}), True, ""),
    ("404", Response(404, {"detail": "Not Found"}), False, "closed route answered 404; expected the route table's 404"),
    ("404", Response(200, {}), False, "closed route served; expected the route table's 404"),
    ("401", Response(None, None, "connection error"), False, "no answer: connection error"),
])
def test_judge(probe_expect, reply, ok, why):
    probe = route_fuzz.Probe("x", "POST", "/x", rp.CLOSED, probe_expect)
    outcome = route_fuzz.judge(probe, reply)
    assert (outcome.ok, outcome.why) == (ok, why)


def test_a_refused_head_has_no_body():
    probe = route_fuzz.Probe("HEAD /docs", "HEAD", "/docs", rp.CLOSED, "404")
    assert route_fuzz.judge(probe, Response(404, "")).ok


# ------------------------------------------------------------------------------------ against a gate


def test_a_correct_gate_passes_with_the_key(serve):
    gate = Gate(KEY)
    url = serve(gate)
    report = safety.run_routes(url, KEY)
    check = safety.check_routes(report)
    assert check.status == PASS, check.offenders
    summary = report["summary"]
    assert summary["admin_acts"] == {"ok": True, "status": 200, "why": ""}
    assert summary["by_verdict"]["admin"] == 2 * rp.counts()[rp.ADMIN] - 2  # /dumper is not registered
    assert summary["counts"] == rp.counts(rp.table()) and summary["validated_agree"] is None
    anonymous_admin = [(m, p) for m, p, auth in gate.seen if auth is None and rp.lookup(m, p.split("?")[0]).route
                       and rp.lookup(m, p.split("?")[0]).route.verdict == rp.ADMIN]
    assert len(anonymous_admin) == rp.counts()[rp.ADMIN] - 1
    assert ("GET", "/server_info", f"Bearer {KEY}") in gate.seen


def test_a_correct_gate_without_a_key_passes(serve):
    url = serve(Gate(None))
    report = safety.run_routes(url, None)
    assert safety.check_routes(report).status == PASS
    assert report["summary"]["admin_acts"]["status"] is None


@pytest.mark.parametrize("leak, expected", [
    ({("POST", "/update_weights_from_tensor")}, "POST /update_weights_from_tensor (no key): admin route served"),
    ({("POST", "/vertex_generate")}, "POST /vertex_generate: closed route served"),
    ({("WEBSOCKET", "/v1/realtime")}, None),  # a leaked handshake is sent as GET: still 404 for GET
])
def test_a_gate_that_lets_a_route_through_fails(serve, leak, expected):
    report = safety.run_routes(serve(Gate(KEY, leak=leak)), KEY)
    check = safety.check_routes(report)
    if expected is None:
        assert check.status == PASS
        return
    assert check.status == FAIL and any(o.startswith(expected) for o in check.offenders), check.offenders


def test_a_5xx_on_junk_fails_and_a_missing_key_is_named(serve):
    url = serve(Gate(KEY, five_hundred={("GET", "/v1/loads")}))
    check = safety.check_routes(safety.run_routes(url, None))
    assert check.status == FAIL
    assert any(o.startswith("GET /v1/loads <- query") and "a 5xx" in o for o in check.offenders)
    assert any("no admin key given (CACHE_POLICY_ADMIN_KEY)" in o for o in check.offenders)


def test_a_server_without_a_table_fails(serve):
    report = safety.run_routes("http://127.0.0.1:9", KEY)
    check = safety.check_routes(report)
    assert report["available"] is False and check.status == FAIL


def test_a_dead_server_is_named(serve, monkeypatch):
    url = serve(Gate(KEY))
    monkeypatch.setattr(schema_fuzz, "alive", lambda base, timeout=60.0: False)
    check = safety.check_routes(safety.run_routes(url, KEY))
    assert check.status == FAIL and check.offenders[0].startswith("the server stopped answering after")
