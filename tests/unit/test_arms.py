"""eval/arms.py and the benchmark's serving arguments per arm (eval/bench_policies.py)."""

from __future__ import annotations

import pytest

from eval.arms import (DEFAULT_ARMS, Arm, ArmError, baseline, parse_arm, parse_arms, parse_concurrency, sweep,
                       with_profile)
from eval.bench_policies import bench_settings, serving_args


def test_default_arms_are_the_three_policies_with_their_defaults():
    assert [(a.name, a.policy, a.settings) for a in parse_arms(None)] == [
        ("radix", "radix", ()), ("exact", "exact", ()), ("scr", "scr", ())]
    assert len(DEFAULT_ARMS) == 3


def test_an_arm_with_settings():
    arm = parse_arm("scr-notree=scr:relocated_in_tree=0,ssm_mode=none")
    assert arm == Arm("scr-notree", "scr", (("relocated_in_tree", "0"), ("ssm_mode", "none")))
    assert arm.cache_policy_args() == ["--cache-policy-set", "relocated_in_tree=0", "--cache-policy-set", "ssm_mode=none"]
    assert arm.describe() == "scr:relocated_in_tree=0,ssm_mode=none"


@pytest.mark.parametrize("text, message", [
    ("scr", "expected NAME=POLICY"),
    ("a b=scr", "expected NAME=POLICY"),
    ("x=nope", "unknown policy 'nope'"),
    ("x=scr:relocated_in_tree", "'relocated_in_tree' is not KEY=VALUE"),
    ("x=scr:no_such=1", "has no setting 'no_such'"),
    ("x=exact:piece_tokens=100", "piece_tokens"),  # exact refuses it (not a multiple of 64)
])
def test_bad_arms_fail_before_anything_runs(text, message):
    with pytest.raises(ArmError, match=message):
        parse_arm(text)


def test_arm_names_are_unique():
    with pytest.raises(ArmError, match="repeated: a"):
        parse_arms(["a=radix", "a=scr"])


@pytest.mark.parametrize("text, expected", [("4", [4]), ("1,4", [1, 4]), (" 1, 4 ", [1, 4])])
def test_concurrency(text, expected):
    assert parse_concurrency(text) == expected


@pytest.mark.parametrize("text", ["0", "1,1", "x", ""])
def test_bad_concurrency(text):
    with pytest.raises(ArmError):
        parse_concurrency(text)


def test_sweep_names_arms_by_concurrency_only_when_there_are_several():
    arms = parse_arms(["radix=radix", "scr=scr"])
    assert [(a.name, a.concurrency) for a in sweep(arms, [4])] == [("radix", 4), ("scr", 4)]
    swept = sweep(arms, [1, 4])
    assert [(a.name, a.concurrency) for a in swept] == [("radix@c1", 1), ("scr@c1", 1), ("radix@c4", 4), ("scr@c4", 4)]
    assert baseline([a for a in swept if a.concurrency == 4]).name == "radix@c4"
    assert baseline(parse_arms(["s=scr", "e=exact"])).name == "s"


def test_serving_args_put_the_arms_settings_over_the_benchmarks():
    default = serving_args(Arm("exact", "exact"), 32768, 100000, 4)
    assert default[default.index("--chunked-prefill-size") + 1] == "832"
    assert "piece_tokens=832" in default and "retain_every=6656" in default
    fine = serving_args(parse_arm("e64=exact:piece_tokens=64,retain_every=512"), 32768, 100000, 4)
    assert fine[fine.index("--chunked-prefill-size") + 1] == "64"
    assert "piece_tokens=64" in fine and "piece_tokens=832" not in fine
    scr = serving_args(parse_arm("s=scr:side_sessions=3"), 32768, 100000, 4)
    assert "side_sessions=3" in scr and "side_tokens" not in " ".join(scr)
    assert scr[scr.index("--chunked-prefill-size") + 1] == "512"
    # scr's default arm runs with the authors' deployed defaults: no setting added
    assert "--cache-policy-set" not in serving_args(Arm("scr", "scr"), 32768, 100000, 4)
    assert bench_settings(Arm("radix", "radix")) == {}
    assert serving_args("radix", 8192, 9000, 1) == serving_args(Arm("radix", "radix"), 8192, 9000, 1)


def test_every_arm_of_a_run_is_served_with_one_profile():
    arms = with_profile(parse_arms(None), "matched-graphs")
    assert {a.serving_profile for a in sweep(arms, [1, 4])} == {"matched-graphs"}
    for arm in arms:
        argv = serving_args(arm, 8192, 9000, 1)
        assert argv[argv.index("--serving-profile") + 1] == "matched-graphs"
    assert {a.serving_profile for a in parse_arms(None)} == {"matched"}
    with pytest.raises(ArmError, match="unknown; valid: matched, matched-graphs, none"):
        with_profile(arms, "fast")
