"""eval/soak/safety.py and schema_fuzz.py on recorded data: the checks fail on what they name.
(End to end against servers: tests/engine/test_validation_server.py and test_soak.py.)"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from eval.http import Response
from eval.soak import safety, schema_fuzz
from eval.soak.checks import FAIL, PASS, SKIPPED
from policy.namespace import namespace
from serving.route_schemas import GENERATE, RouteSchema
from serving.schema import Field, ListOf, OneOf, Scalar, Struct

SAMPLING = Struct("SamplingParams", {"max_new_tokens": Field(Scalar("int")), "n": Field(Scalar("int"), nullable=False),
                                     "temperature": Field(Scalar("float"), nullable=False)}, closed=True)
BODY = Struct("GenerateReqInput", {
    "input_ids": Field(OneOf((ListOf(ListOf(Scalar("int"))), ListOf(Scalar("int"))))),
    "text": Field(OneOf((Scalar("str"), ListOf(Scalar("str"))))),
    "sampling_params": Field(OneOf((ListOf(SAMPLING), SAMPLING))),
    "extra_key": Field(Scalar("str")),
    "rid": Field(Scalar("str")),
})
ROUTE = RouteSchema(GENERATE, BODY, exclusive=(("text", "input_ids"),), non_empty=("text",), names=("extra_key",),
                    server_only={"rid": "made up for the test"})


def test_cases_put_each_wrong_value_at_each_field_and_predict_the_named_field():
    cases = schema_fuzz.cases({GENERATE: ROUTE})
    by_name = {c.name: c for c in cases}
    n_null = by_name[f"{GENERATE} sampling_params.n <- null"]
    assert n_null.refused_at is None  # null for a defaulted field: unset, accepted
    assert by_name[f"{GENERATE} sampling_params.n <- string"].refused_at == "sampling_params.n"
    assert by_name[f"{GENERATE} text <- list"].refused_at == "text[0]"
    assert by_name[f"{GENERATE} text <- string"].refused_at == "input_ids"  # text and input_ids together
    assert by_name[f"{GENERATE} extra_key <- string"].refused_at is None
    assert by_name[f"{GENERATE} extra_key <- lone surrogate"].refused_at == "extra_key"
    assert by_name[f"{GENERATE} rid <- string"].refused_at == "rid"  # server-only in this table
    assert by_name[f"{GENERATE} sampling_params.max_new_tokens <- huge int"].body["sampling_params"] == {
        "max_new_tokens": 10**30, "temperature": 0.0}
    fields = ["input_ids", "text", "sampling_params", "max_new_tokens", "n", "temperature", "extra_key", "rid"]
    assert len(cases) == len(schema_fuzz.schema.wrong_values()) * len(fields)


def test_route_rules_json_round_trip():
    again = RouteSchema.from_json(GENERATE, schema_fuzz.schema.to_json(BODY), ROUTE.rules_json())
    for case in schema_fuzz.cases({GENERATE: ROUTE}):
        assert schema_fuzz._refused_at(again, case.body) == case.refused_at


@pytest.mark.parametrize("refused_at, status, message, ok", [
    ("sampling_params.n", 400, "sampling_params.n: must be an integer", True),
    ("sampling_params.n", 400, "something else", False),
    ("sampling_params.n", 200, "", False),
    ("sampling_params.n", 500, "boom", False),
    (None, 400, "SGLang's own check", True),
    (None, 200, "", True),
    (None, 500, "boom", False),
    (None, None, "timeout", False),
])
def test_judge(refused_at, status, message, ok):
    case = schema_fuzz.Case(GENERATE, ("sampling_params", "n"), "string", {}, refused_at)
    reply = Response(status, {"message": message} if status else None, None if status else "timed out")
    assert schema_fuzz.judge(case, reply).ok is ok


def fuzz_report(failures=(), dead_at=None):
    return {"available": True, "cases_in_schema": 10,
            "summary": {"cases": 10, "refused_by_schema": 6, "refused_4xx": 6 - len(failures), "accepted_by_schema": 4,
                        "5xx": 0, "no_answer": 0, "failures": len(failures), "alive_checks": 1, "dead_at": dead_at},
            "failures": [{"case": f, "status": 500, "why": "a 5xx", "message": "x"} for f in failures]}


def test_check_fuzz():
    assert safety.check_fuzz(None).status == SKIPPED
    assert safety.check_fuzz(fuzz_report()).status == PASS
    assert safety.check_fuzz(fuzz_report(["/generate n <- string"])).status == FAIL
    assert safety.check_fuzz(fuzz_report(dead_at="/generate x <- nested")).status == FAIL
    assert safety.check_fuzz({"available": False, "error": "404"}).status == FAIL


def bomb(**changes):
    base = {"alone_median_s": 0.02, "beside_plain_median_s": 0.03, "beside_bomb_median_s": 0.03,
            "bomb_over_plain": 1.0, "bomb_status": 200, "bomb_seconds": 2.0, "plain_seconds": 2.0, "trivial_failed": 0}
    return {**base, **changes}


def test_check_bomb():
    assert safety.check_bomb(bomb()).status == PASS
    assert safety.check_bomb(bomb(bomb_over_plain=safety.BOMB_MAX_RATIO + 0.1)).status == FAIL
    assert safety.check_bomb(bomb(bomb_over_plain=float("inf"))).status == FAIL
    assert safety.check_bomb(bomb(bomb_status=None)).status == FAIL
    assert safety.check_bomb(bomb(trivial_failed=2)).status == FAIL


@dataclass
class Probe:
    """What the server did for one namespace probe."""

    reused: int = 0
    status: int = 200
    recorded: str | None = field(default="same")  # "same": the event has the expected namespace


def namespace_run(outcomes: dict[tuple[int, int], Probe]):
    records, events = [], {}
    for number, sequence in enumerate(safety.namespace_sequences("t")):
        for turn, probe in enumerate(sequence, 1):
            rid = f"t.ns{number:02d}.{turn}"
            got = outcomes.get((number, turn), Probe(status=400 if probe.role == "refused" else 200,
                                                     reused=5 if probe.role == "same" else 0))
            expected = probe.expected_namespace() if probe.role != "refused" else None
            records.append({"rid": rid, "role": probe.role, "cache_salt": probe.cache_salt,
                            "extra_key": probe.extra_key, "namespace": expected, "status": got.status})
            if got.status == 200:
                events[rid] = {"cache_salt": expected if got.recorded == "same" else "other",
                               "prefix_reused": got.reused, "moved": 0}
    return records, events


def test_check_namespaces_passes_a_correct_run_and_fails_each_fault():
    assert safety.check_namespaces(*namespace_run({})).status == PASS
    assert safety.check_namespaces([], None).status == SKIPPED
    shared = safety.check_namespaces(*namespace_run({(0, 3): Probe(reused=64)}))  # "A" + "B" read "AB"'s prefix
    assert shared.status == FAIL and "reused 64 tokens of another namespace" in shared.offenders[0]
    blind = safety.check_namespaces(*namespace_run({(0, 2): Probe(reused=0)}))  # the control saw no reuse
    assert blind.status == FAIL and "cannot see reuse" in blind.offenders[0]
    accepted = safety.check_namespaces(*namespace_run({(2, 2): Probe(status=200)}))  # the empty salt accepted
    assert accepted.status == FAIL
    renamed = safety.check_namespaces(*namespace_run({(1, 2): Probe(recorded="other")}))
    assert renamed.status == FAIL and "event namespace" in renamed.offenders[0]


def test_namespace_sequences_cover_the_collisions_of_sglang_0_5_16():
    sequences = safety.namespace_sequences("t")
    # The control follows its prime at once (before other namespaces' copies can evict the prime).
    assert [p.role for p in sequences[0][:2]] == ["prime", "same"]
    probes = [p for seq in sequences for p in seq]
    joined = {(p.cache_salt or "") + (p.extra_key or "") for p in probes if p.role in ("prime", "isolated")}
    assert len({p.expected_namespace() for p in probes if p.role != "refused"}) == 6  # all apart but the control
    assert namespace("ns-t-A" + "B", None) in {p.expected_namespace() for p in probes if p.role == "same"}
    assert "ns-t-AB" in joined and "ns-t-tenantX" in joined
