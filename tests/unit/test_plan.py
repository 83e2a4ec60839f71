"""``policy.api.Plan.validate`` and ``policy.radix.RadixPolicy.plan``."""

from __future__ import annotations

import pytest

from policy.api import Arrival, Read, Plan, Release
from policy.radix import RadixConfig, RadixPolicy


@pytest.mark.parametrize(
    "plan, prompt_len",
    [
        pytest.param(Plan("r", 5, ()), 5, id="full-resume-no-steps"),
        pytest.param(Plan("r", 0, ()), 0, id="empty-prompt"),
        pytest.param(Plan("r", 0, (Read(0, 5),)), 5, id="one-extend-from-0"),
        pytest.param(Plan("r", 3, (Read(3, 5),)), 5, id="one-extend-after-resume"),
        pytest.param(Plan("r", 2, (Read(2, 4), Read(4, 7))), 7, id="two-contiguous-extends"),
        pytest.param(Plan("r", 0, (Read(0, 1), Read(1, 2), Read(2, 3))), 3, id="unit-steps"),
    ],
)
def test_validate_accepts(plan, prompt_len):
    assert plan.validate(prompt_len) is None


@pytest.mark.parametrize(
    "plan, prompt_len, message",
    [
        pytest.param(
            Plan("r", 0, (Read(0, 2), Read(3, 5))), 5,
            "plan r: step [3, 5) does not continue at 2", id="gap",
        ),
        pytest.param(
            Plan("r", 0, (Read(0, 3), Read(2, 5))), 5,
            "plan r: step [2, 5) does not continue at 3", id="overlap",
        ),
        pytest.param(
            Plan("r", 2, (Read(0, 5),)), 5,
            "plan r: step [0, 5) does not continue at 2", id="first-step-not-at-resume",
        ),
        pytest.param(
            Plan("r", 0, (Read(0, 4),)), 5,
            "plan r: steps end at 4, prompt has 5", id="wrong-end-short",
        ),
        pytest.param(
            Plan("r", 0, (Read(0, 6),)), 5,
            "plan r: steps end at 6, prompt has 5", id="wrong-end-long",
        ),
        pytest.param(
            Plan("r", 3, ()), 5,
            "plan r: steps end at 3, prompt has 5", id="no-steps-before-end",
        ),
        pytest.param(Plan("r", 6, ()), 5, "plan r: resume 6 outside [0, 5]", id="resume-past-len"),
        pytest.param(Plan("r", -1, ()), 5, "plan r: resume -1 outside [0, 5]", id="negative-resume"),
        pytest.param(
            Plan("r", -1, (Read(-1, 5),)), 5,
            "plan r: resume -1 outside [0, 5]", id="negative-resume-with-step",
        ),
        pytest.param(
            Plan("r", 0, (Read(0, 0), Read(0, 5))), 5,
            "plan r: step [0, 0) does not continue at 0", id="zero-length-step",
        ),
        pytest.param(
            Plan("r", 5, (Read(5, 5),)), 5,
            "plan r: step [5, 5) does not continue at 5", id="zero-length-step-at-end",
        ),
        pytest.param(
            Plan("r", 3, (Read(3, 1),)), 5,
            "plan r: step [3, 1) does not continue at 3", id="reversed-step",
        ),
    ],
)
def test_validate_rejects(plan, prompt_len, message):
    with pytest.raises(ValueError) as info:
        plan.validate(prompt_len)
    assert str(info.value) == message


TOKENS = (11, 12, 13, 14, 15)


@pytest.mark.parametrize(
    "tokens, tree_hit, expected",
    [
        pytest.param(TOKENS, 0, Plan("req-1", 0, (Read(0, 5),)), id="miss"),
        pytest.param(TOKENS, 1, Plan("req-1", 1, (Read(1, 5),)), id="hit-1"),
        pytest.param(TOKENS, 3, Plan("req-1", 3, (Read(3, 5),)), id="partial"),
        pytest.param(TOKENS, 4, Plan("req-1", 4, (Read(4, 5),)), id="all-but-last"),
        pytest.param(TOKENS, 5, Plan("req-1", 5, ()), id="full-hit-no-steps"),
        pytest.param((), 0, Plan("req-1", 0, ()), id="empty-prompt"),
    ],
)
def test_radix_plan(tokens, tree_hit, expected):
    policy = RadixPolicy(RadixConfig())
    plan = policy.plan(Arrival(rid="req-1", tokens=tokens, cache_key=None, tree_hit=tree_hit))
    assert plan == expected
    plan.validate(len(tokens))


@pytest.mark.parametrize("cache_key", [None, "salt-a"], ids=["no-key", "keyed"])
def test_radix_plan_ignores_cache_key(cache_key):
    policy = RadixPolicy(RadixConfig())
    arrival = Arrival(rid="k", tokens=TOKENS, cache_key=cache_key, tree_hit=2)
    assert policy.plan(arrival) == Plan("k", 2, (Read(2, 5),))


def test_radix_is_stateless():
    policy = RadixPolicy(RadixConfig())
    assert RadixPolicy.name == "radix"
    assert policy.config == RadixConfig()
    assert policy.release(Release(rid="r", prompt_tokens=5, decode_tokens=2)) is None
    assert policy.check() is None
    arrival = Arrival(rid="r", tokens=TOKENS, cache_key=None, tree_hit=2)
    assert policy.plan(arrival) == policy.plan(arrival) == Plan("r", 2, (Read(2, 5),))


def test_two_snapshots_at_one_position_are_rejected():
    from policy.api import Snapshot

    plan = Plan(rid="d", resume=0, steps=(Read(0, 64), Snapshot(64, "periodic"), Snapshot(64, "prompt_end"),
                                          Read(64, 100)))
    with pytest.raises(ValueError, match=r"^plan d: snapshot at 64 is not within the read forward before it$"):
        plan.validate(100)


# ---------------------------------------------------------------------- optional members: PolicyDefaults


@pytest.mark.parametrize(
    "member, args, default",
    [
        pytest.param("server_settings", (), {}, id="server_settings"),
        pytest.param("server_defaults", (), {}, id="server_defaults"),
        pytest.param("startup_problems", ({"page_size": 16}, {}, True), [], id="startup_problems"),
        pytest.param("snapshot_budget", (), 0, id="snapshot_budget"),
    ],
)
def test_policy_defaults(member, args, default):
    from policy.api import PolicyDefaults

    assert getattr(PolicyDefaults(), member)(*args) == default
    assert getattr(RadixPolicy(RadixConfig()), member)(*args) == default  # radix needs nothing from SGLang


@pytest.mark.parametrize("max_snapshots", [0, 2, 7])
def test_exact_declares_its_snapshot_budget(max_snapshots):
    from exact_cache.config import ExactConfig
    from exact_cache.policy import ExactPolicy

    assert ExactPolicy(ExactConfig(max_snapshots=max_snapshots)).snapshot_budget() == max_snapshots
