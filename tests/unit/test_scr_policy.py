"""``ScrPolicy``: the seam's plan, admission through the session table, unsupported settings."""

from __future__ import annotations

import pytest

from policy.api import Arrival, Extend
from scr.config import ScrConfig
from scr.policy import ScrPolicy

GOOD = {"chunked_prefill_size": 512, "tp_size": 1, "disable_radix_cache": False}


@pytest.mark.parametrize(
    "changes, problem",
    [
        pytest.param({}, None, id="supported"),
        pytest.param({"disable_radix_cache": True}, "--disable-radix-cache", id="no-radix-cache"),
        pytest.param({"chunked_prefill_size": -1}, "chunked prefill is off", id="no-chunking"),
        pytest.param({"chunked_prefill_size": None}, "chunked prefill is off", id="chunking-unset"),
        pytest.param({"tp_size": 2}, "--tp-size > 1", id="tensor-parallel"),
        pytest.param({"enable_hierarchical_cache": True}, "--enable-hierarchical-cache", id="hicache"),
        pytest.param({"speculative_algorithm": "EAGLE"}, "speculative decoding", id="speculative"),
    ],
)
def test_startup_problems(changes, problem):
    problems = ScrPolicy(ScrConfig()).startup_problems({**GOOD, **changes}, {}, on_cuda=True)
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problems[0].startswith(problem)


def test_plan_resumes_at_the_tree_hit():
    plan = ScrPolicy(ScrConfig()).plan(Arrival(rid="r", tokens=tuple(range(10)), cache_key=None, tree_hit=4))
    assert plan.resume == 4 and plan.steps == (Extend(4, 10),)


def test_admit_plans_after_a_stored_turn():
    policy = ScrPolicy(ScrConfig())
    old = list(range(3000))
    first = policy.admit(old, None)
    assert first.kind == "cold"
    policy.sessions.finish(first.sid, old + [7, 7], store=True)
    new = old[:1500] + old[1700:] + [9] * 30
    second = policy.admit(new, None)
    assert second.kind == "plan" and second.sid == first.sid
    assert [(b.old_start, b.new_start, b.num_rows) for b in second.blocks] == [(1700, 1500, 1300 - 16)]
    policy.check()


def test_kvreuse_off_takes_no_session():
    policy = ScrPolicy(ScrConfig())
    assert policy.admit(list(range(2000)), "kvreuse:off").kind == "off"
    assert len(policy.sessions) == 0
