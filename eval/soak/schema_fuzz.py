"""A schema-driven fuzz: every field of every generating route, each wrong kind of value.

The server serves the schema it enforces (``GET /cache_policy/request_schema``, built from SGLang's
own request types; ``serving/route_schemas.py``). For every field reachable through objects
(``schema.walk_fields``) and every kind in ``schema.wrong_values`` (string, list, object, null,
huge int, huge string, nesting past the limit, a lone surrogate, a boolean), one request is the
route's good body with that one value put in. The client checks the body against the same schema
(``RouteSchema.check``):

* refused there: the server must answer 4xx and name the field the check names;
* accepted there (``null`` for an Optional field, a string for a string field): the server must
  answer, and not with a 5xx (SGLang's own checks may still refuse it with a 4xx).

After every ``alive_every`` cases and at the end, a good request must get a 200: a server that
stopped or stalls fails the run. Bodies are sent as ASCII JSON bytes, so a lone surrogate travels
as its ``\\ud800`` escape, as a client's JSON library would write it.

Also here, ``regex_bomb``: a request whose ``stop_regex`` backtracks catastrophically under
Python's ``re``, decoding beside a stream of trivial requests; their latency against the same
requests alone is the measured cost (``patches/stop_regex.py`` matches in linear time).
"""

from __future__ import annotations

import copy
import json
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from eval.soak import client
from serving import schema
from serving.route_schemas import CHAT, COMPLETIONS, GENERATE, RouteSchema

SCHEMA_PATH = "/cache_policy/request_schema"
GOOD_BODIES: dict[str, dict] = {
    GENERATE: {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2, "temperature": 0.0}},
    COMPLETIONS: {"model": "default", "prompt": "hello", "max_tokens": 2, "temperature": 0.0},
    CHAT: {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
           "temperature": 0.0},
}
# The bomb of issue 19: exponential backtracking under Python's re on any text without U+FFFF.
REGEX_BOMB = "([\\s\\S]+[\\s\\S]+[\\s\\S]+)+\uffff"


@dataclass(frozen=True)
class Case:
    route: str
    path: tuple
    kind: str
    body: dict
    refused_at: str | None  # the field the schema names, or None: the schema accepts the body

    @property
    def name(self) -> str:
        return f"{self.route} {schema.format_path(self.path)} <- {self.kind}"


@dataclass
class Outcome:
    case: Case
    status: int | None
    message: str
    ok: bool
    why: str = ""


@dataclass
class FuzzReport:
    outcomes: list[Outcome] = field(default_factory=list)
    alive_checks: int = 0
    dead_at: str | None = None  # the case after which the server stopped answering

    @property
    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.ok]

    def summary(self) -> dict[str, Any]:
        refused = [o for o in self.outcomes if o.case.refused_at is not None]
        return {
            "cases": len(self.outcomes),
            "refused_by_schema": len(refused),
            "refused_4xx": sum(1 for o in refused if o.status is not None and 400 <= o.status < 500),
            "accepted_by_schema": len(self.outcomes) - len(refused),
            "5xx": sum(1 for o in self.outcomes if o.status is not None and o.status >= 500),
            "no_answer": sum(1 for o in self.outcomes if o.status is None),
            "failures": len(self.failures),
            "alive_checks": self.alive_checks,
            "dead_at": self.dead_at,
        }


def fetch_routes(base: str) -> dict[str, RouteSchema]:
    """The server's route schemas (``GET /cache_policy/request_schema``)."""
    reply = client.request(base, SCHEMA_PATH, timeout=30, method="GET")
    if reply.status != 200 or not isinstance(reply.body, Mapping):
        raise RuntimeError(f"GET {SCHEMA_PATH} -> {reply.status}: {reply.error} (not a patched server?)")
    data = reply.body
    return {route: RouteSchema.from_json(route, body, data["rules"][route]) for route, body in data["routes"].items()}


def with_value(body: dict, path: tuple, value) -> dict:
    """A deep copy of ``body`` with ``value`` at ``path`` (missing objects on the way created)."""
    out = copy.deepcopy(body)
    target = out
    for key in path[:-1]:
        if not isinstance(target.get(key), dict):
            target[key] = {}
        target = target[key]
    target[path[-1]] = value
    return out


def cases(routes: Mapping[str, RouteSchema], good: Mapping[str, dict] = GOOD_BODIES, max_depth: int = 2,
          skip: Callable[[str, tuple], bool] = lambda route, path: False) -> list[Case]:
    """One case per (route, field, wrong kind); see the module docstring."""
    out = []
    for route, rules in routes.items():
        if route not in good:
            continue
        for path, _ in schema.walk_fields(rules.body, max_depth=max_depth):
            if skip(route, path):
                continue
            for kind, value in schema.wrong_values():
                body = with_value(good[route], path, value)
                out.append(Case(route, path, kind, body, _refused_at(rules, body)))
    return out


def _refused_at(rules: RouteSchema, body: dict) -> str | None:
    try:
        rules.check(body)
    except schema.SchemaError as exc:
        return schema.format_path(exc.path) or "body"
    return None


def _message(reply: client.Reply) -> str:
    body = reply.body
    if isinstance(body, Mapping):
        inner = body.get("error") if isinstance(body.get("error"), Mapping) else body
        return str(inner.get("message", body))
    return str(body if body is not None else reply.error)


def judge(case: Case, reply: client.Reply) -> Outcome:
    message = _message(reply)
    status = reply.status
    if status is None:
        return Outcome(case, status, message, False, f"no answer: {reply.error}")
    if status >= 500:
        return Outcome(case, status, message, False, "a 5xx")
    if case.refused_at is None:
        return Outcome(case, status, message, True)
    if not 400 <= status < 500:
        return Outcome(case, status, message, False, f"expected a 4xx naming {case.refused_at}")
    if case.refused_at not in message:
        return Outcome(case, status, message, False, f"the 4xx does not name {case.refused_at}")
    return Outcome(case, status, message, True)


def send(base: str, case_or_route, body: dict | None = None, timeout: float = 60.0) -> client.Reply:
    route, body = (case_or_route.route, case_or_route.body) if isinstance(case_or_route, Case) else (case_or_route, body)
    return client.request(base, route, json.dumps(body).encode(), timeout=timeout)


def alive(base: str, timeout: float = 60.0) -> bool:
    return send(base, GENERATE, GOOD_BODIES[GENERATE], timeout).status == 200


def run(base: str, fuzz_cases: Iterable[Case], alive_every: int = 50, timeout: float = 60.0,
        progress: Callable[[str], None] | None = None, progress_every: int = 500) -> FuzzReport:
    """Send every case in order; stop at the first liveness check that fails."""
    report = FuzzReport()
    fuzz_cases = list(fuzz_cases)
    for i, case in enumerate(fuzz_cases, 1):
        report.outcomes.append(judge(case, send(base, case, timeout=timeout)))
        if i % alive_every == 0 or i == len(fuzz_cases):
            report.alive_checks += 1
            if not alive(base, timeout):
                report.dead_at = case.name
                break
            if progress is not None and (i % progress_every < alive_every or i == len(fuzz_cases)):
                progress(f"[fuzz] {i}/{len(fuzz_cases)} cases, {len(report.failures)} failures")
    return report


# --------------------------------------------------------------------------------- the regex bomb


@dataclass
class BombReport:
    """Latencies (s) of the same trivial requests alone, beside a long plain decode (the
    control: what sharing the scheduler costs) and beside the same decode with ``REGEX_BOMB``."""

    alone_s: list[float]
    beside_plain_s: list[float]
    beside_bomb_s: list[float]
    bomb_status: int | None
    bomb_seconds: float
    plain_seconds: float

    @property
    def ratio(self) -> float:
        """Median latency beside the bomb / beside the plain decode (1.0: the regex costs nothing)."""
        return statistics.median(self.beside_bomb_s) / statistics.median(self.beside_plain_s)

    def summary(self) -> dict[str, Any]:
        return {"alone_median_s": round(statistics.median(self.alone_s), 4),
                "beside_plain_median_s": round(statistics.median(self.beside_plain_s), 4),
                "beside_bomb_median_s": round(statistics.median(self.beside_bomb_s), 4),
                "bomb_over_plain": round(self.ratio, 2), "bomb_status": self.bomb_status,
                "bomb_seconds": round(self.bomb_seconds, 2), "plain_seconds": round(self.plain_seconds, 2)}


def _trivial(base: str, n: int, timeout: float) -> list[float]:
    times = []
    for i in range(n):
        reply = send(base, GENERATE, {"input_ids": [7, 8, 9 + i % 50],
                                      "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}, timeout)
        times.append(reply.seconds if reply.status == 200 else float("inf"))
    return times


def _beside(base: str, sampling: dict, trivial: int, timeout: float) -> tuple[list[float], int | None, float]:
    """Trivial requests sent while one long decode with ``sampling`` runs."""
    result: dict[str, Any] = {}

    def long_decode():
        reply = send(base, GENERATE, {"input_ids": [5, 6, 7], "sampling_params": sampling}, timeout)
        result.update(status=reply.status, seconds=reply.seconds)

    thread = threading.Thread(target=long_decode, daemon=True)
    thread.start()
    time.sleep(0.5)  # it is decoding
    times = _trivial(base, trivial, timeout)
    thread.join(timeout)
    return times, result.get("status"), result.get("seconds", float("inf"))


def regex_bomb(base: str, trivial: int = 10, bomb_tokens: int = 256, timeout: float = 120.0) -> BombReport:
    """See ``BombReport``; both long decodes run ``bomb_tokens`` tokens (``ignore_eos``)."""
    alone = _trivial(base, trivial, timeout)
    plain = {"max_new_tokens": bomb_tokens, "temperature": 0.0, "ignore_eos": True}
    beside_plain, _, plain_s = _beside(base, plain, trivial, timeout)
    beside_bomb, status, bomb_s = _beside(base, {**plain, "stop_regex": REGEX_BOMB}, trivial, timeout)
    return BombReport(alone, beside_plain, beside_bomb, status, bomb_s, plain_s)
