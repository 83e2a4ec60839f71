"""Fixtures for the unit tier (standard library only)."""

from __future__ import annotations

import pytest

from policy import registry

FAKE_POLICY = "unit_test_policy"


@pytest.fixture
def fake_policy():
    """Register the test-only policy (``tests/unit/fake_policy.py``) for one test, then remove it."""
    assert FAKE_POLICY not in registry._IMPLEMENTATIONS
    registry.register(FAKE_POLICY, "tests.unit.fake_policy:FakePolicy")
    try:
        yield FAKE_POLICY
    finally:
        registry._IMPLEMENTATIONS.pop(FAKE_POLICY, None)
