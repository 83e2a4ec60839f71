"""The event of an SCR request that fell back and was then retracted names the first reason.

``PolicyExecutor._retracted`` (patches/executor.py) keeps a fallback reason recorded before the
retraction and adds the retraction's own only where there was none: the event says why the
request stopped relocating first, not that it was read again afterwards. Driven through SCR's
real step carrier on the fake engine of ``scr_fake_engine.py`` (a first turn, then an edited
second turn with one relocated block), with a fault injected in one step, then a retraction.

* ``scr.save_state@1`` fails after the relocation's forward: the rows stay moved, so the
  retraction has a reason of its own ("retracted: ..."), which must not replace the earlier one;
* ``scr.round@1`` fails before any row moved: the retraction has no reason, which must not
  clear the earlier one.
"""

from __future__ import annotations

import json

import pytest
import torch

from policy import faults
from scr.settings import ScrConfig
from tests.integration import scr_fake_engine as fake

pytestmark = pytest.mark.integration
RETRACTED = "retracted: read again without relocation"


def second_turn_event(fault: str, forwards: int) -> dict:
    """The event of the second turn: ``fault`` injected during its first ``forwards`` forwards
    (1: phase 1 only; 2: phase 1 and the forward after the relocation), then retracted, read
    again from scratch and finished."""
    fake.OUT.clear()
    rotary = fake.scr_tensors.text_rotary
    fake.scr_tensors.text_rotary = lambda *args, **kwargs: fake.ROT
    try:
        env = fake.make(ScrConfig())
        old, new = fake.edited(5, [(1400, 1600)])
        fake.first_turn(env, "a.1", old)
        faults._PLAN = faults.parse(fault)
        faults._CALLS.clear()
        req = fake.Req("a.2", new)
        fake.enqueue(env, req)
        fake.match(env, req, 1024)
        fake.admit(env, req)
        fake.forward(env, req)
        if forwards == 2:
            fake.chunk_next(env, req)
            fake.admit(env, req)
            fake.forward(env, req)
        faults._PLAN = {}
        fake.release(env, req, finished=False)  # SGLang retracts it
        fake.enqueue(env, req, is_retracted=True)
        req.prefix_indices = torch.empty(0, dtype=torch.int64)
        fake.match(env, req, 0)
        fake.admit(env, req)
        fake.forward(env, req)
        fake.release(env, req)
    finally:
        faults._PLAN = {}
        faults._CALLS.clear()
        fake.scr_tensors.text_rotary = rotary
    (event,) = [json.loads(line[len("EVENT "):]) for line in fake.OUT
                if line.startswith("EVENT ") and '"rid": "a.2"' in line]
    return event


def test_a_retraction_with_a_reason_keeps_the_earlier_fallback():
    event = second_turn_event("scr.save_state@1", forwards=2)
    assert event["retractions"] == 1 and event["moved"] > 0  # the retraction had a reason of its own
    assert event["fallback"].startswith("save_state: InjectedFault"), event["fallback"]


def test_a_retraction_without_a_reason_does_not_clear_the_earlier_fallback():
    event = second_turn_event("scr.round@1", forwards=1)
    assert event["retractions"] == 1 and event["moved"] == 0
    assert event["fallback"].startswith("round: InjectedFault"), event["fallback"]


def test_a_retraction_alone_gives_its_own_reason():
    for forwards in (1, 2):
        event = second_turn_event("", forwards)
        assert (event["retractions"], event["fallback"]) == (1, RETRACTED)
