"""PolicyExecutor (patches/executor.py) with stand-in requests: planning, events, idle check.

The executor reads only a handful of ``Req`` fields, so a small stand-in covers its logic;
tests/integration runs it on real SGLang ``Req`` objects.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

import pytest

from exact_cache.config import ExactConfig
from exact_cache.policy import ExactPolicy
from serving.event_writer import EventWriter
from patches.executor import OFF_PLAN_LOG, PolicyExecutor
from policy.api import Read, Plan, Snapshot
from policy.events import read_events
from policy.radix import RadixConfig, RadixPolicy


@dataclass
class FinishLength:
    def to_json(self):
        return {"type": "length", "length": 3}


@dataclass
class FakeReq:
    rid: str
    origin_input_ids: list
    prefix_indices: list = field(default_factory=list)
    extra_key: str | None = None
    output_ids: list = field(default_factory=list)
    cached_tokens: int = 0
    finished_reason: object = None
    to_finish: object = None

    def finished(self) -> bool:
        return self.finished_reason is not None


class FakeScheduler:
    def __init__(self, idle: bool):
        self.idle = idle

    def is_fully_idle(self) -> bool:
        return self.idle


class RecordingPolicy(RadixPolicy):
    def __init__(self):
        super().__init__(RadixConfig())
        self.arrivals, self.releases, self.checks = [], [], 0

    def plan(self, arrival):
        self.arrivals.append(arrival)
        return super().plan(arrival)

    def release(self, release):
        self.releases.append(release)

    def check(self):
        self.checks += 1


def test_plan_follows_the_latest_match_and_keeps_the_first_sighting(tmp_path):
    policy = RecordingPolicy()
    executor = PolicyExecutor(policy, EventWriter(str(tmp_path / "e.jsonl")))
    req = FakeReq("r1", list(range(10)), prefix_indices=[0] * 0, extra_key="salt")
    executor.on_matched(req)
    first = executor._tracked["r1"]
    req.prefix_indices = [0] * 6
    executor.on_matched(req)
    tracked = executor._tracked["r1"]
    assert tracked.plan == Plan(rid="r1", resume=6, steps=(Read(6, 10),))
    assert tracked.queued_ts == first.queued_ts
    assert tracked.tokens is first.tokens  # the prompt is copied once
    assert [(a.tree_hit, a.cache_key, len(a.tokens)) for a in policy.arrivals] == [(0, "salt", 10), (6, "salt", 10)]


def test_release_writes_one_event_and_forgets_the_request(tmp_path):
    path = tmp_path / "e.jsonl"
    policy = RecordingPolicy()
    executor = PolicyExecutor(policy, EventWriter(str(path)))
    req = FakeReq("r2", list(range(20)), prefix_indices=[0] * 16, extra_key="k")
    executor.on_matched(req)
    req.cached_tokens, req.output_ids, req.finished_reason = 16, [1, 2, 3], FinishLength()
    executor.on_release(req)
    (event,) = [json.loads(line) for line in path.read_text().splitlines()]
    assert {k: event[k] for k in ("rid", "policy", "prompt_tokens", "prefix_reused", "moved", "read",
                                  "decode_tokens", "cache_salt", "plan_resume", "finish_reason")} == {
        "rid": "r2", "policy": "radix", "prompt_tokens": 20, "prefix_reused": 16, "moved": 0, "read": 4,
        "decode_tokens": 3, "cache_salt": "k", "plan_resume": 16, "finish_reason": "length",
    }
    assert executor._tracked == {}
    assert [(r.rid, r.prompt_tokens, r.decode_tokens) for r in policy.releases] == [("r2", 20, 3)]


def test_unfinished_release_is_ignored(tmp_path):
    path = tmp_path / "e.jsonl"
    executor = PolicyExecutor(RecordingPolicy(), EventWriter(str(path)))
    req = FakeReq("r3", [1, 2, 3])
    executor.on_matched(req)
    executor.on_release(req)  # e.g. a retraction: the request comes back later
    assert path.read_text() == ""
    assert "r3" in executor._tracked


def test_without_an_events_file_nothing_is_written_but_the_policy_hears_the_release():
    policy = RecordingPolicy()
    executor = PolicyExecutor(policy, None)
    req = FakeReq("r4", [1, 2, 3], finished_reason=FinishLength(), output_ids=[9])
    executor.on_release(req)
    assert [r.rid for r in policy.releases] == ["r4"]


def test_idle_check_drops_stale_requests_loudly_and_runs_the_policy_check(caplog):
    policy = RecordingPolicy()
    executor = PolicyExecutor(policy, None)
    executor.on_matched(FakeReq("stale", [1, 2, 3]))
    executor.on_idle(FakeScheduler(idle=False))
    assert "stale" in executor._tracked and policy.checks == 0
    with caplog.at_level(logging.ERROR):
        executor.on_idle(FakeScheduler(idle=True))
    assert executor._tracked == {} and policy.checks == 1
    assert "dropped state of 1 request(s)" in caplog.text and "stale" in caplog.text


def test_a_plan_that_does_not_resume_at_the_tree_hit_is_refused():
    class Greedy(RecordingPolicy):
        def plan(self, arrival):
            return Plan(rid=arrival.rid, resume=0, steps=(Read(0, len(arrival.tokens)),))

    executor = PolicyExecutor(Greedy(), None)
    # Contained: SGLang's own match stands (a plain radix read), the reason goes to the event.
    assert executor.on_matched(FakeReq("r5", [1, 2, 3, 4], prefix_indices=[0, 0])) is None
    tracked = executor._tracked["r5"]
    assert tracked.plan is None and "resume 0 differs from the tree hit 2" in tracked.fallback


# ---------------------------------------------------------------------- exact: plans made inside the tree

EXACT = ExactConfig(piece_tokens=64, retain_every=256)
# A cold 300-token prompt: pieces [0,64) ... [192,256), tail [256,300); e = floor(299/64)*64 = 256 = R,
# so one snapshot, at 256, of kind periodic (periodic wins over prompt_end).
COLD_300_FORWARDS = [(0, 64), (64, 128), (128, 192), (192, 256), (256, 300)]


def exact_executor(events=None) -> PolicyExecutor:
    return PolicyExecutor(ExactPolicy(EXACT), events)  # plans_at = tree


def test_exact_cold_plan_and_pieces_as_planned(caplog):
    executor = exact_executor()
    req = FakeReq("x1", list(range(300)))
    plan = executor.plan_in_tree(req, 0, ())
    assert plan.resume == 0
    assert plan.forwards() == COLD_300_FORWARDS
    assert plan.snapshots() == {256: "periodic"}
    with caplog.at_level(logging.ERROR):
        kinds = [executor.piece_done(req, end) for end in (64, 128, 192, 256, 300)]
        assert kinds == [None, None, None, "periodic", None]
        # The call after the last prefill forward counts the first output token: 301 > 300.
        assert executor.piece_done(req, 301) is None
    assert executor._tracked["x1"].forwards_off_plan == 0
    assert caplog.text == ""


def test_exact_tail_reported_with_the_first_output_token():
    """The tail piece may only be seen as end = |P| + 1: clamped to |P|, it is the planned tail."""
    executor = exact_executor()
    req = FakeReq("x2", list(range(300)))
    executor.plan_in_tree(req, 0, ())
    assert [executor.piece_done(req, end) for end in (64, 128, 192, 256, 301)] == [None, None, None, "periodic", None]
    assert executor._tracked["x2"].forwards_off_plan == 0
    assert executor._tracked["x2"].read_until == 300


def test_exact_repeated_end_is_not_a_forward():
    executor = exact_executor()
    req = FakeReq("x3", list(range(300)))
    executor.plan_in_tree(req, 0, ())
    assert executor.piece_done(req, 64) is None
    assert executor.piece_done(req, 64) is None  # no new tokens read: ignored, not off plan
    assert executor._tracked["x3"].forwards_off_plan == 0


def test_exact_resumed_plan_from_the_tree_walk():
    executor = exact_executor()
    req = FakeReq("x4", list(range(300)), extra_key="salt")
    # m = 200 -> A = 192; states (64, 192) -> c* = 192; keep: 256 (periodic) only.
    plan = executor.plan_in_tree(req, 200, (64, 192))
    assert plan == Plan("x4", 192, (Read(192, 256), Snapshot(256, "periodic"), Read(256, 300)))
    assert [executor.piece_done(req, end) for end in (256, 300)] == ["periodic", None]
    assert executor._tracked["x4"].forwards_off_plan == 0


def test_exact_off_plan_forward_is_counted_and_logged(caplog):
    executor = exact_executor()
    req = FakeReq("x5", list(range(300)))
    executor.plan_in_tree(req, 0, ())
    with caplog.at_level(logging.ERROR):
        assert executor.piece_done(req, 100) is None  # [0, 100): not a piece
    assert executor._tracked["x5"].forwards_off_plan == 1
    assert [r.getMessage() for r in caplog.records] == [OFF_PLAN_LOG % ("x5", 0, 100, (0, 64))]
    assert caplog.records[0].levelno == logging.ERROR
    caplog.clear()
    with caplog.at_level(logging.ERROR):
        # From 100 no planned forward starts: every later forward is off plan, none takes a snapshot.
        assert executor.piece_done(req, 256) is None
    assert executor._tracked["x5"].forwards_off_plan == 2
    assert [r.getMessage() for r in caplog.records] == [OFF_PLAN_LOG % ("x5", 100, 256, None)]


def test_exact_event_carries_snapshots_and_off_plan_count(tmp_path):
    path = tmp_path / "e.jsonl"
    executor = exact_executor(EventWriter(str(path)))
    req = FakeReq("x6", list(range(300)), extra_key="k")
    executor.plan_in_tree(req, 0, ())
    for end in (64, 128, 192, 256):
        kind = executor.piece_done(req, end)
        if kind is not None:
            executor.snapshot_written(req, end, kind)
    executor.piece_done(req, 280)  # off plan: the tail should be [256, 300)
    executor.piece_done(req, 301)  # off plan too: [280, 300)
    req.cached_tokens, req.output_ids, req.finished_reason = 0, [7, 8], FinishLength()
    executor.on_release(req)
    (event,) = [json.loads(line) for line in path.read_text().splitlines()]
    assert {k: event[k] for k in ("rid", "policy", "prompt_tokens", "prefix_reused", "read", "plan_resume",
                                  "snapshots", "forwards_off_plan", "cache_salt")} == {
        "rid": "x6", "policy": "exact", "prompt_tokens": 300, "prefix_reused": 0, "read": 300, "plan_resume": 0,
        "snapshots": [[256, "periodic"]], "forwards_off_plan": 2, "cache_salt": "k",
    }
    assert executor._tracked == {}


def test_radix_event_has_empty_snapshots(tmp_path):
    path = tmp_path / "e.jsonl"
    executor = PolicyExecutor(RecordingPolicy(), EventWriter(str(path)))
    req = FakeReq("r6", [1, 2, 3], finished_reason=FinishLength())
    executor.on_matched(req)
    executor.on_release(req)
    (event,) = [json.loads(line) for line in path.read_text().splitlines()]
    assert (event["snapshots"], event["forwards_off_plan"]) == ([], 0)


def test_replanning_a_waiting_request_resets_its_progress():
    executor = exact_executor()
    req = FakeReq("x7", list(range(300)))
    assert executor.plan_in_tree(req, 0, ()).resume == 0
    before = executor._tracked["x7"]
    executor.plan_in_tree(req, 200, (192,))  # re-matched on a later scheduling pass: c* = 192
    tracked = executor._tracked["x7"]
    assert (tracked.plan.resume, tracked.read_until, tracked.forwards_off_plan) == (192, 192, 0)
    assert tracked.tokens is before.tokens and tracked.queued_ts == before.queued_ts
    assert executor.piece_done(req, 256) == "periodic"  # [192, 256) is the new plan's first piece


@pytest.mark.parametrize(
    "prefix_len, raises",
    [
        pytest.param(192, False, id="tree-serves-the-plan's-resume"),
        pytest.param(0, True, id="tree-serves-less"),
        pytest.param(256, True, id="tree-serves-more"),
    ],
)
def test_on_matched_checks_the_tree_against_the_plan(prefix_len, raises, aborts):
    executor = exact_executor()
    req = FakeReq("x8", list(range(300)))
    executor.plan_in_tree(req, 200, (192,))  # c* = 192
    req.prefix_indices = [0] * prefix_len
    assert executor.on_matched(req) is None
    if raises:  # the answer could not be exact: the request (not the server) ends, with the reason
        assert req.to_finish == f"cache policy exact: match: AssertionError: SGLang resumes at {prefix_len}, the plan at 192"
        assert executor._tracked["x8"].fallback.endswith(f"resumes at {prefix_len}, the plan at 192")
    else:
        assert req.to_finish is None
    assert executor._tracked["x8"].plan.resume == 192  # on_matched never replans in the tree mode


def test_on_matched_without_a_plan_from_the_tree(aborts):
    executor = exact_executor()
    req = FakeReq("x9", [1, 2, 3])
    executor.on_matched(req)
    assert req.to_finish == "cache policy exact: match: AssertionError: SGLang resumes at 0, the plan at None"


def test_a_plan_with_snapshots_is_refused_outside_the_tree():
    class PlansAtTheMatch(ExactPolicy):  # exact's plans, made where a plain policy plans
        plans_at = "match"

    executor = PolicyExecutor(PlansAtTheMatch(EXACT), None)
    executor.on_matched(FakeReq("x10", list(range(300))))
    assert executor._tracked["x10"].fallback == (
        "plan: NotImplementedError: plan x10: step Snapshot(at=256, kind='periodic') needs a policy that "
        "plans inside the tree"
    )


@pytest.fixture
def aborts(monkeypatch):
    """``abort`` without SGLang: the finish reason is its message."""
    import patches.executor as executor_module

    monkeypatch.setattr(executor_module, "abort_reason", lambda message: message)


def test_a_failing_exact_plan_falls_back_to_a_cold_read(monkeypatch):
    """Planning raises (here: an injected fault): the request is planned as a cold read, which is
    exact by definition; the event records why."""
    from policy import faults

    monkeypatch.setattr(faults, "_PLAN", faults.parse("exact.plan~x11@1"))
    monkeypatch.setattr(faults, "_CALLS", {})
    executor = exact_executor()
    req = FakeReq("x11", list(range(300)))
    plan = executor.plan_in_tree(req, 200, (192,))
    assert plan.resume == 0 and [f for f in plan.forwards()] == COLD_300_FORWARDS
    assert executor._tracked["x11"].fallback.startswith("plan: InjectedFault")


def test_a_failing_release_still_writes_the_event(tmp_path, monkeypatch):
    from policy import faults

    monkeypatch.setattr(faults, "_PLAN", faults.parse("radix.release@1"))
    monkeypatch.setattr(faults, "_CALLS", {})
    events = EventWriter(str(tmp_path / "events.jsonl"))
    executor = PolicyExecutor(RadixPolicy(RadixConfig()), events)
    req = FakeReq("r9", [1, 2, 3, 4], prefix_indices=[0, 0])
    executor.on_matched(req)
    req.finished_reason = "stop"
    executor.on_release(req)
    (event,) = read_events(str(tmp_path / "events.jsonl"))
    assert event.rid == "r9" and event.fallback.startswith("release: InjectedFault")


def test_match_cap_is_the_logprob_start_len_below_the_usual_limit():
    from patches.executor import match_cap

    class Req:
        def __init__(self, ret, start):
            self.return_logprob, self.logprob_start_len = ret, start

    assert [match_cap(Req(*case), 100) for case in [(True, 10), (True, -1), (False, 10), (True, 99), (True, 98)]] \
        == [10, None, None, None, 98]


def test_an_abort_of_waiting_requests_forgets_them_without_an_event(tmp_path):
    """SGLang pops aborted waiting requests without ``release_kv_cache``: the executor forgets the
    ones the abort rule selects (rid prefix, or all) so the idle check finds no stale state."""
    from types import SimpleNamespace

    from patches.executor import aborted_waiting

    executor = PolicyExecutor(RadixPolicy(RadixConfig()), EventWriter(str(tmp_path / "events.jsonl")))
    reqs = [FakeReq(rid, [1, 2, 3]) for rid in ("conv1.1", "conv1.2", "conv2.1")]
    for req in reqs:
        executor.on_matched(req)
    scheduler = SimpleNamespace(waiting_queue=reqs)
    assert aborted_waiting(scheduler, SimpleNamespace(rid="conv1", abort_all=False)) == reqs[:2]
    assert aborted_waiting(scheduler, SimpleNamespace(rid="", abort_all=True)) == reqs
    executor.on_abort(scheduler, SimpleNamespace(rid="conv1", abort_all=False))
    assert sorted(executor._tracked) == ["conv2.1"]
    assert not (tmp_path / "events.jsonl").read_text()
