"""Fixtures for the unit tier (standard library only; SGLang, where a test needs its hook registry, is a stub)."""

from __future__ import annotations

import pytest

from policy import registry

FAKE_POLICY = "unit_test_policy"


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch):
    """``patches.process`` holds one policy and one executor per process: each test starts with none."""
    from patches import process

    monkeypatch.setattr(process, "_state", {"policy": None, "executor": None})


@pytest.fixture
def fake_policy():
    """Register the test-only policy (``tests/unit/fake_policy.py``) for one test, then remove it."""
    assert FAKE_POLICY not in registry._IMPLEMENTATIONS
    registry.register(FAKE_POLICY, "tests.unit.fake_policy:FakePolicy")
    try:
        yield FAKE_POLICY
    finally:
        registry._IMPLEMENTATIONS.pop(FAKE_POLICY, None)


class FakeRegistry:
    """Stands in for SGLang's ``HookRegistry`` (importing SGLang takes ~15 s): ``register`` records,
    ``apply_hooks`` puts a new object at every registered target but those in ``skip`` (a hook
    SGLang failed to apply); ``resolve`` is what a target names now."""

    def __init__(self):
        self.hooks: list[tuple[str, object, str]] = []
        self.skip: set[str] = set()
        self._now: dict[str, object] = {}

    def register(self, target, hook, kind):
        self.hooks.append((target, hook, kind))

    def apply_hooks(self):
        for target, _, _ in self.hooks:
            if target not in self.skip:
                self._now[target] = object()

    def resolve(self, target):
        return self._now.setdefault(target, object())


@pytest.fixture
def fake_sglang(monkeypatch):
    """``patches.plugin.install`` without SGLang: the hook registry, the exact tree and the CPU
    platform stubbed (no CUDA check, no torch), nothing installed yet."""
    import sys
    import types

    import patches.cpu
    from patches import log_guard, plugin, validation

    registry = FakeRegistry()
    module = types.ModuleType("sglang.srt.plugins.hook_registry")
    module.HookRegistry = registry
    module.HookType = {"BEFORE": "before", "AFTER": "after", "AROUND": "around", "REPLACE": "replace"}
    monkeypatch.setitem(sys.modules, "sglang.srt.plugins.hook_registry", module)
    exact_tree = types.ModuleType("patches.exact_tree")
    exact_tree.register_backend = lambda: None
    exact_tree.whole_piece_budget = lambda *a, **k: None
    exact_tree.planned_first_piece = lambda *a, **k: None
    exact_tree.run_batch = lambda *a, **k: None
    monkeypatch.setitem(sys.modules, "patches.exact_tree", exact_tree)
    monkeypatch.setattr(plugin.versions, "check_pins", lambda: None)
    # No CPU-platform hooks (not what is tested; the real module imports torch).
    cpu_platform = types.ModuleType("patches.cpu.platform")
    cpu_platform.cuda_available = lambda: True
    monkeypatch.setitem(sys.modules, "patches.cpu.platform", cpu_platform)
    monkeypatch.setattr(patches.cpu, "platform", cpu_platform, raising=False)
    monkeypatch.setattr(plugin, "_resolve", registry.resolve)
    monkeypatch.setattr(plugin, "_state", {"installed": False, "targets": (), "cpu": False})
    monkeypatch.setattr(validation, "_check_field_tables", lambda: None)
    monkeypatch.setattr(validation.stop_regex, "install", lambda: None)  # patches SGLang's scheduler module
    monkeypatch.setattr(log_guard, "install", lambda: None)  # changes logging for the whole process
    return registry
