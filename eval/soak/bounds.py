"""The request limits under load: a request over a limit gets a 400 naming its flag, and a trivial
request beside such requests answers at its usual latency.

The server serves its limits with its schema (``GET /cache_policy/request_schema``,
``request_limits``; ``serving/request_limits.py``). From them ``over_limit_requests`` builds one
request just over each limit: prompts per request, prompts x ``n``, ``stop_regex`` patterns per
request, their characters, one pattern over RE2's ``max_mem`` (issue 33's 300-code-point class
repeated 1,000 times), a body over the size limit, and the two nestings the JSON parser cannot
take (a body and a forcing envelope 100,000 deep). Unbounded, the batch and regex requests among
them made trivial requests wait 12.5-30 s.

``run_bounds``: each request once, in turn (each must get a 400 whose message names its flag);
then ``trivial`` one-token requests alone, and as many again, each sent while a burst of the
batch, regex and nesting requests (one of each, from their own threads) is in flight (every reply
again a 400 naming the flag). The latency ratio (median beside / median alone) is measured and
reported; it is judged only against a ratio given to ``check_bounds`` (the soak's
``--max-latency-ratio``), never in the tests, which may not depend on the machine's speed. Every
count here is fixed: what is sent does not depend on how fast the server answers.
"""

from __future__ import annotations

import json
import statistics
import threading
from dataclasses import dataclass
from typing import Any, Mapping

from eval.soak import client
from eval.soak.checks import FAIL, Check, latency_offenders, ratio_shown
from eval.soak.schema_fuzz import SCHEMA_PATH, _message
from serving.field_rules import MAX_N
from serving.request_limits import FLAGS, MIB

# Issue 33's heavy pattern: under RE2's own default max_mem (8 MiB) it compiled for ~0.15 s into
# ~3.3 MB in each process; any max_mem under HEAVY_FITS refuses it.
HEAVY_PATTERN = "[" + "".join(chr(0x4E00 + 7 * i) for i in range(300)) + "]{1000}"
HEAVY_FITS = 4 * MIB
NESTING = 100_000
TOO_DEEP = "nested deeper"
TRIVIAL = {"input_ids": [7, 8, 9], "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}


@dataclass(frozen=True)
class OverLimit:
    """One request just over a limit; ``names`` is what its 400's message must contain."""

    name: str
    names: str
    path: str
    body: bytes
    beside: bool = True  # sent in the loop beside the trivial requests (the body case is sent once)


def _generate(prompts, **sampling) -> bytes:
    return json.dumps({"input_ids": prompts, "sampling_params": {"max_new_tokens": 1, **sampling}}).encode()


def over_limit_requests(limits: Mapping[str, int]) -> tuple[list[OverLimit], list[str]]:
    """(the requests, the limits no request can be built for, with why) for a server's limits."""
    requests, skipped = [], []
    prompts = limits["max_prompts"]
    requests.append(OverLimit("prompts", FLAGS["max_prompts"], "/generate", _generate([[5]] * (prompts + 1))))
    sequences = limits["max_sequences"]
    n = min(MAX_N, sequences + 1)
    batch = sequences // n + 1  # the fewest prompts that, with n each, pass the limit
    if batch <= prompts:
        requests.append(OverLimit("sequences", FLAGS["max_sequences"], "/generate", _generate([[5]] * batch, n=n)))
    else:
        skipped.append(f"max_sequences: {prompts} prompts x n = {MAX_N} stays within {sequences}")
    patterns = [f"s{i}x" for i in range(limits["max_stop_regexes"] + 1)]
    requests.append(OverLimit("stop_regex count", FLAGS["max_stop_regexes"], "/generate",
                              _generate([5, 6], stop_regex=patterns)))
    requests.append(OverLimit("stop_regex characters", FLAGS["max_stop_regex_chars"], "/generate",
                              _generate([5, 6], stop_regex="[" + "a" * limits["max_stop_regex_chars"] + "]")))
    if limits["stop_regex_max_mem"] < HEAVY_FITS and len(HEAVY_PATTERN) <= limits["max_stop_regex_chars"]:
        requests.append(OverLimit("stop_regex max_mem", FLAGS["stop_regex_max_mem"], "/generate",
                                  _generate([5, 6], stop_regex=HEAVY_PATTERN)))
    else:
        skipped.append(f"stop_regex_max_mem: {limits['stop_regex_max_mem']} bytes compile issue 33's pattern")
    body = b'{"text": "' + b"a" * (limits["max_body_bytes"] + 1024) + b'"}'
    requests.append(OverLimit("body size", FLAGS["max_body_bytes"], "/generate", body, beside=False))
    requests.append(OverLimit("nested body", TOO_DEEP, "/generate",
                              b'{"input_ids": ' + b"[" * NESTING + b"]" * NESTING + b"}"))
    envelope = '{"forced_output_ids": ' + "[" * NESTING + "1" + "]" * NESTING + "}"
    requests.append(OverLimit("nested envelope", TOO_DEEP, "/generate",
                              json.dumps({"input_ids": [5, 6], "custom_logit_processor": envelope}).encode()))
    return requests, skipped


def fetch_limits(base: str) -> dict | None:
    """The server's request limits, or None (not served: the server predates them)."""
    reply = client.request(base, SCHEMA_PATH, timeout=30, method="GET")
    body = reply.body if reply.status == 200 and isinstance(reply.body, Mapping) else {}
    limits = body.get("request_limits")
    return dict(limits) if isinstance(limits, Mapping) else None


def judge(request: OverLimit, reply: client.Reply) -> dict:
    message = _message(reply)
    ok = reply.status == 400 and request.names in message
    return {"request": request.name, "status": reply.status, "ok": ok, "message": message[:300]}


def _trivial(base: str, count: int, timeout: float) -> list[float]:
    times = []
    for _ in range(count):
        reply = client.request(base, "/generate", TRIVIAL, timeout)
        times.append(reply.seconds if reply.status == 200 else float("inf"))
    return times


def _send(base: str, request: OverLimit, timeout: float, into: list, lock: threading.Lock) -> None:
    outcome = judge(request, client.request(base, request.path, request.body, timeout))
    with lock:
        into.append(outcome)


def run_bounds(base: str, trivial: int = 10, timeout: float = 120.0) -> dict[str, Any]:
    """The bounds phase's report (module docstring)."""
    limits = fetch_limits(base)
    if limits is None:
        return {"available": False, "error": f"GET {SCHEMA_PATH} serves no request_limits (not a patched server?)"}
    requests, skipped = over_limit_requests(limits)
    each = [judge(r, client.request(base, r.path, r.body, timeout)) for r in requests]
    alone = _trivial(base, trivial, timeout)
    burst = [r for r in requests if r.beside]
    beside, replies, lock = [], [], threading.Lock()
    for _ in range(trivial):  # each trivial request sent while one request over each limit is in flight
        threads = [threading.Thread(target=_send, args=(base, r, timeout, replies, lock), daemon=True) for r in burst]
        for thread in threads:
            thread.start()
        beside += _trivial(base, 1, timeout)
        for thread in threads:
            thread.join(timeout + 5)
    ratio = statistics.median(beside) / statistics.median(alone)  # a failed trivial request counts as inf
    return {
        "available": True, "limits": limits, "skipped": skipped, "each": each,
        "beside_sent": len(replies), "beside_refused": sum(1 for o in replies if o["ok"]),
        "beside_failures": [o for o in replies if not o["ok"]][:20],
        "alone_median_s": round(statistics.median(alone), 4), "beside_median_s": round(statistics.median(beside), 4),
        "latency_ratio": round(ratio, 2),
        "trivial_failed": sum(1 for t in alone + beside if t == float("inf")),
    }


def check_bounds(report: Mapping[str, Any] | None, max_ratio: float | None = None) -> Check:
    """Every over-limit request refused with a 400 naming its flag, alone and beside the trivial
    requests; every trivial request answered; the latency ratio judged only against ``max_ratio``."""
    if report is None:
        return Check.skipped("bounds", "--no-bounds")
    if not report.get("available"):
        return Check("bounds", FAIL, "the server serves no request limits", [str(report.get("error"))], 1)
    offenders = [f"{o['request']}: got {o['status']} ({o['message'][:120]}), expected a 400 naming the limit"
                 for o in report["each"] if not o["ok"]]
    offenders += [f"beside trivial requests, {o['request']}: got {o['status']} ({o['message'][:120]})"
                  for o in report["beside_failures"]]
    offenders += latency_offenders(report["trivial_failed"], report["latency_ratio"], max_ratio,
                                   "beside over-limit requests")
    detail = (f"{sum(o['ok'] for o in report['each'])} of {len(report['each'])} over-limit requests refused naming "
              f"the limit, {report['beside_refused']} of {report['beside_sent']} beside trivial requests; trivial "
              f"median {report['alone_median_s']} s alone, {report['beside_median_s']} s beside "
              f"({ratio_shown(report['latency_ratio'], max_ratio)})")
    if report["skipped"]:
        detail += "; not probed: " + "; ".join(report["skipped"])
    return Check.of("bounds", offenders, detail)
