"""scr/gates.py: the recurrent-state gate (§9.3; the authors' §13.1 tests 2-4)."""
# Spec: docs/scr.md

from __future__ import annotations

import pytest

from scr.gates import Gate, state_ready

HYBRID = dict(has_state_pool=True, shadow_ready=True, has_snapshot=True)


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        (dict(mode="fork", rows=0, state_tokens=10, **HYBRID), Gate(False, reason="no_rows")),
        (dict(mode="fork", rows=500, state_tokens=600, **HYBRID), Gate(True, restore=True)),
        (dict(mode="strict", rows=500, state_tokens=600, **HYBRID),
         Gate(False, reason="strict_snapshot_longer_than_rows")),
        (dict(mode="strict", rows=500, state_tokens=400, **HYBRID), Gate(True, restore=True)),
        (dict(mode="none", rows=500, state_tokens=-1, **HYBRID), Gate(True)),
        (dict(mode="fork", rows=500, state_tokens=-1, **HYBRID), Gate(False, reason="no_snapshot")),
        (dict(mode="strict", rows=500, state_tokens=-1, **HYBRID), Gate(False, reason="no_snapshot")),
        (dict(mode="fork", rows=500, state_tokens=600, has_state_pool=True, shadow_ready=True, has_snapshot=False),
         Gate(False, reason="no_snapshot")),
        (dict(mode="fork", rows=500, state_tokens=600, has_state_pool=True, shadow_ready=False, has_snapshot=False),
         Gate(False, reason="no_shadow")),
        (dict(mode="fork", rows=500, state_tokens=-1, has_state_pool=False, shadow_ready=False, has_snapshot=False),
         Gate(True, reason="ssm_na")),
        (dict(mode="none", rows=500, state_tokens=-1, has_state_pool=True, shadow_ready=False, has_snapshot=False),
         Gate(False, reason="no_shadow")),
        (dict(mode="fork", rows=500, state_tokens=600, window=128, **HYBRID), Gate(True, restore=True, reason="swa_capped")),
        (dict(mode="fork", rows=100, state_tokens=600, window=128, **HYBRID), Gate(False, reason="swa_too_short")),
    ],
    ids=["no-rows", "fork", "strict-declines-default-path", "strict-covered", "none-needs-no-snapshot",
         "fork-stale", "strict-stale", "fork-no-slot", "hybrid-without-shadow", "dense-model",
         "none-hybrid-without-shadow", "window-capped", "window-too-short"],
)
def test_state_ready(kwargs, expected):
    assert state_ready(**kwargs) == expected


def test_unknown_mode_is_an_error():
    with pytest.raises(ValueError, match="unknown ssm mode 'lazy'"):
        state_ready(mode="lazy", rows=5, state_tokens=5, **HYBRID)


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        pytest.param(dict(mode="fork", rows=128, state_tokens=600, window=128, **HYBRID),
                     Gate(False, reason="swa_too_short"), id="window-leaves-zero-rows"),
        pytest.param(dict(mode="fork", rows=128, state_tokens=600, window=127, **HYBRID),
                     Gate(True, restore=True, reason="swa_capped"), id="window-leaves-one-row"),
        pytest.param(dict(mode="fork", rows=500, state_tokens=0, **HYBRID),
                     Gate(False, reason="no_snapshot"), id="state-of-zero-tokens-is-none"),
        pytest.param(dict(mode="fork", rows=500, state_tokens=1, **HYBRID),
                     Gate(True, restore=True), id="state-of-one-token"),
        pytest.param(dict(mode="strict", rows=500, state_tokens=500, **HYBRID),
                     Gate(True, restore=True), id="strict-state-exactly-the-rows"),
        pytest.param(dict(mode="strict", rows=500, state_tokens=501, **HYBRID),
                     Gate(False, reason="strict_snapshot_longer_than_rows"), id="strict-one-token-longer"),
    ],
)
def test_state_ready_boundaries(kwargs, expected):
    """The edges of each comparison: ``rows - window`` of 0 leaves nothing, a state covering 0
    tokens is no state, and ``strict`` accepts a snapshot exactly as long as the rows."""
    assert state_ready(**kwargs) == expected
