"""The soak's request-limit probes (``eval/soak/bounds.py``) on plain data: the requests built just
over each limit, and the check over recorded replies; the ratio judged only when asked."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from eval.soak import bounds, safety
from eval.soak.checks import FAIL, PASS, SKIPPED
from eval.soak.client import Reply
from serving.field_rules import MAX_N
from serving.request_limits import FLAGS, MIB, RequestLimits

DEFAULTS = asdict(RequestLimits())


def built(limits) -> dict[str, bounds.OverLimit]:
    requests, _ = bounds.over_limit_requests(limits)
    return {r.name: r for r in requests}


def test_each_request_is_just_over_its_limit_at_the_defaults():
    requests = built(DEFAULTS)
    assert set(requests) == {"prompts", "sequences", "stop_regex count", "stop_regex characters", "stop_regex max_mem",
                             "body size", "nested body", "nested envelope"}
    prompts = json.loads(requests["prompts"].body)["input_ids"]
    assert len(prompts) == DEFAULTS["max_prompts"] + 1
    sequences = json.loads(requests["sequences"].body)
    count, n = len(sequences["input_ids"]), sequences["sampling_params"]["n"]
    assert count <= DEFAULTS["max_prompts"] and n <= MAX_N and count * n > DEFAULTS["max_sequences"]
    patterns = json.loads(requests["stop_regex count"].body)["sampling_params"]["stop_regex"]
    assert len(set(patterns)) == DEFAULTS["max_stop_regexes"] + 1
    assert sum(map(len, patterns)) <= DEFAULTS["max_stop_regex_chars"]  # over the count, not the characters
    long = json.loads(requests["stop_regex characters"].body)["sampling_params"]["stop_regex"]
    assert len(long) == DEFAULTS["max_stop_regex_chars"] + 2
    assert json.loads(requests["stop_regex max_mem"].body)["sampling_params"]["stop_regex"] == bounds.HEAVY_PATTERN
    assert len(requests["body size"].body) > DEFAULTS["max_body_bytes"] and not requests["body size"].beside
    assert requests["nested body"].body.count(b"[") == bounds.NESTING
    for name, request in requests.items():
        assert request.names == {"prompts": FLAGS["max_prompts"], "sequences": FLAGS["max_sequences"],
                                 "stop_regex count": FLAGS["max_stop_regexes"],
                                 "stop_regex characters": FLAGS["max_stop_regex_chars"],
                                 "stop_regex max_mem": FLAGS["stop_regex_max_mem"],
                                 "body size": FLAGS["max_body_bytes"]}.get(name, bounds.TOO_DEEP)


@pytest.mark.parametrize("changes, count, n", [
    ({"max_sequences": 10}, 1, 11),
    ({"max_sequences": 300}, 3, 128),
    ({"max_prompts": 2, "max_sequences": 200}, 2, 128),
    ({"max_prompts": 1, "max_sequences": 100}, 1, 101),
])
def test_the_sequence_request_fits_the_prompt_limit_and_n(changes, count, n):
    body = json.loads(built({**DEFAULTS, **changes})["sequences"].body)
    assert (len(body["input_ids"]), body["sampling_params"]["n"]) == (count, n)


def test_limits_no_request_can_exceed_are_reported_not_probed():
    requests, skipped = bounds.over_limit_requests({**DEFAULTS, "max_prompts": 2, "max_sequences": 1000,
                                                    "stop_regex_max_mem": 8 * MIB})
    names = {r.name for r in requests}
    assert "sequences" not in names and "stop_regex max_mem" not in names
    assert skipped == ["max_sequences: 2 prompts x n = 128 stays within 1000",
                       f"stop_regex_max_mem: {8 * MIB} bytes compile issue 33's pattern"]
    _, skipped = bounds.over_limit_requests({**DEFAULTS, "max_stop_regex_chars": 100})
    assert skipped and skipped[0].startswith("stop_regex_max_mem")  # the characters limit refuses it first


@pytest.mark.parametrize("status, message, ok", [
    (400, "input_ids: 65 prompts in one request, over the limit of 64 (--max-prompts 64)", True),
    (400, "input_ids: something else", False),
    (500, "... --max-prompts ...", False),
    (200, "", False),
])
def test_judge_wants_a_400_naming_the_limit(status, message, ok):
    request = built(DEFAULTS)["prompts"]
    outcome = bounds.judge(request, Reply(status, {"error": {"message": message}}, None, 0.01))
    assert outcome["ok"] is ok and outcome["request"] == "prompts"


def report(**changes):
    base = {"available": True, "limits": DEFAULTS, "skipped": [],
            "each": [{"request": "prompts", "status": 400, "ok": True, "message": "--max-prompts"}],
            "beside_sent": 40, "beside_refused": 40, "beside_failures": [], "alone_median_s": 0.05,
            "beside_median_s": 0.06, "latency_ratio": 1.2, "trivial_failed": 0}
    return {**base, **changes}


def test_check_bounds():
    assert bounds.check_bounds(None).status == SKIPPED
    assert bounds.check_bounds({"available": False, "error": "no limits"}).status == FAIL
    passed = bounds.check_bounds(report())
    assert passed.status == PASS and "1.2x, not judged" in passed.detail
    assert bounds.check_bounds(report(latency_ratio=50.0)).status == PASS  # not judged: measured only
    assert bounds.check_bounds(report(latency_ratio=50.0), max_ratio=3.0).status == FAIL
    assert bounds.check_bounds(report(latency_ratio=2.9), max_ratio=3.0).status == PASS
    refused_wrong = report(each=[{"request": "prompts", "status": 500, "ok": False, "message": "boom"}])
    assert bounds.check_bounds(refused_wrong).offenders[0].startswith("prompts: got 500 (boom)")
    beside = report(beside_failures=[{"request": "sequences", "status": 200, "ok": False, "message": ""}])
    assert bounds.check_bounds(beside).status == FAIL
    assert bounds.check_bounds(report(trivial_failed=1)).status == FAIL
    noted = bounds.check_bounds(report(skipped=["max_sequences: fits"]))
    assert noted.status == PASS and noted.detail.endswith("not probed: max_sequences: fits")


def test_the_bomb_ratio_is_judged_only_when_asked():
    bomb = {"alone_median_s": 0.02, "beside_plain_median_s": 0.03, "beside_bomb_median_s": 0.3,
            "bomb_over_plain": 10.0, "bomb_status": 200, "bomb_seconds": 2.0, "plain_seconds": 2.0, "trivial_failed": 0}
    assert safety.check_bomb(bomb).status == FAIL  # the CLI's default judges it (3x)
    unjudged = safety.check_bomb(bomb, max_ratio=None)
    assert unjudged.status == PASS and "10.0x, not judged" in unjudged.detail
    assert safety.check_bomb({**bomb, "bomb_status": None}, max_ratio=None).status == FAIL
