"""``patches.request_book``: the executor's per-request bookkeeping, without SGLang."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from policy.api import Read, Plan, Snapshot
from patches.request_book import (Forward, RequestBook, TrackedRequest, check_invariants, event_fields, finish_type,
                                  forget_stale, piece_shortfall, prefix_match_cap, request_event, tree_plan_problem)

# [0, 64) [64, 128) snapshot at 128 (periodic), tail [128, 150)
PLAN = Plan("r", 0, (Read(0, 64), Read(64, 128), Snapshot(128, "periodic"), Read(128, 150)))


def tracked(plan: Plan = PLAN, prompt_len: int = 150, read_until: int = 0) -> TrackedRequest:
    return TrackedRequest(queued_ts=1.0, tokens=tuple(range(prompt_len)), plan=plan, read_until=read_until)


@pytest.mark.parametrize(
    "read_until, end, expected, off_plan",
    [
        pytest.param(0, 64, Forward(0, 64, (0, 64), None), 0, id="first-piece"),
        pytest.param(64, 128, Forward(64, 128, (64, 128), "periodic"), 0, id="piece-ending-at-a-keep-point"),
        pytest.param(128, 151, Forward(128, 150, (128, 150), None), 0, id="tail-seen-with-the-first-output-token"),
        pytest.param(64, 64, None, 0, id="nothing-new-read"),
        pytest.param(0, 100, Forward(0, 100, (0, 64), None), 1, id="off-the-grid"),
        pytest.param(100, 128, Forward(100, 128, None, None), 1, id="no-planned-forward-starts-here"),
    ],
)
def test_read_to(read_until, end, expected, off_plan):
    request = tracked(read_until=read_until)
    assert request.read_to(end) == expected
    assert request.forwards_off_plan == off_plan
    assert request.read_until == (expected.end if expected else read_until)
    assert request.pieces == ([[expected.start, expected.end]] if expected else [])  # what the event lists


@pytest.mark.parametrize(
    "plan, start, expected",
    [
        pytest.param(PLAN, 0, 64, id="first"),
        pytest.param(PLAN, 128, 22, id="tail"),
        pytest.param(PLAN, 100, None, id="off-grid"),
        pytest.param(None, 0, None, id="no-plan"),
    ],
)
def test_next_piece_len(plan, start, expected):
    assert tracked(plan=plan).next_piece_len(start) == expected


def test_book_keeps_the_first_sighting_and_the_first_fallback():
    book = RequestBook()
    tokens = book.prompt("r", [1, 2, 3])
    book.track("r", tokens, None, None)
    book.note_fallback("r", "plan: boom")
    first = book["r"]
    assert book.prompt("r", [1, 2, 3]) is first.tokens  # copied once
    assert book.prompt("r", [9]) == (9,)  # SGLang rewrote the prompt
    book.note_fallback("r", "later")
    plan = Plan("r", 1, (Read(1, 3),))
    assert book.track("r", tokens, plan, 2) is plan
    assert (book["r"].queued_ts, book["r"].fallback, book["r"].read_until, book["r"].match_cap) == (
        first.queued_ts, "plan: boom", 1, 2)
    book.note_fallback("gone", "ignored")
    assert sorted(book) == ["r"]


def test_book_refuses_a_plan_that_does_not_tile_the_prompt():
    book = RequestBook()
    with pytest.raises(ValueError, match="steps end at 2, prompt has 3"):
        book.track("r", (1, 2, 3), Plan("r", 0, (Read(0, 2),)), None)
    assert book == {}


@pytest.mark.parametrize(
    "return_logprob, start, prompt_tokens, expected",
    [
        pytest.param(True, 10, 100, 10, id="capped"),
        pytest.param(True, -1, 100, None, id="no-prompt-logprobs"),
        pytest.param(False, 10, 100, None, id="no-logprobs"),
        pytest.param(True, 99, 100, None, id="at-the-usual-limit"),
        pytest.param(True, 98, 100, 98, id="just-below-the-usual-limit"),
        pytest.param(True, None, 100, None, id="unset"),
    ],
)
def test_prefix_match_cap(return_logprob, start, prompt_tokens, expected):
    assert prefix_match_cap(return_logprob, start, prompt_tokens) == expected


@pytest.mark.parametrize(
    "reason, expected",
    [
        pytest.param(None, None, id="unfinished"),
        pytest.param(SimpleNamespace(to_json=lambda: {"type": "length", "length": 3}), "length", id="typed"),
        pytest.param(SimpleNamespace(to_json=lambda: {"matched": 2}), "SimpleNamespace", id="untyped-json"),
        pytest.param("stop", "str", id="no-to_json"),
    ],
)
def test_finish_type(reason, expected):
    assert finish_type(reason) == expected


def test_event_fields_of_a_tracked_request():
    request = tracked()
    request.snapshots.append([128, "periodic"])
    request.pieces.append([0, 128])
    request.fallback, request.forwards_off_plan, request.match_cap = "plan: boom", 1, 5
    request.blocks, request.retractions = 2, 1
    assert event_fields(request, 7) == dict(plan_resume=0, queued_ts=1.0, snapshots=[[128, "periodic"]],
                                            forwards_off_plan=1, pieces=[[0, 128]], fallback="plan: boom",
                                            match_cap=5, blocks=2, retractions=1)
    request.plan = None
    assert event_fields(request, 7)["plan_resume"] is None


def test_event_fields_of_an_untracked_request():
    fields = event_fields(None, 7)
    assert fields.pop("queued_ts") > 0
    assert fields == dict(plan_resume=None, snapshots=[], forwards_off_plan=0, pieces=[], fallback=None, match_cap=7,
                          blocks=0, retractions=0)


@pytest.mark.parametrize(
    "piece_len, budget, expected",
    [
        pytest.param(64, 10, 54, id="short"),
        pytest.param(64, 63, 1, id="one-short"),
        pytest.param(64, 64, 0, id="exact"),
        pytest.param(64, 500, 0, id="plenty"),
        pytest.param(64, 0, 0, id="zero-stock-overcommit"),
        pytest.param(64, -5, 0, id="negative"),
        pytest.param(None, 10, 0, id="no-plan"),
    ],
)
def test_piece_shortfall(piece_len, budget, expected):
    assert piece_shortfall(piece_len, budget) == expected


@pytest.mark.parametrize(
    "plan, tree_hit, expected",
    [
        pytest.param(Plan("r", 64, (Read(64, 150),)), 64, None, id="reads-after-the-tree-hit"),
        pytest.param(Plan("r", 0, (Read(0, 150),)), 64, "plan r: resume 0 differs from the tree hit 64; only a "
                     "policy that plans inside the tree may move the resume point", id="moves-the-resume-point"),
        pytest.param(PLAN, 0, "plan r: step Snapshot(at=128, kind='periodic') needs a policy that plans inside "
                     "the tree", id="keeps-a-snapshot"),
    ],
)
def test_tree_plan_problem(plan, tree_hit, expected):
    assert tree_plan_problem(plan, tree_hit) == expected


def test_book_lookups_by_rid():
    book = RequestBook()
    book.track("r", tuple(range(150)), PLAN, None)
    book.snapshot_written("r", 128, "periodic")
    book.snapshot_written("gone", 1, "periodic")  # ignored
    assert (book.planned_resume("r"), book.planned_resume("gone")) == (0, None)
    assert (book.next_piece_len("r", 64), book.next_piece_len("gone", 0)) == (64, None)
    assert book["r"].snapshots == [[128, "periodic"]]


class Log:
    def __init__(self):
        self.lines = []

    def error(self, msg, *args):
        self.lines.append(("ERROR", msg % args))

    def exception(self, msg, *args):
        self.lines.append(("EXCEPTION", msg % args))


def test_forget_stale_logs_and_empties_the_book():
    log, book = Log(), {"b": 2, "a": 1}
    assert forget_stale(book, log, "dropped %d: %s") == [2, 1]
    assert book == {} and log.lines == [("ERROR", "dropped 2: ['a', 'b']")]
    assert forget_stale(book, log, "dropped %d: %s") == [] and len(log.lines) == 1


def test_check_invariants_logs_a_broken_invariant_instead_of_raising():
    class Broken:
        def check(self):
            raise AssertionError("leak")

    log = Log()
    check_invariants(Broken(), log, "check failed")
    check_invariants(SimpleNamespace(check=lambda: None), log, "check failed")
    assert log.lines == [("EXCEPTION", "check failed")]


@pytest.mark.parametrize(
    "cached, expected_reused",
    [pytest.param(64, 64, id="tree-hit"), pytest.param(151, 150, id="at-most-the-prompt")],
)
def test_request_event_counts(cached, expected_reused):
    event = request_event(tracked(), None, prompt_tokens=150, cached_tokens=cached, rid="r", policy="radix",
                          decode_tokens=3, cache_salt=None, finish_reason="stop")
    assert (event.prefix_reused, event.moved, event.read) == (expected_reused, 0, 150 - expected_reused)
    assert (event.plan_resume, event.queued_ts, event.rid, event.decode_tokens) == (0, 1.0, "r", 3)
