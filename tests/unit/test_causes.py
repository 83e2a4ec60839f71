"""eval/accounting/causes.py: each call's cause, the moved / read tokens per cause, the offline bound."""

from __future__ import annotations

import pytest

from eval.accounting.causes import attribute, classify, relocation_read_bound, session_use
from eval.traces.format import TraceCall


def call(turn, prompt, completion=(9, 9), **meta) -> TraceCall:
    return TraceCall(conversation="q1", turn=turn, prompt_ids=list(prompt), completion_ids=list(completion),
                     cache_salt=None, meta={"edited_from_turn": None, "rolled_back": False, **meta})


BASE = list(range(100, 200))


def trace():
    return [
        call(0, BASE, completion=(1, 2, 3)),                         # first
        call(1, BASE + [1, 2] + [50] * 10),                          # append: previous prompt + completion[:-1]
        call(2, BASE[:60] + [7] * 40 + [50] * 10, edited_from_turn=3),  # the agent deleted a message
        call(3, BASE[:30] + [8] * 30, rolled_back=True),             # rollback
        call(4, BASE[:20] + [6] * 50),                               # messages only grew: the template re-rendered
        TraceCall(conversation="q1", turn=5, prompt_ids=[1, 2, 3], completion_ids=[4], cache_salt=None, meta={}),
    ]


def test_classify():
    assert classify(trace()) == {"q1.0": "first", "q1.1": "append", "q1.2": "edit", "q1.3": "rollback",
                                 "q1.4": "template", "q1.5": "other"}


def test_attribute_sums_each_cause_and_its_share_of_all_prompt_tokens():
    causes = classify(trace())
    rows = [{"rid": f"r.q1.{t}", "prompt_tokens": 100, "prefix_reused": 60, "moved": 10 * (t == 4), "read": 40 - 10 * (t == 4)}
            for t in range(6)]
    out = attribute(rows, causes, "r")
    assert out["template"]["moved"] == 10 and out["template"]["moved_points"] == pytest.approx(100 * 10 / 600)
    assert out["append"]["calls"] == 1 and out["append"]["read"] == 40
    assert sum(c["prompt_tokens"] for c in out.values()) == 600
    assert sum(c["read_points"] + c["moved_points"] + c["prefix_reused_points"] for c in out.values()) == pytest.approx(100)


def test_the_bound_counts_reads_up_to_the_end_of_an_earlier_relocated_region():
    calls = [call(0, BASE), call(1, BASE[:40] + BASE[50:] + [5] * 10), call(2, BASE[:40] + BASE[50:] + [5] * 10 + [6] * 20)]
    # turn 1 relocated rows [40, 80) of its prompt; turn 2 shares turn 1's sequence and resumed at 40
    rows = {"r.q1.1": {"prefix_reused": 40, "moved": 40}, "r.q1.2": {"prefix_reused": 40, "moved": 0}}
    bound = relocation_read_bound(calls, rows, {"r.q1.1": [(40, 40)]}, "r")
    assert bound["tokens"] == 40 and bound["calls"] == 1
    resumed_past = relocation_read_bound(calls, {**rows, "r.q1.2": {"prefix_reused": 95, "moved": 0}}, {"r.q1.1": [(40, 40)]}, "r")
    assert resumed_past["tokens"] == 0
    assert relocation_read_bound(calls, rows, {}, "r")["tokens"] == 0


def test_session_use_counts_merges_and_calls_that_missed_their_own_session():
    calls = trace() + [TraceCall(conversation="q2", turn=t, prompt_ids=[5] * 10, completion_ids=[1], cache_salt=None,
                                 meta={}) for t in range(3)]
    sessions = {"r.q1.0": "s1", "r.q1.1": "s2", "r.q1.2": "s2", "r.q1.3": "s3", "r.q1.4": "s2",
                "r.q2.0": "s9", "r.q2.1": "s3", "r.q2.2": "s3"}  # q1.5 has no trace line
    rows = {f"r.q1.{t}": {"read": 10 * t} for t in range(6)} | {f"r.q2.{t}": {"read": 1} for t in range(3)}
    out = session_use(calls, sessions, rows, "r")
    # q1: s1 -> s2 (turn 1), s2 -> s3 (turn 3), s3 -> s2 (turn 4); q2: s9 -> s3 (turn 1)
    assert out["split_calls"] == 4
    assert out["split_read_tokens"] == 10 + 30 + 40 + 1
    assert out["split_prompt_tokens"] == len(calls[1].prompt_ids) + len(calls[3].prompt_ids) + len(calls[4].prompt_ids) + 10
    assert (out["sessions"], out["conversations"], out["merged"]) == (4, 2, 1)  # s3 served q1 and q2
    total = sum(len(c.prompt_ids) for c in calls)
    assert out["split_read_points"] == pytest.approx(100 * 81 / total)
    assert session_use(calls, {}, rows, "r")["sessions"] == 0


def test_append_needs_the_previous_completion_up_to_its_last_token():
    """The next prompt holds the previous completion without its final (end-of-turn) token; one
    that keeps only part of it is no append."""
    first = TraceCall(conversation="q3", turn=0, prompt_ids=BASE, completion_ids=[1, 2, 3], cache_salt=None, meta={})
    whole = TraceCall(conversation="q3", turn=1, prompt_ids=BASE + [1, 2, 7], completion_ids=[4], cache_salt=None, meta={})
    cut = TraceCall(conversation="q4", turn=1, prompt_ids=BASE + [1, 7], completion_ids=[4], cache_salt=None, meta={})
    first_4 = TraceCall(conversation="q4", turn=0, prompt_ids=BASE, completion_ids=[1, 2, 3], cache_salt=None, meta={})
    assert classify([first, whole, first_4, cut]) == {"q3.0": "first", "q3.1": "append", "q4.0": "first", "q4.1": "other"}


def test_the_bound_counts_a_region_ending_exactly_where_the_shared_prefix_ends_and_skips_calls_without_a_row():
    calls = [call(0, BASE), call(1, BASE[:40] + BASE[50:] + [5] * 10), call(2, BASE[:40] + BASE[50:] + [5] * 10 + [6] * 20)]
    # turn 2 shares turn 1's prompt + completion[:-1] up to the first differing token; the
    # relocated region ends exactly there
    sequence = calls[1].prompt_ids + calls[1].completion_ids[:-1]
    shared = next(i for i, (a, b) in enumerate(zip(sequence, calls[2].prompt_ids)) if a != b)
    rows = {"r.q1.1": {"prefix_reused": 40, "moved": 0}, "r.q1.2": {"prefix_reused": 40, "moved": 0}}
    region = (40, shared - 40)
    bound = relocation_read_bound(calls, rows, {"r.q1.1": [region]}, "r")
    assert (bound["tokens"], bound["calls"]) == (sum(region) - 40, 1)
    # without an ingested row for turn 2 nothing is counted (and nothing is read from a missing row)
    no_row = relocation_read_bound(calls, {"r.q1.1": rows["r.q1.1"]}, {"r.q1.1": [region]}, "r")
    assert (no_row["tokens"], no_row["calls"]) == (0, 0)
