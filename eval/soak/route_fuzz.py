"""The route table's fuzz: every route the server says it has, each asked as its verdict says.

The server serves its table (``GET /cache_policy/routes``; ``serving/route_policy.py``). For each
route it registered (WebSocket routes are sent as a GET):

* ``open``: its plain request answers 2xx, and the same request with junk beside it (a nested
  JSON body of ``NEST_DEPTH`` levels, a 1 MiB body, a lone surrogate and an invalid UTF-8 byte in
  the query, an unknown query parameter) never answers 5xx;
* ``closed``: 404, without a key and with the admin key;
* ``admin``: without a key, and with a wrong key, 401 when the server has an admin key, 403 when
  it has none; with the key (the soak's ``admin_key``), the harmless ``GET /server_info`` answers
  200 with the server's settings (the route acts);
* ``validated``: the routes of the request schema (``GET /cache_policy/request_schema``), which
  ``schema_fuzz`` walks field by field; here only that the two lists agree.

A refusal must come from the gate (SGLang's error shape with the status as ``code``; an answer to
HEAD has no body). Requests without the key carry a body that is harmless even if a route acted on
it (``{}``), and a server that let one through fails the check, so a broken gate is found, not
trusted. The server must answer a plain request after every ``alive_every`` routes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from eval import http
from eval.soak import client
from serving.route_policy import ADMIN, CLOSED, OPEN, ROUTES_PATH, SCHEMA_PATH, VALIDATED, WEBSOCKET

NEST_DEPTH = 100_000
BIG_BODY = 1 << 20
ADMIN_PROBE = ("GET", "/server_info")  # harmless with the key: reads the settings
# Query strings sent raw (the client does not re-encode them): a lone surrogate (UTF-8 of U+D800),
# an invalid UTF-8 byte, an unknown parameter, a junk value for SGLang's own parameter.
JUNK_QUERIES = ("?include=%ED%A0%80", "?include=%FF", "?zzz=1&dp_rank=x", "?format=" + "x" * 4096)


@dataclass(frozen=True)
class Probe:
    name: str
    method: str
    path: str
    verdict: str
    expect: str  # "2xx", "not5xx" or a status as text ("404", "401", "403")
    body: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass
class Outcome:
    probe: Probe
    status: int | None
    ok: bool
    why: str = ""


def fetch_table(base: str) -> dict:
    """The server's route table; raises RuntimeError when it serves none."""
    reply = client.request(base, ROUTES_PATH, timeout=30, method="GET")
    if reply.status != 200 or not isinstance(reply.body, Mapping) or "routes" not in reply.body:
        raise RuntimeError(f"GET {ROUTES_PATH} -> {reply.status}: {reply.error} (not a patched server?)")
    return reply.body


def concrete(path: str, model: str) -> str:
    """A request path for a route template: ``{x:path}`` the model's name, other parameters ``x1``."""
    path = re.sub(r"\{[^}:]+:path\}", model, path)
    return re.sub(r"\{[^}]+\}", "x1", path)


def probes(table: Mapping[str, Any], admin_key: str | None, model: str = "default") -> list[Probe]:
    """Every probe of the table's registered routes (see the module docstring)."""
    configured = bool(table.get("admin_key_configured"))
    refused = "401" if configured else "403"
    key = http.admin_headers(admin_key) if admin_key else {}
    out = []
    for route in table["routes"]:
        if not route.get("registered"):
            continue
        for method in route["methods"]:
            sent = "GET" if method == WEBSOCKET else method
            path = concrete(route["path"], model)
            body = b"{}" if sent in ("POST", "PUT", "DELETE", "PATCH") else None
            name = f"{method} {route['path']}"
            verdict = route["verdict"]
            if verdict == OPEN:
                out.append(Probe(name, sent, path, verdict, "2xx"))
                out.extend(_junk(name, sent, path, verdict))
            elif verdict == CLOSED:
                out.append(Probe(name, sent, path, verdict, "404", body))
                if key:
                    out.append(Probe(name + " (admin key)", sent, path, verdict, "404", body, key))
            elif verdict == ADMIN:
                out.append(Probe(name + " (no key)", sent, path, verdict, refused, body))
                out.append(Probe(name + " (wrong key)", sent, path, verdict, refused, body,
                                 {"Authorization": "Bearer not-the-admin-key"}))
    for row in table.get("unlisted") or ():
        name = f"{row['method']} {row['path']} (not in the table)"
        out.append(Probe(name, "GET" if row["method"] == WEBSOCKET else row["method"], concrete(row["path"], model),
                         CLOSED, "404", b"{}"))
    return out


def _junk(name: str, method: str, path: str, verdict: str) -> list[Probe]:
    if method == "HEAD":
        return []
    nested = ("[" * NEST_DEPTH + "]" * NEST_DEPTH).encode()
    out = [Probe(f"{name} <- nested body", method, path, verdict, "not5xx", nested),
           Probe(f"{name} <- 1 MiB body", method, path, verdict, "not5xx", b"x" * BIG_BODY)]
    out += [Probe(f"{name} <- query {query[:24]}", method, path + query, verdict, "not5xx") for query in JUNK_QUERIES]
    return out


def from_gate(reply: client.Reply, status: int, method: str) -> bool:
    """The reply is the route gate's refusal with ``status``."""
    if reply.status != status:
        return False
    if method == "HEAD":
        return True
    body = reply.body
    return isinstance(body, Mapping) and body.get("object") == "error" and body.get("code") == status


def judge(probe: Probe, reply: client.Reply) -> Outcome:
    status = reply.status
    if status is None:
        return Outcome(probe, None, False, f"no answer: {reply.error}")
    if probe.expect == "2xx":
        return Outcome(probe, status, 200 <= status < 300, "" if 200 <= status < 300 else "expected a 2xx")
    if probe.expect == "not5xx":
        return Outcome(probe, status, status < 500, "" if status < 500 else "a 5xx")
    wanted = int(probe.expect)
    if from_gate(reply, wanted, probe.method):
        return Outcome(probe, status, True)
    what = "served" if 200 <= status < 300 else f"answered {status}"
    return Outcome(probe, status, False, f"{probe.verdict} route {what}; expected the route table's {wanted}")


def send(base: str, probe: Probe, timeout: float) -> client.Reply:
    return client.request(base, probe.path, probe.body, timeout=timeout, method=probe.method,
                          headers=dict(probe.headers))


@dataclass
class RouteReport:
    outcomes: list[Outcome] = field(default_factory=list)
    admin_acts: dict | None = None  # the probe with the key: status and why it failed, or None (no key)
    validated_agree: str | None = None  # why the validated routes and the schema routes differ
    dead_at: str | None = None
    counts: dict = field(default_factory=dict)

    @property
    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.ok]

    def summary(self) -> dict[str, Any]:
        return {"probes": len(self.outcomes), "failures": len(self.failures), "counts": self.counts,
                "by_verdict": {v: sum(1 for o in self.outcomes if o.probe.verdict == v) for v in (OPEN, CLOSED, ADMIN)},
                "admin_acts": self.admin_acts, "validated_agree": self.validated_agree, "dead_at": self.dead_at}


def admin_acts(base: str, admin_key: str | None, configured: bool, timeout: float) -> dict:
    """``GET /server_info`` with the key: 200 and a settings object (``ok``), or why not."""
    method, path = ADMIN_PROBE
    if not configured:
        return {"ok": True, "status": None, "why": "the server has no admin key: admin routes are refused to all"}
    if not admin_key:
        return {"ok": False, "status": None, "why": f"no admin key given ({http.ADMIN_KEY_ENV})"}
    reply = client.request(base, path, None, timeout=timeout, method=method, headers=http.admin_headers(admin_key))
    ok = reply.status == 200 and isinstance(reply.body, Mapping) and "version" in reply.body
    return {"ok": ok, "status": reply.status, "why": "" if ok else f"{method} {path} with the key: {reply.error}"}


def validated_problem(base: str, table: Mapping[str, Any]) -> str | None:
    """Why the table's validated routes and the request schema's routes differ, or None."""
    validated = {route["path"] for route in table["routes"] if route["verdict"] == VALIDATED}
    reply = client.request(base, SCHEMA_PATH, timeout=30, method="GET")
    if reply.status != 200 or not isinstance(reply.body, Mapping):
        return f"GET {SCHEMA_PATH} -> {reply.status}"
    schema = set(reply.body.get("routes") or ())
    if schema != validated:
        return f"validated routes {sorted(validated)} but schema routes {sorted(schema)}"
    return None


def served_model(base: str) -> str:
    """The first model ``/v1/models`` lists (``default`` when it lists none)."""
    reply = client.request(base, "/v1/models", timeout=30, method="GET")
    try:
        return str(reply.body["data"][0]["id"])
    except (TypeError, KeyError, IndexError):
        return "default"


def run(base: str, admin_key: str | None, model: str | None = None, alive: Any = None, alive_every: int = 25,
        timeout: float = 60.0) -> RouteReport:
    """Send every probe of the server's table (``model``: the served model's name, asked of the
    server when None); ``alive(base)`` (a plain request answered) after every ``alive_every``
    probes and at the end. Raises RuntimeError without a table."""
    table = fetch_table(base)
    model = model if model is not None else served_model(base)
    report = RouteReport(counts=dict(table.get("counts") or {}))
    report.validated_agree = validated_problem(base, table)
    all_probes = probes(table, admin_key, model)
    for i, probe in enumerate(all_probes, 1):
        report.outcomes.append(judge(probe, send(base, probe, timeout)))
        if alive is not None and (i % alive_every == 0 or i == len(all_probes)) and not alive(base):
            report.dead_at = probe.name
            return report
    report.admin_acts = admin_acts(base, admin_key, bool(table.get("admin_key_configured")), timeout)
    return report


def report_json(report: RouteReport) -> dict:
    return {"summary": report.summary(),
            "failures": [{"probe": o.probe.name, "method": o.probe.method, "path": o.probe.path[:120],
                          "status": o.status, "why": o.why} for o in report.failures[:50]]}
