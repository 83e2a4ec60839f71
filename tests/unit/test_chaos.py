"""``eval.chaos``'s pure parts: the trace, the retry rule, the checks (no server)."""

from __future__ import annotations

import json

import pytest

from eval.chaos import checks
from eval.replay.retry import RetryingSend, retryable
from eval.chaos.run import Plan, phase
from eval.chaos.trace import SHARED_TOKENS, chaos_trace
from eval.replay.run import ServerError
from eval.soak.client import Reply
from policy.tokens import common_prefix_len


# ---------------------------------------------------------------------- trace


def test_trace_is_seeded_turn_ordered_and_shares_only_a_short_prefix():
    calls = chaos_trace(3, 4, seed=1)
    assert calls == chaos_trace(3, 4, seed=1) and calls != chaos_trace(3, 4, seed=2)
    assert [(c.turn, c.conversation) for c in calls[:3]] == [(0, "c00"), (0, "c01"), (0, "c02")]
    firsts = [c.prompt_ids for c in calls if c.turn == 0]
    shared = {common_prefix_len(a, b) for a in firsts for b in firsts if a is not b}
    # exactly the system prompt is shared (the next ids may agree by chance, never 1,024: scr's session match)
    assert min(shared) >= SHARED_TOKENS and max(shared) < 1024
    # a conversation's next prompt keeps its own history's first ids (scr can match its session)
    by_conv = {}
    for c in calls:
        by_conv.setdefault(c.conversation, []).append(c)
    for turns in by_conv.values():
        assert all(common_prefix_len(a.prompt_ids, b.prompt_ids) >= 1024 for a, b in zip(turns, turns[1:]))


def test_plan_puts_every_phase_on_at_least_one_turn():
    for turns in range(3, 12):
        plan = Plan.for_turns(turns)
        assert 0 < plan.a < plan.b < turns
    with pytest.raises(ValueError):
        Plan.for_turns(2)
    calls = chaos_trace(2, 6)
    assert len(phase(calls, 0, 2)) + len(phase(calls, 2, 4)) + len(phase(calls, 4, 6)) == len(calls)


# ---------------------------------------------------------------------- retries


@pytest.mark.parametrize("reply, retry", [
    (Reply(None, None, "connection error: refused", 0.0), True),
    (Reply(502, None, "bad gateway", 0.0), True),
    (Reply(503, None, "no worker", 0.0), True),
    (Reply(504, None, "call_upstream_timeout", 0.0), False),  # the worker may still be running it
    (Reply(None, None, "client timeout", 0.0), False),  # the server may still be running it
    (Reply(500, None, "boom", 0.0), False),
    (Reply(500, {"error": {"code": "call_upstream_request_error", "message": "error sending request"}}, "x", 0.0), True),
    (Reply(500, {"error": {"code": "internal", "message": "call_upstream"}}, "x", 0.0), False),
    (Reply(400, None, "bad field", 0.0), False),
    (Reply(200, {}, None, 0.0), False),
])
def test_retry_only_when_the_server_is_gone(reply, retry):
    assert retryable(reply) is retry


def test_retrying_send_retries_a_gone_server_and_records_the_attempts():
    answers = [Reply(None, None, "connection error: reset", 0.0), Reply(502, None, "x", 0.0), Reply(200, {"a": 1}, None, 0.0)]
    send = RetryingSend(lambda path, payload: answers.pop(0), sleep=lambda s: None)
    assert send("/generate", {"rid": "r.c.0"}).status == 200
    assert len(send.retried()["r.c.0"]) == 2 and not send.flying()


def test_retrying_send_gives_up_after_its_deadline():
    now = [0.0]

    def clock():
        now[0] += 100.0
        return now[0]

    send = RetryingSend(lambda path, payload: Reply(None, None, "connection error", 0.0), retry_for_s=250.0,
                        clock=clock, sleep=lambda s: None)
    with pytest.raises(ServerError, match="no server answered"):
        send("/generate", {"rid": "r.c.1"})


def test_a_server_error_is_not_retried():
    calls = []
    send = RetryingSend(lambda path, payload: calls.append(1) or Reply(500, None, "boom", 0.0), sleep=lambda s: None)
    assert send("/generate", {"rid": "x"}).status == 500 and len(calls) == 1


# ---------------------------------------------------------------------- checks


def event(rid, moved=0, ts=0.0, prompt=10):
    return {"rid": rid, "moved": moved, "queued_ts": ts, "prompt_tokens": prompt}


def seg(file, start, events, last=True, startup=None):
    return checks.Segment(file, start, startup, tuple(events), last)


def test_answered_once():
    rows = [{"rid": "r.a.0"}, {"rid": "r.a.1"}]
    assert checks.answered_once(["r.a.0", "r.a.1"], rows).ok
    assert not checks.answered_once(["r.a.0", "r.a.1", "r.a.2"], rows).ok
    assert not checks.answered_once(["r.a.0", "r.a.1"], rows + [{"rid": "r.a.1"}]).ok


def test_a_retried_call_passes_whatever_order_the_files_are_read_in():
    dead = seg("w1", 1, [dict(event("r.a.1"), finished_ts=1.0)], last=False)
    kept = seg("w0", 1, [dict(event("r.a.1"), finished_ts=5.0)])
    assert checks.no_event_twice([kept, dead], {"r.a.1"}).ok and checks.no_event_twice([dead, kept], {"r.a.1"}).ok


def test_restart_said_comes_from_what_the_scenario_did_and_counts_starts_per_file():
    said = seg("w1", 2, [event("r.a.2")], startup={"restart": True, "cache": "cold"})
    assert checks.restart_said([said], {"w1"}, {"w1": 2}).ok
    assert not checks.restart_said([], {"w1"}, {"w1": 2}).ok  # the restarted server wrote no record
    assert not checks.restart_said([said], {"w1"}, {"w0": 1, "w1": 1}).ok  # another file's start is no split
    idle = seg("w1", 2, [], startup={"restart": True, "cache": "cold"})
    assert checks.restart_said([idle], {"w1"}, {"w1": 1}).ok  # served nothing after the restart: nothing to split
    assert checks.restart_said([], set(), {}).ok is None


def test_an_event_twice_is_a_retry_only_across_a_restart():
    crashed = seg("w1", 1, [event("r.a.1")], last=False)
    after = seg("w0", 1, [event("r.a.1")])
    assert checks.no_event_twice([crashed, after], {"r.a.1"}).ok
    live = seg("w1", 1, [event("r.a.1")], last=True)
    assert not checks.no_event_twice([live, after], {"r.a.1"}).ok
    assert not checks.no_event_twice([seg("w0", 1, [event("r.a.1"), event("r.a.1")])], {"r.a.1"}).ok


def test_no_event_lost_beyond_the_last_calls_of_the_full_disk_window():
    segs = [seg("e", 1, [event("r.a.0"), event("r.a.1"), event("r.a.3")])]
    answered = {"r.a.0", "r.a.1", "r.a.2", "r.a.3"}
    assert checks.no_event_lost(segs, answered - {"r.a.3"}, ["r.a.1", "r.a.2"]).ok  # fit, then lost
    assert not checks.no_event_lost(segs, answered, []).ok  # lost without a full disk
    assert not checks.no_event_lost(segs, answered, ["r.a.2", "r.a.3"]).ok  # a write after a loss succeeded
    assert not checks.no_event_lost(segs, answered | {"r.a.4"}, ["r.a.2"]).ok  # lost outside the window
    assert not checks.no_event_lost(segs, {"r.a.0", "r.a.1"}, ["r.a.1"]).ok  # a window that lost nothing


def test_disk_full_logged_needs_every_count_to_agree():
    assert checks.disk_full_logged(["x", "y"], 2, 2, 2, 2).ok
    assert not checks.disk_full_logged(["x", "y"], 2, 1, 2, 2).ok
    assert not checks.disk_full_logged(["x", "y"], 2, 2, 0, 2).ok
    assert not checks.disk_full_logged(["x", "y"], 2, 2, 2, None).ok
    assert not checks.disk_full_logged(["x", "y"], 0, 0, 0, 0).ok
    assert checks.disk_full_logged([], 0, 0, 0, 0).ok is None


def test_scr_may_relocate_only_after_its_conversation_came_to_this_server_start():
    first = seg("e", 1, [event("r.a.0", ts=1), event("r.a.1", moved=40, ts=2)], last=False)
    restarted = seg("e", 2, [event("r.a.2", moved=0, ts=3), event("r.a.3", moved=30, ts=4)])
    verdict = checks.scr_own_rows([first, restarted])
    assert verdict.ok and "1 conversations resumed" in verdict.detail
    ghost = seg("e", 2, [event("r.a.2", moved=25, ts=3)])
    assert not checks.scr_own_rows([first, ghost]).ok
    inert = seg("e", 1, [event("r.a.0", ts=1), event("r.a.1", ts=2)])
    assert not checks.scr_own_rows([inert]).ok  # nothing relocated: the rule was never exercised


def test_exact_equals_replay_allows_less_reuse_only_where_the_pool_was_shrunk():
    off = [{"file": "e", "start": 2, "calls": 3, "differ": [{"rid": "r.a.2", "served": 100, "predicted": 900}]}]
    assert checks.exact_equals_replay(off, {("e", 2)}).ok
    assert not checks.exact_equals_replay(off, set()).ok
    more = [{"file": "e", "start": 2, "calls": 3, "differ": [{"rid": "r.a.2", "served": 950, "predicted": 900}]}]
    assert not checks.exact_equals_replay(more, {("e", 2)}).ok


def test_warm_equals_cold_needs_probes_that_reused_something():
    good = {"rid": "r", "problems": [], "warm_cached": 900, "cold_cached": 0}
    assert not checks.exact_warm_cold([{**good, "cold_cached": 832}]).ok  # the "cold" read was warm
    assert checks.exact_warm_cold([good]).ok
    assert not checks.exact_warm_cold([{**good, "problems": ["logprobs differ at [3]"]}]).ok
    assert not checks.exact_warm_cold([{**good, "warm_cached": 0}]).ok
    assert not checks.exact_warm_cold([]).ok
    # an exact run that never took its probes fails; another policy's reads as n/a
    assert checks.exact_warm_cold(None, required=True) == checks.Verdict(False, "no warm/cold probe was taken")
    assert checks.exact_warm_cold(None).ok is None


def test_identities_accept_only_the_missing_events_the_disk_explains():
    missing = "C1: 2 answered calls have no event; the events files record 2 lost writes (disk full?)"
    row = "C1 r.a.1: client request without a server row"
    assert checks.identities([missing, row], {"r.a.1"}).ok
    assert not checks.identities([missing, row], set()).ok
    assert not checks.identities([missing, "C1 r.a.2: client request without a server row"], {"r.a.1"}).ok
    assert not checks.identities([missing, "I1 r.a.0: negative"], {"r.a.1"}).ok


def test_segments_cut_a_file_at_its_startup_records(tmp_path):
    path = tmp_path / "events.jsonl"
    rows = [{"record": "startup", "restart": False}, {"rid": "r.a.0"}, {"record": "startup", "restart": True},
            {"rid": "r.a.1"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"rid": "r.a.2", "cut')
    found = checks.segments(str(path))
    assert [(s.start, [e["rid"] for e in s.events], s.last) for s in found] == [(1, ["r.a.0"], False),
                                                                                 (2, ["r.a.1"], True)]


def test_a_prompt_whose_event_the_disk_took_still_counts_in_the_exact_replay():
    """The server read and kept the lost call's prompt: the next call's predicted reuse comes from it."""
    from eval.bench_policies import replayed_reuse
    from eval.traces.format import TraceCall
    from exact_cache.replay import ReplayTree

    first = list(range(10, 1010))
    calls = [TraceCall("a", 0, first, [1]), TraceCall("a", 1, first + [5] * 100, [1])]
    later = [{"rid": "r.a.1", "queued_ts": 2.0}]
    tree = lambda: ReplayTree(100, 100_000)  # noqa: E731
    assert replayed_reuse(calls, later, "r", tree()) == {"r.a.1": 0}
    assert replayed_reuse(calls, later, "r", tree(), unrecorded={"r.a.0": 1.0}) == {"r.a.1": 900}
