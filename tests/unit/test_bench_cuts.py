"""``eval.bench_cuts``: the offline replay per namespace, the read floors and the summary row."""

from __future__ import annotations

import pytest

from eval.bench_cuts import BODY_PARAMS, floors, replay_arm, summary
from eval.traces.format import TraceCall
from tests.reference.exact_oracle import expected_reuse

E = 9  # message-end token


def call(conversation, turn, prompt, completion=(), salt=None):
    return TraceCall(conversation=conversation, turn=turn, prompt_ids=list(prompt), completion_ids=list(completion),
                     cache_salt=salt)


def test_floors_count_new_tokens_and_the_previous_completion():
    first = list(range(100, 110))
    calls = [call("a", 0, first, [11, 12]), call("a", 1, first + [11, 12, 13, 14], [15]),
             call("b", 0, first, [])]
    new, completions = floors(calls)
    assert new == 10 + 2 + 10  # a's first prompt, a's 13 and 14, b's first prompt (new to b)
    assert completions == 2  # 11 and 12 came from a's previous completion


def test_replay_arm_keeps_namespaces_apart_and_agrees_with_the_oracle():
    base = [1] * 20 + [E] + [2] * 30 + [E] + [1] * 10
    edited = base[:21] + [0] * 25 + [E] + [1] * 10
    calls = [call("a", 0, base, salt="x"), call("a", 1, edited, salt="x"), call("b", 0, edited, salt="y")]
    run = replay_arm(calls, piece=16, retain_every=64, message_end=E, min_piece=4)
    oracle = expected_reuse([base, edited], piece=16, retain_every=64, message_end=E, min_piece=4)
    assert run["reused"][:2] == oracle and oracle[1] == 21  # resumed right after the first message end
    assert run["reused"][2] == 0  # another namespace shares nothing
    assert [p[0][0] for p in run["pieces"]] == [0, 21, 0]


def test_summary_row():
    calls = [call("a", 0, [1] * 100, [2] * 5), call("a", 1, [1] * 200, [2] * 5)]
    row = summary(calls, [0, 100], [[(0, 64), (64, 100)], [(100, 164), (164, 200)]], questions=1)
    assert row["prefix"] == pytest.approx(100 / 300) and row["read"] == pytest.approx(200 / 300)
    assert row["pflops_per_question"] == pytest.approx(2 * BODY_PARAMS * (200 + 10) / 1e15)
    assert row["forwards_per_question"] == 4 and row["pieces_under_128"] == 1.0
    low, high = row["gpu_estimate_pflops_per_question"]
    assert low == pytest.approx(2 * BODY_PARAMS * (200 + 150 * 4 + 10) / 1e15) and high > low
