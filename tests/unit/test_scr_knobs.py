"""``scr.knobs``: the per-request ``cache_salt`` knobs (``docs/scr.md`` §2.3)."""

from __future__ import annotations

import dataclasses

import pytest

from scr.knobs import RequestKnobs, parse_request_knobs
from scr.kvreuse_env import UnsupportedKnob, from_env
from scr.settings import ScrConfig

DEFAULT = ScrConfig()


@pytest.mark.parametrize(
    "salt, expected",
    [
        pytest.param(None, RequestKnobs(), id="no-salt"),
        pytest.param("tenant-a", RequestKnobs(namespace="tenant-a"), id="plain-salt"),
        pytest.param("kvreuse:off", RequestKnobs(namespace="kvreuse:off", off=True), id="off"),
        pytest.param(
            "KVREUSE:off", RequestKnobs(namespace="KVREUSE:off"), id="prefix-is-case-sensitive"
        ),
        pytest.param(
            "kvreuse:offline",
            RequestKnobs(namespace="kvreuse:offline", ignored=(("offline", "unknown kvreuse switch"),)),
            id="off-must-be-exact",
        ),
        pytest.param(
            "tenant-kvreuse:off", RequestKnobs(namespace="tenant-kvreuse:off"), id="prefix-must-lead"
        ),
        pytest.param(
            "kvreuse:knobs:maxblocks=3",
            RequestKnobs(namespace="kvreuse:knobs:maxblocks=3", overrides={"max_blocks": 3}),
            id="maxblocks",
        ),
        pytest.param(
            "kvreuse:knobs:maxblocks=0,minext=-2",
            RequestKnobs(
                namespace="kvreuse:knobs:maxblocks=0,minext=-2", overrides={"max_blocks": 1, "min_extend": 1}
            ),
            id="maxblocks-minext-clamped-to-1-like-the-planner",
        ),
        pytest.param(
            "kvreuse:knobs:mintail=128,ssm=none,rerot=0",
            RequestKnobs(
                namespace="kvreuse:knobs:mintail=128,ssm=none,rerot=0",
                overrides={"min_tail": 128, "ssm_mode": "none", "no_rerotate": True},
            ),
            id="mintail-ssm-rerot-off",
        ),
        pytest.param(
            "kvreuse:knobs:rerot=YES",
            RequestKnobs(namespace="kvreuse:knobs:rerot=YES", overrides={"no_rerotate": False}),
            id="rerot-true-word-case-insensitive",
        ),
        pytest.param(
            "kvreuse:knobs:pin=0,v6=1,lead=off,force=no,min_extra=512,maxblocks=2",
            RequestKnobs(
                namespace="kvreuse:knobs:pin=0,v6=1,lead=off,force=no,min_extra=512,maxblocks=2",
                overrides={"max_blocks": 2},
                ignored=(
                    ("min_extra=512", "single-phase path only (its gain test): no effect"),
                    ("pin=0", "single-phase knob at its two-phase value: no effect"),
                    ("v6=1", "single-phase knob at its two-phase value: no effect"),
                    ("lead=off", "single-phase knob at its two-phase value: no effect"),
                    ("force=no", "single-phase knob at its two-phase value: no effect"),
                ),
            ),
            id="single-phase-knobs-at-two-phase-values-have-no-effect",
        ),
        pytest.param(
            "kvreuse:knobs:pin=1,pin=0",
            RequestKnobs(
                namespace="kvreuse:knobs:pin=1,pin=0",
                ignored=(("pin=0", "single-phase knob at its two-phase value: no effect"),),
            ),
            id="single-phase-knob-later-wins",
        ),
        pytest.param(
            "kvreuse:knobs: maxblocks = 2 ,,maxblocks=4,",
            RequestKnobs(namespace="kvreuse:knobs: maxblocks = 2 ,,maxblocks=4,", overrides={"max_blocks": 4}),
            id="spaces-empty-items-later-wins",
        ),
        pytest.param(
            "kvreuse:knobs:maxblocks,zz=1,maxblocks=two,ssm=FORK,mintail=0,min_extra=x,minext=8",
            RequestKnobs(
                namespace="kvreuse:knobs:maxblocks,zz=1,maxblocks=two,ssm=FORK,mintail=0,min_extra=x,minext=8",
                overrides={"min_extend": 8},
                ignored=(
                    ("maxblocks", "expected key=value"),
                    ("zz=1", "unknown knob"),
                    ("maxblocks=two", "expected an integer"),
                    ("ssm=FORK", "expected one of fork, strict, none"),
                    ("mintail=0", "must be >= 1"),
                    ("min_extra=x", "single-phase path only (its gain test): no effect"),
                ),
            ),
            id="malformed-items-ignored-and-reported",
        ),
        pytest.param(
            "kvreuse:knobs:",
            RequestKnobs(namespace="kvreuse:knobs:"),
            id="empty-knob-list",
        ),
        pytest.param(
            "kvreuse:knobs:maxblocks=3,PIN = ON",
            RequestKnobs(namespace="kvreuse:knobs:maxblocks=3,PIN = ON", overrides={"max_blocks": 3},
                         ignored=(("PIN = ON", "unknown knob"),)),
            id="single-phase-key-is-case-sensitive-so-unknown",
        ),
        pytest.param(
            "kvreuse:knobs:maxblocks=3tenant-b",
            RequestKnobs(
                namespace="kvreuse:knobs:maxblocks=3tenant-b",
                ignored=(("maxblocks=3tenant-b", "expected an integer"),),
            ),
            id="extra_key-concatenated-onto-the-last-value",
        ),
    ],
)
def test_parse_request_knobs(salt, expected):
    assert parse_request_knobs(salt) == expected


NOT_PORTED = "selects the single-phase path, which this port does not implement"
PIN_HINT = "for a control run that relocates nothing use cache_salt 'kvreuse:off' (plain radix cache)"
V6_HINT = "leave the knob out: the two-phase path is the default"
FORCE_NOT_PORTED = "applies to the single-phase path only, which this port does not implement"
FORCE_HINT = "leave the knob out: the two-phase path has no gain test to skip"


@pytest.mark.parametrize(
    "salt, message",
    [
        pytest.param("kvreuse:knobs:pin=1",
                     f"cache_salt knob pin='1': {NOT_PORTED} (only pin=0 is accepted); {PIN_HINT}", id="pin"),
        pytest.param("kvreuse:knobs:v6=0",
                     f"cache_salt knob v6='0': {NOT_PORTED} (only v6=1 is accepted); {V6_HINT}", id="v6-off"),
        pytest.param("kvreuse:knobs:lead=yes",
                     f"cache_salt knob lead='yes': {NOT_PORTED} (only lead=0 is accepted); leave the knob out: "
                     "the radix cache serves the leading run", id="lead"),
        pytest.param("kvreuse:knobs:force=true",
                     f"cache_salt knob force='true': {FORCE_NOT_PORTED} (only force=0 is accepted); {FORCE_HINT}",
                     id="force"),
        # anywhere in the salt:
        pytest.param("kvreuse:knobs:maxblocks=3, pin = ON ",
                     f"cache_salt knob pin='ON': {NOT_PORTED} (only pin=0 is accepted); {PIN_HINT}",
                     id="after-a-supported-knob"),
        pytest.param("kvreuse:knobs:v6=1,v6=off",
                     f"cache_salt knob v6='off': {NOT_PORTED} (only v6=1 is accepted); {V6_HINT}", id="later-wins"),
        pytest.param("kvreuse:knobs:force=1,lead=1",
                     f"cache_salt knob force='1': {FORCE_NOT_PORTED} (only force=0 is accepted); {FORCE_HINT}",
                     id="first-in-the-salt-named"),
    ],
)  # fmt: skip
def test_single_phase_knobs_raise(salt, message):
    with pytest.raises(UnsupportedKnob) as info:
        parse_request_knobs(salt)
    assert str(info.value) == message
    assert isinstance(info.value, ValueError)


def test_admit_lets_an_unsupported_knob_propagate_before_any_session_change():
    from scr.policy import ScrPolicy

    policy = ScrPolicy(DEFAULT)
    with pytest.raises(UnsupportedKnob, match="pin="):
        policy.admit(list(range(3000)), "kvreuse:knobs:pin=1")
    assert len(policy.sessions) == 0


def test_env_and_knob_refusals_share_their_wording():
    with pytest.raises(UnsupportedKnob) as env:
        from_env({"KVREUSE_PIN_ONLY": "1"})
    with pytest.raises(UnsupportedKnob) as knob:
        parse_request_knobs("kvreuse:knobs:pin=1")
    assert NOT_PORTED in str(env.value) and NOT_PORTED in str(knob.value)


@pytest.mark.parametrize(
    "salt, changes",
    [
        pytest.param("kvreuse:knobs:maxblocks=3,ssm=strict", {"max_blocks": 3, "ssm_mode": "strict"}, id="overrides"),
        pytest.param("tenant-a", {}, id="no-overrides-is-identity"),
    ],
)
def test_knobs_apply(salt, changes):
    config = parse_request_knobs(salt).apply(DEFAULT)
    assert config == dataclasses.replace(DEFAULT, **changes)
    assert (config is DEFAULT) == (not changes)  # without overrides the base itself comes back
    assert DEFAULT.max_blocks == 6  # the base is not changed


@pytest.mark.parametrize("value", [-1, 0, 1, 2, 128])
def test_mintail_accepts_exactly_the_values_of_at_least_one(value):
    knobs = parse_request_knobs(f"kvreuse:knobs:mintail={value}")
    if value >= 1:
        assert (knobs.overrides, knobs.ignored) == ({"min_tail": value}, ())
    else:
        assert (knobs.overrides, knobs.ignored) == ({}, ((f"mintail={value}", "must be >= 1"),))
