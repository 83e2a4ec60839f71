"""The soak's request-safety phases, run after the load with no other traffic:

* ``fuzz``: the schema-driven malformed set (``schema_fuzz``): every field of ``/generate``,
  ``/v1/completions`` and ``/v1/chat/completions``, each wrong kind of value; a 4xx naming the
  field where the schema refuses, never a 5xx, the server alive throughout;
* ``bomb``: the regex-bomb probe (``schema_fuzz.regex_bomb``): trivial requests beside a decode
  whose ``stop_regex`` backtracks catastrophically under Python's ``re``, against the same beside a
  plain decode;
* ``routes``: the route table's fuzz (``route_fuzz``): every open route answers, junk beside it
  gets no 5xx, every closed route 404, every admin route 401 (403 without a configured key)
  without the key, and with the key ``/server_info`` acts;
* ``namespaces``: the pairs of names that SGLang 0.5.16 mapped to one cache namespace
  (``policy/namespace.py``), sent after a prime: each must reuse nothing, while a positive control
  (the same tenant on another route) must reuse the prime, so the probe can see reuse at all.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from eval.soak import client, route_fuzz, schema_fuzz
from eval.soak.checks import FAIL, Check, latency_offenders, ratio_shown
from policy.namespace import SEP, namespace

BOMB_MAX_RATIO = 3.0  # latency beside the bomb / beside a plain decode; unpatched, requests time out
# Prime prompts span two of exact's pieces as the soak serves it (128 tokens): exact keeps a
# state at a prompt's last piece end, so a shorter prime would leave it nothing to reuse and the
# positive control could not see reuse under exact.
NAMESPACE_PROMPT_TOKENS = 320


# ----------------------------------------------------------------------------------------- fuzz


def run_fuzz(base: str, max_cases: int | None, seed: int, progress=None) -> dict[str, Any]:
    """The fuzz phase's report: ``summary``, the failed cases (first 50) and whether the server
    serves its schema at all (``available``)."""
    try:
        routes = schema_fuzz.fetch_routes(base)
    except RuntimeError as exc:
        return {"available": False, "error": str(exc)}
    cases = schema_fuzz.cases(routes)
    total = len(cases)
    if max_cases is not None and max_cases < total:
        cases = random.Random(f"fuzz:{seed}").sample(cases, max_cases)
    report = schema_fuzz.run(base, cases, progress=progress)
    return {"available": True, "cases_in_schema": total, "summary": report.summary(),
            "failures": [{"case": o.case.name, "status": o.status, "why": o.why, "message": o.message[:300]}
                         for o in report.failures[:50]]}


def _not_walked(name: str, report: Mapping[str, Any] | None, skipped: str, unserved: str) -> Check | None:
    """The check of a walk that did not run (``skipped``) or found nothing to walk (``unserved``)."""
    if report is None:
        return Check.skipped(name, skipped)
    if not report.get("available"):
        return Check(name, FAIL, unserved, [str(report.get("error"))], 1)
    return None


def _dead_first(offenders: list[str], summary: Mapping[str, Any]) -> list[str]:
    dead = [f"the server stopped answering after {summary['dead_at']}"] if summary["dead_at"] else []
    return dead + offenders


def check_fuzz(fuzz: Mapping[str, Any] | None) -> Check:
    not_walked = _not_walked("schema_fuzz", fuzz, "--fuzz none", "the server serves no request schema")
    if not_walked is not None:
        return not_walked
    summary = fuzz["summary"]
    offenders = _dead_first([f"{f['case']}: {f['why']} ({f['status']}: {f['message'][:120]})"
                             for f in fuzz["failures"]], summary)
    detail = (f"{summary['cases']} of {fuzz['cases_in_schema']} cases: {summary['refused_4xx']} of "
              f"{summary['refused_by_schema']} refused with a 4xx naming the field, "
              f"{summary['accepted_by_schema']} accepted by the schema, {summary['5xx']} 5xx")
    return Check("schema_fuzz", FAIL if offenders else "pass", detail, offenders[:20],
                 max(len(offenders), summary["failures"]))


# --------------------------------------------------------------------------------------- routes


def run_routes(base: str, admin_key: str | None, model: str | None = None) -> dict[str, Any]:
    """The route phase's report (``route_fuzz``), or ``available: False`` without a table."""
    try:
        report = route_fuzz.run(base, admin_key, model, alive=schema_fuzz.alive)
    except RuntimeError as exc:
        return {"available": False, "error": str(exc)}
    return {"available": True, **route_fuzz.report_json(report)}


def check_routes(routes: Mapping[str, Any] | None) -> Check:
    not_walked = _not_walked("routes", routes, "not run", "the server serves no route table")
    if not_walked is not None:
        return not_walked
    summary = routes["summary"]
    offenders = _dead_first([f"{f['probe']}: {f['why']} ({f['status']})" for f in routes["failures"]], summary)
    if summary["validated_agree"]:
        offenders.append(summary["validated_agree"])
    acts = summary["admin_acts"]
    if acts is not None and not acts["ok"]:
        offenders.append(f"with the admin key: {acts['why']} ({acts['status']})")
    by = summary["by_verdict"]
    detail = (f"{summary['probes']} probes of the table ({summary['counts']}): {by['open']} on open routes, "
              f"{by['closed']} on closed, {by['admin']} on admin without the key; with the key: "
              f"{'acts' if acts and acts['ok'] and acts['status'] else (acts or {}).get('why', 'not checked')}")
    return Check("routes", FAIL if offenders else "pass", detail, offenders[:20], len(offenders))


# ----------------------------------------------------------------------------------------- bomb


def run_bomb(base: str, bomb_tokens: int, trivial: int = 10) -> dict[str, Any]:
    report = schema_fuzz.regex_bomb(base, trivial=trivial, bomb_tokens=bomb_tokens)
    out = report.summary()
    out["trivial_failed"] = sum(1 for t in report.beside_bomb_s + report.beside_plain_s + report.alone_s
                                if t == float("inf"))
    return out


def check_bomb(bomb: Mapping[str, Any] | None, max_ratio: float | None = BOMB_MAX_RATIO) -> Check:
    """The bomb decoded (a 200) and every trivial request beside it got a 200; their latency beside
    it over beside a plain decode is judged against ``max_ratio`` (None: reported only, as in the
    tests, which may not depend on the machine's speed; unpatched, the trivial requests timed out)."""
    if bomb is None:
        return Check.skipped("regex_bomb", "--no-regex-bomb")
    offenders = [f"the bomb request got {bomb['bomb_status']}"] if bomb["bomb_status"] != 200 else []
    offenders += latency_offenders(bomb["trivial_failed"], bomb["bomb_over_plain"], max_ratio, "beside the bomb",
                                   "their time beside a plain decode")
    detail = (f"trivial request median {bomb['alone_median_s']} s alone, {bomb['beside_plain_median_s']} s beside "
              f"a plain decode, {bomb['beside_bomb_median_s']} s beside the bomb "
              f"({ratio_shown(bomb['bomb_over_plain'], max_ratio)})")
    return Check.of("regex_bomb", offenders, detail)


# ----------------------------------------------------------------------------------- namespaces


@dataclass(frozen=True)
class NamespaceProbe:
    """One request of a namespace sequence: ``role`` is ``prime``, ``isolated`` (must reuse
    nothing of the prime), ``same`` (the same namespace: must reuse the prime) or ``refused``."""

    route: str  # "generate" | "completions"
    cache_salt: str | None
    extra_key: str | None
    role: str

    def expected_namespace(self) -> str | None:
        if self.route == "generate":
            return self.extra_key
        return namespace(self.cache_salt, self.extra_key)


def namespace_sequences(tag: str) -> list[list[NamespaceProbe]]:
    """The collisions of SGLang 0.5.16, with names unique to this run (``tag``).

    The positive control (``same``) follows its prime at once: the isolated probes each cache
    another namespace's copy of the prompt, and under a small recurrent-state pool (the engine
    tests run radix with 32 slots) they would evict the prime's states first, so a control sent
    after them reused nothing for a reason that is not namespaces. Sent first, it also leaves the
    freshest entry a colliding probe would hit."""
    a, b, t = f"ns-{tag}-A", "B", f"ns-{tag}-tenant"
    return [
        [NamespaceProbe("completions", a + b, None, "prime"),
         NamespaceProbe("generate", None, a + b, "same"),
         NamespaceProbe("completions", a, b, "isolated"),
         NamespaceProbe("completions", None, a + b, "isolated")],
        [NamespaceProbe("generate", None, t + "X", "prime"),
         NamespaceProbe("completions", t, "X", "isolated")],
        [NamespaceProbe("completions", f"ns-{tag}-plain", None, "prime"),
         NamespaceProbe("completions", "", None, "refused"),
         NamespaceProbe("generate", None, f"ns-{tag}-plain{SEP}x", "refused")],
    ]


def namespace_payload(probe: NamespaceProbe, rid: str, prompt: list[int], model: str) -> tuple[str, dict]:
    if probe.route == "generate":
        body = {"rid": rid, "input_ids": prompt, "extra_key": probe.extra_key,
                "sampling_params": {"temperature": 0.0, "max_new_tokens": 2}}
        return "/generate", body
    body = {"model": model, "prompt": prompt, "max_tokens": 2, "temperature": 0.0, "rid": rid}
    for key in ("cache_salt", "extra_key"):
        if getattr(probe, key) is not None:
            body[key] = getattr(probe, key)
    return "/v1/completions", body


def send_namespace_probes(base: str, run: str, model: str, seed: int, vocab_top: int = 400) -> list[dict]:
    """Send every sequence (a fresh prompt each) and return one record per request."""
    rng = random.Random(f"namespaces:{seed}")
    records = []
    for number, sequence in enumerate(namespace_sequences(run)):
        prompt = [rng.randrange(10, vocab_top) for _ in range(NAMESPACE_PROMPT_TOKENS)]
        # Followers append to the prime's prompt: every policy reuses a cached prompt it extends
        # (exact resumes only before a prompt's last token, so a plain repeat may reuse nothing).
        longer = prompt + [rng.randrange(10, vocab_top) for _ in range(NAMESPACE_PROMPT_TOKENS // 3)]
        for turn, probe in enumerate(sequence, 1):
            rid = f"{run}.ns{number:02d}.{turn}"
            path, body = namespace_payload(probe, rid, prompt if probe.role == "prime" else longer, model)
            reply = client.request(base, path, body, timeout=120)
            records.append({"rid": rid, "kind": "namespace", "endpoint": path, "role": probe.role,
                            "cache_salt": probe.cache_salt, "extra_key": probe.extra_key,
                            "namespace": probe.expected_namespace() if probe.role != "refused" else None,
                            "status": reply.status, "error": (reply.error or "")[:300] or None,
                            "seconds": round(reply.seconds, 4)})
    return records


def check_namespaces(records: Sequence[dict], events: Mapping[str, dict] | None) -> Check:
    """``isolated`` probes reuse nothing, ``same`` reuses, ``refused`` get a 4xx, and each event
    carries the namespace its names map to."""
    if events is None:
        return Check.skipped("namespaces", "no --events")
    offenders, reused_same = [], []
    for r in records:
        rid, role, status = r["rid"], r["role"], r.get("status")
        if role == "refused":
            if not (isinstance(status, int) and 400 <= status < 500):
                offenders.append(f"{rid} (cache_salt {r['cache_salt']!r}, extra_key {r['extra_key']!r}): "
                                 f"got {status}, expected a 4xx")
            continue
        if status != 200:
            offenders.append(f"{rid}: got {status or r.get('error')}")
            continue
        event = events.get(rid)
        if event is None:
            offenders.append(f"{rid}: no event")
            continue
        if event.get("cache_salt") != r["namespace"]:
            offenders.append(f"{rid}: event namespace {event.get('cache_salt')!r} != {r['namespace']!r}")
        shared = int(event.get("prefix_reused") or 0) + int(event.get("moved") or 0)
        if role == "isolated" and shared:
            offenders.append(f"{rid} (cache_salt {r['cache_salt']!r}, extra_key {r['extra_key']!r}): "
                             f"reused {shared} tokens of another namespace")
        if role == "same":
            reused_same.append(shared)
            if not shared:
                offenders.append(f"{rid}: the same namespace on another route reused nothing (the probe cannot "
                                 "see reuse)")
    isolated = sum(1 for r in records if r["role"] == "isolated")
    detail = (f"{isolated} name pairs that SGLang 0.5.16 mapped to one namespace reused nothing; the positive "
              f"control reused {statistics.mean(reused_same) if reused_same else 0:g} tokens")
    return Check.of("namespaces", offenders, detail)
