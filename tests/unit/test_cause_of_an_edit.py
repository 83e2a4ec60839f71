"""eval/accounting/causes.py ``classify``: an edit is an edit from whichever turn it starts, turn 0
included; only a call whose message list only grew (``edited_from_turn`` recorded as None) is the
template's.

Why a file of its own: ``edited_from_turn`` is the index of the first message that changed
(``eval/traces/standin.first_difference``), and 0 (the system prompt or the question replaced) is
a real edit that Python's truthiness reads as "no edit": the cause would then fall through to
``template`` and the paper's split of SCR's moved tokens between template stripping and the
agent's edits (``docs/eval.md``) would lean the wrong way."""

from __future__ import annotations

import pytest

from eval.accounting.causes import attribute, classify
from eval.traces.format import TraceCall

BASE = list(range(100, 160))


def call(turn, prompt, **meta) -> TraceCall:
    return TraceCall(conversation="c", turn=turn, prompt_ids=list(prompt), completion_ids=[1, 2], cache_salt=None,
                     meta=meta)


def diverging(**meta) -> list[TraceCall]:
    """A first call, then one whose prompt leaves the first one's sequence at token 10."""
    return [call(0, BASE, edited_from_turn=None, rolled_back=False),
            call(1, BASE[:10] + [7] * 60, rolled_back=False, **meta)]


@pytest.mark.parametrize("edited_from", [0, 1, 5])
def test_an_edit_from_any_turn_is_an_edit(edited_from):
    assert classify(diverging(edited_from_turn=edited_from))["c.1"] == "edit"


def test_only_a_recorded_none_is_the_template_and_no_record_is_other():
    assert classify(diverging(edited_from_turn=None))["c.1"] == "template"
    assert classify(diverging())["c.1"] == "other"  # the trace says nothing about the messages


def test_an_edit_of_turn_0_is_counted_under_edit_not_template():
    causes = classify(diverging(edited_from_turn=0))
    rows = [{"rid": "run.c.0", "prompt_tokens": 60, "prefix_reused": 0, "moved": 0, "read": 60},
            {"rid": "run.c.1", "prompt_tokens": 70, "prefix_reused": 10, "moved": 40, "read": 20}]
    split = attribute(rows, causes, "run")
    assert (split["edit"]["calls"], split["edit"]["moved"]) == (1, 40)
    assert (split["template"]["calls"], split["template"]["moved"]) == (0, 0)
