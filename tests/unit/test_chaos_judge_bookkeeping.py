"""eval/chaos: the judge's own bookkeeping, apart from the checks it calls.

* ``chaos_trace`` refuses a trace without a conversation or a turn, and takes one of each;
* ``starts_per_file`` counts the server starts ingest reported per events file (what
  ``restart said`` compares with two), ``restarted_files`` names the files whose server the
  scenario restarted: every file of a killed server alone, else the router's restarted worker's;
* ``judge``: a scenario that raised fails ``answered once`` with the error, and fails ``forced
  ids`` only for the replay's ``Mismatch`` (a call answered with ids other than the trace's);
* ``RetryingSend`` backs off 0.5, 1, 2, 4 s and then 4 s for every later attempt, and retries
  until the clock is past its deadline (at the deadline it still tries once more)."""

from __future__ import annotations

from pathlib import Path

import pytest

from eval.chaos.judge import judge, restarted_files, starts_per_file
from eval.chaos.run import Record
from eval.chaos.trace import chaos_trace
from eval.replay.retry import BACKOFF_S, RetryingSend
from eval.soak.client import Reply


@pytest.mark.parametrize("conversations, turns", [(0, 1), (1, 0), (0, 0), (-1, 3)])
def test_a_trace_needs_a_conversation_and_a_turn(conversations, turns):
    with pytest.raises(ValueError, match="need at least one conversation and one turn"):
        chaos_trace(conversations, turns)


def test_the_smallest_trace_is_one_call():
    assert [(c.conversation, c.turn) for c in chaos_trace(1, 1)] == [("c00", 0)]


def test_starts_are_counted_per_file():
    summary = {"starts": [{"file": "w0.jsonl"}, {"file": "w1.jsonl"}, {"file": "w1.jsonl"}, {"file": Path("w2")}]}
    assert starts_per_file(summary) == {"w0.jsonl": 1, "w1.jsonl": 2, "w2": 1}
    assert starts_per_file({}) == {}


def test_the_restarted_files_are_the_killed_servers():
    files = [Path("out/w0.events.jsonl"), Path("out/w1.events.jsonl")]
    alone = Record("radix", "alone", Path("out"), notes={"killed": True})
    assert restarted_files(alone, files[:1]) == {"out/w0.events.jsonl"}
    assert restarted_files(Record("radix", "alone", Path("out")), files[:1]) == set()
    router = Record("radix", "router", Path("out"), notes={"restarted": "w1", "killed": True})
    assert restarted_files(router, files) == {"out/w1.events.jsonl"}
    assert restarted_files(Record("radix", "router", Path("out")), files) == set()


@pytest.mark.parametrize("error, forced_ok, answered_detail", [
    (None, True, None),
    ("Mismatch: r.c00.1 came back with other ids", False, "the scenario stopped: Mismatch"),
    ("ServerError: no server answered", True, "the scenario stopped: ServerError"),
])  # fmt: skip
def test_a_scenario_that_raised_fails_answered_once_and_only_a_mismatch_fails_forced_ids(
        tmp_path, error, forced_ok, answered_detail):
    verdicts = judge(Record("radix", "alone", tmp_path), [], error)
    assert verdicts["forced ids"].ok is forced_ok
    if not forced_ok:
        assert verdicts["forced ids"].detail == error
    if answered_detail is None:
        assert verdicts["answered once"].ok  # no call, no answer: nothing missing
    else:
        assert verdicts["answered once"].ok is False and verdicts["answered once"].detail.startswith(answered_detail)


def test_retries_back_off_to_the_longest_pause_and_try_again_at_the_deadline():
    """Each failed attempt moves the clock 1 s; the sixth fails with the clock exactly at the
    deadline (6 s), so one more is sent, and it is answered."""
    now, pauses = [0.0], []
    failures = len(BACKOFF_S) + 2
    answers = [Reply(None, None, "connection error", 0.0)] * failures + [Reply(200, {}, None, 0.0)]

    def sleep(seconds):
        pauses.append(seconds)

    def send_once(path, payload):
        reply = answers.pop(0)
        if reply.status is None:
            now[0] += 1.0
        return reply

    send = RetryingSend(send_once, retry_for_s=float(failures), clock=lambda: now[0], sleep=sleep)
    assert send("/generate", {"rid": "r.c.0"}).status == 200
    assert pauses == [*BACKOFF_S, BACKOFF_S[-1], BACKOFF_S[-1]]
