"""PolicyExecutor (patches/executor.py) with stand-in requests: planning, events, idle check.

The executor reads only a handful of ``Req`` fields, so a small stand-in covers its logic;
tests/integration runs it on real SGLang ``Req`` objects.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

import pytest

from patches.events import EventWriter
from patches.executor import PolicyExecutor
from policy.api import Extend, Plan
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
    assert tracked.plan == Plan(rid="r1", resume=6, steps=(Extend(6, 10),))
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
            return Plan(rid=arrival.rid, resume=0, steps=(Extend(0, len(arrival.tokens)),))

    executor = PolicyExecutor(Greedy(), None)
    with pytest.raises(NotImplementedError, match="resume 0 differs from the tree hit 2"):
        executor.on_matched(FakeReq("r5", [1, 2, 3, 4], prefix_indices=[0, 0]))
