"""patches/executor.py: a request's event carries the FIRST fallback reason it met.

A contained step failure records its reason (``PolicyExecutor._failed``); a retraction adds the
step carrier's reason (``steps.retracted``: why the plan stopped) only where none was recorded,
and a carrier with nothing to say (None) clears nothing. With a stand-in carrier, so the rule is
checked here in milliseconds; ``tests/integration/test_fallback_reason_survives_retraction.py``
checks it through SCR's real carrier."""

from __future__ import annotations

import json

import pytest

from patches.executor import PolicyExecutor
from policy.carrier import CarrierDefaults
from policy.radix import RadixConfig, RadixPolicy
from serving.event_writer import EventWriter
from tests.unit.test_executor import FakeReq, FinishLength


class Carrier(CarrierDefaults):
    """The step-carrier call the executor makes on a retraction; the rest do nothing."""

    def __init__(self, retraction_reason: str | None):
        self.retraction_reason = retraction_reason

    def retracted(self, req, record) -> str | None:
        return self.retraction_reason


def event_after(tmp_path, earlier: str | None, retraction_reason: str | None, retractions: int = 1) -> dict:
    path = tmp_path / "events.jsonl"
    executor = PolicyExecutor(RadixPolicy(RadixConfig()), EventWriter(str(path)), steps=Carrier(retraction_reason))
    req = FakeReq("r", list(range(12)))
    executor.on_matched(req)
    if earlier is not None:
        record = executor._tracked["r"]
        executor.contain(earlier, req, record, "plain_read", lambda: 1 / 0)
    for _ in range(retractions):
        executor.on_release(req)  # not finished: SGLang took it back
    req.finished_reason, req.output_ids = FinishLength(), [1]
    executor.on_release(req)
    (event,) = [json.loads(line) for line in path.read_text().splitlines()]
    return event


@pytest.mark.parametrize("retraction_reason", ["retracted: read again without relocation", None])
def test_a_retraction_keeps_an_earlier_reason(tmp_path, retraction_reason):
    event = event_after(tmp_path, "round", retraction_reason)
    assert event["fallback"] == "round: ZeroDivisionError: division by zero" and event["retractions"] == 1


def test_a_retraction_gives_its_reason_when_there_was_none(tmp_path):
    event = event_after(tmp_path, None, "retracted: read again without relocation", retractions=2)
    assert event["fallback"] == "retracted: read again without relocation" and event["retractions"] == 2


def test_a_retraction_without_a_reason_leaves_no_fallback(tmp_path):
    event = event_after(tmp_path, None, None)
    assert event["fallback"] is None and event["retractions"] == 1
